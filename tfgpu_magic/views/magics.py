"""The `%tfgpu` / `%%tfgpu` magic: from a line or cell to its result (parse, check the options against
the registry, run the edit or the action, show what it returns), and its registration.

Kept light, since `%load_ext` imports it: the grammar, the actions and the words are imported inside
the functions that use them, on the first `%tfgpu`; the controller is created when first needed. An
edit goes straight to the controller and its report straight to the status view's words.
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
    from ..language.grammar import Action, Edit


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

    from ..tf import quietimport

    if "tensorflow" in sys.modules:
        magics.controller.apply()
    elif not quietimport.is_armed():
        quietimport.arm(lambda: magics.controller.on_tensorflow_import())


# ----- from a line or a cell to its result (imported nothing until the first `%tfgpu`) -------------
SAID_RECORDED = "_tfgpu_said_recorded"
"""Attribute on the shell: a weak reference to the cell whose output already said `RECORDED`."""

CONTROL_FORMATS = frozenset("\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069")
"""Bidirectional controls: like an ANSI escape, they make a name show other than it reads."""
COMMAND_LINE_OPTIONS = ("--slurm",)
"""Options whose value is itself a command line: it may start with `--` (`--slurm "--gres=gpu:1"`)."""


def run_cell(controller: Controller, shell: Any, line: str, cell: str) -> None:
    """`%%tfgpu`: every line an edit, all or nothing."""
    from ..language.grammar import parse_cell

    if line.strip():
        raise PolicyError("%%tfgpu takes its directives in the cell body, not on the first line")
    say_edited(controller, shell, parse_cell(cell, controller.catalog))


def run_line(controller: Controller, shell: Any, line: str) -> None:
    """`%tfgpu ...`: one edit or one action."""
    from . import actions
    from ..language import directives
    from ..language.grammar import Action, parse_words
    from .results import show

    words, options = split_options(line)
    directive = parse_words(words, controller.catalog)
    check_options(options, directive)
    if isinstance(directive, Action):
        keywords = {name.lstrip("-").replace("-", "_"): value for name, value in options.items()}
        show(actions.run(directive.name, controller, shell, directive.arg, **keywords))
    else:
        say_edited(controller, shell, [directive], directives.spec(directive.name).reports)


def say_edited(controller: Controller, shell: Any, edits: list[Edit], action: str = "edit") -> None:
    """Apply `edits` (all or nothing) and print what the edit did (`action` "edit" or "reset")."""
    from .status import edit_report

    text = once_per_cell(shell, edit_report(controller.edit(edits), shell, action))
    if text:
        print(text)


def once_per_cell(shell: Any, text: str) -> str:
    """`text` without the `RECORDED` line when an earlier directive of the same cell said it (a cell of
    three `%tfgpu` lines says it once). The running cell is IPython's `displayhook.exec_result`;
    outside a cell (`run_line_magic` from code) every message stays whole."""
    import weakref

    from .status import RECORDED

    lines = text.split("\n")
    cell = getattr(getattr(shell, "displayhook", None), "exec_result", None)
    if RECORDED not in lines or cell is None:
        return text
    said = getattr(shell, SAID_RECORDED, None)
    if said is not None and said() is cell:
        return "\n".join(line for line in lines if line != RECORDED)
    setattr(shell, SAID_RECORDED, weakref.ref(cell))
    return text


def split_options(line: str) -> tuple[list[str], dict[str, Any]]:
    """Words of the directive, and its `--options` (declared in `directives`, like `%tfgpu?`).

    Parsed here rather than by argparse so that `-1GB` reaches the grammar (and gets its message),
    quotes and `#` comments (a word that starts with `#`) behave as in a `%%tfgpu` cell, and every
    mistake is a `PolicyError`."""
    from ..language import directives
    from ..language.grammar import split_words, suggest
    from ..language.policy import quote

    words, options = [], {}
    remaining = iter(split_words(line))
    for word in remaining:
        if not word.startswith("--"):
            words.append(word)
            continue
        name, has_value, value = word.partition("=")
        if name not in directives.OPTIONS:
            known = f"; the options are {', '.join(directives.OPTIONS)} (see %tfgpu?)"
            raise PolicyError(f"unknown option {quote(name)}{suggest(name, tuple(directives.OPTIONS)) or known}")
        if name in options:
            raise PolicyError(f"{name} is given twice; give it once")
        if directives.OPTIONS[name][1].value is not None:
            value = value if has_value else next(remaining, "")
            if not value or (value.startswith("--") and name not in COMMAND_LINE_OPTIONS):
                raise PolicyError(f"{name} needs a value, e.g. {name} \"TensorFlow GPU 0\"")
            check_printable(name, value)
            options[name] = value
        elif has_value:
            raise PolicyError(f"{name} takes no value")
        else:
            options[name] = True
    return words, options


def check_printable(name: str, value: str) -> None:
    """`PolicyError` for an option value with control characters (an ANSI escape sequence, a newline,
    a bidirectional override): it would show in a launcher or a terminal other than it reads."""
    import unicodedata

    from ..language.policy import quote

    bad = next((char for char in value if unicodedata.category(char) in ("Cc", "Zl", "Zp") or char in CONTROL_FORMATS),
               None)
    if bad is not None:
        raise PolicyError(f"{name}: control characters such as {bad!r} (ANSI escapes, line breaks, direction "
                          f"overrides) are not allowed: {quote(value)}")


def check_options(options: dict[str, Any], directive: Action | Edit) -> None:
    """Each option belongs to the one directive the registry declares it on (`--yes`: restart)."""
    from ..language import directives

    for option in options:
        owners = [owner.name for owner in directives.OPTIONS[option][0]]
        if directive.name not in owners:
            raise PolicyError(f"{option} only goes with {' or '.join(f'`{owner}`' for owner in owners)}")
    for install_only in ("--display-name", "--slurm"):
        if "--remove" in options and install_only in options:
            raise PolicyError(f"{install_only} shapes a kernelspec to install; it makes no sense with --remove")
