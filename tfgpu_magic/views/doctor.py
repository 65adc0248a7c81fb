"""`%tfgpu doctor` in words: each check as a line (and its fix), a closing sentence, or the checks as
JSON for scripts. The checks themselves come from `tfgpu_magic.doctor`."""

from __future__ import annotations

import json

from ..doctor import FAIL, Check

SELFTEST_HINT = ("`%tfgpu selftest` (in a terminal: `python -m tfgpu_magic selftest`) proves, in fresh "
                 "processes, that each setting of the policy takes effect here.")


def check_text(check: Check) -> str:
    """`[FAIL] name: detail`, and the fix on a line of its own below."""
    line = f"[{check.verdict:>4}] {check.name}: {check.detail}"
    return line + (f"\n       fix: {check.fix}" if check.fix else "")


def summary(checks: list[Check]) -> str:
    """One closing sentence: why TensorFlow has no GPU here, or that all is well."""
    failed = [c for c in checks if c.verdict == FAIL]
    if not failed:
        return "Nothing stops TensorFlow from using the GPUs above."
    reasons = "; ".join(f"{c.name}: {c.detail}" for c in failed)
    return f"TensorFlow has no GPU here because: {reasons}. Fix the first one first."


def report_text(checks: list[Check]) -> str:
    """The checks, one block each, then the closing sentence and where to prove the policy: the
    doctor's plain-text form."""
    return "\n".join([check_text(c) for c in checks] + ["", f"{summary(checks)} {SELFTEST_HINT}"])


def report_json(checks: list[Check]) -> str:
    """The checks as data: a JSON list of {check, verdict, detail, fix} (`%tfgpu doctor --json`)."""
    return json.dumps([{"check": c.name, "verdict": c.verdict, "detail": c.detail, "fix": c.fix} for c in checks],
                      indent=2, ensure_ascii=False)
