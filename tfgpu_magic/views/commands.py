"""From a `%tfgpu` line or `%%tfgpu` cell to its result: parse, check the options against the
registry, run the edit or the action, show what it returns (imported on the first `%tfgpu`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .. import actions
from ..errors import PolicyError
from ..language import directives
from ..language.grammar import Action, Edit, parse_cell, parse_words, split_words, suggest
from ..language.policy import quote
from .results import show

if TYPE_CHECKING:
    from ..controller import Controller


def run_cell(controller: Controller, shell: Any, line: str, cell: str) -> None:
    """`%%tfgpu`: every line an edit, all or nothing."""
    if line.strip():
        raise PolicyError("%%tfgpu takes its directives in the cell body, not on the first line")
    show(actions.edit_report(controller.edit(parse_cell(cell, controller.catalog)), shell))


def run_line(controller: Controller, shell: Any, line: str) -> None:
    """`%tfgpu ...`: one edit or one action."""
    words, options = split_options(line)
    directive = parse_words(words, controller.catalog)
    check_options(options, directive)
    if isinstance(directive, Action):
        keywords = {name.lstrip("-").replace("-", "_"): value for name, value in options.items()}
        show(actions.run(directive.name, controller, shell, directive.arg, **keywords))
    else:
        action = "reset" if directive.name == "reset" else "edit"
        show(actions.edit_report(controller.edit([directive]), shell, action))


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
        if directives.OPTIONS[name][1].value is not None:
            value = value if has_value else next(remaining, "")
            if not value or value.startswith("--"):
                raise PolicyError(f"{name} needs a value, e.g. {name} \"TensorFlow GPU 0\"")
            options[name] = value
        elif has_value:
            raise PolicyError(f"{name} takes no value")
        else:
            options[name] = True
    return words, options


def check_options(options: dict[str, Any], directive: Action | Edit) -> None:
    """Each option belongs to the one directive the registry declares it on (`--yes`: restart)."""
    for option in options:
        owners = [owner.name for owner in directives.OPTIONS[option][0]]
        if directive.name not in owners:
            raise PolicyError(f"{option} only goes with {' or '.join(f'`{owner}`' for owner in owners)}")
    if "--remove" in options and "--display-name" in options:
        raise PolicyError("--display-name names a kernelspec to install; it makes no sense with --remove")
