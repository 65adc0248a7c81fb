"""The words of a restart: where it goes, what happened, what to do where nothing here can restart
the kernel (`jupyter.restart` decides and returns records; this words them)."""

from __future__ import annotations

import sys
from typing import Any

from ..jupyter.restart import RESTART_COMMAND, RESTART_ENV, Restarting, Route, restart_command_offered
from ..jupyter.startup import on_next

RESTARTING = "Restarting the kernel"
TO_DO_FRONTEND = "restart the kernel from your front end (VS Code: Restart; nbclient, papermill: `restart_kernel()`)"
"""What to do where nothing here can restart the kernel."""
QUEUED_NOT_RUN = ("Cells queued behind this one are not run in the old kernel (they would run under the old policy): "
                  "run them again once the new kernel is up.")
REASONS = {
    "terminal": "this is terminal IPython, not a kernel: quit and start IPython again",
    "unconnected": "this kernel has no connection file, so nothing can carry the policy over",
    "server": "the Jupyter server that owns this kernel restarts it",
    "exit": f"{RESTART_ENV}=exit: the kernel exits and its manager starts it again",
    "frontend": "no Jupyter server owns this kernel, so nothing here can restart it",
}
"""Why each route (`Route.kind`) is the one taken."""


def reason(route: Route) -> str:
    return REASONS[route.kind]


def restart_text(done: Restarting) -> str:
    """What `%tfgpu restart --yes` (or the panel's button) did, and what comes next."""
    route = done.route
    if not route.stores:
        return f"Not restarted: {reason(route)}. `%tfgpu export` gives the policy as code."
    if done.not_stored is not None:
        return f"Not restarted: could not store the policy for the new kernel: {done.not_stored}"
    if route.kind == "frontend":
        return (f"Not restarted: {reason(route)}.\nThe policy is stored: {TO_DO_FRONTEND}, "
                "and it will be in force before the restarted kernel's first cell.")
    held = f"\n{QUEUED_NOT_RUN}" if done.held else ""
    if route.kind == "server":
        when = "as this cell ends" if done.at_cell_end else "in a moment"
        return (f"{RESTARTING}: its Jupyter server (it confirmed it owns this kernel) is asked to restart it {when}; "
                f"the policy will be in force in the new kernel before your next cell.{held}")
    return f"{RESTARTING}: it exits now and its manager starts it again; the policy will be in force before your next cell.{held}"


def refused_text(error: str) -> str:
    """Said at the start of the next cell when the server refused the restart."""
    return (f"tfgpu_magic: the kernel was NOT restarted: its Jupyter server refused ({error}). "
            "The policy stays stored; restart the kernel from your front end to apply it.")


def say_refused(shell: Any) -> Any:
    """The `refused` callback of `restart_and_apply` for `shell`: the next cell starts with `refused_text`."""
    def refused(error: str) -> None:
        message = refused_text(error)
        on_next(shell, "pre_run_cell", lambda: print(message, file=sys.stderr))

    return refused


def command_sentence(shell: Any) -> str:
    """The sentence naming the labextension's restart command where this kernel's front end has it; ""
    elsewhere."""
    if not restart_command_offered(shell):
        return ""
    return f"In JupyterLab or Notebook 7, {RESTART_COMMAND} also runs your cells again with the policy in force."
