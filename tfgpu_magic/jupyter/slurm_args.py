"""The Slurm options a `%tfgpu kernelspec NAME --slurm "ARGS"` kernel is submitted with (pure).

ARGS are split as a shell would (`shlex`), and only options that shape where and how long the kernel
runs pass: the provisioner itself decides what the job runs, where its output goes and its
environment, and a kernel is one process on one node. Each option is stored in one canonical form,
`--long=value`, so the kernelspec holds a list that `sbatch` takes as it is (no shell ever sees it).

The job's GPUs come from `--gres=gpu[:TYPE]:N`, `--gpus=[TYPE:]N` or `--gpus-per-node=[TYPE:]N`;
`with_gpu_count` replaces them with one `--gres=gpu[:TYPE]:N` where a notebook asks for N GPUs.
"""

from __future__ import annotations

import shlex
import unicodedata
from typing import Iterator, NamedTuple

from ..errors import PolicyError
from ..language.policy import quote, whole_number

VALUED = {
    "--partition": "-p", "--time": "-t", "--account": "-A", "--qos": "-q", "--gres": None, "--gpus": "-G",
    "--gpus-per-node": None, "--constraint": "-C", "--mem": None, "--mem-per-cpu": None, "--mem-per-gpu": None,
    "--cpus-per-task": "-c", "--cpus-per-gpu": None, "--nodelist": "-w", "--exclude": "-x",
    "--reservation": None, "--job-name": "-J", "--comment": None, "--begin": "-b", "--licenses": "-L",
}
"""Options with a value that pass through, and their short forms (sbatch(1))."""
FLAGS = ("--exclusive",)
SHORT = {short: long for long, short in VALUED.items() if short}
GPU_OPTIONS = ("--gres", "--gpus", "--gpus-per-node")
ONE_PROCESS = ("--nodes", "-N", "--ntasks", "-n", "--ntasks-per-node", "--array", "-a")
MAX_VALUE_CHARS = 256
MAX_ARGS = 32


class GpuRequest(NamedTuple):
    """What the options ask of GPUs: how many (None: they do not say) and of which type."""

    count: int | None
    kind: str | None = None


def parse_slurm_args(text: str) -> tuple[str, ...]:
    """`text` (options as `sbatch` takes them) as canonical `--long=value` words; `PolicyError`, in
    one line, for anything that does not pass (see the module docstring)."""
    try:
        words = shlex.split(text, comments=False)
    except ValueError as err:
        raise PolicyError(f"--slurm: cannot split {quote(text)} ({err})") from None
    if len(words) > MAX_ARGS:
        raise PolicyError(f"--slurm: {len(words)} words, at most {MAX_ARGS}")
    found: dict[str, str] = {}
    remaining = iter(words)
    for word in remaining:
        name, value = _option(word, remaining)
        if name in found:
            raise PolicyError(f"--slurm: {name} is given twice; give it once")
        found[name] = value
    canonical = tuple(name if name in FLAGS else f"{name}={value}" for name, value in found.items())
    gpu_request(canonical)  # a GPU option Slurm would take but we could not count is refused here
    return canonical


def _option(word: str, remaining: Iterator[str]) -> tuple[str, str]:
    """One option of ARGS: its long name and value (empty for a flag)."""
    if word in ONE_PROCESS or word.partition("=")[0] in ONE_PROCESS:
        raise PolicyError(f"--slurm: {word.partition('=')[0]} is not passed through: a kernel is one process on one node")
    if word.startswith("--"):
        name, has_value, value = word.partition("=")
        if name in FLAGS:
            if has_value:
                raise PolicyError(f"--slurm: {name} takes no value")
            return name, ""
        if name not in VALUED:
            raise PolicyError(f"--slurm: {name} is not passed through; the options that are: {allowed()}")
        if not has_value:
            value = _next_value(name, remaining)
    elif word.startswith("-") and len(word) >= 2 and word[:2] in SHORT:
        name = SHORT[word[:2]]
        value = word[2:] or _next_value(word[:2], remaining)
    else:
        what = "option" if word.startswith("-") else "word"
        raise PolicyError(f"--slurm: the {what} {quote(word)} is not passed through; the options that are: {allowed()}")
    _check_value(name, value)
    return name, value


def _next_value(name: str, remaining: Iterator[str]) -> str:
    value = next(remaining, "")
    if not value or value.startswith("-"):
        raise PolicyError(f"--slurm: {name} needs a value")
    return value


def _check_value(name: str, value: str) -> None:
    if not value:
        raise PolicyError(f"--slurm: {name} needs a value")
    if len(value) > MAX_VALUE_CHARS:
        raise PolicyError(f"--slurm: the value of {name} has {len(value)} characters, at most {MAX_VALUE_CHARS}")
    if any(unicodedata.category(char)[0] in "CZ" and char != " " for char in value):
        raise PolicyError(f"--slurm: the value of {name} holds control or separator characters: {quote(value)}")


def allowed() -> str:
    """The options that pass, for messages and the docs."""
    return ", ".join([*VALUED, *FLAGS])


def gpu_request(args: tuple[str, ...]) -> GpuRequest:
    """How many GPUs (and of which type) the canonical `args` ask for; `PolicyError` for a GPU
    option this module cannot count (then it could not replace it either)."""
    total, kinds = None, set()
    for arg in args:
        name, _, value = arg.partition("=")
        if name not in GPU_OPTIONS:
            continue
        entries = value.split(",") if name == "--gres" else [value]
        for entry in entries:
            parts = entry.split(":")
            if name == "--gres":
                if parts[0] != "gpu":
                    continue  # another resource (a licence-like gres): passes as it is
                parts = parts[1:] or ["1"]
            count = whole_number(parts[-1]) if parts[-1] else None
            if count is None or len(parts) > 2 or any(not part for part in parts):
                raise PolicyError(f"--slurm: cannot read a GPU count in {name}={value} (e.g. {name}="
                                  f"{'gpu:2' if name == '--gres' else '2'})")
            total = (total or 0) + count
            if len(parts) == 2:
                kinds.add(parts[0])
    if len(kinds) > 1:
        raise PolicyError(f"--slurm: GPUs of several types ({', '.join(sorted(kinds))}); ask for one type")
    return GpuRequest(total, next(iter(kinds), None))


def with_gpu_count(args: tuple[str, ...], count: int) -> tuple[str, ...]:
    """`args` asking for `count` GPUs: their GPU options replaced by `--gres=gpu[:TYPE]:count` (the
    type kept), other gres kept; no GPU option at all for 0."""
    kind = gpu_request(args).kind
    kept = []
    for arg in args:
        name, _, value = arg.partition("=")
        if name in ("--gpus", "--gpus-per-node"):
            continue
        if name == "--gres":
            others = [entry for entry in value.split(",") if entry.split(":")[0] != "gpu"]
            if others:
                kept.append(f"--gres={','.join(others)}")
            continue
        kept.append(arg)
    if count:
        gres = f"gpu:{kind}:{count}" if kind else f"gpu:{count}"
        others = [arg for arg in kept if arg.startswith("--gres=")]
        if others:  # one --gres holding every resource: sbatch takes the last one only
            kept.remove(others[0])
            gres = f"{others[0].partition('=')[2]},{gres}"
        kept.append(f"--gres={gres}")
    return tuple(kept)
