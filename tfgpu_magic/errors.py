"""The one error type the user sees as one line; the magic turns it into a `UsageError`."""

from __future__ import annotations

import sys


class PolicyError(ValueError):
    """What the user is told in one line, never a traceback: a directive or policy that is malformed
    or contradictory (nothing changed: validation comes before any effect), or a file or setting the
    user's request depends on that cannot be read or written (`safefile`: unreadable, too large, not
    UTF-8, bad JSON; an action's `OSError`). The message says what is wrong and what is accepted or
    where; callers that must not stop (a kernel's start-up) show it as a warning instead.
    """


def error_text(err: BaseException) -> str:
    """An exception's text; TensorFlow's errors carry theirs in `.message`."""
    return str(getattr(err, "message", None) or err)


def short_error(err: BaseException, limit: int | None = 200) -> str:
    """The first line of an error's text (`error_text`), at most `limit` characters (None: whole);
    its type where it says nothing. TensorFlow's C++ errors carry many lines of context."""
    text = error_text(err).strip()
    line = text.splitlines()[0] if text else type(err).__name__
    return line[:limit] if limit is not None else line


def warn(message: str) -> None:
    """One line on stderr, prefixed `tfgpu_magic:`; for problems that must not stop a kernel."""
    print(f"tfgpu_magic: {message}", file=sys.stderr)
