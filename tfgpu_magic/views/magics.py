"""The `%tfgpu` / `%%tfgpu` magic: IPython glue over the controller.

Kept light, since `%load_ext` imports it: what each directive does lives in `commands`, imported on
the first `%tfgpu`; the controller is created when first needed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable

from IPython.core.error import UsageError
from IPython.core.magic import Magics, line_cell_magic, magics_class, no_var_expand
from traitlets import Bool, List, Unicode, observe

from ..errors import PolicyError

COMPLETER_ID = "tfgpu_magic"
"""The matcher's name in `shell.Completer.custom_matchers` (and the `origin` of its completions)."""
SUMMARY = "Control TensorFlow's GPUs from a notebook, before and after `import tensorflow`."


def full_help() -> str:
    """The `%tfgpu?` text, built from the registry of directives when asked (so it cannot drift from
    what parses, and `%load_ext` does not build it)."""
    from ..language.directives import help_text

    return help_text(SUMMARY)


if TYPE_CHECKING:
    from ..controller import Controller


@magics_class
class TFGPUMagics(Magics):
    """Magics that record and apply the TensorFlow GPU policy."""

    default_policy = List(
        Unicode(),
        help="Directives applied when the extension loads, e.g. ['growth on', 'visible 0'].",
    ).tag(config=True)

    release_oom_frames = Bool(
        True,
        help="After a cell raised TensorFlow's ResourceExhaustedError, clear the failed cell's frames so the "
        "tensors only they held are freed (`%debug` on that error then sees cleared frames).",
    ).tag(config=True)

    @observe("release_oom_frames")
    def _release_oom_frames_changed(self, change: dict) -> None:
        from ..tf import oom

        oom.settings.release = change["new"]

    def __init__(self, shell: Any, controller: Controller | None = None) -> None:
        super().__init__(shell=shell)
        self._controller = controller

    @property
    def controller(self) -> Controller:
        """The process-wide controller (or the one given), created on first use."""
        if self._controller is None:
            from .hookup import shared_controller

            self._controller = shared_controller()
        return self._controller

    @property
    def profile_dir(self) -> str:
        return self.shell.profile_dir.location

    @line_cell_magic
    @no_var_expand  # no directive needs `$var`, and expanding a long line costs quadratic time
    def tfgpu(self, line: str, cell: str | None = None) -> None:
        from .commands import run_cell, run_line

        try:
            if cell is not None:
                run_cell(self.controller, self.shell, line, cell)
            else:
                run_line(self.controller, self.shell, line)
        except PolicyError as err:
            raise UsageError(str(err)) from None

    tfgpu.__doc__ = SUMMARY + "\n\n`%tfgpu?` lists every directive."
    tfgpu.getdoc = lambda: full_help()  # type: ignore[attr-defined]  # what IPython's `?` asks first


def load(shell: Any) -> TFGPUMagics:
    """Register the magics on `shell` and apply the policy this kernel starts with."""
    from ..jupyter.startup import say, startup_policy

    magics = TFGPUMagics(shell)  # a configured `release_oom_frames = False` reaches `oom` through the observer
    shell.register_magics(magics)
    register_completer(shell, lambda: magics.controller)
    policy, warnings = startup_policy(lambda *edit: magics.controller.edit_policy(*edit), magics.default_policy, magics.profile_dir, shell)
    for warning in warnings:
        say(shell, f"tfgpu_magic: {warning}", warning=True)
    if policy is not None:
        report = magics.controller.set_policy(policy)
        if not report.ok:
            from .status import describe_report, restart_hint

            say(shell, describe_report(report, restart_hint(shell)))
    else:
        watch_tensorflow_import(magics)
    return magics


def register_completer(shell: Any, controller: Callable[[], Any]) -> None:
    """Add the `%tfgpu` matcher to `shell`'s completer, replacing one from an earlier `%load_ext`.
    What it offers is worked out in `completion`, imported at the first Tab."""
    completer = getattr(shell, "Completer", None)
    if completer is None or not hasattr(completer, "custom_matchers"):
        return
    try:
        from IPython.core.completer import completion_matcher
    except ImportError:  # IPython before 8.6: no matcher API v2, no completion
        return

    @completion_matcher(identifier=COMPLETER_ID, api_version=2, priority=100)
    def tfgpu_matcher(context: Any) -> dict[str, Any]:
        from .completion import complete

        return complete(context, controller)

    completer.custom_matchers[:] = [
        m for m in completer.custom_matchers if getattr(m, "matcher_identifier", None) != COMPLETER_ID
    ]
    completer.custom_matchers.append(tfgpu_matcher)


def watch_tensorflow_import(magics: TFGPUMagics) -> None:
    """Without a policy nothing armed the import hook: arm it, so that `import tensorflow` starts the
    cell hooks (`tf.cellhooks`: the initializing cell, OOM explanations). If TensorFlow is imported
    already, start them now."""
    import sys

    from ..tf import importhook

    if "tensorflow" in sys.modules:
        magics.controller.apply()
    elif not importhook.is_armed():
        importhook.arm(lambda: magics.controller.apply())
