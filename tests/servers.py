"""Real Jupyter servers and kernels for tests, in throwaway directories.

`isolated_jupyter()` gives a `JupyterEnv`: JUPYTER_RUNTIME_DIR, JUPYTER_DATA_DIR, JUPYTER_CONFIG_DIR,
IPYTHONDIR and HOME under one temporary root (nothing of the machine's Jupyter or IPython setup leaks
in), and a `python3` kernelspec running `sys.executable`. On it:

- `running_server(env)` starts `python -m jupyter_server` (or another app, e.g. `jupyterlab`) on
  127.0.0.1 with a free port and a random token; `JupyterServer` is its small REST client;
- `standalone_kernel(env)` is a kernel without a server and without autorestart (like nbclient);
- `restarting_kernel(env)` is a kernel under an `AsyncIOLoopKernelManager` that restarts it when
  it dies (like a front end's manager), no server;
- `KernelConnection` (a `kernels.Kernel` on a connection file) runs cells and records everything the
  kernel printed in `env.transcript`; `await_new_kernel()` follows a kernel through a restart;
- connection files are named as their real users name them (`CONNECTION_NAMING`): a server's
  `kernel-<id>.json`, jupyter_client's and nbclient's temp `tmpXXXXXXXX.json`, VS Code's `kernel-v2-…`;
- `RecordingListener` is a tiny HTTP server on 127.0.0.1 that records every request (a stand-in for
  a stale server's port, a proxy, a redirect target); `self_signed_cert()` makes an https certificate.

Cleanup is by PID and always happens, failures included: when the env closes, every process whose
command line names the env's root (the server, its kernels, helpers started with a kernel's
connection file) is terminated, then killed, and checked gone with `os.kill(pid, 0)`; a kernel on a
temp-named connection file (outside the root) is stopped the same way by its connection file.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, TypeVar

from jupyter_client import BlockingKernelClient, KernelManager
from jupyter_client.kernelspec import KernelSpecManager
from kernels import CELL_TIMEOUT, QUIET_ENV, CellResult, Kernel

from tfgpu_magic.gpus.processes import alive


STARTUP_TIMEOUT = 60.0
"""Seconds for a server to answer /api/status, or a kernel its first kernel_info request."""
HTTP_TIMEOUT = 30.0
STOP_TIMEOUT = 10.0
"""Seconds a process gets between SIGTERM and SIGKILL, and after SIGKILL."""
DROPPED_PREFIXES = ("JUPYTER", "JPY_", "TFGPU_MAGIC_")
DROPPED = {"IPYTHONDIR", "PYTHONSTARTUP", "KERNEL_ID"}
"""Variables of the calling environment that would point Jupyter or the kernel elsewhere."""

T = TypeVar("T")


def wait_until(condition: Callable[[], T], timeout: float, what: str, interval: float = 0.1) -> T:
    """Poll `condition` until it returns something true, and return that; `TimeoutError` naming
    `what` after `timeout` seconds. Exceptions from `condition` count as "not yet" (the last one
    is chained to the `TimeoutError`)."""
    deadline = time.monotonic() + timeout
    last_error: Exception | None = None
    while True:
        try:
            value = condition()
            if value:
                return value
        except Exception as err:  # noqa: BLE001 (a kernel that is restarting, a server that is starting)
            last_error = err
        if time.monotonic() > deadline:
            raise TimeoutError(f"not within {timeout:.0f} s: {what}") from last_error
        time.sleep(interval)


def pid_alive(pid: int) -> bool:
    """True while process `pid` exists and is not a zombie (a zombie has finished running)."""
    if not alive(pid):
        return False
    try:
        stat = Path(f"/proc/{pid}/stat").read_text(encoding="ascii")
    except FileNotFoundError:
        return False
    except OSError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def processes_naming(text: str) -> list[int]:
    """PIDs (other than ours) of live processes whose command line contains `text`."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if text in cmdline and pid_alive(int(entry.name)):
            found.append(int(entry.name))
    return found


def stop_pids(pids: list[int], timeout: float = STOP_TIMEOUT) -> None:
    """SIGTERM, then SIGKILL after `timeout`; raises `RuntimeError` if any of `pids` survives."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, sig)
        with contextlib.suppress(TimeoutError):
            wait_until(lambda: not any(_alive_reaping(pid) for pid in pids), timeout, "processes gone")
            return
    survivors = [pid for pid in pids if pid_alive(pid)]
    if survivors:
        raise RuntimeError(f"processes still running after SIGKILL: {survivors}")


def _alive_reaping(pid: int) -> bool:
    """`pid_alive`, reaping `pid` first if it is our own finished child."""
    with contextlib.suppress(ChildProcessError, OSError):
        os.waitpid(pid, os.WNOHANG)
    return pid_alive(pid)


@dataclass
class JupyterEnv:
    """Jupyter and IPython directories under `root`, and the environment that points at them."""

    root: Path
    environ: dict[str, str] = field(default_factory=dict)
    transcript: list[str] = field(default_factory=list)
    """Everything kernels printed into cells run through `KernelConnection.run`, in order."""
    connections: list[KernelConnection] = field(default_factory=list)

    @classmethod
    def create(cls, root: Path) -> JupyterEnv:
        """Make the directories and the `python3` kernelspec under `root`."""
        env = cls(root.resolve())
        for path in (env.runtime_dir, env.data_dir, env.config_dir, env.ipython_dir, env.home):
            path.mkdir(parents=True, exist_ok=True)
        inherited = {
            name: value
            for name, value in os.environ.items()
            if name not in DROPPED and not name.startswith(DROPPED_PREFIXES)
        }
        env.environ = {
            **inherited,
            **QUIET_ENV,
            "JUPYTER_RUNTIME_DIR": str(env.runtime_dir),
            "JUPYTER_DATA_DIR": str(env.data_dir),
            "JUPYTER_CONFIG_DIR": str(env.config_dir),
            "IPYTHONDIR": str(env.ipython_dir),
            "HOME": str(env.home),
            "PYDEVD_DISABLE_FILE_VALIDATION": "1",  # silences ipykernel's debugger warning
        }
        env.write_kernelspec("python3")
        return env

    @property
    def runtime_dir(self) -> Path:
        return self.root / "runtime"

    @property
    def data_dir(self) -> Path:
        return self.root / "data"

    @property
    def config_dir(self) -> Path:
        return self.root / "config"

    @property
    def ipython_dir(self) -> Path:
        return self.root / "ipython"

    @property
    def home(self) -> Path:
        return self.root / "home"

    @property
    def profile_dir(self) -> Path:
        """The IPython profile every kernel of this env uses."""
        return self.ipython_dir / "profile_default"

    @property
    def kernels_dir(self) -> Path:
        return self.data_dir / "kernels"

    def write_kernelspec(self, name: str, env: dict[str, str] | None = None, extra_argv: tuple[str, ...] = ()) -> Path:
        """A kernelspec `name` running `sys.executable` with `env` added to the kernel's environment."""
        spec = {
            "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}", *extra_argv],
            "display_name": f"tests: {name}",
            "language": "python",
            "env": env or {},
        }
        directory = self.kernels_dir / name
        directory.mkdir(parents=True, exist_ok=True)
        (directory / "kernel.json").write_text(json.dumps(spec, indent=1), encoding="utf-8")
        return directory

    def kernelspec_manager(self) -> KernelSpecManager:
        """Finds only this env's kernelspecs."""
        return KernelSpecManager(kernel_dirs=[str(self.kernels_dir)])

    def new_connection_file(self, naming: str = "server") -> Path | None:
        """A fresh connection file path named as `naming` (a key of `CONNECTION_NAMING`) names them;
        None for a temp name that jupyter_client picks itself."""
        return CONNECTION_NAMING[naming](self)

    def connect(self, connection_file: Path | str, timeout: float = STARTUP_TIMEOUT) -> KernelConnection:
        """A `KernelConnection` on `connection_file` once the kernel answers. The file is read again
        on every attempt: a manager may rewrite it with new ports while restarting."""
        path = Path(connection_file)

        def attempt() -> BlockingKernelClient | None:
            client = BlockingKernelClient(connection_file=str(path))
            client.load_connection_file()
            client.start_channels()
            try:
                client.wait_for_ready(timeout=5)
            except RuntimeError:
                client.stop_channels()
                return None
            return client

        client = wait_until(attempt, timeout, f"kernel answering on {path.name}", interval=0.05)
        connection = KernelConnection(client, path, self)
        self.connections.append(connection)
        return connection

    def processes(self) -> list[int]:
        """PIDs of live processes started for this env (their command line names its root)."""
        return processes_naming(str(self.root))

    def stop_processes(self) -> None:
        """Close every client, stop every process of this env; `RuntimeError` if one survives SIGKILL."""
        for connection in self.connections:
            connection.close()
        stop_pids(self.processes())


@contextlib.contextmanager
def isolated_jupyter(prefix: str = "tfgpu-jupyter-") -> Iterator[JupyterEnv]:
    """A `JupyterEnv` in a temporary directory; its processes are stopped and the directory removed."""
    with tempfile.TemporaryDirectory(prefix=prefix) as tmp:
        env = JupyterEnv.create(Path(tmp))
        try:
            yield env
        finally:
            env.stop_processes()


CONNECTION_NAMING: dict[str, Callable[[JupyterEnv], Path | None]] = {
    "server": lambda env: env.runtime_dir / f"kernel-{uuid.uuid4()}.json",
    "temp": lambda env: None,  # KernelManager() / start_new_kernel / nbclient / papermill: mkstemp's tmpXXXXXXXX.json
    "vscode": lambda env: env.runtime_dir / f"kernel-v2-{os.getpid()}{secrets.token_urlsafe(9)}.json",
}
"""How Jupyter servers, plain jupyter_client (nbclient, papermill) and VS Code name connection files."""


class KernelConnection(Kernel):
    """A blocking client on a kernel's connection file (server-owned or not)."""

    def __init__(self, client: BlockingKernelClient, connection_file: Path, env: JupyterEnv) -> None:
        super().__init__(manager=None, client=client)  # type: ignore[arg-type]  (run/evaluate use the client only)
        self.connection_file = connection_file
        self.env = env

    @property
    def kernel_id(self) -> str:
        return self.connection_file.stem.removeprefix("kernel-")

    def run(self, code: str, timeout: float = CELL_TIMEOUT) -> CellResult:
        """`Kernel.run`, recording the output in the env's transcript."""
        result = super().run(code, timeout)
        self.env.transcript.append(result.output)
        return result

    def pid(self, timeout: float = CELL_TIMEOUT) -> int:
        """The kernel's process id, asked from the kernel."""
        return self.evaluate("__import__('os').getpid()", timeout=timeout)

    def close(self) -> None:
        self.client.stop_channels()


def await_new_kernel(connection: KernelConnection, old_pid: int, timeout: float = STARTUP_TIMEOUT) -> KernelConnection:
    """After a restart was asked for: wait until process `old_pid` is gone, then connect to the new
    kernel on the same connection file. `connection` is closed; the new one is returned."""
    wait_until(lambda: not pid_alive(old_pid), timeout, f"old kernel {old_pid} gone", interval=0.02)
    connection.close()
    return connection.env.connect(connection.connection_file, timeout)


@dataclass
class JupyterServer:
    """A running Jupyter server and a small REST client for it."""

    env: JupyterEnv
    process: subprocess.Popen
    url: str
    token: str
    log: Path

    def request(self, method: str, path: str, body: dict[str, Any] | None = None, timeout: float = HTTP_TIMEOUT) -> Any:
        """An authenticated request; the decoded JSON reply, None when empty. HTTP errors raise."""
        request = urllib.request.Request(
            self.url.rstrip("/") + "/" + path.lstrip("/"),
            method=method,
            data=json.dumps(body or {}).encode() if method in ("POST", "PATCH", "PUT") else None,
            headers={"Authorization": f"token {self.token}", "Content-Type": "application/json"},
        )
        context = None
        if self.url.startswith("https:"):
            import ssl

            context = ssl._create_unverified_context()  # noqa: S323 (our own self-signed test server)
        with urllib.request.urlopen(request, timeout=timeout, context=context) as reply:  # noqa: S310 (local URL)
            data = reply.read()
        return json.loads(data) if data else None

    def create_kernel(self, name: str = "python3") -> str:
        """Start a kernel from kernelspec `name`; its id."""
        return self.request("POST", "api/kernels", {"name": name})["id"]

    def restart_kernel(self, kernel_id: str) -> dict[str, Any]:
        """Restart through the API; returns once the server has a new kernel process running."""
        return self.request("POST", f"api/kernels/{kernel_id}/restart")

    def delete_kernel(self, kernel_id: str) -> None:
        self.request("DELETE", f"api/kernels/{kernel_id}")

    def kernels(self) -> list[dict[str, Any]]:
        return self.request("GET", "api/kernels")

    def kernelspecs(self) -> dict[str, Any]:
        return self.request("GET", "api/kernelspecs")["kernelspecs"]

    def connection_file(self, kernel_id: str) -> Path:
        return self.env.runtime_dir / f"kernel-{kernel_id}.json"

    def connect(self, kernel_id: str, timeout: float = STARTUP_TIMEOUT) -> KernelConnection:
        """A client on kernel `kernel_id` once it answers."""
        path = self.connection_file(kernel_id)
        wait_until(path.exists, timeout, f"connection file of kernel {kernel_id}", interval=0.05)
        return self.env.connect(path, timeout)

    @contextlib.contextmanager
    def kernel(self, name: str = "python3") -> Iterator[KernelConnection]:
        """A new kernel of this server and a client on it; deleted afterwards (stopped by PID if
        deleting fails)."""
        kernel_id = self.create_kernel(name)
        connection = None
        try:
            connection = self.connect(kernel_id)
            yield connection
        finally:
            if connection is not None:
                connection.close()
            with contextlib.suppress(OSError):
                self.delete_kernel(kernel_id)
            stop_pids(processes_naming(str(self.connection_file(kernel_id))))

    def log_tail(self, lines: int = 40) -> str:
        with contextlib.suppress(OSError):
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        return ""

    def stop(self) -> None:
        """SIGTERM the server (it shuts its kernels down), then stop whatever of the env is left."""
        try:
            stop_pids([self.process.pid])
        finally:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(timeout=STOP_TIMEOUT)
            self.env.stop_processes()


@contextlib.contextmanager
def running_server(
    env: JupyterEnv, app: str = "jupyter_server", extra_args: tuple[str, ...] = (), timeout: float = STARTUP_TIMEOUT,
    certificate: tuple[Path, Path] | None = None, python: Path | str = sys.executable,
) -> Iterator[JupyterServer]:
    """`python -m {app}` on 127.0.0.1 (free port, random token, root dir `env.root`) until it answers
    /api/status; stopped, with every kernel it started, on exit. `app="jupyterlab"` gives JupyterLab;
    `certificate` (cert, key files) makes it serve https; `python` is another environment's interpreter."""
    token = secrets.token_hex(24)
    port = free_port()
    log = env.root / f"{app}-{port}.log"
    argv = [
        str(python), "-m", app, "--no-browser", "--ip=127.0.0.1", f"--port={port}",
        "--ServerApp.port_retries=0", f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={env.root}",
    ]  # fmt: skip
    if certificate is not None:
        argv += [f"--ServerApp.certfile={certificate[0]}", f"--ServerApp.keyfile={certificate[1]}"]
    if os.geteuid() == 0:
        argv.append("--allow-root")
    with open(log, "wb") as log_file:
        process = subprocess.Popen(
            [*argv, *extra_args], env=env.environ, cwd=env.root, stdin=subprocess.DEVNULL,
            stdout=log_file, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    scheme = "https" if certificate is not None else "http"
    server = JupyterServer(env, process, f"{scheme}://127.0.0.1:{port}/", token, log)
    try:

        def answering() -> bool:
            if process.poll() is not None:
                raise RuntimeError(f"{app} exited with {process.returncode}:\n{server.log_tail()}")
            return server.request("GET", "api/status", timeout=2) is not None

        try:
            wait_until(answering, timeout, f"{app} answering on port {port}", interval=0.1)
        except TimeoutError as err:
            raise TimeoutError(f"{err}\n{server.log_tail()}") from err.__cause__
        yield server
    finally:
        server.stop()


@contextlib.contextmanager
def standalone_kernel(
    env: JupyterEnv, extra_env: dict[str, str] | None = None, kernel_name: str = "python3", naming: str = "server",
    connection_file: Path | None = None,
) -> Iterator[KernelConnection]:
    """A kernel started by a plain `KernelManager`: no server, no autorestart (what nbclient does),
    its connection file named as `naming` says (`CONNECTION_NAMING`), or `connection_file`. The
    connection's `manager` is that `KernelManager` (`manager.restart_kernel()` is what a front
    end's restart does)."""
    chosen = connection_file or env.new_connection_file(naming)
    manager = KernelManager(kernel_name=kernel_name, kernel_spec_manager=env.kernelspec_manager())
    if chosen is not None:
        manager.connection_file = str(chosen)
    connection = None
    with open(env.root / f"kernel-{uuid.uuid4().hex[:8]}.log", "ab") as log:
        manager.start_kernel(env={**env.environ, **(extra_env or {})}, cwd=str(env.root), stdout=log, stderr=log)
        try:
            connection = env.connect(manager.connection_file)
            connection.manager = manager
            yield connection
        finally:
            if connection is not None:
                connection.close()
            with contextlib.suppress(Exception):  # the kernel may be gone already; PIDs are checked below
                manager.shutdown_kernel(now=True)
            manager.cleanup_resources()
            stop_pids(processes_naming(manager.connection_file))


class RestartingManager:
    """An `AsyncIOLoopKernelManager` with autorestart, on an event loop in a daemon thread.

    `start()` launches the kernel and the restarter; `close()` always undoes whatever was started."""

    def __init__(
        self, env: JupyterEnv, extra_env: dict[str, str], time_to_dead: float, stable_start_time: float,
        naming: str = "server",
    ) -> None:  # fmt: skip
        self.env = env
        self.extra_env = extra_env
        self.config = {"KernelRestarter": {"time_to_dead": time_to_dead, "stable_start_time": stable_start_time}}
        self.connection_file = env.new_connection_file(naming)
        """None until started when jupyter_client picks a temp name."""
        self.restarts = 0
        """How often the restarter brought the kernel back."""
        self.manager: Any = None
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="restarting-manager", daemon=True)
        self.log = open(env.root / f"restarting-{uuid.uuid4().hex[:8]}.log", "ab")  # noqa: SIM115 (restarted kernels reuse it)

    def start(self) -> None:
        from jupyter_client.ioloop import AsyncIOLoopKernelManager
        from traitlets.config import Config

        async def start() -> Any:
            manager = AsyncIOLoopKernelManager(
                kernel_name="python3",
                kernel_spec_manager=self.env.kernelspec_manager(),
                autorestart=True,
                config=Config(self.config),
            )
            if self.connection_file is not None:
                manager.connection_file = str(self.connection_file)
            self.manager = manager
            await manager.start_kernel(
                env={**self.env.environ, **self.extra_env}, cwd=str(self.env.root), stdout=self.log, stderr=self.log
            )
            self.connection_file = Path(manager.connection_file)
            manager.start_restarter()  # on this loop: the restarter polls with a tornado PeriodicCallback
            manager.add_restart_callback(self._count_restart)

        self.thread.start()
        self.call(start)

    def _count_restart(self) -> None:
        self.restarts += 1

    def call(self, coroutine: Callable[[], Any], timeout: float = STARTUP_TIMEOUT) -> Any:
        """Run `coroutine()` on the manager's loop and wait for its result."""
        return asyncio.run_coroutine_threadsafe(coroutine(), self.loop).result(timeout)

    def close(self) -> None:
        """Stop the restarter, shut the kernel down, stop the loop; stop leftovers by PID."""

        async def stop() -> None:
            if self.manager is not None:
                self.manager.stop_restarter()
                with contextlib.suppress(Exception):
                    await self.manager.shutdown_kernel(now=True)

        try:
            if self.thread.is_alive():
                self.call(stop, timeout=STOP_TIMEOUT * 2)
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(STOP_TIMEOUT)
            self.log.close()
            if self.connection_file is not None:
                stop_pids(processes_naming(str(self.connection_file)))


@contextlib.contextmanager
def restarting_kernel(
    env: JupyterEnv,
    extra_env: dict[str, str] | None = None,
    time_to_dead: float = 0.5,
    stable_start_time: float = 10.0,
    naming: str = "server",
) -> Iterator[tuple[RestartingManager, KernelConnection]]:
    """A kernel that its manager restarts when it dies (checked every `time_to_dead` s), no server.
    `extra_env` is added to the kernel's environment; `naming` as in `standalone_kernel`."""
    manager = RestartingManager(env, extra_env or {}, time_to_dead, stable_start_time, naming)
    connection = None
    try:
        manager.start()
        connection = env.connect(manager.connection_file)
        yield manager, connection
    finally:
        if connection is not None:
            connection.close()
        manager.close()


# ----- stand-ins on loopback: recording listeners, jpserver files, certificates ------------------
@dataclass
class Recorded:
    """One request a `RecordingListener` received."""

    method: str
    path: str
    headers: dict[str, str]


class RecordingListener:
    """An HTTP server on `host` (127.0.0.1, or ::1; a thread of this process) that records every request
    and answers each with `reply(method, path)` → (status, headers, body). Use as a context manager."""

    def __init__(
        self, reply: Callable[[str, str], tuple[int, dict[str, str], bytes]] | None = None, host: str = "127.0.0.1"
    ) -> None:
        import socket
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        self.requests: list[Recorded] = []
        self.reply = reply or (lambda method, path: (200, {"Content-Type": "application/json"}, b"{}"))
        listener = self

        class Handler(BaseHTTPRequestHandler):
            def answer(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                if length:
                    self.rfile.read(length)
                listener.requests.append(Recorded(self.command, self.path, dict(self.headers.items())))
                status, headers, body = listener.reply(self.command, self.path)
                self.send_response(status)
                for name, value in headers.items():
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_GET = do_POST = do_CONNECT = answer  # noqa: N815 (http.server's names)

            def log_message(self, *args: Any) -> None:
                pass

        class Server(ThreadingHTTPServer):
            address_family = socket.AF_INET6 if ":" in host else socket.AF_INET

        self.server = Server((host, 0), Handler)
        self.port = self.server.server_address[1]
        self.url = f"http://{f'[{host}]' if ':' in host else host}:{self.port}/"
        self.thread = threading.Thread(target=self.server.serve_forever, name="recording-listener", daemon=True)

    def __enter__(self) -> RecordingListener:
        self.thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(STOP_TIMEOUT)

    def carrying(self, secret: str) -> list[Recorded]:
        """The requests in which `secret` appears anywhere (path or any header)."""
        return [r for r in self.requests if secret in r.path or any(secret in v for v in r.headers.values())]


def write_server_file(runtime_dir: Path, pid: int, port: int, token: str, **fields: Any) -> Path:
    """A `jpserver-<pid>.json` as jupyter_server writes it (mode 0600), for a server on 127.0.0.1."""
    info = {
        "url": f"http://127.0.0.1:{port}/", "hostname": "127.0.0.1", "port": port, "sock": "", "secure": False,
        "base_url": "/", "token": token, "root_dir": str(runtime_dir), "password": False, "pid": pid,
        "version": "2.0.0", **fields,
    }  # fmt: skip
    path = runtime_dir / f"jpserver-{pid}.json"
    path.write_text(json.dumps(info), encoding="utf-8")
    path.chmod(0o600)
    return path


def dead_pid() -> int:
    """The pid of a process that has finished (and been reaped)."""
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    process.wait(STOP_TIMEOUT)
    return process.pid


def self_signed_cert(directory: Path) -> tuple[Path, Path] | None:
    """(certificate, key) for 127.0.0.1, self-signed, made with the `openssl` command line; None
    where there is no `openssl`."""
    import shutil

    if shutil.which("openssl") is None:
        return None
    cert, key = directory / "cert.pem", directory / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(cert),
         "-days", "1", "-subj", "/CN=127.0.0.1"],
        check=True, capture_output=True, timeout=60,
    )  # fmt: skip
    return cert, key


NO_RESTART_SCHEDULED = (
    "not any(t.name == 'tfgpu_magic-restart' for t in __import__('threading').enumerate())"
    " and not any(getattr(f, '__qualname__', '').startswith('on_next.')"
    " for f in get_ipython().events.callbacks['post_execute'])"
)
"""In a kernel: no thread is asking for a restart (`restart.RESTART_THREAD`) and no end-of-cell
callback will start one."""
KEPT_WINDOW = 1.0
"""Seconds within which a restart that was asked for would have begun (asked 0.05 s after the cell)."""


def assert_kernel_kept(kernel: KernelConnection, pid: int) -> None:
    """`kernel` was not restarted and will not be: nothing in it is set to ask for a restart, and
    process `pid` keeps answering through a bounded poll (failing at once if it goes)."""
    assert kernel.evaluate(NO_RESTART_SCHEDULED), "a restart is scheduled"
    deadline = time.monotonic() + KEPT_WINDOW
    while time.monotonic() < deadline:
        assert pid_alive(pid), f"kernel {pid} went away"
        time.sleep(0.05)
    assert kernel.pid() == pid
