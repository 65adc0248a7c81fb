"""`GET /api/tfgpu/gpus`, `GET /api/tfgpu/kernels/<kernel_id>` and `POST /api/tfgpu/kernels/<kernel_id>/keep`,
on jupyter_server's `APIHandler`.

The server's own authentication and authorization apply (`@web.authenticated`: a request without it
gets 403; `@authorized` on the `kernels` resource, so a server's Authorizer decides as it does for
`/api/kernels`; a POST is XSRF-checked as the server checks its own); there is no token of ours.
NVML is read in a daemon thread of its own, one read at a time, each bounded by `gpus.inventory`'s
deadline, and that read serves every request for `cache_seconds`; the kernels' state files and /proc
likewise, separately: the kernel endpoint never waits on NVML (a wedged driver leaves it fast), and
no thread of ours keeps the server from exiting. The kernels' memory history (`history`) is sampled from
those same readings by `Sampler`, on the event loop, and the kernel endpoint sends what is new after
`?since=`. Every reply that is not 200 is the schema's `$defs/error` (a code the browser words, and
English for logs); a client that sends another schema version (`x-version-header`) gets a 409
`version_mismatch` naming both. Each reply carries its handler time in a `Server-Timing` header
(https://www.w3.org/TR/server-timing/), which `benchmarks/bench_serverext.py` reads.
"""

from __future__ import annotations

import asyncio
import math
import threading
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Awaitable, Callable, TypeVar

from jupyter_server.auth.decorator import authorized
from jupyter_server.base.handlers import APIHandler
from jupyter_server.utils import url_path_join
from tornado import web
from tornado.ioloop import PeriodicCallback
from traitlets import Float
from traitlets.config import LoggingConfigurable

from .. import safefile
from ..errors import PolicyError
from ..gpus import processes
from ..gpus.inventory import Inventory, read_inventory
from ..jupyter import kernelstate, persist
from ..jupyter.sessions import KernelSession
from .gather import (KEEP_STAMP, KernelProcess, Machine, Owner, TensorFlowSeen, gpus_reply, kernel_reply,
                     memory_figures, own_sessions, owners, read_kernel, read_kernels, server_grant)
from .history import SAMPLE_SECONDS, SAMPLES, History

SETTINGS_KEY = "tfgpu_readings"
"""Where the handlers find the shared `Readings` in the tornado application's settings."""
FIRST_READ_WAIT = 0.2
"""Seconds the kernel endpoint waits for the server's very first NVML reading (never for a later one)."""

UNKNOWN_KERNEL, BAD_SINCE, POLICY_REFUSED, KEEP_FAILED, VERSION_MISMATCH, FORBIDDEN, SERVER_ERROR = (
    "unknown_kernel", "bad_since", "policy_refused", "keep_failed", "version_mismatch", "forbidden", "server_error")
"""The `$defs/errorCode`s the handlers answer with (with `kernelstate`'s for a state file refused)."""

T = TypeVar("T")


class ReplyError(web.HTTPError):
    """A refusal whose body is `$defs/error`: `code` says what (the browser words it), `message` in English."""

    def __init__(self, status: int, code: str, message: str, **fields: Any) -> None:
        super().__init__(status, "%s", message)
        self.body = {"code": code, "message": message[:1000], **fields}


def in_daemon_thread(function: Callable[..., T], *args: Any) -> Awaitable[T]:
    """`function(*args)` in a daemon thread of its own: unlike the loop's default executor, whose
    threads are joined at exit, a call stuck in a driver never keeps the server from stopping."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[T] = loop.create_future()

    def run() -> None:
        try:
            result = function(*args)
        except BaseException as err:  # handed to the awaiting request, which reports it
            loop.call_soon_threadsafe(_settle, future, None, err)
        else:
            loop.call_soon_threadsafe(_settle, future, result, None)

    threading.Thread(target=run, name="tfgpu_magic-read", daemon=True).start()
    return future


def _settle(future: asyncio.Future[Any], result: Any, error: BaseException | None) -> None:
    if future.cancelled():
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)


class TFGPUServer(LoggingConfigurable):
    """Settings of the server extension (`c.TFGPUServer.cache_seconds = 2` in jupyter_server_config.py)."""

    cache_seconds = Float(
        1.0, help="How long one read of NVML, or of /proc and the kernels' state files, answers requests, in seconds."
    ).tag(config=True)
    history_seconds = Float(
        SAMPLE_SECONDS, min=0.1, help="Seconds between two samples of a busy kernel's GPU memory (its history "
        f"keeps the last {SAMPLES} samples)."
    ).tag(config=True)


class Cached:
    """One value read off the event loop, shared by every request while younger than `max_age`; at
    most one read in flight (requests meanwhile share it, or take the last value)."""

    def __init__(self, read: Callable[[], Awaitable[Any]], max_age: float) -> None:
        self.read = read
        self.max_age = max_age
        self.value: Any = None
        self.taken = -math.inf
        self.reading: asyncio.Task[Any] | None = None

    def _start(self) -> asyncio.Task[Any]:
        if self.reading is None:
            self.reading = asyncio.ensure_future(self._read())
        return self.reading

    async def _read(self) -> Any:
        try:
            self.value = await self.read()
            self.taken = time.monotonic()
            return self.value
        finally:
            self.reading = None

    async def get(self) -> Any:
        """The value, waiting for a read when it is older than `max_age`."""
        if time.monotonic() - self.taken > self.max_age:
            await asyncio.shield(self._start())
        return self.value

    async def latest(self, first_wait: float) -> Any:
        """The last value without waiting for a new one (a read starts if it is old); only before the
        first value ever, up to `first_wait` seconds for it (None if it has not come)."""
        if time.monotonic() - self.taken > self.max_age:
            reading = self._start()
            if self.taken == -math.inf:
                try:
                    await asyncio.wait_for(asyncio.shield(reading), first_wait)
                except asyncio.TimeoutError:
                    pass
        return self.value


class Readings:
    """The last NVML reading and the last read of this server's kernels, each shared by every request."""

    def __init__(self, serverapp: Any, cache_seconds: float, history_seconds: float = SAMPLE_SECONDS) -> None:
        self.serverapp = serverapp
        self.history = History(history_seconds)
        """Each kernel's memory over time, sampled by `Sampler` from these readings."""
        self.seen = TensorFlowSeen()
        self.nvml = Cached(self._read_machine, cache_seconds)
        self.kernels = Cached(self._read_kernels, cache_seconds)
        self._owners: tuple[Machine, dict[str, KernelProcess], dict[int, Owner]] | None = None

    @property
    def runtime_dir(self) -> Path:
        return Path(self.serverapp.kernel_manager.connection_dir)

    async def _read_machine(self) -> Machine:
        inventory: Inventory = await in_daemon_thread(read_inventory)
        grant = await in_daemon_thread(server_grant, inventory)  # it may ask the CUDA driver in a child process
        return Machine(inventory, host_pids=processes.foreign_pid_namespace() is True, grant=grant)

    async def _read_kernels(self) -> dict[str, KernelProcess]:
        manager = self.serverapp.kernel_manager
        pids = {model["id"]: started_pid(manager, model["id"]) for model in manager.list_kernels()}
        return await in_daemon_thread(read_kernels, pids, self.runtime_dir, self.seen)

    async def owners(self, machine: Machine, kernels: dict[str, KernelProcess]) -> dict[int, Owner]:
        """The owners of the other processes on the cards (`gather.owners`: /proc and the user database),
        read in a thread once per NVML reading and read of the kernels, not once per request; none where
        NVML's pids are the host's."""
        if machine.host_pids:
            return {}
        if self._owners is None or self._owners[0] is not machine or self._owners[1] is not kernels:
            self._owners = (machine, kernels, await in_daemon_thread(owners, machine.inventory, kernels))
        return self._owners[2]

    async def sessions(self) -> dict[str, KernelSession]:
        """This server's kernels' notebooks and states, from its own models (never stale)."""
        kernels = self.serverapp.kernel_manager.list_kernels()
        return own_sessions(kernels, await self.serverapp.session_manager.list_sessions())

    async def kernel(self, kernel_id: str) -> KernelProcess:
        """Kernel `kernel_id` read now: its state file and /proc alone, whatever the other kernels hold."""
        started = started_pid(self.serverapp.kernel_manager, kernel_id)
        return await in_daemon_thread(read_kernel, kernel_id, started, self.runtime_dir, self.seen)


class Sampler:
    """Takes the memory history's samples (`history.History`) every `interval` seconds, on the event loop.

    It reads nothing of its own: its NVML reading and its read of the kernels' state files are the
    shared ones the endpoints use (`Readings.nvml`, `Readings.kernels`: one read per `cache_seconds`
    serves the requests and the history alike). It asks for a read only while something may change a
    kernel's memory: a kernel is busy (the server's own model, from its status messages: no read), was
    busy at its last sample, or is new. For `history.SETTLE_SECONDS` after a kernel's last busy sample,
    and while its last cell has no end for up to `history.OPEN_CELL_SECONDS`, it reads the kernels'
    states alone (the kernel publishes a cell's end with its next look). Otherwise
    nothing changes (an idle kernel runs no cell; what a thread of its own allocates meanwhile is seen
    with the next reading), and when no client asked for a reading either (a newer one than the last
    sample), a tick reads nothing at all."""

    def __init__(self, serverapp: Any, readings: Readings) -> None:
        self.serverapp = serverapp
        self.readings = readings
        self.sampled: Machine | None = None
        """The NVML reading of the last samples: a client's newer one is sampled without a read."""
        self.failed = False

    async def tick(self) -> bool:
        """One round of samples; True when it took any (every kernel was looked at)."""
        try:
            return await self._tick()
        except Exception:  # one bad round costs its samples, never the server or the next round
            if not self.failed:
                self.serverapp.log.exception("tfgpu_magic: a round of memory samples failed")
                self.failed = True
            return False

    async def _tick(self) -> bool:
        history = self.readings.history
        models = self.serverapp.kernel_manager.list_kernels()
        ids = {model["id"] for model in models}
        busy = {model["id"] for model in models if model.get("execution_state") == "busy"}
        history.keep_only(ids)
        now = time.time()
        if history.wants_reading(ids, busy):
            machine, kernels = await asyncio.gather(self.readings.nvml.get(), self.readings.kernels.get())
        elif history.settling(ids, now):  # the states only, for the ends of cells: NVML is not read
            machine, kernels = self.readings.nvml.value, await self.readings.kernels.get()
        elif self.readings.nvml.value is not self.sampled and self.readings.kernels.value is not None:
            machine, kernels = self.readings.nvml.value, self.readings.kernels.value  # a client's reading
        else:
            return False
        self.sampled = machine
        for kernel_id in ids & kernels.keys():
            kernel = kernels[kernel_id]
            cells = kernel.state.get("cells", ()) if kernel.state is not None else ()
            figures = memory_figures(kernel, machine) if machine is not None else None
            history.record(kernel_id, now, figures, cells, kernel_id in busy)
        return True

    def start(self) -> PeriodicCallback:
        """Tick every `interval` seconds once the server's loop runs (the loop stops it with the server)."""
        periodic = PeriodicCallback(self.tick, self.readings.history.interval * 1000)
        self.serverapp.io_loop.add_callback(periodic.start)
        return periodic


def started_pid(kernel_manager: Any, kernel_id: str) -> int | None:
    """The pid the kernel's provisioner started (jupyter_client's `LocalProvisioner.pid`); None for a
    kernel that is gone or runs elsewhere (a remote provisioner)."""
    try:
        pid = getattr(kernel_manager.get_kernel(kernel_id).provisioner, "pid", None)
    except KeyError:
        return None
    return pid if isinstance(pid, int) else None


class TFGPUHandler(APIHandler):
    """Shared by the handlers: the readings, and a JSON reply with its handler time."""

    auth_resource = "kernels"

    @property
    def readings(self) -> Readings:
        return self.settings[SETTINGS_KEY]

    def reply(self, body: dict[str, Any], started: float) -> None:
        self.set_header("Server-Timing", f"tfgpu;dur={(time.perf_counter() - started) * 1000:.3f}")
        self.finish(safefile.dumps(body))

    def known(self, kernel_id: str) -> None:
        """404 `unknown_kernel` for a kernel this server does not run; 409 for a client of another version."""
        self.same_version()
        if kernel_id not in self.kernel_manager:
            raise ReplyError(404, UNKNOWN_KERNEL, f"this server has no kernel {kernel_id}")

    def same_version(self) -> None:
        """409 `version_mismatch` where the client says it speaks another version of the schema (a
        client that says nothing is answered: it compares a reply's `format` and `version` itself)."""
        given = self.request.headers.get(kernelstate.contract()["x-version-header"])
        ours = kernelstate.schema_version()
        if given is not None and given.strip() != str(ours):
            said = given.strip()
            client = int(said) if said.isascii() and said.isdigit() and len(said) <= 9 else None  # "²" is a digit too
            raise ReplyError(409, VERSION_MISMATCH, f"the client speaks version {given[:20]!r} of tfgpu_magic's "
                             f"schema, this server {ours}", server_version=ours, client_version=client)

    def write_error(self, status_code: int, **kwargs: Any) -> None:
        """Every error reply as `$defs/error` (jupyter_server's `APIHandler` writes `message` and `reason` only)."""
        error = kwargs.get("exc_info", (None, None, None))[1]
        if isinstance(error, ReplyError):
            body = error.body
        else:
            message = error.log_message if isinstance(error, web.HTTPError) and error.log_message else self._reason
            body = {"code": FORBIDDEN if status_code == 403 else SERVER_ERROR, "message": str(message)[:1000]}
        self.set_header("Content-Type", "application/json")
        self.finish(safefile.dumps(body))


class GpusHandler(TFGPUHandler):
    @web.authenticated
    @authorized
    async def get(self) -> None:
        started = time.perf_counter()
        self.same_version()
        machine, kernels = await asyncio.gather(self.readings.nvml.get(), self.readings.kernels.get())
        sessions = await self.readings.sessions()
        others = await self.readings.owners(machine, kernels)
        self.reply(gpus_reply(machine, kernels, others, sessions, datetime.now(timezone.utc)), started)


class KernelHandler(TFGPUHandler):
    @web.authenticated
    @authorized
    async def get(self, kernel_id: str) -> None:
        started = time.perf_counter()
        self.known(kernel_id)
        since = self.since()
        machine = await self.readings.nvml.latest(FIRST_READ_WAIT) or Machine(None)
        kernel = await self.readings.kernel(kernel_id)
        sessions = await self.readings.sessions()
        memory = self.readings.history.reply(kernel_id, since)
        self.reply(kernel_reply(kernel, machine, sessions.get(kernel_id), datetime.now(timezone.utc), memory), started)

    def since(self) -> float | None:
        """`?since=`: a reply's `history.next_since` (a finite number); 400 for anything else."""
        given = self.get_query_argument("since", None)
        if given is None:
            return None
        try:
            since = float(given)
        except ValueError:
            since = math.nan
        if not math.isfinite(since):
            raise ReplyError(400, BAD_SINCE, "since must be a number: the history's next_since from the last reply")
        return since


class KeepHandler(TFGPUHandler):
    """Store the policy kernel `kernel_id` published for the next kernel on its connection file, as
    `%tfgpu restart` stores it from inside: the labextension's restart command asks this just before it
    restarts, so a busy or hung kernel is never asked anything. A state file it cannot use (its code:
    `kernelstate.StateInvalid.code`), a policy in it that the policy's rules refuse (`policy_refused`),
    or a store that fails (`keep_failed`) is a 409 with the reason."""

    @web.authenticated
    @authorized
    async def post(self, kernel_id: str) -> None:
        started = time.perf_counter()
        self.known(kernel_id)
        connection = Path(self.kernel_manager.get_kernel(kernel_id).connection_file)
        kernel = await in_daemon_thread(read_kernel, kernel_id, None, connection.parent, TensorFlowSeen())
        if kernel.invalid is not None:
            raise ReplyError(409, kernel.invalid_code, f"kernel {kernel_id}'s state file is not usable: {kernel.invalid}")
        if kernel.state is None or not kernel.state["keep"]:
            self.reply({**KEEP_STAMP, "kept": False}, started)
            return
        try:  # a state the schema accepts may hold a policy its rules refuse: a conflict, like a file refused
            policy = kernelstate.policy_from_record(kernel.state["policy"])
        except PolicyError as err:
            raise ReplyError(409, POLICY_REFUSED, f"the policy could not be kept: {err}") from None
        try:
            await in_daemon_thread(persist.store_pending, kernel_id, policy, connection, connection.parent)
        except (OSError, PolicyError) as err:
            raise ReplyError(409, KEEP_FAILED, f"the policy could not be kept: {err}") from None
        self.reply({**KEEP_STAMP, "kept": True}, started)


def setup_handlers(serverapp: Any) -> None:
    """Register the handlers under the server's base URL."""
    web_app = serverapp.web_app
    settings = TFGPUServer(parent=serverapp)
    readings = web_app.settings[SETTINGS_KEY] = Readings(serverapp, settings.cache_seconds, settings.history_seconds)
    Sampler(serverapp, readings).start()
    base = web_app.settings["base_url"]
    kernel = r"api/tfgpu/kernels/(?P<kernel_id>[\w-]+)"
    web_app.add_handlers(".*$", [
        (url_path_join(base, "api/tfgpu/gpus"), GpusHandler),
        (url_path_join(base, kernel), KernelHandler),
        (url_path_join(base, kernel, "keep"), KeepHandler),
    ])
