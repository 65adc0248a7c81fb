"""Run the selftest: each rule in a fresh process of this Python, in this environment, under one
overall deadline, each row handed on (`on_row`) as soon as it is decided.

The order: the run without a policy (`baseline`) first, side by side with the NVML-only rules and
JAX's and PyTorch's (each found here without importing it); the other TensorFlow rules once it is
done, and only if it gave a result (else each is skipped with its reason, without waiting on a
TensorFlow that hangs or fails); then the GPU rules one at a time (each holds a card, and the memory
NVML shows must be its own). `children` runs the processes: their own process groups, stopped on
timeout, interrupt, deadline and exit. `frames` reads their results.

Children get a temporary IPYTHONDIR (the IPython probe writes its history there, never into the
user's profile), and the TensorFlow rules on the CPU get `TF_FORCE_GPU_ALLOW_GROWTH=true` unless the
environment sets it: on a GPU machine they then take only what their op needs instead of each
grabbing the cards side by side. Nothing here imports TensorFlow, JAX or PyTorch.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import queue
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Callable, Collection, Mapping

from ..gpus.inventory import read_inventory
from ..envvars import TF_FORCE_GPU_ALLOW_GROWTH
from . import probes
from .children import GRACE, STOPPED, TIMED_OUT, Children, Finished
from .frames import Reader, new_nonce
from .report import Row, row_from
from .rules import (BASELINE, FAIL, FRAMEWORKS, GPU, NAMES, NVML, RULES, SKIP, TENSORFLOW, Machine, Prepared, Probe,
                    Rule)

ROOT = str(Path(__file__).resolve().parents[2])
"""The folder holding this tfgpu_magic: children import the same one."""
PROBE_TIMEOUT = 120.0
"""Seconds one child may take (a TensorFlow import takes seconds; an OOM on a GPU first dumps the
allocator's state)."""
DEADLINE = 600.0
"""Seconds the whole run may take; rules not done by then are skipped."""
RUNNER_GRACE = 3 * GRACE
"""Seconds the selftest's own process gets to stop its children when `run_outside` stops it."""
LAUNCH = f"import sys; sys.path.append({ROOT!r}); from tfgpu_magic.__main__ import main; sys.exit(main())"
"""`python -c LAUNCH selftest ...`: the command line, wherever the process starts."""

OnRow = Callable[[Row], None]


def default_workers() -> int:
    """Processes side by side: one per core, at least two (a TensorFlow import also waits on disk),
    at most eight (each holds about 600 MB)."""
    return min(8, max(2, os.cpu_count() or 2))


def missing(package: str, name: str, python: str = sys.executable) -> str | None:
    """Why this Python cannot import `package` (found without importing it; `name` as people write
    it); None when it can."""
    try:
        found = importlib.util.find_spec(package) is not None
    except (ImportError, ValueError) as err:
        return f"{python} cannot import {name}: {err}"
    return None if found else f"{name} is not installed for {python}"


def look(environ: Mapping[str, str]) -> Machine:
    """This machine before any child runs: NVML's inventory (through its one chokepoint) and
    whether TensorFlow, JAX and PyTorch can be imported."""
    return Machine(dict(environ), read_inventory(), missing("tensorflow", "TensorFlow"), jax=missing("jax", "JAX"),
                   torch=missing("torch", "PyTorch"))


def child_environ(environ: Mapping[str, str], ipython_dir: str, lane: str) -> dict[str, str]:
    env = {**environ, "IPYTHONDIR": ipython_dir}
    if lane == TENSORFLOW:
        env.setdefault(TF_FORCE_GPU_ALLOW_GROWTH, "true")
    return env


def probe(children: Children, rule: Rule, prepared: Prepared, env: Mapping[str, str],
          timeout: float = PROBE_TIMEOUT) -> Probe:
    """Run `rule`'s script with `prepared` in a fresh process; what it reported in its framed line."""
    nonce = new_nonce()
    argument = json.dumps([ROOT, list(prepared.policy), prepared.args, nonce])
    done = children.run([sys.executable, "-c", probes.script(rule.probe), argument], env, timeout, Reader(nonce))
    if done.reader.frames:  # measured; a crash at exit after it (CUDA teardown) changes nothing that was measured
        return Probe(done.reader.frames[-1], done.stderr, done.seconds)
    return Probe(None, done.stderr, done.seconds, why_no_result(done, timeout))


def why_no_result(done: Finished, timeout: float) -> str:
    """Why a child wrote no result: timed out, stopped, or its exit status and last stderr line."""
    if done.cut == TIMED_OUT:
        why = f"it did not finish within {timeout:.0f} s"
    elif done.cut == STOPPED:
        why = "it was stopped before it finished"
    else:
        last = next((line.strip() for line in reversed(done.stderr) if line.strip()), "nothing on stderr")
        why = f"exit status {done.returncode}: {last[:300]}"
    return why + "".join(f"; it wrote {rejected}" for rejected in done.reader.rejected[:1])


def selected(only: Collection[str] | None) -> list[Rule]:
    """The rules `only` names, in report order, with the run without a policy whenever another
    TensorFlow rule needs it; every rule for None."""
    if only is None:
        return list(RULES)
    needs_baseline = any(rule.lane in (TENSORFLOW, GPU) for rule in RULES if rule.name in only)
    wanted = set(only) | ({BASELINE.name} if needs_baseline else set())
    return [rule for rule in RULES if rule.name in wanted]


def selftest(environ: Mapping[str, str] | None = None, only: Collection[str] | None = None,
             workers: int | None = None, timeout: float = PROBE_TIMEOUT, deadline: float = DEADLINE,
             on_row: OnRow | None = None) -> list[Row]:
    """Run the rules (`only` those named, default all), each process within `timeout` seconds and all
    within `deadline`; one row per rule, in report order, each also given to `on_row` once decided."""
    machine = look(os.environ if environ is None else environ)
    rules = selected(only)
    with tempfile.TemporaryDirectory(prefix="tfgpu-selftest-") as ipython_dir:
        run = _Run(machine, ipython_dir, workers or default_workers(), timeout, deadline, on_row)
        try:
            run.all(rules)
        finally:
            run.children.close()
    return [run.rows[rule.name] for rule in rules]


class _Run:
    """One selftest run: which rules wait, which run (a thread each, waiting on its process), and
    the rows decided so far."""

    def __init__(self, machine: Machine, ipython_dir: str, workers: int, timeout: float, deadline: float,
                 on_row: OnRow | None) -> None:
        self.machine, self.ipython_dir, self.workers, self.timeout = machine, ipython_dir, workers, timeout
        self.deadline, self.on_row = deadline, on_row
        self.end = time.monotonic() + deadline
        self.children = Children()
        self.rows: dict[str, Row] = {}
        self.waiting: list[tuple[Rule, Prepared]] = []
        self.running: dict[str, tuple[Rule, Prepared, float]] = {}
        self.results: queue.Queue[tuple[str, Probe | BaseException]] = queue.Queue()

    def all(self, rules: list[Rule]) -> None:
        """Run `rules`: the baseline with the NVML, JAX and PyTorch rules first; the other TensorFlow
        rules once the baseline is decided (`selected` puts it in whenever they are there); the GPU
        rules one at a time once everything else is done; until the deadline."""
        later = [rule for rule in rules if rule.lane == TENSORFLOW and rule is not BASELINE]
        last = [rule for rule in rules if rule.lane == GPU]
        self.prepare([rule for rule in rules if rule is BASELINE or rule.lane in (NVML, FRAMEWORKS)])
        while True:
            if later and BASELINE.name in self.rows:  # its figures, or why the others are skipped
                self.prepare(later)
                later = []
            if last and not (later or self.waiting or self.running):
                self.workers = 1
                self.prepare(last)
                last = []
            if not (self.waiting or self.running):
                return
            while self.waiting and len(self.running) < self.workers:
                self.start(*self.waiting.pop(0))
            try:
                name, result = self.results.get(timeout=max(0.0, self.end - time.monotonic()))
            except queue.Empty:
                self.past_deadline(later + last)
                return
            if isinstance(result, BaseException):
                raise result
            self.finished(name, result)

    def prepare(self, rules: list[Rule]) -> None:
        """Each rule made concrete for this machine, or skipped with why."""
        for rule in rules:
            prepared = rule.prepare(self.machine)
            if isinstance(prepared, Prepared):
                self.waiting.append((rule, prepared))
            else:
                self.decide(Row(rule.name, rule.claim, (), SKIP, prepared, "", "", 0.0))

    def start(self, rule: Rule, prepared: Prepared) -> None:
        env = child_environ(self.machine.environ, self.ipython_dir, rule.lane)

        def work() -> None:
            try:
                result: Probe | BaseException = probe(self.children, rule, prepared, env, self.timeout)
            except BaseException as err:  # a bug: the main thread raises it
                result = err
            self.results.put((rule.name, result))

        self.running[rule.name] = (rule, prepared, time.monotonic())
        threading.Thread(target=work, name=f"tfgpu-selftest-{rule.name}", daemon=True).start()

    def finished(self, name: str, result: Probe) -> None:
        rule, prepared, _ = self.running.pop(name)
        if rule is BASELINE:
            self.machine = dataclasses.replace(self.machine, baseline=result)
        self.decide(verdict_row(rule, prepared, result, self.machine))

    def past_deadline(self, unprepared: list[Rule]) -> None:
        """Stop what runs; every rule not decided is skipped, saying the deadline passed."""
        self.children.close()
        why = f"the overall deadline of {self.deadline:.0f} s passed"
        for rule, prepared, started in self.running.values():
            self.decide(Row(rule.name, rule.claim, prepared.policy, SKIP, f"{why} while it ran", "", "",
                            round(time.monotonic() - started, 1)))
        for rule, prepared in self.waiting:
            self.decide(Row(rule.name, rule.claim, prepared.policy, SKIP, f"{why} before it ran", "", "", 0.0))
        for rule in unprepared:
            self.decide(Row(rule.name, rule.claim, (), SKIP, f"{why} before it ran", "", "", 0.0))
        self.running.clear()
        self.waiting.clear()

    def decide(self, row: Row) -> None:
        self.rows[row.rule] = row
        if self.on_row is not None:
            self.on_row(row)


def verdict_row(rule: Rule, prepared: Prepared, run: Probe, machine: Machine) -> Row:
    """The row of `rule` after its process ran: failed when the process wrote no result, else
    judged. A verdict quotes the first line tfgpu_magic wrote on the process's stderr (a pass too:
    it may say that part of the policy could not be applied)."""
    seconds = round(run.seconds, 1)
    if run.figures is None:
        return Row(rule.name, rule.claim, prepared.policy, FAIL, f"the probe wrote no result: {run.error}", "", "",
                   seconds)
    try:
        outcome = rule.judge(run, prepared, machine)
    except (LookupError, TypeError, ValueError, AttributeError, ArithmeticError) as err:
        return Row(rule.name, rule.claim, prepared.policy, FAIL,
                   f"the probe's figures are not what this rule reads ({type(err).__name__}: {err})", "", "",
                   seconds, run.figures)
    why = outcome.why
    said = next((line.strip() for line in run.stderr if "tfgpu_magic" in line), None)
    if outcome.verdict != SKIP and said:
        why = f"{why} (the process said: {said[:300]})"
    return Row(rule.name, rule.claim, prepared.policy, outcome.verdict, why, outcome.expected, outcome.measured,
               seconds, run.figures)


def run_outside(environ: Mapping[str, str], on_row: OnRow | None = None, only: Collection[str] | None = None,
                timeout: float | None = None, deadline: float | None = None) -> list[Row]:
    """The whole selftest in a child `python -m tfgpu_magic selftest`, for a kernel: its own
    TensorFlow state stays untouched, and so does its stdout. Each row goes to `on_row` as it
    arrives; an interrupt stops the child, which stops its own children first."""
    timeout = PROBE_TIMEOUT if timeout is None else timeout
    deadline = DEADLINE if deadline is None else deadline
    nonce = new_nonce()
    rows: list[Row] = []

    def take(item: dict) -> None:
        rows.append(row_from(item))
        if on_row is not None:
            on_row(rows[-1])

    argv = [sys.executable, "-c", LAUNCH, "selftest", "--frames", nonce, "--timeout", str(timeout),
            "--deadline", str(deadline), *(["--only", ",".join(only)] if only else [])]
    children = Children(grace=RUNNER_GRACE)
    try:
        done = children.run(argv, environ, deadline + 2 * RUNNER_GRACE, Reader(nonce, take))
    finally:
        children.close()
    if done.cut is not None or done.returncode not in (0, 1):
        raise RuntimeError(f"the selftest process failed: {why_no_result(done, deadline + 2 * RUNNER_GRACE)}"
                           + "".join(f"\n{line}" for line in done.stderr[-20:]))
    return sorted(rows, key=lambda row: NAMES.index(row.rule))
