"""The selftest's verdicts as rows, to JSON and back from JSON (`%tfgpu selftest` reads them, one
framed line per row, from the process that ran them); `views.selftest` words them."""

from __future__ import annotations

import json
from typing import Any, NamedTuple

from .rules import FAIL


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
    """Whether a rule failed (the command's exit status says so)."""
    return any(row.verdict == FAIL for row in rows)


def to_json(rows: list[Row]) -> str:
    """A JSON list, one object per rule: rule, claim, policy, verdict (pass/fail/skip), why,
    expected, measured, seconds, figures."""
    return json.dumps([row._asdict() for row in rows], indent=2, ensure_ascii=False)


def row_from(item: dict[str, Any]) -> Row:
    """One object of `to_json` (or of a framed line, `frames`) as a row again."""
    return Row(**{**item, "policy": tuple(item["policy"])})


def from_json(text: str) -> list[Row]:
    """`to_json`'s rows back."""
    return [row_from(item) for item in json.loads(text)]

