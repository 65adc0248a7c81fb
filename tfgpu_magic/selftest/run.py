"""Run the selftest: each rule in a fresh process of this Python, in this environment; TensorFlow
and NVML-only rules side by side, then the GPU rules one at a time (each holds a card, and the
memory NVML shows must be its own); then each rule's judge gives its verdict.

Children get a temporary IPYTHONDIR (the IPython probe writes its history there, never into the
user's profile), and the TensorFlow rules on the CPU get `TF_FORCE_GPU_ALLOW_GROWTH=true` unless the
environment sets it: on a GPU machine they then take only what their op needs instead of each
grabbing the cards side by side. Nothing here imports TensorFlow.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Collection, Mapping

from ..gpus.inventory import read_inventory
from ..tf.envvars import TF_FORCE_GPU_ALLOW_GROWTH
from . import probes
from .report import Row, from_json
from .rules import BASELINE, FAIL, GPU, NVML, RULES, SKIP, TENSORFLOW, Machine, Prepared, Probe, Rule

ROOT = str(Path(__file__).resolve().parents[2])
"""The folder holding this tfgpu_magic: children import the same one."""
TIMEOUT = 300.0
"""Seconds one child may take (an OOM on a GPU dumps the allocator's state first)."""
LAUNCH = f"import sys; sys.path.append({ROOT!r}); from tfgpu_magic.__main__ import main; sys.exit(main())"
"""`python -c LAUNCH selftest --json`: the command line, wherever the process starts."""


def default_workers() -> int:
    """Processes side by side: one per core, at least two (a TensorFlow import also waits on disk),
    at most eight (each holds about 600 MB)."""
    return min(8, max(2, os.cpu_count() or 2))


def tensorflow_missing(python: str = sys.executable) -> str | None:
    """Why this Python cannot import TensorFlow (found without importing it); None when it can."""
    try:
        found = importlib.util.find_spec("tensorflow") is not None
    except (ImportError, ValueError) as err:
        return f"{python} cannot import TensorFlow: {err}"
    return None if found else f"TensorFlow is not installed for {python}"


def look(environ: Mapping[str, str]) -> Machine:
    """This machine before any child runs: NVML's inventory (through its one chokepoint) and
    whether TensorFlow can be imported."""
    return Machine(dict(environ), read_inventory(), tensorflow_missing())


def child_environ(environ: Mapping[str, str], ipython_dir: str, lane: str) -> dict[str, str]:
    env = {**environ, "IPYTHONDIR": ipython_dir}
    if lane == TENSORFLOW:
        env.setdefault(TF_FORCE_GPU_ALLOW_GROWTH, "true")
    return env


def probe(rule: Rule, prepared: Prepared, env: Mapping[str, str], timeout: float = TIMEOUT) -> Probe:
    """Run `rule`'s script with `prepared` in a fresh process; what it reported."""
    argument = json.dumps([ROOT, list(prepared.policy), prepared.args])
    start = time.monotonic()
    try:
        done = subprocess.run([sys.executable, "-c", probes.script(rule.probe), argument], env=dict(env),
                              capture_output=True, text=True, errors="replace", timeout=timeout)
    except subprocess.TimeoutExpired as err:
        stderr = err.stderr.decode(errors="replace") if isinstance(err.stderr, bytes) else err.stderr or ""
        return Probe(None, tuple(stderr.splitlines()), time.monotonic() - start,
                     f"it did not finish within {timeout:.0f} s")
    seconds = time.monotonic() - start
    stderr = tuple(done.stderr.splitlines())
    reports = [line for line in done.stdout.splitlines() if line.startswith(probes.MARKER)]
    if reports:  # measured; a crash at exit after it (CUDA teardown) changes nothing that was measured
        return Probe(json.loads(reports[-1][len(probes.MARKER):]), stderr, seconds)
    last = next((line.strip() for line in reversed(stderr) if line.strip()), "no output")
    return Probe(None, stderr, seconds, f"exit status {done.returncode}: {last[:300]}")


def run_all(jobs: list[tuple[Rule, Prepared]], environ: Mapping[str, str], ipython_dir: str, workers: int,
            timeout: float = TIMEOUT) -> dict[str, Probe]:
    """Each job's probe, `workers` at a time (threads, each waiting on its own process)."""
    if not jobs:
        return {}
    with ThreadPoolExecutor(max_workers=workers) as pool:
        futures = {rule.name: pool.submit(probe, rule, prepared, child_environ(environ, ipython_dir, rule.lane),
                                          timeout) for rule, prepared in jobs}
        return {name: future.result() for name, future in futures.items()}


def selected(only: Collection[str] | None) -> list[Rule]:
    """The rules `only` names, in report order, with the run without a policy whenever another
    TensorFlow rule needs it; every rule for None."""
    if only is None:
        return list(RULES)
    wanted = set(only) | ({BASELINE.name} if any(rule.lane != NVML for rule in RULES if rule.name in only) else set())
    return [rule for rule in RULES if rule.name in wanted]


def selftest(environ: Mapping[str, str] | None = None, only: Collection[str] | None = None,
             workers: int | None = None, timeout: float = TIMEOUT) -> list[Row]:
    """Run the rules (`only` those named, default all) and return one row per rule, in order."""
    machine = look(os.environ if environ is None else environ)
    rules = selected(only)
    prepared: dict[str, Prepared | str] = {}
    runs: dict[str, Probe] = {}
    with tempfile.TemporaryDirectory(prefix="tfgpu-selftest-") as ipython_dir:
        for lanes, count in (((TENSORFLOW, NVML), workers or default_workers()), ((GPU,), 1)):
            batch = [rule for rule in rules if rule.lane in lanes]
            prepared.update({rule.name: rule.prepare(machine) for rule in batch})
            jobs = [(rule, ready) for rule in batch if isinstance(ready := prepared[rule.name], Prepared)]
            runs.update(run_all(jobs, machine.environ, ipython_dir, count, timeout))
            machine = dataclasses.replace(machine, baseline=runs.get(BASELINE.name))
    return [verdict_row(rule, prepared[rule.name], runs.get(rule.name), machine) for rule in rules]


def verdict_row(rule: Rule, prepared: Prepared | str, run: Probe | None, machine: Machine) -> Row:
    """The row of `rule`: skipped with why (`prepared` is that reason, and nothing ran), failed when
    its process reported nothing, else judged. A failure quotes the first line tfgpu_magic wrote on
    the process's stderr."""
    if isinstance(prepared, str) or run is None:
        return Row(rule.name, rule.claim, (), SKIP, prepared if isinstance(prepared, str) else "it did not run",
                   "", "", 0.0)
    if run.figures is None:
        return Row(rule.name, rule.claim, prepared.policy, FAIL, f"the process reported nothing: {run.error}", "",
                   "", round(run.seconds, 1))
    outcome = rule.judge(run, prepared, machine)
    why = outcome.why
    said = next((line.strip() for line in run.stderr if "tfgpu_magic" in line), None)
    if outcome.verdict == FAIL and said:
        why = f"{why} (the process said: {said[:300]})"
    return Row(rule.name, rule.claim, prepared.policy, outcome.verdict, why, outcome.expected, outcome.measured,
               round(run.seconds, 1), run.figures)


def run_outside(environ: Mapping[str, str], timeout: float = 30 * 60) -> list[Row]:
    """The whole selftest in a child `python -m tfgpu_magic selftest --json`, for a kernel: its own
    TensorFlow state stays untouched, and so does its stdout."""
    done = subprocess.run([sys.executable, "-c", LAUNCH, "selftest", "--json"], env=dict(environ),
                          capture_output=True, text=True, errors="replace", timeout=timeout)
    if done.returncode not in (0, 1):
        raise RuntimeError(f"the selftest process failed (exit status {done.returncode}): {done.stderr[-2000:]}")
    return from_json(done.stdout)
