"""What each `%tfgpu` action does: it runs a service (the controller, the doctor, `holders`, the
selftest, `jupyter`) and returns what to show; the panel calls the same controller methods (export,
apply, edits, pending changes). An action lives with the views because what it returns is shown.

Every action has one signature, `(controller, shell, arg, **options)`, and `@runs(name)` files it in
`ACTIONS` under its directive's name (the registry stays data), so the dispatcher calls any of them
from there: `shell` is the IPython shell (None in a script), `arg` the
directive's one argument, `options` the `--options` with dashes as underscores (`--display-name` →
`display_name`). Each returns plain text (print it unless empty) or a `views.results.Result`
(display it: text in a terminal, HTML in a notebook); `views.results.show` does either. User
mistakes raise `PolicyError`.

This module never imports the magic; it imports the panel only inside `open_panel`, and the panel
does not import it back (it is handed the restart it needs).
"""

from __future__ import annotations

import functools
from typing import Any, Callable

from ..controller import Controller
from ..errors import PolicyError
from ..jupyter import persist
from ..language.directives import spec
from .results import DoctorResult, MemoryResult, Result, RestartOffer, SelftestResult, StatusResult
from .status import describe_policy, edit_report, note_text, pending_lines, snapshot

Action = Callable[..., "str | Result"]


ACTIONS: dict[str, Action] = {}
"""Every action by its directive's name (`runs`); `tests/test_registry.py` checks there is one per action."""


def runs(name: str) -> Callable[[Action], Action]:
    """File the decorated function in `ACTIONS` as what action `name` runs (a declared action: `spec`)."""

    def register(action: Action) -> Action:
        ACTIONS[spec(name).name] = action
        return action

    return register



@runs("status")
def status(controller: Controller, shell: Any = None, arg: str | None = None) -> StatusResult:
    """`%tfgpu` / `%tfgpu status`: TensorFlow's state, the policy, the environment, what TF recorded."""
    return StatusResult(snapshot(controller))


@runs("apply")
def apply(controller: Controller, shell: Any = None, arg: str | None = None) -> str:
    """`%tfgpu apply`: apply now as far as TensorFlow allows."""
    return edit_report(controller.apply(), shell, "apply")


@runs("export")
def export(controller: Controller, shell: Any = None, arg: str | None = None) -> str:
    """`%tfgpu export [python | env | json]`: the standalone equivalent of the policy."""
    return controller.export(arg or "python", note_text).rstrip("\n")


@runs("restart")
def restart(controller: Controller, shell: Any, arg: str | None = None, *, yes: bool = False) -> str | Result:
    """`%tfgpu restart [--yes]`: with `yes`, or where nothing could restart the kernel anyway, store
    the policy and restart (or say what to do); else say what is lost and offer a confirm button
    where pressing it restarts."""
    from ..jupyter.restart import choose_route
    from .restarting import TO_DO_FRONTEND, command_sentence

    if yes:
        return restart_now(controller, shell)
    route = choose_route(shell)
    if not route.stores:
        return restart_now(controller, shell)  # says why nothing can restart here and what to do instead
    pending = [f"  - {item}" for _, items in pending_lines(controller) for item in items]
    lost = ["Restarting loses every variable of this kernel." + (" Changes it applies:" if pending else "")] + pending
    if not route.restarts:
        last = f"Nothing here can restart this kernel: run `%tfgpu restart --yes` to store the policy, then {TO_DO_FRONTEND}."
        return "\n".join(lost + [last])
    command = command_sentence(shell) if route.kind == "server" else ""
    text = "\n".join(lost + ["Click the button, or run `%tfgpu restart --yes`."] + ([command] if command else []))
    return RestartOffer(text, functools.partial(restart_now, controller, shell))


def restart_now(controller: Controller, shell: Any) -> str:
    """Store the policy for the next kernel and restart this one by the best route; what happened."""
    from ..jupyter.restart import restart_and_apply
    from .restarting import restart_text, say_refused

    return restart_text(restart_and_apply(shell, controller.policy, say_refused(shell)))


def restarts(shell: Any) -> bool:
    """Whether anything brings this kernel back after a restart (else a restart only stores the policy)."""
    from ..jupyter.restart import choose_route

    return choose_route(shell).restarts


@runs("doctor")
def doctor(controller: Controller, shell: Any = None, arg: str | None = None, *,
           json: bool = False) -> DoctorResult | str:
    """`%tfgpu doctor [--json]`: why TensorFlow does (not) see a GPU, check by check, with the fix;
    with `json`, the checks as a JSON list for scripts."""
    from ..doctor import inspect_machine, run_checks
    from .doctor import report_json

    machine = inspect_machine(controller.environ, controller.inventory(), controller.policy, controller.api)
    checks = run_checks(machine)
    return report_json(checks) if json else DoctorResult(tuple(checks))


@runs("selftest")
def selftest(controller: Controller, shell: Any = None, arg: str | None = None, *,
             json: bool = False) -> SelftestResult | str:
    """`%tfgpu selftest [--json]`: each rule of the policy proven on this machine, each in a fresh process,
    all run by a child `python -m tfgpu_magic selftest` with the environment this process started with
    (this kernel's own TensorFlow stays untouched). A line per rule as it is decided, then the table;
    with `json`, only the verdicts as a JSON list. An interrupt stops every process it started."""
    import time

    from ..selftest.report import to_json
    from ..selftest.run import run_outside
    from .selftest import progress

    def said(row: Any) -> None:
        print(progress(row), flush=True)

    start = time.monotonic()
    rows = run_outside(controller.inherited_environment(), None if json else said)
    return to_json(rows) if json else SelftestResult(tuple(rows), time.monotonic() - start)


@runs("memory")
def memory(controller: Controller, shell: Any = None, arg: str | None = None) -> MemoryResult:
    """`%tfgpu memory`: one row per visible GPU, then each recent cell's figures per card (never imports
    or initializes TensorFlow)."""
    from .figures import memory_result

    return memory_result(controller, shell)


@runs("watch")
def watch(controller: Controller, shell: Any, arg: str | None = None) -> str:
    """`%tfgpu watch on | off`: a line per GPU after each cell; off leaves no hook."""
    from .watch import watch as switch

    return switch(controller, shell, arg)


@runs("panel")
def panel(controller: Controller, shell: Any, arg: str | None = None) -> str:
    """`%tfgpu panel`: show the widget panel (its restart button uses `restart_now`); '' once shown."""
    if getattr(shell, "kernel", None) is None:
        return "The panel needs a notebook front end (JupyterLab, Notebook 7, VS Code); here use %tfgpu directives."
    open_panel(controller, shell)
    return ""


def open_panel(controller: Controller, shell: Any) -> Any:
    """Build and display a panel over `controller` for `shell`'s kernel; returns the `Panel`."""
    from .panel import show_panel

    return show_panel(controller, shell, functools.partial(restart_now, controller, shell), restarts(shell),
                      functools.partial(who, controller))


def _setup_errors(action: Action) -> Action:
    """Files that cannot be written and a missing jupyter_client become one-line errors."""

    @functools.wraps(action)
    def guarded(*args: Any, **kwargs: Any) -> str | Result:
        try:
            return action(*args, **kwargs)
        except OSError as err:
            raise PolicyError(f"{action.__name__}: {err}") from None
        except ImportError as err:
            raise PolicyError(f"{action.__name__} needs {err.name}: pip install {err.name}") from None

    return guarded


def _profile_dir(shell: Any) -> str:
    return shell.profile_dir.location


@runs("default")
@_setup_errors
def default(controller: Controller, shell: Any, arg: str | None = None) -> str:
    """`%tfgpu default save | clear | show` (`arg`; None is show): the profile's default policy."""
    path = persist.default_path(_profile_dir(shell))
    if arg == "save":
        persist.write_policy(path, controller.policy)
        return f"Saved as the default policy of every kernel that loads tfgpu_magic ({path})."
    if arg == "clear":
        path.unlink(missing_ok=True)
        return f"No default policy any more ({path} removed)."
    saved = persist.read_policy(path)
    if saved is None:
        return f"No default policy saved ({path})."
    return f"Default policy ({path}): " + ("; ".join(describe_policy(saved)) or "TensorFlow defaults")


@runs("autoload")
@_setup_errors
def autoload(controller: Controller, shell: Any, arg: str | None = None) -> str:
    """`%tfgpu autoload on | off`: load the extension in every new kernel of the profile."""
    path = persist.set_autoload(_profile_dir(shell), arg == "on")
    if arg == "on":
        return f"Every new IPython session and kernel of this profile loads tfgpu_magic ({path})."
    if path is not None:
        return f"Removed {path}: new kernels no longer load tfgpu_magic by themselves."
    return "Autoload was not on; nothing to remove."


@runs("kernelspec")
@_setup_errors
def kernelspec(controller: Controller, shell: Any, arg: str | None = None, *,
               display_name: str | None = None, slurm: str | None = None, remove: bool = False) -> str:
    """`%tfgpu kernelspec NAME [--display-name TEXT] [--slurm ARGS] [--remove]`: install or remove our
    kernelspec `arg` (a Slurm job's with `slurm`)."""
    from ..jupyter import kernelspec as specs

    name = arg or ""
    if remove:
        return f"Removed kernelspec {name!r} ({specs.remove(name)})."
    where = specs.install(name, controller.policy, display_name, slurm)
    job = " that runs as a Slurm job" if slurm is not None else ""
    return f"Installed kernelspec {name!r} in {where}; pick it in the launcher for a kernel{job} with this policy."


@runs("who")
def who(controller: Controller, shell: Any = None, arg: str | None = None, *,
        shutdown: str | None = None, yes: bool = False) -> str:
    """`%tfgpu who [--shutdown KERNEL_ID --yes]`: who holds which GPU; shuts a kernel down only with --yes."""
    from .. import holders
    from .who import report, shutdown_text

    if shutdown is not None:
        return shutdown_text(holders.shutdown(shutdown, yes=yes))
    if yes:
        raise PolicyError("--yes confirms `--shutdown KERNEL_ID`; alone it does nothing")
    return report(controller.inventory(), grant=controller.grant())


def run(name: str, controller: Controller, shell: Any, arg: str | None = None, **options: Any) -> str | Result:
    """Run action `name`; `options` as keyword arguments (`yes=True`, `display_name="..."`)."""
    action = ACTIONS.get(name)
    if action is None:
        raise PolicyError(f"`{name}` is not an action")
    return action(controller, shell, arg, **options)
