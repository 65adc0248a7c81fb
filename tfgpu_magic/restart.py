"""Restart this kernel and re-apply the policy in the new one: the only module that talks to Jupyter.

Routes, in order (facts in DESIGN.md §3):
1. a Jupyter server owns this kernel → `POST /api/kernels/{id}/restart` with that server's token;
2. no server, but the kernel was started with `TFGPU_MAGIC_RESTART=exit` (a manager that restarts
   dead kernels; such a manager cannot be detected from inside the kernel) → exit cleanly;
3. otherwise (nbclient, VS Code, terminal IPython) → never kill the kernel; say what to do.
The policy is stored as pending for this kernel id, and a startup file in the IPython profile loads
the extension in the new kernel before it answers any cell; loading takes the pending policy. (An
earlier design re-applied from a detached helper over the connection file; a cell sent right after
the restart could beat it, which the startup file rules out.) Tokens are never printed or logged.
"""

from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from . import persist
from .policy import Policy
from .startup import current_kernel_id, on_next

RESTART_ENV = "TFGPU_MAGIC_RESTART"
REQUEST_DELAY = 0.05
"""Seconds between the end of the cell and the restart request. The server interrupts the kernel
before it shuts it down: that must not land in the cell (a KeyboardInterrupt), and the cell's reply
should reach the front end first."""
OUTSIDE_CELL_DELAY = 0.3
"""The same, when the restart comes from a widget (a comm message, whose end has no event)."""
HTTP_TIMEOUT = 3.0


@dataclass(frozen=True)
class Server:
    """A Jupyter server that owns this kernel. `repr` hides the token."""

    url: str
    token: str
    hub_token: str = ""

    def __repr__(self) -> str:
        return f"Server(url={self.url!r})"

    def request(self, method: str, path: str) -> Any:
        """An authenticated request; returns the decoded JSON reply (or None when empty).

        Raises OSError (urllib's URLError is one) when the server cannot be reached or refuses."""
        import urllib.request  # not at import time: %load_ext must stay cheap

        request = urllib.request.Request(self.url.rstrip("/") + "/" + path.lstrip("/"), method=method)
        if self.token or self.hub_token:
            request.add_header("Authorization", f"token {self.token or self.hub_token}")
        if method == "POST":
            request.data = b"{}"
            request.add_header("Content-Type", "application/json")
        with urllib.request.urlopen(request, timeout=HTTP_TIMEOUT) as reply:  # noqa: S310 (local URL)
            body = reply.read()
        return json.loads(body) if body else None


@dataclass(frozen=True)
class Route:
    """How this kernel can be restarted: `server`, `exit` or `none`, and why."""

    kind: str
    reason: str
    server: Server | None = None


def find_server(kernel_id: str, runtime_dir: Path | None = None) -> Server | None:
    """The running Jupyter server that owns kernel `kernel_id`, from its `jpserver-*.json`."""
    directory = runtime_dir or persist.runtime_dir()
    try:
        infos = sorted(directory.glob("jpserver-*.json"), key=lambda p: p.stat().st_mtime, reverse=True)
    except OSError:
        return None
    for path in infos:
        try:
            info = json.loads(path.read_text(encoding="utf-8"))
            server = Server(str(info["url"]), str(info.get("token", "")), os.environ.get("JUPYTERHUB_API_TOKEN", ""))
            server.request("GET", f"api/kernels/{kernel_id}")
        except (OSError, ValueError, KeyError):
            continue
        return server
    return None


def choose_route(kernel_id: str | None) -> Route:
    """The restart route for this kernel (see the module docstring)."""
    if kernel_id is None:
        return Route("none", "this is not a Jupyter kernel (terminal IPython): restart IPython yourself")
    server = find_server(kernel_id)
    if server is not None:
        return Route("server", "the Jupyter server that owns this kernel restarts it", server)
    if os.environ.get(RESTART_ENV) == "exit":
        return Route("exit", f"{RESTART_ENV}=exit: the kernel exits and its manager starts it again")
    return Route(
        "none",
        "no Jupyter server owns this kernel (nbclient, VS Code or another front end), so nothing "
        "would bring it back: restart it from your front end",
    )


def restart_and_apply(shell: Any, policy: Policy) -> str:
    """Store `policy` for this kernel, restart it if something will bring it back, and say what happened."""
    kernel_id = current_kernel_id(shell)
    route = choose_route(kernel_id)
    if kernel_id is None:
        return f"Not restarted: {route.reason}. `%tfgpu export` gives the policy as code."
    try:
        persist.set_pending_startup(shell.profile_dir.location)
        persist.store_pending(kernel_id, policy)
    except OSError as err:
        return f"Not restarted: could not store the policy for the new kernel: {err}"
    if route.kind == "none":
        return f"Not restarted: {route.reason}. The policy is stored; `%load_ext tfgpu_magic` applies it there."
    if route.kind == "server":
        assert route.server is not None
        server = route.server
        after_this_request(shell, lambda delay: _request_restart(server, kernel_id, delay))
    else:
        shell.kernel.do_shutdown(True)
    return "Restarting the kernel; the policy will be in force in the new kernel before your next cell."


def after_this_request(shell: Any, start: Callable[[float], None]) -> None:
    """Call `start(delay)` once the cell being run has finished, or at once (with a longer delay)
    when the request being handled is not a cell."""
    header = (getattr(shell, "parent_header", None) or {}).get("header", {})
    if header.get("msg_type") != "execute_request":
        start(OUTSIDE_CELL_DELAY)
        return

    on_next(shell, "post_execute", lambda: start(REQUEST_DELAY))  # fires for silent cells too


def _request_restart(server: Server, kernel_id: str, delay: float) -> None:
    import threading

    threading.Thread(target=_post_restart, args=(server, kernel_id, delay), daemon=True).start()


def _post_restart(server: Server, kernel_id: str, delay: float) -> None:
    time.sleep(delay)
    try:
        server.request("POST", f"api/kernels/{kernel_id}/restart")
    except OSError as err:
        print(f"tfgpu_magic: the server refused the restart: {err}", file=sys.__stderr__)
