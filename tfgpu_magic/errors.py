"""The one error type for user mistakes; the magic turns it into a `UsageError`."""

from __future__ import annotations

import sys


class PolicyError(ValueError):
    """A directive or policy the user asked for is malformed or contradictory.

    The message is one line that says what is wrong and what is accepted.
    Raising it guarantees that nothing (policy, environment, TensorFlow) was changed.
    """


def warn(message: str) -> None:
    """One line on stderr, prefixed `tfgpu_magic:`; for problems that must not stop a kernel."""
    print(f"tfgpu_magic: {message}", file=sys.stderr)
