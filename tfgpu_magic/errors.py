"""The one error type for user mistakes; the magic turns it into a `UsageError`."""

from __future__ import annotations


class PolicyError(ValueError):
    """A directive or policy the user asked for is malformed or contradictory.

    The message is one line that says what is wrong and what is accepted.
    Raising it guarantees that nothing (policy, environment, TensorFlow) was changed.
    """
