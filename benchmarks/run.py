#!/usr/bin/env python
"""`make bench`: speed figures of tfgpu_magic, each a RATIO against a baseline measured in the same run.

Absolute times depend on the machine; a ratio against a baseline taken moments before (or after) on
the same machine does much less. Every figure is the median of `--repeat` samples taken in
back-to-back pairs (baseline, measured), alternating which of the two goes first so that drift
cancels; the ratio is the median of the per-pair ratios, so it can differ slightly from
value / baseline. Import-time figures run in fresh interpreters (imports are cached in-process).

Bytecode: the fresh interpreters, and the kernels of the restart figure, cache compiled bytecode in
a private folder, warmed before measuring, as a user's install has it (`bytecode.py` says why);
`--no-pyc-cache` keeps the environment as it is.

Adding a figure: write `def my_figure(bench: Bench) -> Row` and append it to FIGURES. Samples that
several figures share come from a cached sampler (see `_vs_shell_start`).

Exit status: 1 if any figure misses its target, so `make bench` fails visibly.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import functools
import gc
import io
import json
import math
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any, Callable, NamedTuple

from bytecode import caches_bytecode, with_bytecode_cache
from pairs import DEFAULT_REPEAT, EMPTY_CELL_PAIRS_FACTOR, RESTART_PAIRS_FACTOR

HEAVY = ("tensorflow", "keras", "jax", "torch", "ipywidgets", "pynvml")
"""Modules that loading the extension and editing the policy must not import."""

MARK = "BENCH-RESULT "
PRELUDE = f"""\
import contextlib, io, json, sys, time
clock = time.perf_counter
HEAVY = {HEAVY!r}
def quiet():
    return contextlib.redirect_stdout(io.StringIO())
def emit(**values):
    print({MARK!r} + json.dumps(values), flush=True)
"""
"""Defined in every fresh interpreter before the snippet: a clock, `quiet()` and `emit(**values)`."""


class Row(NamedTuple):
    """One line of the table: `ratio <= target` passes. Durations are in seconds (unit "s")."""

    name: str
    value: float
    baseline: float | None
    ratio: float
    target: float
    unit: str = "s"
    note: str = ""

    @property
    def ok(self) -> bool:
        return self.ratio <= self.target  # NaN (nothing measured) is a miss


@dataclass(frozen=True)
class Bench:
    """Settings of one run, handed to every figure (hashable, so samplers can be cached on it)."""

    repeat: int
    cells: int
    env: tuple[tuple[str, str], ...]
    """Environment of the fresh interpreters, taken before this process loads the extension."""


# ----- measuring ------------------------------------------------------------------------------------
def fresh(bench: Bench, snippet: str) -> dict[str, Any]:
    """Run `snippet` in a fresh interpreter and return what it passed to `emit(...)`."""
    code = PRELUDE + textwrap.dedent(snippet)
    proc = subprocess.run(
        [sys.executable, "-c", code], env=dict(bench.env), capture_output=True, text=True, timeout=600
    )
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith(MARK):
            return json.loads(line[len(MARK):])
    raise RuntimeError(f"benchmark snippet failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")


def paired(sample: Callable[[str], Any], repeat: int) -> tuple[list[Any], list[Any]]:
    """`repeat` back-to-back (baseline, measured) samples, alternating which goes first."""
    sample("baseline")  # warm-up: bytecode cache, file cache, first-time setup
    sample("measured")
    baseline, measured = [], []
    for i in range(repeat):
        order = ("baseline", "measured") if i % 2 == 0 else ("measured", "baseline")
        got = {which: sample(which) for which in order}
        baseline.append(got["baseline"])
        measured.append(got["measured"])
    return baseline, measured


def ratio_row(name: str, measured: list[float], baseline: list[float], target: float, note: str = "") -> Row:
    """Row with the medians and the median of the per-pair ratios."""
    pairs = [m / b for m, b in zip(measured, baseline) if b > 0 and not math.isnan(m)]
    return Row(
        name,
        statistics.median(measured) if measured else math.nan,
        statistics.median(baseline) if baseline else None,
        statistics.median(pairs) if pairs else math.nan,
        target,
        note=note,
    )


def progress(message: str) -> None:
    print(f"[bench] {message}", file=sys.stderr, flush=True)


# ----- snippets run in fresh interpreters -------------------------------------------------------------
SHELL_START = """
t = clock()
from IPython.core.interactiveshell import InteractiveShell
InteractiveShell.instance()
emit(seconds=clock() - t)
"""
"""Baseline: IPython shell start, import of IPython included (what every kernel pays)."""

EXTENSION = """
from IPython.core.interactiveshell import InteractiveShell
shell = InteractiveShell.instance()
heavy = {}
with quiet():
    t = clock()
    shell.run_line_magic("load_ext", "tfgpu_magic")
    load = clock() - t
    heavy["load_ext"] = [m for m in HEAVY if m in sys.modules]
    shell.run_line_magic("tfgpu", "growth on")
    shell.run_line_magic("tfgpu", "split cpu 2")
    heavy["policy"] = [m for m in HEAVY if m in sys.modules]
    t = clock()
    shell.run_line_magic("tfgpu", "")
    status = clock() - t
    heavy["status"] = [m for m in HEAVY if m in sys.modules]
emit(load=load, status=status, heavy=heavy)
"""
"""`%load_ext`, a policy, then the first bare `%tfgpu` (status), TensorFlow never imported."""

PANEL = """
from IPython.core.interactiveshell import InteractiveShell
from IPython.display import display
shell = InteractiveShell.instance()
with quiet():
    shell.run_line_magic("load_ext", "tfgpu_magic")
    t = clock()
    from tfgpu_magic.controller import get_controller
    from tfgpu_magic.views.panel import Panel
    display(Panel(get_controller()).widget)
    seconds = clock() - t
emit(seconds=seconds)
"""
"""First panel built and displayed (ipywidgets import included), TensorFlow not imported."""

TF_IMPORT = """
from IPython.core.interactiveshell import InteractiveShell
shell = InteractiveShell.instance()
applies = []
if WITH_EXTENSION:
    with quiet():
        shell.run_line_magic("load_ext", "tfgpu_magic")
        shell.run_line_magic("tfgpu", "split cpu 2")
        shell.run_line_magic("tfgpu", "growth on")
    from tfgpu_magic.controller import get_controller
    controller = get_controller()
    apply = controller.apply
    def timed_apply():
        caller = sys._getframe(1).f_code.co_name  # the import hook's callback that calls self.apply()
        t = clock()
        try:
            return apply()
        finally:
            if caller != "_on_framework_import":  # TensorFlow's, not JAX's (`import tensorflow` imports it)
                applies.append(clock() - t)
    controller.apply = timed_apply
t, cpu_t = clock(), time.process_time()
import tensorflow as tf
seconds, cpu_seconds = clock() - t, time.process_time() - cpu_t
cpu = tf.config.list_physical_devices("CPU")[0]
emit(seconds=seconds, cpu_seconds=cpu_seconds, applies=applies,
     cpu_devices=len(tf.config.get_logical_device_configuration(cpu) or ()))
"""
"""`import tensorflow` after an IPython shell started, with or without the extension and a policy.

With the extension, the import hook runs `controller.apply()` inside the import (right after
TensorFlow's module body, before `import` returns); the wrapper times exactly that call: TensorFlow
imported, runtime not initialized, the policy applied through `tf.config`. That includes the first
`tf.config.list_physical_devices` (device discovery, which on a GPU machine starts CUDA: work TensorFlow
would otherwise do at the first op) and excludes nothing the hook does but a report on failure.
"""


# ----- samplers shared by several figures ----------------------------------------------------------------
@functools.cache
def _vs_shell_start(bench: Bench, snippet: str, what: str) -> tuple[list[dict], list[dict]]:
    """Fresh shell starts (baseline) paired with fresh runs of `snippet`; figures that read the same
    snippet share its samples."""
    progress(f"shell start vs {what}: {bench.repeat} pairs of fresh interpreters")
    return paired(lambda which: fresh(bench, SHELL_START if which == "baseline" else snippet), bench.repeat)


def _extension_samples(bench: Bench) -> tuple[list[dict], list[dict]]:
    return _vs_shell_start(bench, EXTENSION, "%load_ext / %tfgpu")


def tf_import_snippet(with_extension: bool) -> str:
    """`TF_IMPORT` with or without the extension and its policy."""
    return f"WITH_EXTENSION = {with_extension}\n" + textwrap.dedent(TF_IMPORT)


@functools.cache
def _tf_import_samples(bench: Bench) -> tuple[list[dict], list[dict]]:
    """Fresh `import tensorflow` without (baseline) and with the extension and a policy."""
    progress(f"import tensorflow without / with the extension: {bench.repeat} pairs (~5 s each)")
    return paired(lambda which: fresh(bench, tf_import_snippet(which == "measured")), bench.repeat)


# ----- figures ---------------------------------------------------------------------------------------------
def load_ext_vs_shell_start(bench: Bench) -> Row:
    """`%load_ext tfgpu_magic` in a fresh shell / the shell's own start."""
    shells, runs = _extension_samples(bench)
    return ratio_row("%load_ext / shell start", [r["load"] for r in runs], [s["seconds"] for s in shells], 0.05)


def _heavy(runs: list[dict], *steps: str) -> list[str]:
    """The heavy modules found in `sys.modules` after any of `steps`, in any run."""
    return sorted({f"{m} (after {step})" for r in runs for step in steps for m in r["heavy"][step]})


def heavy_imports_after_load(bench: Bench) -> Row:
    """1 if `%load_ext` or policy edits (TensorFlow not imported) imported TF, ipywidgets or NVML, else 0."""
    _, runs = _extension_samples(bench)
    found = _heavy(runs, "load_ext", "policy")
    value = 1.0 if found else 0.0
    return Row("heavy imports after load", value, None, value, 0, unit="", note=", ".join(found))


def status_vs_shell_start(bench: Bench) -> Row:
    """First bare `%tfgpu` (status, TensorFlow not imported) / the shell's own start."""
    shells, runs = _extension_samples(bench)
    found = _heavy(runs, "status")
    return ratio_row("%tfgpu status / shell start", [r["status"] for r in runs], [s["seconds"] for s in shells],
                     0.10, note="imports " + ", ".join(found) if found else "")


def seconds_per_empty_cell(shell: Any, cells: int) -> float:
    """Mean seconds of one empty cell over `cells` cells, after a garbage collection."""
    gc.collect()
    start = time.perf_counter()
    for _ in range(cells):
        shell.run_cell("pass", store_history=False)
    return (time.perf_counter() - start) / cells


def empty_cell_overhead(bench: Bench) -> Row:
    """`run_cell("pass")` with the extension loaded and a policy set / without, in this process.

    The extension cannot be unloaded, so "without" is this shell with every hook point (import
    finders, events, transformers, magics) put back as it was before `%load_ext`; the two states
    alternate between samples.
    """
    from IPython.core.interactiveshell import InteractiveShell

    pairs = bench.repeat * EMPTY_CELL_PAIRS_FACTOR
    progress(f"empty cell with / without the extension: {pairs} pairs of {bench.cells} cells")
    shell = InteractiveShell.instance()
    without = _snapshot(shell)
    with contextlib.redirect_stdout(io.StringIO()):
        shell.run_line_magic("load_ext", "tfgpu_magic")
        shell.run_line_magic("tfgpu", "growth on")
    loaded = _snapshot(shell)

    def sample(which: str) -> float:
        _restore(shell, loaded if which == "measured" else without)
        return seconds_per_empty_cell(shell, bench.cells)

    baseline, measured = paired(sample, pairs)
    _restore(shell, loaded)
    return ratio_row("empty cell, loaded+policy / without", measured, baseline, 1.01)


def _hook_points(shell: Any) -> list[list | dict]:
    """The mutable containers through which an extension can add work to a cell or an import."""
    return [
        sys.meta_path,
        shell.ast_transformers,
        shell.input_transformers_post,
        shell.input_transformers_cleanup,
        shell.input_transformer_manager.line_transforms,
        *shell.events.callbacks.values(),
        *shell.magics_manager.magics.values(),
    ]


def _snapshot(shell: Any) -> list[list | dict]:
    return [container.copy() for container in _hook_points(shell)]


def _restore(shell: Any, snapshot: list[list | dict]) -> None:
    for container, saved in zip(_hook_points(shell), snapshot):
        if isinstance(container, dict):
            container.clear()
            container.update(saved)
        else:
            container[:] = saved


def policy_apply_vs_tf_import(bench: Bench) -> Row:
    """The import hook's `controller.apply()` (split cpu 2 + growth on) / `import tensorflow` alone."""
    plain, runs = _tf_import_samples(bench)
    applies = [r["applies"][0] if r["applies"] else math.nan for r in runs]
    problems = []
    if any(len(r["applies"]) != 1 for r in runs):
        problems.append(f"hook applied {sorted({len(r['applies']) for r in runs})} times per import, expected once")
    if any(r["cpu_devices"] != 2 for r in runs):
        problems.append("split cpu 2 not in force after the import")
    return ratio_row("policy apply on import / import tensorflow", applies,
                     [p["seconds"] for p in plain], 0.01, note="; ".join(problems))


def tf_import_with_vs_without(bench: Bench) -> Row:
    """Sanity: `import tensorflow` with the extension and a policy / without (hook's apply included).

    The note gives the same ratio in CPU time, which other processes on a busy machine disturb less:
    a wall-time miss with a CPU-time ratio near 1 is noise, not the extension.
    """
    plain, runs = _tf_import_samples(bench)
    cpu = ratio_row("", [r["cpu_seconds"] for r in runs], [p["cpu_seconds"] for p in plain], 1.05)
    return ratio_row("import tensorflow, with / without ext", [r["seconds"] for r in runs],
                     [p["seconds"] for p in plain], 1.05, note=f"CPU-time ratio {cpu.ratio:.4g}")


def panel_vs_shell_start(bench: Bench) -> Row:
    """First `Panel` built and displayed / the shell's own start (no target is set for it; a panel
    that costs more than a whole shell start would be noticed, hence 1.0)."""
    shells, panels = _vs_shell_start(bench, PANEL, "first panel display")
    return ratio_row("panel first display / shell start", [p["seconds"] for p in panels],
                     [s["seconds"] for s in shells], 1.0)


def restart_vs_plain_restart(bench: Bench) -> Row:
    """`%tfgpu restart --yes` until the policy is in force / a plain server restart (bench_restart.py)."""
    from bench_restart import TARGET, restart_roundtrip

    pairs = bench.repeat * RESTART_PAIRS_FACTOR
    progress(f"restart and apply vs plain server restart: {pairs} pairs under a real server")
    result = restart_roundtrip(pairs, pyc_cache=caches_bytecode(dict(bench.env)))
    return ratio_row("restart and apply / plain restart", result["samples"]["apply_s"],
                     result["samples"]["plain_s"], TARGET)


# ----- memory figures: `%tfgpu memory`, `%tfgpu watch on|off` -----------------------------------
MEMORY = """
from IPython.core.interactiveshell import InteractiveShell
shell = InteractiveShell.instance()
with quiet():
    shell.run_line_magic("load_ext", "tfgpu_magic")
    shell.run_line_magic("tfgpu", "growth on")
    t = clock()
    shell.run_line_magic("tfgpu", "memory")
    seconds = clock() - t
emit(seconds=seconds, heavy=[m for m in HEAVY if m in sys.modules])
"""
"""First `%tfgpu memory` in a fresh shell (TensorFlow not imported: it must stay so)."""

HOOKS_LEFT = """
from IPython.core.interactiveshell import InteractiveShell
shell = InteractiveShell.instance()
def ours():
    return [c for event in ("pre_run_cell", "post_run_cell") for c in shell.events.callbacks[event]
            if "tfgpu_magic" in getattr(c, "__module__", "")]
with quiet():
    shell.run_line_magic("load_ext", "tfgpu_magic")
    before_import = len(ours())
    shell.run_line_magic("tfgpu", "watch on")
    shell.run_line_magic("tfgpu", "watch off")
    after_watch_off = len(ours())
    shell.run_cell("import tensorflow as tf")
    shell.run_cell("tf.constant(1)")
    from tfgpu_magic.tf import initcell
    from tfgpu_magic.views.tfstate import init_text
    record = initcell.initialized_record()
    known = None if record is None else init_text(record)
    left = [getattr(c, "__qualname__", type(c).__qualname__) for c in ours()]
emit(before_import=before_import, after_watch_off=after_watch_off, known=known, left=left)
"""
"""Hooks of ours on the cell events: none before `import tensorflow`, none after `watch off`, and
once the initializing cell is known only the OOM hook (`OomHook`, ~1 µs a cell)."""


def watch_cell_overhead(bench: Bench) -> Row:
    """`run_cell("pass")` with `%tfgpu watch on` / with it off, extension loaded, no GPU, TF not imported."""
    from IPython.core.interactiveshell import InteractiveShell

    pairs = bench.repeat * EMPTY_CELL_PAIRS_FACTOR
    progress(f"empty cell with / without watch on: {pairs} pairs of {bench.cells} cells")
    shell = InteractiveShell.instance()
    with contextlib.redirect_stdout(io.StringIO()):
        shell.run_line_magic("load_ext", "tfgpu_magic")

    def sample(which: str) -> float:
        with contextlib.redirect_stdout(io.StringIO()):
            shell.run_line_magic("tfgpu", "watch on" if which == "measured" else "watch off")
        return seconds_per_empty_cell(shell, bench.cells)

    baseline, measured = paired(sample, pairs)
    with contextlib.redirect_stdout(io.StringIO()):
        shell.run_line_magic("tfgpu", "watch off")
    return ratio_row("empty cell, watch on / off", measured, baseline, 1.02)


def memory_vs_shell_start(bench: Bench) -> Row:
    """First `%tfgpu memory` (TensorFlow not imported) / the shell's own start."""
    shells, runs = _vs_shell_start(bench, MEMORY, "first %tfgpu memory")
    heavy = sorted({m for r in runs for m in r["heavy"]})
    return ratio_row("%tfgpu memory / shell start", [r["seconds"] for r in runs], [s["seconds"] for s in shells],
                     0.10, note="imports " + ", ".join(heavy) if heavy else "")


def hooks_left(bench: Bench) -> Row:
    """Count of our cell hooks that should not be there: before import, after `watch off`, and
    besides the OOM hook once the initializing cell is known (target 0)."""
    progress("hooks left after watch off / once the initializing cell is known (TensorFlow import)")
    r = fresh(bench, HOOKS_LEFT)
    extra = [name for name in r["left"] if name != "OomHook"]
    value = float(r["before_import"] + r["after_watch_off"] + len(extra) + (r["known"] is None))
    return Row("cell hooks left (besides the OOM check)", value, None, value, 0, unit="",
               note=f"initialized {r['known']}; left: {', '.join(r['left']) or 'none'}")


FIGURES: list[Callable[[Bench], Row]] = [
    load_ext_vs_shell_start,
    heavy_imports_after_load,
    empty_cell_overhead,
    policy_apply_vs_tf_import,
    tf_import_with_vs_without,
    status_vs_shell_start,
    panel_vs_shell_start,
    restart_vs_plain_restart,
    watch_cell_overhead,
    memory_vs_shell_start,
    hooks_left,
]


# ----- report ---------------------------------------------------------------------------------------------
def machine() -> dict[str, Any]:
    """What the figures were measured on (TensorFlow's version read from metadata, not imported)."""

    def version(*dists: str) -> str:
        for dist in dists:
            with contextlib.suppress(metadata.PackageNotFoundError):
                return metadata.version(dist) if len(dists) == 1 else f"{metadata.version(dist)} ({dist})"
        return "not installed"

    return {
        "cpus": os.cpu_count(),
        "load_average": [round(x, 2) for x in os.getloadavg()] if hasattr(os, "getloadavg") else None,
        "platform": platform.platform(),
        "python": platform.python_version(),
        "ipython": version("ipython"),
        "tensorflow": version("tensorflow", "tensorflow-cpu", "tf-nightly", "tf-nightly-cpu"),
        "tfgpu_magic": version("tfgpu_magic"),
    }


def show(value: float | None, unit: str) -> str:
    if value is None:
        return "-"
    if unit != "s" or math.isnan(value):
        return f"{value:g}{unit}"
    for scale, suffix in ((1, "s"), (1e-3, "ms"), (1e-6, "µs")):
        if value >= scale:
            return f"{value / scale:.3g} {suffix}"
    return f"{value / 1e-9:.3g} ns"


def table(rows: list[Row]) -> str:
    header = ("figure", "value", "baseline", "ratio", "target", "")
    lines = [header] + [
        (r.name, show(r.value, r.unit), show(r.baseline, r.unit), f"{r.ratio:.4g}", f"≤ {r.target:g}",
         "PASS" if r.ok else "MISS")
        for r in rows
    ]
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    text = ["  ".join(cell.ljust(w) if i == 0 else cell.rjust(w) for i, (cell, w) in enumerate(zip(line, widths)))
            for line in lines]
    text.insert(1, "-" * len(text[0]))
    text += [f"  {r.name}: {r.note}" for r in rows if r.note]
    return "\n".join(text)


def _json_safe(values: dict[str, Any]) -> dict[str, Any]:
    """NaN (nothing measured) as null: strict JSON."""
    return {k: None if isinstance(v, float) and math.isnan(v) else v for k, v in values.items()}


def child_env(workdir: Path, pyc_cache: bool) -> tuple[tuple[str, str], ...]:
    """This environment for the fresh interpreters, with a private IPYTHONDIR and bytecode cache."""
    env = with_bytecode_cache(dict(os.environ, IPYTHONDIR=str(workdir / "ipython")), pyc_cache)
    return tuple(sorted(env.items()))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=DEFAULT_REPEAT, help=f"samples (pairs) per figure (default {DEFAULT_REPEAT})")
    parser.add_argument("--cells", type=int, default=2000, help="cells per empty-cell sample (default 2000)")
    parser.add_argument("--json", type=Path, metavar="FILE", help="also write the results as JSON")
    parser.add_argument("--only", action="append", default=[], metavar="TEXT",
                        help="run the figures whose function name contains TEXT (repeatable)")
    parser.add_argument("--no-pyc-cache", dest="pyc_cache", action="store_false",
                        help="fresh interpreters keep the environment's bytecode setting")
    args = parser.parse_args(argv)
    if args.repeat < 1 or args.cells < 1:
        parser.error("--repeat and --cells must be at least 1")
    figures = [f for f in FIGURES if not args.only or any(text in f.__name__ for text in args.only)]
    if not figures:
        parser.error(f"no figure matches {args.only}; figures: {', '.join(f.__name__ for f in FIGURES)}")

    workdir = Path(tempfile.mkdtemp(prefix="tfgpu_magic-bench-"))
    atexit.register(shutil.rmtree, workdir, True)  # registered first, so it runs after IPython's own atexit
    bench = Bench(args.repeat, args.cells, child_env(workdir, args.pyc_cache))
    os.environ["IPYTHONDIR"] = str(workdir / "ipython")  # the in-process shell too: no user config
    started = time.perf_counter()
    rows = [figure(bench) for figure in figures]
    elapsed = time.perf_counter() - started

    info = machine()
    print(f"tfgpu_magic benchmarks: medians of {args.repeat} back-to-back pairs (ratio: median of the "
          f"per-pair ratios), {elapsed:.0f} s")
    print("machine: " + ", ".join(f"{key} {value}" for key, value in info.items()))
    print(f"bytecode: {'cached (private PYTHONPYCACHEPREFIX)' if args.pyc_cache else 'as the environment says'}")
    print()
    print(table(rows))
    if args.json:
        results = [{**_json_safe(row._asdict()), "ok": row.ok} for row in rows]
        payload = {"machine": info, "repeat": args.repeat, "cells": args.cells, "seconds": elapsed,
                   "pyc_cache": args.pyc_cache, "results": results}
        args.json.write_text(json.dumps(payload, indent=2) + "\n")
    return 0 if all(row.ok for row in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
