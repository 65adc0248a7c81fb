"""The selftest's verdicts as plain text, one block per rule like `%tfgpu doctor`: what `python -m
tfgpu_magic selftest` prints (a block as each rule is decided) and `%tfgpu selftest` shows in a
terminal (a line as each rule is decided, then the whole); the rows come from `selftest.report`."""

from __future__ import annotations

import sys

from ..selftest.report import Row
from ..selftest.rules import FAIL, PASS, SKIP


FRAMEWORK_RULES = {"jax-settings": "JAX", "torch-settings": "PyTorch"}
"""The rules whose child reports the version of the framework it imported."""


def header(rows: list[Row]) -> str:
    """Which Python and TensorFlow the rules ran with, from the run without a policy; JAX's and
    PyTorch's versions where their rules ran."""
    figures = next((row.figures for row in rows if row.rule == "baseline" and row.figures), None)
    others = "".join(f" · {FRAMEWORK_RULES[row.rule]} {row.figures['version']}" for row in rows
                     if row.rule in FRAMEWORK_RULES and row.figures and row.figures.get("version"))
    if figures is None:
        why = next((row.why for row in rows if row.rule == "baseline"), "")
        return "tfgpu_magic selftest" + (f" · TensorFlow: {why}" if why else "") + others
    build = "CUDA build" if figures["cuda_build"] else "CPU-only build"
    return (f"tfgpu_magic selftest · Python {figures['python_version']} ({figures['python']}) · "
            f"TensorFlow {figures['version']} ({build}, {figures['gpus']} GPU(s))" + others)


def opening(timeout: float, deadline: float) -> str:
    """The first line `python -m tfgpu_magic selftest` prints, before any rule is decided."""
    return (f"tfgpu_magic selftest · Python {sys.version.split()[0]} ({sys.executable}) · each process at most "
            f"{timeout:.0f} s, the whole run at most {deadline:.0f} s")


def progress(row: Row) -> str:
    """`[pass] split-cpu  (7.4 s)`, with why for a fail or a skip: what `%tfgpu selftest` prints as each
    rule is decided, before the whole table."""
    why = f" · {row.why}" if row.why and row.verdict != PASS else ""
    return f"[{row.verdict}] {row.rule}{took(row)}{why}"


def block(row: Row) -> str:
    """`[pass] rule: claim  (3.1 s)` and a line with the policy, expected, measured and why."""
    parts = [f"policy: {'; '.join(row.policy)}"] if row.policy else []
    parts += [f"{name}: {value}" for name, value in (("expected", row.expected), ("measured", row.measured),
                                                     ("why", row.why)) if value]
    return f"[{row.verdict}] {row.rule}: {row.claim}{took(row)}" + ("\n       " + " · ".join(parts) if parts else "")


def took(row: Row) -> str:
    """`  (3.1 s)`: the time its process ran; nothing for a skip."""
    return f"  ({row.seconds:.1f} s)" if row.verdict != SKIP else ""


def summary(rows: list[Row], seconds: float | None = None, workers: int | None = None) -> str:
    """`12 rules: 9 pass, 0 fail, 3 skip; 41.2 s in all, 4 processes at a time`."""
    counts = ", ".join(f"{sum(row.verdict == v for row in rows)} {v}" for v in (PASS, FAIL, SKIP))
    timing = f"; {seconds:.1f} s in all" if seconds is not None else ""
    timing += f", {workers} processes at a time" if workers else ""
    return f"{len(rows)} rule{'' if len(rows) == 1 else 's'}: {counts}{timing}"


def text(rows: list[Row], seconds: float | None = None, workers: int | None = None) -> str:
    """The header, a block per rule, and the counts."""
    return "\n".join([header(rows), *map(block, rows), summary(rows, seconds, workers)])
