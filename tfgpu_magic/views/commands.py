"""From a `%tfgpu` line or `%%tfgpu` cell to its result: parse, check the options against the
registry, run the edit or the action, show what it returns (imported on the first `%tfgpu`).

An edit goes straight to the controller and its report straight to the status view's words."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from . import actions
from ..errors import PolicyError
from ..language import directives
from ..language.grammar import Action, Edit, parse_cell, parse_words, split_words, suggest
from ..language.policy import quote
from .results import show
from .status import RECORDED, edit_report

if TYPE_CHECKING:
    from ..controller import Controller


SAID_RECORDED = "_tfgpu_said_recorded"
"""Attribute on the shell: a weak reference to the cell whose output already said `RECORDED`."""

CONTROL_FORMATS = frozenset("\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069")
"""Bidirectional controls: like an ANSI escape, they make a name show other than it reads."""


def run_cell(controller: Controller, shell: Any, line: str, cell: str) -> None:
    """`%%tfgpu`: every line an edit, all or nothing."""
    if line.strip():
        raise PolicyError("%%tfgpu takes its directives in the cell body, not on the first line")
    say_edited(controller, shell, parse_cell(cell, controller.catalog))


def run_line(controller: Controller, shell: Any, line: str) -> None:
    """`%tfgpu ...`: one edit or one action."""
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
    text = once_per_cell(shell, edit_report(controller.edit(edits), shell, action))
    if text:
        print(text)


def once_per_cell(shell: Any, text: str) -> str:
    """`text` without the `RECORDED` line when an earlier directive of the same cell said it (a cell of
    three `%tfgpu` lines says it once). The running cell is IPython's `displayhook.exec_result`;
    outside a cell (`run_line_magic` from code) every message stays whole."""
    import weakref

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
            if not value or value.startswith("--"):
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

    bad = next((char for char in value if unicodedata.category(char) in ("Cc", "Zl", "Zp") or char in CONTROL_FORMATS),
               None)
    if bad is not None:
        raise PolicyError(f"{name}: control characters such as {bad!r} (ANSI escapes, line breaks, direction "
                          f"overrides) are not allowed: {quote(value)}")


def check_options(options: dict[str, Any], directive: Action | Edit) -> None:
    """Each option belongs to the one directive the registry declares it on (`--yes`: restart)."""
    for option in options:
        owners = [owner.name for owner in directives.OPTIONS[option][0]]
        if directive.name not in owners:
            raise PolicyError(f"{option} only goes with {' or '.join(f'`{owner}`' for owner in owners)}")
    if "--remove" in options and "--display-name" in options:
        raise PolicyError("--display-name names a kernelspec to install; it makes no sense with --remove")
