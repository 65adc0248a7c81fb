"""What a selftest rule is and what running it gives: the verdicts, the lanes the rules run in, a child's
`Probe`, what the parent knows (`Machine`), a rule made concrete (`Prepared`), a judge's `Outcome`, and
the `Rule` that ties a policy, a child script and a judge together (the rules themselves: `rules`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping, NamedTuple

from ..gpus.inventory import Inventory

PASS, FAIL, SKIP = "pass", "fail", "skip"
TENSORFLOW, NVML, FRAMEWORKS, GPU = "tensorflow", "nvml", "frameworks", "gpu"
"""Lanes: TensorFlow on the CPU, the NVML-only rules and JAX's and PyTorch's (which need no TensorFlow)
run side by side; GPU rules one at a time after them, so that no other probe's memory skews what
NVML shows."""

MIB = 1024 * 1024


class Probe(NamedTuple):
    """One child process's run: what it reported, its stderr lines, how long it took, and why it
    reported nothing (exit status, timeout) when it did not."""

    figures: dict[str, Any] | None
    stderr: tuple[str, ...] = ()
    seconds: float = 0.0
    error: str | None = None


@dataclass(frozen=True)
class Machine:
    """What the parent knows before the children run (and, for the GPU rules, after the baseline)."""

    environ: Mapping[str, str]
    inventory: Inventory
    tensorflow: str | None = None
    """Why this Python cannot import TensorFlow; None when it can."""
    baseline: Probe | None = None
    """The run without a policy, once it ran."""
    jax: str | None = None
    """Why this Python cannot import JAX; None when it can."""
    torch: str | None = None
    """Why this Python cannot import PyTorch; None when it can."""


class Prepared(NamedTuple):
    """A rule made concrete for this machine: its policy and the values its script reads."""

    policy: tuple[str, ...] = ()
    args: dict[str, Any] = {}


class Outcome(NamedTuple):
    verdict: str
    why: str
    expected: str
    measured: str


Judge = Callable[[Probe, Prepared, Machine], Outcome]


@dataclass(frozen=True)
class Rule:
    name: str
    claim: str
    lane: str
    probe: str
    prepare: Callable[[Machine], Prepared | str]
    """The concrete policy, or why the rule cannot run here (a skip)."""
    judge: Judge


def verdict(ok: bool, expected: str, measured: str, why_fail: str = "", why_pass: str = "") -> Outcome:
    return Outcome(PASS if ok else FAIL, why_pass if ok else why_fail, expected, measured)
