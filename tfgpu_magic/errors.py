"""The one error type for user mistakes; the magic turns it into a `UsageError`."""

from __future__ import annotations

import sys


class PolicyError(ValueError):
    """A directive or policy the user asked for is malformed or contradictory.

    The message is one line that says what is wrong and what is accepted.
    Raising it guarantees that nothing (policy, environment, TensorFlow) was changed.
    """


def error_text(err: BaseException) -> str:
    """An exception's text; TensorFlow's errors carry theirs in `.message`."""
    return str(getattr(err, "message", None) or err)


def short_error(err: BaseException) -> str:
    """The first line of an error, at most 200 characters; its type where it says nothing."""
    return str(err).splitlines()[0][:200] if str(err) else type(err).__name__


def warn(message: str) -> None:
    """One line on stderr, prefixed `tfgpu_magic:`; for problems that must not stop a kernel."""
    print(f"tfgpu_magic: {message}", file=sys.stderr)
