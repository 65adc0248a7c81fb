"""What only the views can give the controller: words.

Lower rooms find and decide; they say nothing themselves (docs/architecture.md, the layer table). So
where a view creates or takes the process-wide controller (the magic, the panel, `configure()`), it
hooks up, once, the words for what applying at `import tensorflow` left undone (stderr) and for the
notes after an out-of-memory error, starts publishing a server's kernel's state (data), and voids
what is kept for the kernel's next start once the policy differs from it (`jupyter.kept`). Each
view module that words them is imported only when there is something to say: a kernel that a
restart left a pending policy does this before its first cell, while the user waits.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..tf import oom
from ..tf.runtime import current_shell

if TYPE_CHECKING:
    from ..controller import Controller
    from ..tf.apply import ApplyReport
    from ..tf.oom import Outcome


def shared_controller() -> Controller:
    """The process-wide controller (`controller.get_controller`), with the views' words hooked up."""
    from ..controller import get_controller

    return hook_up(get_controller())


def hook_up(controller: Controller) -> Controller:
    """`controller`, with the views' words hooked up (idempotent, and cheap when done already)."""
    if controller.on_import_failure is _warn_import_failure:
        return controller
    from ..jupyter.kept import void_on_change
    from ..jupyter.kernelstate import start_publishing

    controller.on_import_failure = _warn_import_failure
    oom.settings.words = _oom_text
    start_publishing(current_shell(), controller)  # in a server's kernel only
    void = void_on_change(current_shell())  # in a kernel only
    if void is not None:
        controller.subscribe(void)
    return controller


def _warn_import_failure(report: ApplyReport) -> None:
    from .status import warn_import_failure

    warn_import_failure(report)


def _oom_text(outcome: Outcome) -> str:
    from .oom import outcome_text

    return outcome_text(outcome)
