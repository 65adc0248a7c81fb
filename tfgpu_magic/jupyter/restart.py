"""Restart this kernel and re-apply the policy in the new one.

Routes, in order :
1. `server`: a Jupyter server owns this kernel → `POST /api/kernels/{id}/restart` with its token;
2. `exit`: the kernel was started with `TFGPU_MAGIC_RESTART=exit` (a manager that restarts dead
   kernels, which cannot be detected from inside the kernel) → exit cleanly;
3. `frontend`: any other kernel (nbclient, papermill, VS Code, plain jupyter_client) → never kill it;
   say to restart it from the front end;
4. `terminal`: terminal IPython (no kernel, nothing survives), or `unconnected`: a kernel without a
   connection file (nothing can carry the policy over) → nothing is stored.
In every kernel the policy is stored as pending under the kernel's key (`startup.kernel_key`), and a
startup file in the IPython profile loads the extension in the next kernel on the same connection
file before it answers any cell; loading takes the pending policy. `server` finds and proves the
server (its token goes nowhere else). What happened comes back as records (`Route`, `Restarting`);
`views.restarting` words them.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any, Callable, NamedTuple

from . import persist
from ..errors import PolicyError, short_error
from ..language.policy import Policy
from .server import Server, find_server
from .startup import connection_file, kernel_key, on_next
from ..gpus.processes import server_kernel_id

RESTART_ENV = "TFGPU_MAGIC_RESTART"
REQUEST_WAIT = 1.0
"""Most seconds the restart request waits for the kernel to finish the request that asked for it (the
cell, or a widget's comm message). The server interrupts the kernel before it shuts it down: that must
not land in the cell (a KeyboardInterrupt), and the cell's reply must reach the front end first."""
POLL = 0.001
RESTART_THREAD = "tfgpu_magic-restart"
"""The name of the thread that asks the server for the restart (tests watch for it)."""
RESTART_COMMAND = "Kernel → Restart Kernel with the GPU Policy and Run up to Selected Cell…"
"""The menu entry of the labextension's `tfgpu:restart-run-to-selected` (labextension/src/restart.ts)."""
LABEXTENSION = "tfgpu-magic"


class Route(NamedTuple):
    """How this kernel can be restarted: `server`, `exit`, `frontend`, `terminal` or `unconnected`
    (see the module docstring); `server` is the one that owns it."""

    kind: str
    server: Server | None = None

    @property
    def restarts(self) -> bool:
        """Whether taking this route brings a new kernel by itself."""
        return self.kind in ("server", "exit")

    @property
    def stores(self) -> bool:
        """Whether the policy can be kept for a next kernel here."""
        return self.kind not in ("terminal", "unconnected")


class Restarting(NamedTuple):
    """What `restart_and_apply` did: the route, why the policy could not be stored (then nothing
    restarts), whether cells queued behind are held (`hold_queued_cells`), and whether the server is
    asked as this cell ends (else at once: not in a cell)."""

    route: Route
    not_stored: str | None = None
    held: bool = False
    at_cell_end: bool = False


def labextension_installed() -> bool:
    """Whether this environment's JupyterLab finds the tfgpu_magic labextension (a stat per folder)."""
    try:
        from jupyter_core.paths import jupyter_path
    except ImportError:
        return False
    return any((Path(folder) / LABEXTENSION / "package.json").is_file() for folder in jupyter_path("labextensions"))


def restart_command_offered(shell: Any) -> bool:
    """Whether this kernel's front end has the labextension's restart command: a Jupyter server's
    kernel (connection file `kernel-<id>.json`) in an environment where JupyterLab finds the
    extension. No request is made: it is asked with every locked setting."""
    path = connection_file(shell)
    return path is not None and server_kernel_id(path) is not None and labextension_installed()


def choose_route(shell: Any) -> Route:
    """The restart route for this kernel (see the module docstring)."""
    if getattr(shell, "kernel", None) is None:
        return Route("terminal")
    path = connection_file(shell)
    if path is None:
        return Route("unconnected")
    kernel_id = server_kernel_id(path)
    server = find_server(kernel_id) if kernel_id else None
    if server is not None:
        return Route("server", server)
    if os.environ.get(RESTART_ENV) == "exit":
        return Route("exit")
    return Route("frontend")


def keep_for_next_kernel(shell: Any, policy: Policy, path: Path | None = None) -> None:
    """Store `policy` as pending for the kernel on this kernel's connection file (`path`, default: this
    kernel's), so that the next kernel started on it has it in force before its first cell; the
    labextension's restart command calls this too. OSError or PolicyError when it cannot be stored."""
    path = path or connection_file(shell)
    if path is None:
        raise PolicyError("this kernel has no connection file, so nothing can carry the policy over")
    persist.set_pending_startup(shell.profile_dir.location)
    persist.store_pending(kernel_key(path), policy, connection_file=path)


def restart_and_apply(shell: Any, policy: Policy, refused: Callable[[str], None]) -> Restarting:
    """Store `policy` for this kernel and restart it if something will bring it back. Where the
    server refuses the request (after this cell), the kernel lives on: `refused` is told the reason."""
    route = choose_route(shell)
    path = connection_file(shell)
    if not route.stores or path is None:
        return Restarting(route)
    key = kernel_key(path)
    try:
        keep_for_next_kernel(shell, policy, path)
    except (OSError, PolicyError) as err:
        return Restarting(route, not_stored=str(err))
    if route.kind == "frontend":
        return Restarting(route)
    held = hold_queued_cells(shell)
    if route.kind == "server":
        assert route.server is not None
        server = route.server  # found for the server's kernel id, which is this kernel's key
        after_this_request(shell, lambda wait: _request_restart(shell, server, key, wait, refused))
        return Restarting(route, held=held, at_cell_end=in_cell(shell))
    shell.kernel.do_shutdown(True)
    return Restarting(route, held=held)


def hold_queued_cells(shell: Any) -> bool:
    """From now until this kernel ends, answer every cell that reaches it as aborted instead of running
    it: the restart is decided, and a cell run now would run under the old policy and its work would be
    lost. This is ipykernel's own stop-on-error state (`Kernel._aborting`, read for each execute_request
    in `Kernel.dispatch_shell`, ipykernel 6 and 7; front ends show such cells as not run). False where
    the kernel has no such state."""
    kernel = getattr(shell, "kernel", None)
    if kernel is None or not hasattr(kernel, "_aborting"):
        return False
    kernel._aborting = True
    return True


def release_queued_cells(shell: Any) -> None:
    """Undo `hold_queued_cells`: the restart did not happen, so later cells run in this kernel again."""
    kernel = getattr(shell, "kernel", None)
    if kernel is not None and hasattr(kernel, "_aborting"):
        kernel._aborting = False


def in_cell(shell: Any) -> bool:
    """Whether the request being handled is a cell (rather than, say, a widget's comm message)."""
    header = (getattr(shell, "parent_header", None) or {}).get("header", {})
    return header.get("msg_type") == "execute_request"


def after_this_request(shell: Any, start: Callable[[float], None]) -> None:
    """Call `start(wait)` as the cell being run finishes, or at once when the request being handled is
    not a cell; `start` waits up to `wait` seconds for the request to be over (`wait_for_idle`)."""
    if not in_cell(shell):
        start(REQUEST_WAIT)
        return

    on_next(shell, "post_execute", lambda: start(REQUEST_WAIT))  # fires for silent cells too


def _request_restart(shell: Any, server: Server, kernel_id: str, wait: float, refused: Callable[[str], None]) -> None:
    import threading

    thread = threading.Thread(target=_post_restart, args=(shell, server, kernel_id, wait, refused), name=RESTART_THREAD,
                              daemon=True)
    thread.start()


def wait_for_idle(wait: float) -> None:
    """Return once the kernel has finished handling the request being run (its reply sent), or after
    `wait` seconds. ipykernel sets SIGINT to `default_int_handler` for the time it handles a request and
    puts its idle handler back after the reply (`Kernel.pre_handler_hook` / `post_handler_hook`, ipykernel
    6 and 7), so the handler in place tells, from any thread."""
    import signal

    deadline = time.monotonic() + wait
    while signal.getsignal(signal.SIGINT) is signal.default_int_handler and time.monotonic() < deadline:
        time.sleep(POLL)


def _post_restart(shell: Any, server: Server, kernel_id: str, wait: float, refused: Callable[[str], None]) -> None:
    """Ask for the restart; if the server refuses, the kernel lives on: later cells run again, and
    `refused` is told why (the cell that asked has ended)."""
    wait_for_idle(wait)
    try:
        server.request("POST", f"api/kernels/{kernel_id}/restart")
    except ValueError:  # PolicyError: the server accepted (2xx); only its reply body was odd
        return
    except OSError as err:  # a refusal
        release_queued_cells(shell)
        refused(short_error(err))
