"""The policy kept for this kernel's next start (`restart.keep_for_next_kernel`, the server's `keep`):
what the status shows, and voided as soon as the desired policy differs from it, so that a restart
never brings back a policy the user has changed since (a `%tfgpu reset`, then a restart from the
front end).

Cheap where nothing is kept: the pending file's path is worked out once per kernel (kept on its shell: a
kernel's connection file is fixed for its life), and each policy change or status costs one `lstat`.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, NamedTuple

from . import persist
from ..errors import PolicyError, warn
from .startup import connection_file, kernel_key

if TYPE_CHECKING:
    from ..language.policy import Policy


class KeptFor(NamedTuple):
    """Where this kernel's kept policy would be: its key, connection file and pending file."""

    key: str
    connection: Path
    path: Path


_PLACE = "_tfgpu_kept_for"
"""The shell attribute holding its kernel's `KeptFor`, worked out at the first status or hookup."""


def kept_for(shell: Any) -> KeptFor | None:
    """This kernel's pending-file place (worked out once per shell); None outside a kernel or without a
    connection file."""
    place = getattr(shell, _PLACE, None)
    if place is not None:
        return place
    connection = connection_file(shell)
    if connection is None:
        return None
    key = kernel_key(connection)
    place = KeptFor(key, connection, persist.pending_path(key))
    setattr(shell, _PLACE, place)
    return place


def kept_policy(shell: Any) -> Policy | None:
    """The policy kept for this kernel's next start; None when nothing is kept (or it is unusable:
    its next start says so)."""
    place = kept_for(shell)
    if place is None or not os.path.lexists(place.path):
        return None
    try:
        return persist.read_pending(place.key, place.path.parent, place.connection)
    except (PolicyError, OSError):
        return None


def void_on_change(shell: Any) -> Callable[[Any], None] | None:
    """A controller listener (`Controller.subscribe`) that voids what is kept for this kernel once the
    desired policy differs from it; None outside a kernel."""
    place = kept_for(shell)
    if place is None:
        return None
    said: set[str] = set()  # why voiding failed, once each: an unusable file stays for every later edit

    def void(controller: Any) -> None:
        if not os.path.lexists(place.path):
            return
        try:
            persist.void_pending(place.key, controller.policy, place.path.parent, place.connection)
        except (PolicyError, OSError) as err:
            if str(err) not in said:
                said.add(str(err))
                warn(f"the policy kept for the next start could not be voided: {err}")

    return void
