"""Restart this kernel and re-apply the policy in the new one: the only module that talks to Jupyter.

Routes, in order :
1. `server`: a Jupyter server owns this kernel → `POST /api/kernels/{id}/restart` with its token;
2. `exit`: the kernel was started with `TFGPU_MAGIC_RESTART=exit` (a manager that restarts dead
   kernels, which cannot be detected from inside the kernel) → exit cleanly;
3. `frontend`: any other kernel (nbclient, papermill, VS Code, plain jupyter_client) → never kill it;
   say to restart it from the front end;
4. `none`: terminal IPython (no kernel, nothing survives) → say to restart IPython.
In every kernel the policy is stored as pending under the kernel's key (`startup.kernel_key`), and a
startup file in the IPython profile loads the extension in the next kernel on the same connection
file before it answers any cell; loading takes the pending policy.

A server's token goes only to the server that owns this kernel, proven locally before any request:
its `jpserver-<pid>.json` names a live process that is an ancestor of this kernel (the server
started it, directly or through a kernelspec's wrapper), that process itself holds the socket
listening on the very address and port the request goes to (/proc/net/tcp{,6} against its file
descriptors, on Linux: a server on [::1] only is asked at [::1], never at 127.0.0.1, where another user
may listen on the same port), and the server then lists this kernel id.
Requests go over loopback only (a server listening on every interface is reached at 127.0.0.1 or
::1), never through a proxy, never following a redirect; for `https` the certificate is not checked
(servers on loopback use self-signed ones) since the ancestor pid and the loopback port already
identify the server. Tokens are never printed or logged.
"""

from __future__ import annotations

import ipaddress
import os
import sys
import time
from pathlib import Path
from typing import Any, Callable, Iterator, NamedTuple

from . import persist
from .. import safefile
from ..errors import PolicyError, short_error, warn
from ..language.policy import Policy
from .startup import connection_file, kernel_key, on_next
from ..gpus.processes import server_kernel_id

RESTART_ENV = "TFGPU_MAGIC_RESTART"
REQUEST_WAIT = 1.0
"""Most seconds the restart request waits for the kernel to finish the request that asked for it (the
cell, or a widget's comm message). The server interrupts the kernel before it shuts it down: that must
not land in the cell (a KeyboardInterrupt), and the cell's reply must reach the front end first."""
POLL = 0.001
HTTP_TIMEOUT = 3.0
REPLY_BYTES = 1 << 20
"""Largest server reply read."""
ANCESTOR_DEPTH = 16
LISTEN_STATE = "0A"
"""TCP_LISTEN in /proc/net/tcp."""
WILDCARD_HOSTS = {
    "": ("127.0.0.1", "::1"), "0.0.0.0": ("127.0.0.1",), "localhost": ("127.0.0.1", "::1"), "::": ("::1", "127.0.0.1"),  # noqa: S104
}  # fmt: skip
"""Server `hostname`s (its `--ip`) and the loopback addresses that may reach such a server here."""
RESTARTING = "Restarting the kernel"
RESTART_THREAD = "tfgpu_magic-restart"
"""The name of the thread that asks the server for the restart (tests watch for it)."""
RESTART_COMMAND = "Kernel → Restart Kernel with the GPU Policy and Run up to Selected Cell…"
"""The menu entry of the labextension's `tfgpu:restart-run-to-selected` (labextension/src/index.ts)."""
LABEXTENSION = "tfgpu-magic"
TO_DO_FRONTEND = "restart the kernel from your front end (VS Code: Restart; nbclient, papermill: `restart_kernel()`)"
"""What to do where nothing here can restart the kernel."""


class Server(NamedTuple):
    """A Jupyter server on loopback that owns this kernel. `repr` hides the token."""

    url: str
    token: str
    pid: int
    hub_token: str = ""

    def __repr__(self) -> str:
        return f"Server(url={self.url!r}, pid={self.pid})"

    @classmethod
    def from_info(cls, info: dict[str, Any], url: str, pid: int) -> Server:
        """The server of `info` (a `jpserver-*.json`), reached at `url`."""
        token = info.get("token")
        return cls(url, token if isinstance(token, str) else "", pid, os.environ.get("JUPYTERHUB_API_TOKEN", ""))

    def request(self, method: str, path: str) -> Any:
        """An authenticated request; the decoded JSON reply (None when empty). No proxy, no
        redirect. Raises OSError (urllib's URLError and HTTPError are ones) when the server cannot
        be reached or refuses, `PolicyError` for a reply that is not sensible JSON."""
        import urllib.request  # not at import time: %load_ext must stay cheap

        request = urllib.request.Request(self.url.rstrip("/") + "/" + path.lstrip("/"), method=method)
        if self.token or self.hub_token:
            request.add_unredirected_header("Authorization", f"token {self.token or self.hub_token}")
        if method == "POST":
            request.data = b"{}"
            request.add_header("Content-Type", "application/json")
        with _opener(self.url.startswith("https:")).open(request, timeout=HTTP_TIMEOUT) as reply:
            body = reply.read(REPLY_BYTES + 1)
        if len(body) > REPLY_BYTES:
            raise PolicyError(f"the server at {self.url} sent a reply over {REPLY_BYTES} bytes")
        try:
            return safefile.loads(body.decode("utf-8"), f"the reply of the server at {self.url}") if body else None
        except UnicodeDecodeError:
            raise PolicyError(f"the server at {self.url} sent a reply that is not UTF-8") from None


def _opener(https: bool) -> Any:
    """A urllib opener of its own for each request: urllib's default one uses `http_proxy` (and keeps
    the first proxy it saw for the life of the process) and follows redirects."""
    import urllib.request

    class NoRedirect(urllib.request.HTTPRedirectHandler):
        def redirect_request(self, *args: Any, **kwargs: Any) -> None:
            return None  # the 3xx becomes an HTTPError: the token is never sent on

    handlers: list[Any] = [urllib.request.ProxyHandler({}), NoRedirect()]
    if https:
        import ssl

        context = ssl.create_default_context()
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE  # loopback only; the server is identified by pid (module docstring)
        handlers.append(urllib.request.HTTPSHandler(context=context))
    return urllib.request.build_opener(*handlers)


class Route(NamedTuple):
    """How this kernel can be restarted: `server`, `exit`, `frontend` or `none`, and why."""

    kind: str
    reason: str
    server: Server | None = None

    @property
    def restarts(self) -> bool:
        """Whether taking this route brings a new kernel by itself."""
        return self.kind in ("server", "exit")


def ancestors() -> list[int]:
    """This process's parent, its parent, … (only the parent where /proc is missing)."""
    pids = [os.getppid()]
    while len(pids) < ANCESTOR_DEPTH:
        try:
            stat = Path(f"/proc/{pids[-1]}/stat").read_text(encoding="ascii", errors="replace")
            parent = int(stat.rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            break
        if parent < 1:
            break
        pids.append(parent)
        if parent == 1:  # a server running as the container's init is an ancestor too
            break
    return pids


def _address(hex_address: str) -> str:
    """The IP address of a /proc/net/tcp{,6} `local_address` field's address part (each 32-bit word
    is stored in host byte order, little-endian here)."""
    raw = bytes.fromhex(hex_address)
    return str(ipaddress.ip_address(b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))))


def listening_addresses(pid: int, port: int) -> set[str] | None:
    """The local addresses ('127.0.0.1', '::', …) of the sockets that process `pid` itself holds
    listening on `port` (from /proc/net/tcp{,6} and its file descriptors); None where /proc cannot
    tell (not Linux)."""
    tables = [Path("/proc/net/tcp"), Path("/proc/net/tcp6")]
    if not tables[0].exists():
        return None
    try:
        descriptors = list(Path(f"/proc/{pid}/fd").iterdir())
    except OSError:
        return set()
    inodes = set()
    for fd in descriptors:
        try:
            inodes.add(os.readlink(fd))
        except OSError:  # closed meanwhile (the listing's own descriptor among them)
            continue
    addresses = set()
    for table in tables:
        try:
            rows = table.read_text(encoding="ascii", errors="replace").splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            fields = row.split()
            if len(fields) < 10 or fields[3] != LISTEN_STATE or f"socket:[{fields[9]}]" not in inodes:
                continue
            host, _, hex_port = fields[1].rpartition(":")
            try:
                if int(hex_port, 16) == port:
                    addresses.add(_address(host))
            except ValueError:
                continue
    return addresses


def owner_host(candidates: list[str], listening: set[str]) -> str | None:
    """The first of `candidates` (loopback addresses) that a socket in `listening` surely receives a
    connection to: the same address, or the wildcard of its own family. An IPv6 wildcard may be
    IPv6-only, so it never vouches for 127.0.0.1: another user could hold 127.0.0.1 on that port."""
    for host in candidates:
        wildcard = "::" if ":" in host else "0.0.0.0"  # noqa: S104
        if host in listening or wildcard in listening:
            return host
    return None


def loopback_hosts(info: dict[str, Any]) -> list[str]:
    """The loopback addresses that may reach the server of `info` (a `jpserver-*.json`), best first;
    [] when it listens elsewhere only (a given remote or LAN address, a host name) or on a Unix socket."""
    host, port, base = info.get("hostname"), info.get("port"), info.get("base_url") or "/"
    if info.get("sock") or not isinstance(host, str) or not isinstance(base, str) or not base.startswith("/"):
        return []
    if isinstance(port, bool) or not isinstance(port, int) or not 0 < port < 65536:
        return []
    if host in WILDCARD_HOSTS:
        return list(WILDCARD_HOSTS[host])
    try:
        return [host] if ipaddress.ip_address(host).is_loopback else []
    except ValueError:  # a host name: where it points is not ours to trust
        return []


def server_url(info: dict[str, Any], pid: int) -> str | None:
    """The URL of the server of `info`, at a loopback address that process `pid` itself listens on
    (module docstring); None when there is none. Without /proc, the first loopback address."""
    candidates = loopback_hosts(info)
    listening = listening_addresses(pid, info["port"]) if candidates else set()
    host = candidates[0] if listening is None else owner_host(candidates, listening)
    if host is None:
        return None
    netloc = f"[{host}]" if ":" in host else host
    return f"{'https' if info.get('secure') is True else 'http'}://{netloc}:{info['port']}{info.get('base_url') or '/'}"


def server_files(directory: Path | None = None, quiet: bool = False) -> Iterator[tuple[Path, dict[str, Any], int]]:
    """(path, info, pid) of each `jpserver-*.json` in `directory` (default: the runtime dir) that reads
    as a private JSON object of this user naming an integer pid. Other files are skipped, each with one
    warning line unless `quiet`; nothing here proves that the server is alive or whose it is."""
    directory = directory or persist.runtime_dir()
    try:
        paths = sorted(directory.glob("jpserver-*.json"))
    except OSError:
        return
    for path in paths:
        try:
            info = safefile.read_json(path, safefile.SERVER_INFO_BYTES, private=True)
        except PolicyError as err:
            if not quiet:
                warn(f"ignoring a Jupyter server file: {err}")
            continue
        if not isinstance(info, dict):
            if not quiet:
                warn(f"ignoring {path}: not a Jupyter server file")
            continue
        pid = info.get("pid")
        if isinstance(pid, int) and not isinstance(pid, bool):
            yield path, info, pid


def find_server(kernel_id: str, runtime_dir: Path | None = None) -> Server | None:
    """The running Jupyter server that owns kernel `kernel_id` (see the module docstring). Files of
    other or dead servers get no request; a broken file or reply is one warning line."""
    lineage = set(ancestors())
    for path, info, pid in server_files(runtime_dir):
        if pid not in lineage:
            continue  # a dead server, or one that did not start this kernel: it gets nothing
        if not loopback_hosts(info):
            warn(f"the Jupyter server of {path.name} is not reachable over loopback; its token is not sent")
            continue
        url = server_url(info, pid)
        if url is None:
            continue  # the address is not this process's: whatever answers there gets nothing
        server = Server.from_info(info, url, pid)
        try:
            reply = server.request("GET", f"api/kernels/{kernel_id}")
        except (OSError, ValueError) as err:  # PolicyError is a ValueError
            warn(f"the Jupyter server of {path.name} did not confirm this kernel: {short_error(err)}")
            continue
        if isinstance(reply, dict) and reply.get("id") == kernel_id:
            return server
    return None


def labextension_installed() -> bool:
    """Whether this environment's JupyterLab finds the tfgpu_magic labextension (a stat per folder)."""
    try:
        from jupyter_core.paths import jupyter_path
    except ImportError:
        return False
    return any((Path(folder) / LABEXTENSION / "package.json").is_file() for folder in jupyter_path("labextensions"))


def restart_command_hint(shell: Any) -> str:
    """The sentence naming the labextension's restart command where this kernel's front end has it: a
    Jupyter server's kernel (connection file `kernel-<id>.json`) in an environment where JupyterLab
    finds the extension; "" elsewhere. No request is made: it is said with every locked setting."""
    path = connection_file(shell)
    if path is None or server_kernel_id(path) is None or not labextension_installed():
        return ""
    return f"In JupyterLab or Notebook 7, {RESTART_COMMAND} also runs your cells again with the policy in force."


def choose_route(shell: Any) -> Route:
    """The restart route for this kernel (see the module docstring)."""
    if getattr(shell, "kernel", None) is None:
        return Route("none", "this is terminal IPython, not a kernel: quit and start IPython again")
    path = connection_file(shell)
    if path is None:
        return Route("none", "this kernel has no connection file, so nothing can carry the policy over")
    kernel_id = server_kernel_id(path)
    server = find_server(kernel_id) if kernel_id else None
    if server is not None:
        return Route("server", "the Jupyter server that owns this kernel restarts it", server)
    if os.environ.get(RESTART_ENV) == "exit":
        return Route("exit", f"{RESTART_ENV}=exit: the kernel exits and its manager starts it again")
    return Route("frontend", "no Jupyter server owns this kernel, so nothing here can restart it")


def keep_for_next_kernel(shell: Any, policy: Policy, path: Path | None = None) -> None:
    """Store `policy` as pending for the kernel on this kernel's connection file (`path`, default: this
    kernel's), so that the next kernel started on it has it in force before its first cell; the
    labextension's restart command calls this too. OSError or PolicyError when it cannot be stored."""
    path = path or connection_file(shell)
    if path is None:
        raise PolicyError("this kernel has no connection file, so nothing can carry the policy over")
    persist.set_pending_startup(shell.profile_dir.location)
    persist.store_pending(kernel_key(path), policy, connection_file=path)


def restart_and_apply(shell: Any, policy: Policy) -> str:
    """Store `policy` for this kernel, restart it if something will bring it back, and say what happened."""
    route = choose_route(shell)
    path = connection_file(shell)
    if route.kind == "none" or path is None:
        return f"Not restarted: {route.reason}. `%tfgpu export` gives the policy as code."
    key = kernel_key(path)
    try:
        keep_for_next_kernel(shell, policy, path)
    except (OSError, PolicyError) as err:
        return f"Not restarted: could not store the policy for the new kernel: {err}"
    if route.kind == "frontend":
        return (
            f"Not restarted: {route.reason}.\nThe policy is stored: {TO_DO_FRONTEND}, "
            "and it will be in force before the restarted kernel's first cell."
        )
    held = hold_queued_cells(shell)
    if route.kind == "server":
        assert route.server is not None
        server = route.server  # found for the server's kernel id, which is this kernel's key
        when = "as this cell ends" if in_cell(shell) else "in a moment"
        after_this_request(shell, lambda wait: _request_restart(shell, server, key, wait))
        return (
            f"{RESTARTING}: its Jupyter server (it confirmed it owns this kernel) is asked to restart it {when}; "
            f"the policy will be in force in the new kernel before your next cell.{held}"
        )
    shell.kernel.do_shutdown(True)
    return (
        f"{RESTARTING}: it exits now and its manager starts it again; "
        f"the policy will be in force before your next cell.{held}"
    )


QUEUED_NOT_RUN = "\nCells queued behind this one are not run in the old kernel (they would run under the old policy): run them again once the new kernel is up."


def hold_queued_cells(shell: Any) -> str:
    """From now until this kernel ends, answer every cell that reaches it as aborted instead of running
    it: the restart is decided, and a cell run now would run under the old policy and its work would be
    lost. This is ipykernel's own stop-on-error state (`Kernel._aborting`, read for each execute_request
    in `Kernel.dispatch_shell`, ipykernel 6 and 7; front ends show such cells as not run). Returns the
    sentence that tells the user, or "" where the kernel has no such state."""
    kernel = getattr(shell, "kernel", None)
    if kernel is None or not hasattr(kernel, "_aborting"):
        return ""
    kernel._aborting = True
    return QUEUED_NOT_RUN


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


def _request_restart(shell: Any, server: Server, kernel_id: str, wait: float) -> None:
    import threading

    thread = threading.Thread(target=_post_restart, args=(shell, server, kernel_id, wait), name=RESTART_THREAD, daemon=True)
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


def _post_restart(shell: Any, server: Server, kernel_id: str, wait: float) -> None:
    """Ask for the restart; if the server refuses, the kernel lives on: say so at the start of the next
    cell (the cell that asked has ended)."""
    wait_for_idle(wait)
    try:
        server.request("POST", f"api/kernels/{kernel_id}/restart")
    except ValueError:  # PolicyError: the server accepted (2xx); only its reply body was odd
        return
    except OSError as err:  # a refusal
        release_queued_cells(shell)
        message = (
            f"tfgpu_magic: the kernel was NOT restarted: its Jupyter server refused ({short_error(err)}). "
            "The policy stays stored; restart the kernel from your front end to apply it."
        )
        on_next(shell, "pre_run_cell", lambda: print(message, file=sys.stderr))
