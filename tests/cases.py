"""Malformed or contradictory `%tfgpu` lines, shared by the grammar tests and the magic tests.

Each case: valid `setup` lines that run first (a contradiction needs a policy to contradict), the
bad `line`, and a substring its one-line error message must contain. `bugs` maps a layer
("grammar": `parse_line` + `change`, "magic": `%tfgpu` on a real shell) to the reason of a known
bug there; `params(layer)` turns those into strict xfails.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

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
    Bad("growth", "growth: missing argument"),
    Bad("limit", "limit: missing argument"),
    Bad("visible", "visible: missing argument"),
    Bad("split", "split: missing argument"),
    Bad("allocator", "allocator: missing argument"),
    Bad("split 0", "missing the parts"),
    Bad("split cpu", "split cpu: missing COUNT, e.g. `split cpu 2`"),
    Bad("growth on off", "unexpected 'off'"),
    Bad("limit 1GB 0 1", "unexpected '1'"),
    Bad("visible 0 1", "unexpected '1'"),
    Bad("split 0 2x1GB 1", "unexpected '1'"),
    Bad("split off 0 1", "unexpected '1'"),
    Bad("reset now", "unexpected 'now'"),
    Bad("status now", "unexpected 'now'"),
    Bad("apply now", "unexpected 'now'"),
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
