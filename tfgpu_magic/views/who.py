"""`%tfgpu who` as text: each card with the processes that hold it, this user's idle kernels, and
hints to shut down idle ones (the rows come from `holders.who`), and what `--shutdown` did."""

from __future__ import annotations

from pathlib import Path

from ..gpus.inventory import Inventory
from ..holders import Holder, ShutDown, who
from ..gpus.cudaenv import Grant
from ..language.sizes import bytes_text, gib_pair
from .status import FRAMEWORK_LABELS, outside_grant

NO_NVML = "GPU memory needs NVML"
HOST_PIDS = ("This runs in a container with process ids of its own, and NVML names processes by the host's ids, "
             "so the GPU memory above cannot be matched to notebooks here. To see which notebook holds which "
             "memory, start the container with `docker run --pid=host` (Docker) or `hostPID: true` in the pod's "
             "spec (Kubernetes).")
"""Said once under the cards where NVML's pids are the host's (`holders.Holder.host_pid`)."""
UNSEEN_PIDS = ("NVML lists {pids}, which /proc here does not show: a process that has just ended, a /proc that hides "
               "other users' processes (hidepid), or a container whose process ids are not the host's (then "
               "`docker run --pid=host` or `hostPID: true` shows them).")
"""Where the pid namespace looks like the host's yet NVML's pids are not in /proc: a hint, not a finding."""
IDLE_HINT_SECONDS = 600.0
"""An own kernel idle this long while holding GPU memory gets a hint on how to shut it down."""


def _held(count: int | None, tensorflow: bool = False) -> str:
    return "memory unknown" if count is None else bytes_text(count) + (" (TensorFlow's figure)" if tensorflow else "")


def _idle(seconds: float | None) -> str | None:
    if seconds is None:
        return None
    if seconds < 60:
        return f"idle {int(seconds)}s"
    if seconds < 3600:
        return f"idle {int(seconds // 60)}m"
    return f"idle {int(seconds // 3600)}h{int(seconds % 3600 // 60):02d}m"


def _holder(row: Holder, gpu: int | None) -> str:
    """One line about one process; another user's shows user and memory only, a host pid its memory."""
    if row.host_pid:
        return f"  host pid {row.pid} · {_held(row.gpu_memory.get(gpu))}"
    parts = [f"pid {row.pid}", row.user or "?"]
    if gpu is not None:
        parts.append(_held(row.gpu_memory.get(gpu), row.tensorflow_figure))
    if row.mine:
        parts.insert(2, row.notebook or (f"kernel {row.kernel_id[:8]}" if row.kernel_id
                                         else "a kernel no server owns" if row.is_kernel else "not a kernel"))
        idle = _idle(row.idle_seconds)
        if row.state == "busy":
            parts.append("busy")
        elif idle:
            parts.append(idle)
        if row.tensorflow is not None:
            parts.append("TensorFlow loaded" if row.tensorflow else "no TensorFlow")
        parts += [f"{FRAMEWORK_LABELS[name]} {bytes_text(count)}" for name, count in row.frameworks]
        if row.placed:
            parts.append(row.placed)
    return "  " + " · ".join(parts) + ("   ← this kernel" if row.this else "")


def render(rows: list[Holder], inventory: Inventory, grant: Grant = Grant(None)) -> str:
    """`%tfgpu who`: cards, each with its holders (cards outside `grant` marked); then this user's
    kernels on no GPU; hints."""
    lines: list[str] = [f"Note: {inventory.warning}."] if inventory.warning else []
    foreign = any(row.host_pid for row in rows)
    if not inventory.available:
        lines.append(f"{NO_NVML} ({inventory.error}); your kernels:")
        lines += [_holder(row, None) for row in rows if row.mine] or ["  (no kernel of yours is running)"]
    else:
        for gpu in inventory.gpus:
            used = "" if gpu.memory_used_mib is None or gpu.memory_total_mib is None else (
                f" · {gib_pair(gpu.memory_used_mib, gpu.memory_total_mib)} used")
            busy = "" if gpu.utilization_pct is None else f" · {gpu.utilization_pct}% busy"
            outside = outside_grant(gpu, grant)
            lines.append(f"GPU {gpu.index} · {gpu.name or gpu.uuid}{used}{busy}" + (f" · {outside}" if outside else ""))
            holders = [row for row in rows if gpu.index in row.gpu_memory]
            lines += [_holder(row, gpu.index) for row in holders] or ["  (no process)"]
        idle = [row for row in rows if row.mine and not row.gpu_memory]
        if idle:
            lines.append("Your kernels (their TensorFlow reports no GPU memory):" if foreign else "Your kernels on no GPU:")
            lines += [_holder(row, None) for row in idle]
        unseen = [row.pid for row in rows if row.user is None and not row.host_pid and row.gpu_memory]
        if foreign:
            lines.append(HOST_PIDS)
        elif unseen:
            lines.append(UNSEEN_PIDS.format(pids=", ".join(f"pid {pid}" for pid in unseen)))
    hints = [row for row in rows if row.mine and not row.this and row.kernel_id
             and (row.gpu_memory or not inventory.available or foreign)
             and row.idle_seconds is not None and row.idle_seconds >= IDLE_HINT_SECONDS]
    for row in hints:
        lines.append(
            f"Kernel {row.kernel_id} ({row.notebook or 'no notebook'}) is {_idle(row.idle_seconds)}: shut it down "
            f"from its notebook (Kernel → Shut Down Kernel) or `%tfgpu who --shutdown {row.kernel_id} --yes`."
        )
    return "\n".join(lines)


def report(inventory: Inventory | None = None, runtime_dir: Path | None = None, grant: Grant = Grant(None)) -> str:
    """`render(who())` over one inventory read; cards outside `grant` marked."""
    from ..gpus import inventory as gpu_inventory

    found = inventory if inventory is not None else gpu_inventory.cached_inventory()
    return render(who(found, runtime_dir), found, grant)


def shutdown_text(done: ShutDown) -> str:
    """`%tfgpu who --shutdown KERNEL_ID --yes`: which kernel was shut down, and its notebook."""
    return f"Shut down kernel {done.kernel_id}" + (f" ({done.notebook})" if done.notebook else "") + "."
