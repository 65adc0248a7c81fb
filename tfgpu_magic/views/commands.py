"""What each `%tfgpu` directive does, for the magic in `magics` (imported on the first `%tfgpu`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable

from ..jupyter import persist
from ..errors import PolicyError
from ..language.policy import quote
from ..tf.export import export
from ..language.grammar import Action, parse_cell, parse_words, split_words, suggest
from .status import describe_policy, describe_report, describe_status, pending_groups, restart_hint

if TYPE_CHECKING:
    from .magics import TFGPUMagics

OPTIONS = {"--yes": ("restart", False), "--display-name": ("kernelspec", True), "--remove": ("kernelspec", False)}
"""Each option: the directive it belongs to, and whether it takes a value."""


def run_cell(magics: TFGPUMagics, line: str, cell: str) -> None:
    """`%%tfgpu`: every line an edit, all or nothing."""
    if line.strip():
        raise PolicyError("%%tfgpu takes its directives in the cell body, not on the first line")
    controller = magics.controller
    print(describe_report(controller.edit(parse_cell(cell, controller.catalog)), restart_hint(magics.shell)))


def run_line(magics: TFGPUMagics, line: str) -> None:
    """`%tfgpu ...`: one edit or one action."""
    words, options = split_options(line)
    directive = parse_words(words, magics.controller.catalog)
    check_options(options, directive)
    if isinstance(directive, Action):
        text = ACTIONS[directive.name](magics, directive.arg, options)
        if text:
            print(text)
    else:
        action = "reset" if directive.text.split()[0].lower() == "reset" else "edit"
        print(describe_report(magics.controller.edit([directive]), restart_hint(magics.shell), action))


def split_options(line: str) -> tuple[list[str], dict[str, Any]]:
    """Words of the directive, and its `--options` (`OPTIONS`; the magic's docstring is the help).

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
        if name not in OPTIONS:
            known = f"; the options are {', '.join(OPTIONS)} (see %tfgpu?)"
            raise PolicyError(f"unknown option {quote(name)}{suggest(name, tuple(OPTIONS)) or known}")
        if OPTIONS[name][1]:
            value = value if has_value else next(remaining, "")
            if not value or value.startswith("--"):
                raise PolicyError(f"{name} needs a value, e.g. {name} \"TensorFlow GPU 0\"")
            options[name] = value
        elif has_value:
            raise PolicyError(f"{name} takes no value")
        else:
            options[name] = True
    return words, options


def check_options(options: dict[str, Any], directive: Any) -> None:
    """Options belong to one directive each: `--yes` to restart, the others to kernelspec."""
    name = directive.name if isinstance(directive, Action) else directive.text.split()[0]
    for option in options:
        owner = OPTIONS[option][0]
        if name != owner:
            raise PolicyError(f"{option} only goes with `{owner}`")
    if "--remove" in options and "--display-name" in options:
        raise PolicyError("--display-name names a kernelspec to install; it makes no sense with --remove")


# ----- actions: (magics, argument, options) -> text to print ---------------------------------------
def _status(magics: TFGPUMagics, arg: str | None, options: dict[str, Any]) -> str:
    return describe_status(magics.controller)


def _apply(magics: TFGPUMagics, arg: str | None, options: dict[str, Any]) -> str:
    return describe_report(magics.controller.apply(), restart_hint(magics.shell), "apply")


def _export(magics: TFGPUMagics, arg: str | None, options: dict[str, Any]) -> str:
    controller = magics.controller
    return export(controller.policy, arg or "python", controller.export_plan()).rstrip("\n")


def _restart(magics: TFGPUMagics, arg: str | None, options: dict[str, Any]) -> str:
    from ..jupyter.restart import TO_DO_FRONTEND, choose_route, restart_and_apply

    shell, controller = magics.shell, magics.controller

    def restart() -> str:
        return restart_and_apply(shell, controller.policy)

    if options.get("--yes"):
        return restart()
    route = choose_route(shell)
    if route.kind == "none":
        return restart()  # says why nothing can restart here and what to do instead
    pending = [f"  - {item}" for _, items in pending_groups(controller) for item in items]
    lost = ["Restarting loses every variable of this kernel." + (" Changes it applies:" if pending else "")] + pending
    if not route.restarts:
        last = f"Nothing here can restart this kernel: run `%tfgpu restart --yes` to store the policy, then {TO_DO_FRONTEND}."
        return "\n".join(lost + [last])
    print("\n".join(lost + ["Click the button, or run `%tfgpu restart --yes`."]))
    from .confirm import show_restart_button

    show_restart_button(restart)
    return ""


def _doctor(magics: TFGPUMagics, arg: str | None, options: dict[str, Any]) -> str:
    from ..gpus.doctor import doctor

    return doctor(magics.controller)


def _panel(magics: TFGPUMagics, arg: str | None, options: dict[str, Any]) -> str:
    shell, controller = magics.shell, magics.controller
    if getattr(shell, "kernel", None) is None:
        return "The panel needs a notebook front end (JupyterLab, Notebook 7, VS Code); here use %tfgpu directives."
    from .panel import show_panel

    show_panel(controller, shell)
    return ""


def _setup_errors(action: Callable[[TFGPUMagics, str | None, dict[str, Any]], str]) -> Callable:
    """Files that cannot be written and a missing jupyter_client become one-line errors."""

    def guarded(magics: TFGPUMagics, arg: str | None, options: dict[str, Any]) -> str:
        try:
            return action(magics, arg, options)
        except OSError as err:
            raise PolicyError(f"{action.__name__.strip('_')}: {err}") from None
        except ImportError as err:
            raise PolicyError(f"{action.__name__.strip('_')} needs {err.name}: pip install {err.name}") from None

    return guarded


@_setup_errors
def _default(magics: TFGPUMagics, arg: str | None, options: dict[str, Any]) -> str:
    path = persist.default_path(magics.profile_dir)
    if arg == "save":
        persist.write_policy(path, magics.controller.policy)
        return f"Saved as the default policy of every kernel that loads tfgpu_magic ({path})."
    if arg == "clear":
        path.unlink(missing_ok=True)
        return f"No default policy any more ({path} removed)."
    saved = persist.read_policy(path)
    if saved is None:
        return f"No default policy saved ({path})."
    return f"Default policy ({path}): " + ("; ".join(describe_policy(saved)) or "TensorFlow defaults")


@_setup_errors
def _autoload(magics: TFGPUMagics, arg: str | None, options: dict[str, Any]) -> str:
    return persist.set_autoload(magics.profile_dir, arg == "on")


@_setup_errors
def _kernelspec(magics: TFGPUMagics, arg: str | None, options: dict[str, Any]) -> str:
    from ..jupyter import kernelspec

    name = arg or ""
    if options.get("--remove"):
        return f"Removed kernelspec {name!r} ({kernelspec.remove(name)})."
    where = kernelspec.install(name, magics.controller.policy, options.get("--display-name"))
    return f"Installed kernelspec {name!r} in {where}; pick it in the launcher for a kernel with this policy."


ACTIONS: dict[str, Callable[[TFGPUMagics, str | None, dict[str, Any]], str]] = {
    "status": _status,
    "apply": _apply,
    "export": _export,
    "restart": _restart,
    "doctor": _doctor,
    "panel": _panel,
    "default": _default,
    "autoload": _autoload,
    "kernelspec": _kernelspec,
}
