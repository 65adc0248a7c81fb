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
  kernel printed in `env.transcript`; `await_new_kernel()` follows a kernel through a restart.

Cleanup is by PID and always happens, failures included: when the env closes, every process whose
command line names the env's root (the server, its kernels, helpers started with a kernel's
connection file) is terminated, then killed, and checked gone with `os.kill(pid, 0)`.
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
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
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

    def new_connection_file(self) -> Path:
        """A fresh `kernel-<id>.json` path in the runtime dir, named the way Jupyter names them."""
        return self.runtime_dir / f"kernel-{uuid.uuid4()}.json"

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

    def kernel_log(self, connection_file: Path | str) -> Path:
        """Where a kernel started without a server writes its own stdout and stderr."""
        return self.root / (Path(connection_file).stem + ".log")

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
        with urllib.request.urlopen(request, timeout=timeout) as reply:  # noqa: S310 (local URL)
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
    env: JupyterEnv, app: str = "jupyter_server", extra_args: tuple[str, ...] = (), timeout: float = STARTUP_TIMEOUT
) -> Iterator[JupyterServer]:
    """`python -m {app}` on 127.0.0.1 (free port, random token, root dir `env.root`) until it answers
    /api/status; stopped, with every kernel it started, on exit. `app="jupyterlab"` gives JupyterLab."""
    token = secrets.token_hex(24)
    port = free_port()
    log = env.root / f"{app}-{port}.log"
    argv = [
        sys.executable, "-m", app, "--no-browser", "--ip=127.0.0.1", f"--port={port}",
        "--ServerApp.port_retries=0", f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={env.root}",
    ]  # fmt: skip
    if os.geteuid() == 0:
        argv.append("--allow-root")
    with open(log, "wb") as log_file:
        process = subprocess.Popen(
            [*argv, *extra_args], env=env.environ, cwd=env.root, stdin=subprocess.DEVNULL,
            stdout=log_file, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    server = JupyterServer(env, process, f"http://127.0.0.1:{port}/", token, log)
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
    env: JupyterEnv, extra_env: dict[str, str] | None = None, kernel_name: str = "python3"
) -> Iterator[KernelConnection]:
    """A kernel started by a plain `KernelManager`: no server, no autorestart (what nbclient does)."""
    manager = KernelManager(
        kernel_name=kernel_name,
        kernel_spec_manager=env.kernelspec_manager(),
        connection_file=str(env.new_connection_file()),
    )
    connection = None
    with open(env.kernel_log(manager.connection_file), "ab") as log:
        manager.start_kernel(env={**env.environ, **(extra_env or {})}, cwd=str(env.root), stdout=log, stderr=log)
        try:
            connection = env.connect(manager.connection_file)
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
        self, env: JupyterEnv, extra_env: dict[str, str], time_to_dead: float, stable_start_time: float
    ) -> None:
        self.env = env
        self.extra_env = extra_env
        self.config = {"KernelRestarter": {"time_to_dead": time_to_dead, "stable_start_time": stable_start_time}}
        self.connection_file = env.new_connection_file()
        self.restarts = 0
        """How often the restarter brought the kernel back."""
        self.manager: Any = None
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="restarting-manager", daemon=True)
        self.log = open(env.kernel_log(self.connection_file), "ab")  # noqa: SIM115 (restarted kernels reuse it)

    def start(self) -> None:
        from jupyter_client.ioloop import AsyncIOLoopKernelManager
        from traitlets.config import Config

        async def start() -> Any:
            manager = AsyncIOLoopKernelManager(
                kernel_name="python3",
                kernel_spec_manager=self.env.kernelspec_manager(),
                connection_file=str(self.connection_file),
                autorestart=True,
                config=Config(self.config),
            )
            self.manager = manager
            await manager.start_kernel(
                env={**self.env.environ, **self.extra_env}, cwd=str(self.env.root), stdout=self.log, stderr=self.log
            )
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
            stop_pids(processes_naming(str(self.connection_file)))


@contextlib.contextmanager
def restarting_kernel(
    env: JupyterEnv,
    extra_env: dict[str, str] | None = None,
    time_to_dead: float = 0.5,
    stable_start_time: float = 10.0,
) -> Iterator[tuple[RestartingManager, KernelConnection]]:
    """A kernel that its manager restarts when it dies (checked every `time_to_dead` s), no server.
    `extra_env` is added to the kernel's environment."""
    manager = RestartingManager(env, extra_env or {}, time_to_dead, stable_start_time)
    connection = None
    try:
        manager.start()
        connection = env.connect(manager.connection_file)
        yield manager, connection
    finally:
        if connection is not None:
            connection.close()
        manager.close()
