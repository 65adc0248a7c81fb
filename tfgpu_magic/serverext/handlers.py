"""`GET /api/tfgpu/gpus` and `GET /api/tfgpu/kernels/<kernel_id>`, on jupyter_server's `APIHandler`.

The server's own authentication and authorization apply (`@web.authenticated`: a request without
it gets 403; `@authorized` on the `kernels` resource, so a server's Authorizer decides as it does for
`/api/kernels`); there is no token of ours. NVML, /proc and the kernels' state files are read in a
worker thread, one read at a time, and that read serves every request for `cache_seconds`: many
tabs polling cost one read per period. Each reply carries its handler time in a `Server-Timing`
header (https://www.w3.org/TR/server-timing/), which `benchmarks/bench_serverext.py` reads.
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from jupyter_server.auth.decorator import authorized
from jupyter_server.base.handlers import APIHandler
from jupyter_server.utils import url_path_join
from tornado import web
from traitlets import Float
from traitlets.config import LoggingConfigurable

from ..jupyter.sessions import KernelSession
from .gather import Reading, TensorFlowSeen, gpus_reply, kernel_reply, own_sessions, read_machine

SETTINGS_KEY = "tfgpu_readings"
"""Where the handlers find the shared `Readings` in the tornado application's settings."""


class TFGPUServer(LoggingConfigurable):
    """Settings of the server extension (`c.TFGPUServer.cache_seconds = 2` in jupyter_server_config.py)."""

    cache_seconds = Float(
        1.0, help="How long one read of NVML, /proc and the kernels' state files answers requests, in seconds."
    ).tag(config=True)


class Readings:
    """The last read of the machine and of this server's kernels and sessions, shared by every
    request while it is younger than `cache_seconds`; at most one read runs at a time."""

    def __init__(self, serverapp: Any, cache_seconds: float) -> None:
        self.serverapp = serverapp
        self.cache_seconds = cache_seconds
        self.lock = asyncio.Lock()
        self.seen = TensorFlowSeen()
        self.last: tuple[Reading, dict[str, KernelSession]] | None = None
        self.taken = -math.inf

    async def get(self, fresh: bool = False) -> tuple[Reading, dict[str, KernelSession]]:
        """The current reading; `fresh`: newer than any reading taken before this call."""
        asked = time.monotonic()
        async with self.lock:
            if self.last is None or time.monotonic() - self.taken > self.cache_seconds or (fresh and self.taken < asked):
                self.last = await self._read()
                self.taken = time.monotonic()
            return self.last

    async def _read(self) -> tuple[Reading, dict[str, KernelSession]]:
        kernel_manager = self.serverapp.kernel_manager
        kernels = kernel_manager.list_kernels()
        sessions = await self.serverapp.session_manager.list_sessions()
        pids = {model["id"]: started_pid(kernel_manager, model["id"]) for model in kernels}
        directory = Path(kernel_manager.connection_dir)
        reading = await asyncio.get_running_loop().run_in_executor(None, read_machine, pids, directory, self.seen)
        return reading, own_sessions(kernels, sessions)


def started_pid(kernel_manager: Any, kernel_id: str) -> int | None:
    """The pid the kernel's provisioner started (jupyter_client's `LocalProvisioner.pid`); None for a
    kernel that is gone or runs elsewhere (a remote provisioner)."""
    try:
        pid = getattr(kernel_manager.get_kernel(kernel_id).provisioner, "pid", None)
    except KeyError:
        return None
    return pid if isinstance(pid, int) else None


class TFGPUHandler(APIHandler):
    """Shared by both handlers: the readings, and a JSON reply with its handler time."""

    auth_resource = "kernels"

    @property
    def readings(self) -> Readings:
        return self.settings[SETTINGS_KEY]

    def reply(self, body: dict[str, Any], started: float) -> None:
        self.set_header("Server-Timing", f"tfgpu;dur={(time.perf_counter() - started) * 1000:.3f}")
        self.finish(json.dumps(body))


class GpusHandler(TFGPUHandler):
    @web.authenticated
    @authorized
    async def get(self) -> None:
        started = time.perf_counter()
        reading, sessions = await self.readings.get()
        self.reply(gpus_reply(reading, sessions, datetime.now(timezone.utc)), started)


class KernelHandler(TFGPUHandler):
    @web.authenticated
    @authorized
    async def get(self, kernel_id: str) -> None:
        started = time.perf_counter()
        if kernel_id not in self.kernel_manager:
            raise web.HTTPError(404, f"this server has no kernel {kernel_id}")
        reading, sessions = await self.readings.get()
        if kernel_id not in reading.kernels:  # started since the last read
            reading, sessions = await self.readings.get(fresh=True)
        kernel = reading.kernels.get(kernel_id)
        if kernel is None:
            raise web.HTTPError(404, f"this server has no kernel {kernel_id}")
        self.reply(kernel_reply(kernel, reading, sessions.get(kernel_id), datetime.now(timezone.utc)), started)


def setup_handlers(serverapp: Any) -> None:
    """Register the handlers under the server's base URL."""
    web_app = serverapp.web_app
    settings = TFGPUServer(parent=serverapp)
    web_app.settings[SETTINGS_KEY] = Readings(serverapp, settings.cache_seconds)
    base = web_app.settings["base_url"]
    web_app.add_handlers(".*$", [
        (url_path_join(base, "api/tfgpu/gpus"), GpusHandler),
        (url_path_join(base, r"api/tfgpu/kernels/(?P<kernel_id>[\w-]+)"), KernelHandler),
    ])
