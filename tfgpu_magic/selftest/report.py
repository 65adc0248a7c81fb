"""The selftest's verdicts as plain text (one block per rule, like `%tfgpu doctor`) or as JSON, and
back from JSON (what `%tfgpu selftest` reads from the process that ran them)."""

from __future__ import annotations

import json
from typing import Any, NamedTuple

from .rules import FAIL, PASS, SKIP


class Row(NamedTuple):
    """One rule's verdict: `figures` are what its process reported (None when it did not run)."""

    rule: str
    claim: str
    policy: tuple[str, ...]
    verdict: str
    why: str
    expected: str
    measured: str
    seconds: float
    figures: dict[str, Any] | None = None


def failed(rows: list[Row]) -> bool:
    return any(row.verdict == FAIL for row in rows)


def to_json(rows: list[Row]) -> str:
    """A JSON list, one object per rule: rule, claim, policy, verdict (pass/fail/skip), why,
    expected, measured, seconds, figures."""
    return json.dumps([row._asdict() for row in rows], indent=2, ensure_ascii=False)


def from_json(text: str) -> list[Row]:
    return [Row(**{**item, "policy": tuple(item["policy"])}) for item in json.loads(text)]


def header(rows: list[Row]) -> str:
    """Which Python and TensorFlow the rules ran with, from the run without a policy."""
    figures = next((row.figures for row in rows if row.rule == "baseline" and row.figures), None)
    if figures is None:
        why = next((row.why for row in rows if row.rule == "baseline"), "")
        return "tfgpu_magic selftest" + (f" · TensorFlow: {why}" if why else "")
    build = "CUDA build" if figures["cuda_build"] else "CPU-only build"
    return (f"tfgpu_magic selftest · Python {figures['python_version']} ({figures['python']}) · "
            f"TensorFlow {figures['version']} ({build}, {figures['gpus']} GPU(s))")


def block(row: Row) -> str:
    """`[pass] rule: claim  (3.1 s)` and a line with the policy, expected, measured and why."""
    took = f"  ({row.seconds:.1f} s)" if row.verdict != SKIP else ""
    parts = [f"policy: {'; '.join(row.policy)}"] if row.policy else []
    parts += [f"{name}: {value}" for name, value in (("expected", row.expected), ("measured", row.measured),
                                                     ("why", row.why)) if value]
    return f"[{row.verdict}] {row.rule}: {row.claim}{took}" + ("\n       " + " · ".join(parts) if parts else "")


def summary(rows: list[Row], seconds: float | None = None, workers: int | None = None) -> str:
    counts = ", ".join(f"{sum(row.verdict == v for row in rows)} {v}" for v in (PASS, FAIL, SKIP))
    timing = f"; {seconds:.1f} s in all" if seconds is not None else ""
    timing += f", {workers} processes at a time" if workers else ""
    return f"{len(rows)} rule{'' if len(rows) == 1 else 's'}: {counts}{timing}"


def text(rows: list[Row], seconds: float | None = None, workers: int | None = None) -> str:
    return "\n".join([header(rows), *map(block, rows), summary(rows, seconds, workers)])
