"""Malformed or contradictory `%tfgpu` lines, shared by the grammar tests and the magic tests.

Each case: valid `setup` lines that run first (a contradiction needs a policy to contradict), the
bad `line`, and a substring its one-line error message must contain. `bugs` maps a layer
("grammar": `parse_line` + `change`, "magic": `%tfgpu` on a real shell) to the reason of a known
bug there; `params(layer)` turns those into strict xfails.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from tfgpu_magic.language.directives import REGISTRY, Directive

NOT_A_SIZE = "not a size"
NO_INVENTORY = "the card's total memory"
HIGH = "above 1024 GiB"


@dataclass(frozen=True)
class Bad:
    line: str
    expect: str
    setup: tuple[str, ...] = ()
    bugs: dict[str, str] = field(default_factory=dict)

    @property
    def id(self) -> str:
        text = " | ".join(self.setup + (self.line,))
        return text if len(text) <= 48 else text[:45] + "..."


def usage(directive: Directive) -> str:
    """The `usage:` part of an argument-count error for `directive`."""
    return f"{directive.name} {directive.synopsis}" if directive.synopsis else directive.name


BAD: list[Bad] = [
    # unknown words
    Bad("foo", "unknown directive 'foo'"),
    Bad("grow on", "unknown directive 'grow'"),
    Bad("growth yes", "got 'yes'"),
    Bad("allocator cuda", "got 'cuda'"),
    Bad("visible some", "not a GPU: 'some'"),
    Bad("split gpu0 2x1GB", "not a GPU: 'gpu0'"),
    Bad("limit 1GB all", "not a GPU: 'all'"),
    Bad("export xml", "'xml'"),
    Bad("export pythons", "'pythons'"),
    # missing and extra arguments
    Bad("split 0", "missing the parts"),
    Bad("split cpu", "split cpu: missing COUNT, e.g. `split cpu 2`"),
    Bad("growth on off", "unexpected 'off'"),
    Bad("limit 1GB 0 1", "unexpected '1'"),
    Bad("visible 0 1", "unexpected '1'"),
    Bad("split 0 2x1GB 1", "unexpected '1'"),
    Bad("split off 0 1", "unexpected '1'"),
    Bad("export json env", "unexpected 'env'"),
    Bad('limit "1GB', "No closing quotation"),
    # zero and negative
    Bad("limit 0", "below 1 MiB"),
    Bad("limit 0GB", "below 1 MiB"),
    Bad("limit 0.4", "below 1 MiB"),
    Bad("split 0 1GB,0", "below 1 MiB"),
    Bad("split 0 0x1GB", "got 0"),
    Bad("limit -1", "size '-1' is negative; sizes must be positive"),
    Bad("limit -1GB", "size '-1GB' is negative; sizes must be positive"),
    Bad("split cpu -2", "whole number, got '-2'"),
    # not finite, not a number
    Bad("limit inf", NOT_A_SIZE),
    Bad("limit nan", NOT_A_SIZE),
    Bad("limit infGB", NOT_A_SIZE),
    Bad("limit 1e309", NOT_A_SIZE),
    Bad("limit 4096KB", NOT_A_SIZE),
    # huge
    Bad("limit 2TB", "not a size: '2TB'"),
    Bad("limit 2048GB", HIGH),
    Bad("limit 99999999999999", HIGH),
    Bad("split 0 2x1025GB", HIGH),
    # percentages: no GPU inventory here, and out of range
    Bad("limit 50%", NO_INVENTORY),
    Bad("limit 50% 0", NO_INVENTORY),
    Bad("split 0 2x25%", NO_INVENTORY),
    Bad("limit 0%", "percentage must be above 0"),
    Bad("limit 150%", "at most 100"),
    # device counts
    Bad("split cpu 0", "1 to 64, got 0"),
    Bad("split cpu 999", "1 to 64, got 999"),
    Bad("split cpu 1.5", "whole number, got '1.5'"),
    Bad("split 0 65x1GB", "1 to 64, got 65"),
    Bad("split 0 " + ",".join(["1GB"] * 65), "at most 64 parts"),
    Bad("split cpu ²", "whole number, got '²'"),
    # GPU lists
    Bad("visible -1", "visible none"),
    Bad("limit 1GB -1", "visible none"),
    Bad("visible 0,,1", "empty entry"),
    Bad("visible ,0", "empty entry"),
    Bad("visible 3-1", "runs backwards"),
    Bad("visible 0,0", "listed twice"),
    Bad("visible 0-2,1", "listed twice"),
    Bad("visible GPU-8932f937,gpu-8932f937", "listed twice"),
    Bad("limit 1GB 1,1", "listed twice"),
    Bad("visible 256", "out of range"),
    Bad("visible 0-300", "out of range"),
    Bad("visible 1.5", "not a GPU: '1.5'"),
    Bad("visible ²", "not a GPU: '²'"),
    Bad("split off 9x", "not a GPU: '9x'"),
    Bad("visible auto", "`visible auto` needs the GPU inventory"),
    Bad("visible auto:0", "1 to 64, got 0"),
    # removing what is not there
    Bad("limit off 0", "has no limit of its own"),
    Bad("limit off 0", "a limit on all GPUs stays", setup=("limit 1GB",)),
    Bad("split off 0", "is not split"),
    # contradictions with the policy so far
    Bad("split 0 2x1GB", "both a limit and a split", setup=("limit 1GB 0",)),
    Bad("limit 1GB 0", "both a limit and a split", setup=("split 0 2x1GB",)),
    Bad("limit 1GB 0-1", "both a limit and a split", setup=("split 0 2x1GB",)),
    Bad("limit 1GB 1", "not visible", setup=("visible 0",)),
    Bad("split 1 2x1GB", "not visible", setup=("visible 0,2",)),
    Bad("visible 0", "not visible", setup=("limit 1GB 1",)),
    Bad("limit 1GB 0", "`visible none` hides every GPU", setup=("visible none",)),
    Bad("visible none", "`visible none` hides every GPU", setup=("split 0 2x1GB",)),
    # every directive of the registry: a missing argument, one too many, a word outside its closed set
    *(Bad(d.name, f"{d.name}: missing argument; usage: `{usage(d)}`") for d in REGISTRY if d.arity[0]),
    *(Bad(f"{d.name}{' x' * d.arity[1]} now", f"{d.name}: unexpected 'now'; usage: `{usage(d)}`") for d in REGISTRY),
    *(Bad(f"{d.name} xyzzy", f"{d.name}: expected {d.synopsis}, got 'xyzzy'") for d in REGISTRY if d.choices),
]


def params(layer: str) -> list:
    """`BAD` as pytest params for `layer`, known bugs of that layer marked as strict xfails."""
    return [
        pytest.param(
            case,
            id=case.id,
            marks=[pytest.mark.xfail(strict=True, reason=case.bugs[layer])] if layer in case.bugs else [],
        )
        for case in BAD
    ]


# ----- hostile lines: each must be one short UsageError that changes nothing -------
HUGE = "1" * 5000
"""More digits than Python's `int()` accepts from text (4,300): its ValueError must never escape."""

HUGE_NUMBERS = [
    f"visible {HUGE}", f"visible 0,{HUGE}", f"visible 0-{HUGE}", f"visible {HUGE}-{HUGE}", f"visible auto:{HUGE}",
    f"limit {HUGE}", f"limit {HUGE}GB", f"limit {HUGE}.5", f"limit 1GB {HUGE}", f"limit off {HUGE}",
    f"split {HUGE} 2x1GB", f"split 0 {HUGE}x1GB", f"split 0 1GB,{HUGE}", f"split cpu {HUGE}", f"split off {HUGE}",
    f"split cpu -{HUGE}", f"limit -{HUGE}", f"visible -{HUGE}",
]
NON_ASCII = [
    "limit ٣GB", "limit ４GB", "limit 𝟒GB", "limit ４", "limit 1.٥GB", "split 0 1GB,١GB", "split 0 2x１GB",
    "split 0 ٣x1GB", "split cpu ٣", "visible ٣", "limit 1GB ٣", "limit 1\u2009GB", "limit 4ＧB",
    "visible GPU-\u212a", "visible gpu-\u017f1", "visible auto:٣",
]
"""Unicode digits, a thin space, a full-width unit, and the Kelvin sign / long s that a case-insensitive
Unicode regex takes for `k` / `s`."""
HASH_IN_WORD = ["visible 0#1", "limit 1GB 0#1", "limit 1GB#0", "split 0 2x1GB#x", "growth on#", "kernelspec a#b"]
HUGE_LISTS = [
    "visible " + ",".join(f"GPU-{n:08x}" for n in range(300)),
    "visible 0-255,GPU-1",
    "limit 1GB " + ",".join(f"GPU-{n:08x}" for n in range(257)),
    "visible GPU-" + "a" * 200,
    "visible " + "GPU-0," * 200_000,
    "visible " + "x" * 1_000_000,
    "visible " + ",".join(["GPU-8932f937"] * 2000),
]
VARIABLES = ["visible $gpu", "visible {gpu}", "limit $size 0", "visible " + "$gpu" * 5000, "$gpu" * 100_000]
"""`$name` and `{expr}` reach the grammar as typed (with `gpu = "0"` in the user's namespace)."""

HOSTILE = HUGE_NUMBERS + NON_ASCII + HASH_IN_WORD + HUGE_LISTS + VARIABLES
