"""What the server extension answers, put together from four sources, none of which asks a kernel:

- NVML (`gpus.inventory`, the one chokepoint): the cards and which pid holds how much memory;
- the state each kernel publishes (`jupyter.kernelstate`): policy, TensorFlow's state, what waits for
  a restart, and its pid; read as hostile (`safefile`: private, capped, regular files only) and
  trusted only while /proc shows that pid running on that kernel's connection file;
- /proc (`gpus.processes`): who owns a pid, and, for kernels that publish nothing, whether
  TensorFlow's library is mapped (read once per pid until it is: it stays mapped);
- the server's own kernel and session models (notebook path, execution state, last activity),
  mapped by `jupyter.sessions.server_sessions` as it maps any server's replies.

`read_machine` does the blocking reads (run off the event loop); the JSON builders are pure.
Other users' processes show pid, user and memory only.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from ..errors import PolicyError
from ..gpus import processes
from ..gpus.inventory import MIB, Gpu, Inventory, read_inventory
from ..jupyter import kernelstate
from ..jupyter.sessions import KernelSession, server_sessions


@dataclass(frozen=True)
class KernelProcess:
    """One kernel of this server as the machine shows it."""

    kernel_id: str
    pid: int | None
    """Its process: the pid it published, else the one its provisioner started (None if unknown)."""
    state: dict[str, Any] | None
    """Its published state (checked); None where tfgpu_magic publishes nothing in it."""
    tensorflow_mapped: bool | None
    """TensorFlow's library in its memory map (/proc), read only where it publishes no state."""

    @property
    def tensorflow(self) -> str | None:
        """`kernelstate.TENSORFLOW_STATES`, "imported" where only the map tells, None where unknown."""
        if self.state is not None:
            return self.state["tensorflow"]
        return None if self.tensorflow_mapped is None else ("imported" if self.tensorflow_mapped else "not imported")


@dataclass(frozen=True)
class Reading:
    """One read of the machine: the cards, this server's kernels, the other processes on the cards."""

    inventory: Inventory
    kernels: dict[str, KernelProcess]
    others: dict[int, processes.ProcessInfo] = field(default_factory=dict)


class TensorFlowSeen:
    """Pids whose memory map showed TensorFlow: not read again (a library stays mapped until exit)."""

    def __init__(self) -> None:
        self.pids: set[int] = set()

    def mapped(self, pid: int) -> bool | None:
        if pid in self.pids:
            return True
        found = processes.tensorflow_loaded(pid)
        if found:
            self.pids.add(pid)
        return found

    def forget_except(self, live: set[int]) -> None:
        self.pids &= live


def runs_kernel(pid: int, kernel_id: str) -> bool:
    """Whether /proc shows `pid` as the kernel on connection file `kernel-<kernel_id>.json`."""
    return processes.kernel_id_of(processes.connection_file_of(processes.cmdline(pid))) == kernel_id


def read_state(kernel_id: str, runtime_dir: Path) -> dict[str, Any] | None:
    """The state kernel `kernel_id` published, checked field by field; None when there is none, it
    is not a private regular file of ours, or the pid in it no longer runs that kernel (a kernel
    killed before it could remove its file)."""
    from .. import safefile

    try:
        data = safefile.read_json(kernelstate.state_path(kernel_id, runtime_dir), kernelstate.STATE_BYTES, private=True)
    except PolicyError:
        return None
    if not isinstance(data, dict) or data.get("format") != kernelstate.FORMAT or data.get("kernel_id") != kernel_id:
        return None
    pid, tensorflow, policy = data.get("pid"), data.get("tensorflow"), data.get("policy")
    if not isinstance(pid, int) or tensorflow not in kernelstate.TENSORFLOW_STATES or not isinstance(policy, dict):
        return None
    if not runs_kernel(pid, kernel_id):
        return None
    return {
        "pid": pid,
        "policy": policy,
        "policy_text": _strings(data.get("policy_text")),
        "tensorflow": tensorflow,
        "tensorflow_label": data["tensorflow_label"] if isinstance(data.get("tensorflow_label"), str) else tensorflow,
        "initialized_by": data["initialized_by"] if isinstance(data.get("initialized_by"), str) else None,
        "pending": [{"title": group["title"], "items": _strings(group.get("items"))}
                    for group in data.get("pending") or []
                    if isinstance(group, dict) and isinstance(group.get("title"), str)],
    }


def _strings(value: Any) -> list[str]:
    return [item for item in value if isinstance(item, str)] if isinstance(value, list) else []


def read_machine(kernel_pids: dict[str, int | None], runtime_dir: Path, seen: TensorFlowSeen) -> Reading:
    """The blocking reads: NVML, the kernels' state files, /proc. `kernel_pids`: this server's kernel
    ids and the pids their provisioners started."""
    inventory = read_inventory()
    kernels = {}
    for kernel_id, started in kernel_pids.items():
        state = read_state(kernel_id, runtime_dir)
        pid = state["pid"] if state is not None else started
        mapped = seen.mapped(pid) if state is None and pid is not None else None
        kernels[kernel_id] = KernelProcess(kernel_id, pid, state, mapped)
    ours = {kernel.pid for kernel in kernels.values()}
    on_gpus = {proc.pid for gpu in inventory.gpus for proc in gpu.processes}
    seen.forget_except(ours)
    return Reading(inventory, kernels, {pid: processes.describe(pid) for pid in sorted(on_gpus - ours)})


class OwnServer:
    """This server as `sessions.server_sessions` asks a server (`request("GET", "api/kernels")`),
    answered from its own kernel and session models: the same mapping, without a request to itself."""

    def __init__(self, kernels: list[dict[str, Any]], sessions: list[dict[str, Any]]) -> None:
        self.replies = {"api/kernels": kernels, "api/sessions": sessions}

    def request(self, method: str, path: str) -> Any:
        return self.replies[path]


def own_sessions(kernels: list[dict[str, Any]], sessions: list[dict[str, Any]]) -> dict[str, KernelSession]:
    """Kernel id → notebook, state and last activity, from this server's models."""
    return {found.kernel_id: found for found in server_sessions(OwnServer(kernels, sessions))}  # type: ignore[arg-type]


# ----- the replies (pure) -------------------------------------------------------------------------
def _bytes(mib: int | None) -> int | None:
    return None if mib is None else mib * MIB


def _kernel_fields(kernel: KernelProcess, session: KernelSession | None, now: datetime) -> dict[str, Any]:
    return {
        "kernel_id": kernel.kernel_id,
        "notebook": session.notebook if session else None,
        "execution_state": session.execution_state if session else None,
        "idle_seconds": session.idle_seconds(now) if session else None,
        "tensorflow": kernel.tensorflow,
    }


def gpus_reply(reading: Reading, sessions: dict[str, KernelSession], now: datetime) -> dict[str, Any]:
    """`GET /api/tfgpu/gpus`: each card with each process on it; this server's kernels with their
    notebook, state and idle time; other users' processes with user and memory only."""
    me = os.getuid() if hasattr(os, "getuid") else None
    my_name = processes.user_name(me)
    by_pid = {kernel.pid: kernel for kernel in reading.kernels.values() if kernel.pid is not None}
    gpus = []
    for gpu in reading.inventory.gpus:
        rows = []
        for proc in gpu.processes:
            row: dict[str, Any] = {"pid": proc.pid, "gpu_memory": _bytes(proc.used_mib)}
            kernel = by_pid.get(proc.pid)
            if kernel is not None:
                row.update(user=my_name, mine=True, **_kernel_fields(kernel, sessions.get(kernel.kernel_id), now))
            else:
                info = reading.others.get(proc.pid)
                row.update(user=info.user if info else None, mine=info is not None and info.uid == me)
            rows.append(row)
        gpus.append(_card(gpu) | {"processes": rows})
    return {"gpus": gpus, "error": reading.inventory.error}


def _card(gpu: Gpu) -> dict[str, Any]:
    return {
        "index": gpu.index,
        "name": gpu.name,
        "uuid": gpu.uuid,
        "memory_total": _bytes(gpu.memory_total_mib),
        "memory_used": _bytes(gpu.memory_used_mib),
        "utilization": gpu.utilization_pct,
        "mig": [device.uuid for device in gpu.mig_devices],
    }


def kernel_reply(kernel: KernelProcess, reading: Reading, session: KernelSession | None, now: datetime) -> dict[str, Any]:
    """`GET /api/tfgpu/kernels/<id>`: the kernel's policy, TensorFlow's state, what waits for a restart,
    and its GPUs: those its policy makes visible, else those it holds memory on, else every card."""
    state = kernel.state
    held = {gpu.index: sum(p.used_mib or 0 for p in gpu.processes if p.pid == kernel.pid)
            for gpu in reading.inventory.gpus if any(p.pid == kernel.pid for p in gpu.processes)}
    visible = _visible(state, reading.inventory)
    if visible is not None:
        named, source = visible, "policy"
    elif held:
        named, source = sorted(held), "memory"
    else:
        named, source = [gpu.index for gpu in reading.inventory.gpus], "all"
    cards = {gpu.index: gpu for gpu in reading.inventory.gpus}
    pending = state["pending"] if state else []
    return {
        **_kernel_fields(kernel, session, now),
        "pid": kernel.pid,
        "published": state is not None,
        "policy": state["policy"] if state else None,
        "settings": [p for p in state["policy_text"] if not p.startswith(("visible", "(visible"))] if state else [],
        "policy_text": state["policy_text"] if state else [],
        "tensorflow_label": state["tensorflow_label"] if state else None,
        "initialized_by": state["initialized_by"] if state else None,
        "pending": pending,
        "restart_needed": any(group["title"] == kernelstate.RESTART_TITLE for group in pending),
        "gpus_from": source,
        "gpus": [{"index": index, "name": cards[index].name, "memory_total": _bytes(cards[index].memory_total_mib),
                  "kernel_memory": _bytes(held.get(index, 0))} for index in named if index in cards],
        "gpu_error": reading.inventory.error,
    }


def _visible(state: dict[str, Any] | None, inventory: Inventory) -> list[int] | None:
    """The nvidia-smi indices the published policy makes visible (UUIDs resolved through the
    inventory); None without a `visible` setting."""
    refs = state["policy"].get("visible") if state else None
    if not isinstance(refs, list):
        return None
    indices = []
    for ref in refs:
        if isinstance(ref, str):
            try:
                device = inventory.find(ref) if inventory.available else None
            except PolicyError:
                continue
            if isinstance(device, Gpu):
                indices.append(device.index)
            elif device is not None:  # a MIG instance: its card
                indices += [gpu.index for gpu in inventory.gpus if device in gpu.mig_devices]
            elif ref.isdigit():
                indices.append(int(ref))
    return sorted(set(indices))
