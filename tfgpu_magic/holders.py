"""`tfgpu_magic.who()` and `%tfgpu who`: which process holds which GPU, and which notebook it is.

Three sources, each read without touching the processes: NVML (who holds memory on which card),
/proc (owner, the kernel's connection file, whether TensorFlow is mapped: `gpus.processes`), and
the sessions of this user's own Jupyter servers (notebook path, last activity:
`jupyter.sessions`). Other users' processes show their user and memory only. Nothing is ever
shut down by itself; `shutdown` asks the owning server, only when told `yes`.
(Not named `who.py`: importing a submodule `tfgpu_magic.who` would replace the function
`tfgpu_magic.who` with the module.)
"""

from __future__ import annotations

import os
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

from .errors import PolicyError, short_error
from .gpus.inventory import MIB, Inventory

IDLE_HINT_SECONDS = 600.0
"""An own kernel idle this long while holding GPU memory gets a hint on how to shut it down."""
NO_NVML = "GPU memory needs NVML"


def who(inventory: Inventory | None = None, runtime_dir: Path | None = None) -> list[dict[str, Any]]:
    """One plain dict per process that is a Jupyter kernel of this user or holds GPU memory.

    Keys: `pid`, `user`, `kernel_id`, `notebook`, `tensorflow` (None: not readable, another user's),
    `gpu_memory` ({GPU index: bytes, None where NVML cannot tell}; {} without NVML), `idle_seconds`,
    `this`; and `state` (the server's execution state), `placed` (why `visible auto` gave it its GPUs),
    `mine` (this user's), `is_kernel` (this user's and started with a connection file).
    """
    from .gpus import inventory as gpu_inventory
    from .gpus import processes, reservations
    from .jupyter import persist, sessions

    found = inventory if inventory is not None else gpu_inventory.cached_inventory()
    directory = runtime_dir or persist.runtime_dir()
    memory: dict[int, dict[int, int | None]] = {}
    for gpu in found.gpus if found.available else ():
        for process in gpu.processes:
            memory.setdefault(process.pid, {})[gpu.index] = None if process.used_mib is None else process.used_mib * MIB
    mine = {info.pid: info for info in processes.my_kernels()}
    own = _own_connection()
    if own is not None:  # the process running this is a kernel, whatever command line started it
        here = mine.get(os.getpid()) or processes.describe(os.getpid())
        mine[os.getpid()] = replace(here, connection_file=own, kernel_id=processes.kernel_id_of(own))
    known = sessions.kernel_sessions(directory) if mine else {}
    placed = {r.kernel_pid: r.why for r in reservations.current(directory) if r.kernel_pid is not None}
    me = os.getuid() if hasattr(os, "getuid") else None
    rows = []
    for pid in sorted(set(memory) | set(mine)):
        info = mine.get(pid) or processes.describe(pid)
        own = info.uid is not None and info.uid == me
        kernel_id = info.kernel_id if own else None
        session = known.get(kernel_id) if kernel_id else None
        rows.append({
            "pid": pid,
            "user": info.user,
            "kernel_id": kernel_id,
            "notebook": session.notebook if session else None,
            "tensorflow": info.tensorflow if own else None,
            "gpu_memory": memory.get(pid, {}),
            "idle_seconds": session.idle_seconds() if session else None,
            "this": pid == os.getpid(),
            "state": session.execution_state if session else None,
            "placed": placed.get(pid) if own else None,
            "mine": own,
            "is_kernel": own and info.is_kernel,
        })
    return rows


def shutdown(kernel_id: str, yes: bool = False, runtime_dir: Path | None = None) -> str:
    """Ask the Jupyter server that owns `kernel_id` (one of this user's proven servers) to shut it
    down. Refused without `yes`, and for the calling kernel itself."""
    from .jupyter import sessions

    if not yes:
        raise PolicyError(f"shutting down kernel {kernel_id} needs confirmation: add --yes")
    if os.environ.get("KERNEL_ID") == kernel_id or _own_kernel_id() == kernel_id:
        raise PolicyError("that is this kernel; use `%tfgpu restart`, or shut it down from its front end")
    session = sessions.kernel_sessions(runtime_dir).get(kernel_id)
    if session is None:
        raise PolicyError(f"no Jupyter server of yours owns a kernel {kernel_id}")
    try:
        session.server.request("DELETE", f"api/kernels/{kernel_id}")
    except (OSError, ValueError) as err:
        raise PolicyError(f"the server refused to shut down kernel {kernel_id}: {short_error(err)}") from None
    return f"Shut down kernel {kernel_id}" + (f" ({session.notebook})" if session.notebook else "") + "."


def _own_kernel_id() -> str | None:
    from .gpus import processes

    return processes.kernel_id_of(_own_connection())


def _own_connection() -> str | None:
    """This process's connection file: its kernel's when it runs one (a kernel started by a wrapper
    or `conda run` has a command line that may name none), else the one its command line names."""
    from .gpus import processes
    from .jupyter.startup import connection_file

    ipython = sys.modules.get("IPython")
    shell = ipython.get_ipython() if ipython is not None else None
    path = connection_file(shell) if shell is not None else None
    return str(path) if path is not None else processes.connection_file_of(processes.cmdline(os.getpid()))


def _size(value: int | None) -> str:
    if value is None:
        return "memory unknown"
    if value >= 1 << 30:
        return f"{value / (1 << 30):.1f} GiB"
    return f"{value // MIB} MiB"


def _idle(seconds: float | None) -> str | None:
    if seconds is None:
        return None
    if seconds < 60:
        return f"idle {int(seconds)}s"
    if seconds < 3600:
        return f"idle {int(seconds // 60)}m"
    return f"idle {int(seconds // 3600)}h{int(seconds % 3600 // 60):02d}m"


def _holder(row: dict[str, Any], gpu: int | None) -> str:
    """One line about one process; another user's shows user and memory only."""
    parts = [f"pid {row['pid']}", row["user"] or "?"]
    if gpu is not None:
        parts.append(_size(row["gpu_memory"].get(gpu)))
    if row["mine"]:
        parts.insert(2, row["notebook"] or (f"kernel {row['kernel_id'][:8]}" if row["kernel_id"]
                                            else "a kernel no server owns" if row.get("is_kernel") else "not a kernel"))
        idle = _idle(row["idle_seconds"])
        if row["state"] == "busy":
            parts.append("busy")
        elif idle:
            parts.append(idle)
        if row["tensorflow"] is not None:
            parts.append("TensorFlow loaded" if row["tensorflow"] else "no TensorFlow")
        if row["placed"]:
            parts.append(row["placed"])
    return "  " + " · ".join(parts) + ("   ← this kernel" if row["this"] else "")


def render(rows: list[dict[str, Any]], inventory: Inventory) -> str:
    """`%tfgpu who`: cards, each with its holders; then this user's kernels on no GPU; hints."""
    lines: list[str] = []
    if not inventory.available:
        lines.append(f"{NO_NVML} ({inventory.error}); your kernels:")
        lines += [_holder(row, None) for row in rows if row["mine"]] or ["  (no kernel of yours is running)"]
    else:
        for gpu in inventory.gpus:
            used = "" if gpu.memory_used_mib is None or gpu.memory_total_mib is None else (
                f" · {_size(gpu.memory_used_mib * MIB)} of {_size(gpu.memory_total_mib * MIB)} used")
            busy = "" if gpu.utilization_pct is None else f" · {gpu.utilization_pct}% busy"
            lines.append(f"GPU {gpu.index} · {gpu.name or gpu.uuid}{used}{busy}")
            holders = [row for row in rows if gpu.index in row["gpu_memory"]]
            lines += [_holder(row, gpu.index) for row in holders] or ["  (no process)"]
        idle = [row for row in rows if row["mine"] and not row["gpu_memory"]]
        if idle:
            lines.append("Your kernels on no GPU:")
            lines += [_holder(row, None) for row in idle]
    hints = [row for row in rows if row["mine"] and not row["this"] and row["kernel_id"]
             and (row["gpu_memory"] or not inventory.available)
             and row["idle_seconds"] is not None and row["idle_seconds"] >= IDLE_HINT_SECONDS]
    for row in hints:
        lines.append(
            f"Kernel {row['kernel_id']} ({row['notebook'] or 'no notebook'}) is {_idle(row['idle_seconds'])}: shut it down "
            f"from its notebook (Kernel → Shut Down Kernel) or `%tfgpu who --shutdown {row['kernel_id']} --yes`."
        )
    return "\n".join(lines)


def report(inventory: Inventory | None = None, runtime_dir: Path | None = None) -> str:
    """`render(who())` over one inventory read."""
    from .gpus import inventory as gpu_inventory

    found = inventory if inventory is not None else gpu_inventory.cached_inventory()
    return render(who(found, runtime_dir), found)
