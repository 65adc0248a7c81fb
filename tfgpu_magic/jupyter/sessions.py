"""What this user's Jupyter servers know about their kernels: notebook path, last activity, state.

Only servers that prove themselves locally are asked (the same proof as `server.find_server`, less
the ancestry, since `who` asks about every kernel of this user, not only its own): the
`jpserver-<pid>.json` is private to this user, its pid is alive, is this user's, and itself holds the
socket listening on the address and port the request goes to; the request goes over loopback through `server.Server`
(no proxy, no redirect, the token never printed). A server that fails any step gets nothing.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from ..gpus.processes import alive, uid_of
from .server import Server, server_files, server_url


@dataclass(frozen=True)
class KernelSession:
    """A kernel as its server sees it. `server` is the one that owns it (for a shutdown request)."""

    kernel_id: str
    notebook: str | None
    last_activity: datetime | None
    execution_state: str | None
    kernel_name: str | None
    server: Server

    def idle_seconds(self, now: datetime | None = None) -> float | None:
        """Seconds since the server last saw the kernel busy or talking; None if unknown or busy."""
        if self.last_activity is None or self.execution_state == "busy":
            return None
        now = now or datetime.now(timezone.utc)
        return max(0.0, (now - self.last_activity).total_seconds())


def _owned_by_me(pid: int) -> bool:
    return alive(pid) and (not hasattr(os, "getuid") or uid_of(pid) == os.getuid())


def my_servers(runtime_dir: Path | None = None) -> list[Server]:
    """The running Jupyter servers of this user that proved themselves (module docstring)."""
    servers = []
    for _, info, pid in server_files(runtime_dir, quiet=True):  # a broken file: nothing to ask
        if not _owned_by_me(pid):
            continue
        url = server_url(info, pid)
        if url is None:
            continue
        servers.append(Server.from_info(info, url, pid))
    return servers


def parse_time(value: Any) -> datetime | None:
    """A server's ISO 8601 timestamp (`2026-12-01T08:00:00.123456Z`), timezone-aware; None if odd."""
    if not isinstance(value, str) or len(value) > 64:
        return None
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=timezone.utc)


def server_sessions(server: Server) -> list[KernelSession]:
    """The kernels of one server with their notebooks; [] when it does not answer sensibly."""
    try:
        kernels = server.request("GET", "api/kernels")
        sessions = server.request("GET", "api/sessions")
    except (OSError, ValueError):  # PolicyError is a ValueError
        return []
    if not isinstance(kernels, list):
        return []
    notebooks: dict[str, str] = {}
    for session in sessions if isinstance(sessions, list) else []:
        kernel = session.get("kernel") if isinstance(session, dict) else None
        path = session.get("path") if isinstance(session, dict) else None
        if isinstance(kernel, dict) and isinstance(kernel.get("id"), str) and isinstance(path, str):
            notebooks.setdefault(kernel["id"], path)
    found = []
    for kernel in kernels:
        if not isinstance(kernel, dict) or not isinstance(kernel.get("id"), str):
            continue
        state, name = kernel.get("execution_state"), kernel.get("name")
        found.append(KernelSession(
            kernel_id=kernel["id"],
            notebook=notebooks.get(kernel["id"]),
            last_activity=parse_time(kernel.get("last_activity")),
            execution_state=state if isinstance(state, str) else None,
            kernel_name=name if isinstance(name, str) else None,
            server=server,
        ))
    return found


def kernel_sessions(runtime_dir: Path | None = None) -> dict[str, KernelSession]:
    """Kernel id → what its server knows, over every proven server of this user."""
    found: dict[str, KernelSession] = {}
    for server in my_servers(runtime_dir):
        for session in server_sessions(server):
            found.setdefault(session.kernel_id, session)
    return found
