"""What the server extension answers (`jupyter/tfgpu-state.schema.json`: `gpusReply`, `kernelReply`), put
together from four sources, none of which asks a kernel:

- NVML (`gpus.inventory`, the one chokepoint): the cards and which pid holds how much memory;
- the state each kernel publishes (`jupyter.kernelstate.read_state`: checked against the schema, and
  trusted only while /proc shows its pid running on that kernel's connection file); a file that is not
  valid spoils its own kernel's entry only;
- /proc (`gpus.processes`), only for what a reply shows: who owns a pid on a card (its status file),
  and, for kernels that publish nothing, whether TensorFlow's library is mapped (read once per pid
  until it is: it stays mapped);
- the server's own kernel and session models (notebook path, execution state, last activity),
  mapped by `jupyter.sessions.server_sessions` as it maps any server's replies.

The blocking reads (`read_kernels`, NVML) run off the event loop; the reply builders are pure and
carry data only: English appears only in an error's `message`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from . import history
from ..gpus import processes
from ..gpus.cudaenv import Grant, grant_of
from ..gpus.inventory import DRIVER_NOT_ANSWERING, MIB, NVML_FAILED, Gpu, Inventory
from ..jupyter import kernelstate
from ..jupyter.sessions import KernelSession, server_sessions
from ..language.policy import is_index
from ..envvars import CUDA_DEVICE_ORDER, CUDA_VISIBLE_DEVICES

GPUS_STAMP = kernelstate.stamp("gpusReply")
KERNEL_STAMP = kernelstate.stamp("kernelReply")
KEEP_STAMP = kernelstate.stamp("keepReply")


@dataclass(frozen=True)
class KernelProcess:
    """One kernel of this server as the machine shows it."""

    kernel_id: str
    pid: int | None
    """Its process: the pid it published, else the one its provisioner started (None if unknown)."""
    state: dict[str, Any] | None
    """Its published state (checked); None where tfgpu_magic publishes nothing in it."""
    invalid: str | None = None
    """Why its state file was refused (not ours, not valid, not checkable here): only this kernel's entry says so."""
    invalid_code: str = kernelstate.STATE_INVALID
    """`invalid` as `$defs/errorCode` (`kernelstate.StateInvalid.code`)."""
    tensorflow_mapped: bool | None = None
    """TensorFlow's library in its memory map (/proc), read only where it publishes no state."""

    @property
    def tensorflow(self) -> str | None:
        """`tensorflowState`; where only the memory map tells, `imported` or `not_imported`; None where unknown."""
        if self.state is not None:
            return self.state["tensorflow"]["state"]
        return None if self.tensorflow_mapped is None else ("imported" if self.tensorflow_mapped else "not_imported")


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


def read_kernel(kernel_id: str, started: int | None, runtime_dir: Path, seen: TensorFlowSeen) -> KernelProcess:
    """Kernel `kernel_id` as its state file and /proc show it; `started`: the pid its provisioner started."""
    try:
        state = kernelstate.read_state(kernel_id, runtime_dir, processes.runs_kernel)
    except kernelstate.StateInvalid as err:
        return KernelProcess(kernel_id, started, None, invalid=str(err), invalid_code=err.code)
    pid = state["pid"] if state is not None else started
    mapped = seen.mapped(pid) if state is None and pid is not None else None
    return KernelProcess(kernel_id, pid, state, tensorflow_mapped=mapped)


def read_kernels(kernel_pids: dict[str, int | None], runtime_dir: Path, seen: TensorFlowSeen) -> dict[str, KernelProcess]:
    """Every kernel of this server (`kernel_pids`: ids and the pids their provisioners started)."""
    kernels = {kernel_id: read_kernel(kernel_id, started, runtime_dir, seen) for kernel_id, started in kernel_pids.items()}
    seen.forget_except({kernel.pid for kernel in kernels.values() if kernel.pid is not None})
    return kernels


class Owner:
    """Who runs a pid on a card, from its /proc status only (what a reply shows)."""

    __slots__ = ("uid", "user")

    def __init__(self, pid: int) -> None:
        self.uid = processes.uid_of(pid)
        self.user = processes.user_name(self.uid)


def owners(inventory: Inventory | None, kernels: dict[str, KernelProcess]) -> dict[int, Owner]:
    """The owners of the processes on the cards that are not this server's kernels."""
    ours = {kernel.pid for kernel in kernels.values()}
    on_gpus = {proc.pid for gpu in (inventory.gpus if inventory else ()) for proc in gpu.processes}
    return {pid: Owner(pid) for pid in sorted(on_gpus - ours)}


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


@dataclass(frozen=True)
class Machine:
    """The cards as one NVML reading shows them to this server: None before the first reading."""

    inventory: Inventory | None
    host_pids: bool = False
    """This server's pid namespace is not the host's (a container): NVML's pids are not ours to match."""
    grant: Grant = Grant(None)
    """What the server's `CUDA_VISIBLE_DEVICES` gives (a scheduler's or a container's grant): its
    kernels inherit it."""

    @property
    def gpus(self) -> tuple[Gpu, ...]:
        return self.inventory.gpus if self.inventory is not None else ()

    def granted(self) -> set[int]:
        """nvidia-smi indices of the cards within the grant (`Grant.gives`)."""
        return {gpu.index for gpu in self.gpus if self.grant.gives(gpu.index)}


def server_grant(inventory: Inventory) -> Grant:
    """The grant of the server's own environment (a Slurm job's record included), placed on `inventory`'s cards."""
    return grant_of(os.environ.get(CUDA_VISIBLE_DEVICES), os.environ.get(CUDA_DEVICE_ORDER), inventory, os.environ)


# ----- the replies (pure) -------------------------------------------------------------------------
def _bytes(mib: int | None) -> int | None:
    return None if mib is None else mib * MIB


def nvml_error(inventory: Inventory | None) -> dict[str, str] | None:
    """`$defs/error` for a reading without fresh figures; None when NVML answered."""
    if inventory is None:
        return None
    if inventory.blocked_seconds is not None:
        return {"code": DRIVER_NOT_ANSWERING, "message": (inventory.error or inventory.warning or "")[:1000]}
    if inventory.error is None:
        return None
    return {"code": inventory.error_code or NVML_FAILED, "message": inventory.error[:1000]}


def gpu_status(machine: Machine) -> dict[str, Any]:
    """`$defs/gpuStatus`."""
    stale = machine.inventory.stale_seconds if machine.inventory is not None else None
    return {"error": nvml_error(machine.inventory), "stale_seconds": stale, "host_pids": machine.host_pids}


def kernel_ref(kernel: KernelProcess, session: KernelSession | None, now: datetime) -> dict[str, Any]:
    """`$defs/kernelRef`."""
    return {
        "kernel_id": kernel.kernel_id,
        "notebook": session.notebook if session else None,
        "execution_state": session.execution_state if session else None,
        "idle_seconds": session.idle_seconds(now) if session else None,
        "tensorflow": kernel.tensorflow,
    }


def nvml_memory(kernel: KernelProcess, machine: Machine) -> dict[int, int | None]:
    """nvidia-smi index → bytes NVML says the kernel's process holds on that card (None where NVML cannot
    tell), for the cards it is on; none where NVML's pids are the host's."""
    held: dict[int, int | None] = {}
    if machine.host_pids or kernel.pid is None:
        return held
    for gpu in machine.gpus:
        used = [proc.used_mib for proc in gpu.processes if proc.pid == kernel.pid]
        if used:
            known = [mib for mib in used if mib is not None]
            held[gpu.index] = min(kernelstate.BYTES_MAX, sum(known) * MIB) if known else None
    return held


def memory_figures(kernel: KernelProcess, machine: Machine) -> history.Figures:
    """The kernel's figures for one history sample: NVML's for its process on each card (where the
    reading is fresh), and TensorFlow's, JAX's and PyTorch's own from its published state, placed on
    cards through the reading; at most `history.MAX_SERIES`, by card."""
    inventory = machine.inventory
    if inventory is None:
        return ()
    found: dict[history.Key, int | None] = {}
    if inventory.error is None and inventory.stale_seconds is None:
        found.update(((index, "nvml", "used"), held) for index, held in nvml_memory(kernel, machine).items())
    state = kernel.state
    if state is not None:
        frameworks = [("tensorflow", state["tensorflow"]["memory"], ("current", "peak"))]
        frameworks += [(name, state["frameworks"][name]["memory"], ("current", "peak", "reserved"))
                       for name in ("jax", "torch") if state["frameworks"][name] is not None]
        for source, figures, names in frameworks:
            for name in names:
                found.update(((index, source, name), value)
                             for index, value in kernelstate.figures_by_card(figures, inventory, name).items())
    return tuple(sorted(found.items(), key=history.order)[:history.MAX_SERIES])


def tensorflow_memory(kernel: KernelProcess, machine: Machine) -> dict[int, int]:
    """nvidia-smi index → bytes TensorFlow's allocator says this kernel's tensors use on that card."""
    if kernel.state is None or machine.inventory is None:
        return {}
    return kernelstate.memory_by_card(kernel.state, machine.inventory)


def gpus_reply(machine: Machine, kernels: dict[str, KernelProcess], others: dict[int, Owner],
               sessions: dict[str, KernelSession], now: datetime) -> dict[str, Any]:
    """`GET /api/tfgpu/gpus`: each card with each process on it; this server's kernels with their
    notebook, state and idle time; other users' processes with user and memory only. In a container
    (`host_pids`) NVML's pids are shown as they are, and this server's kernels by TensorFlow's own figure."""
    me = os.getuid() if hasattr(os, "getuid") else None
    my_name = processes.user_name(me)
    by_pid = {} if machine.host_pids else {kernel.pid: kernel for kernel in kernels.values() if kernel.pid is not None}
    granted = machine.granted()
    own_figures = {kernel_id: tensorflow_memory(kernel, machine) for kernel_id, kernel in kernels.items()} \
        if machine.host_pids else {}
    gpus = []
    for gpu in machine.gpus:
        rows = []
        for proc in gpu.processes:
            row: dict[str, Any] = {"pid": proc.pid, "gpu_memory": _bytes(proc.used_mib), "memory_source": "nvml"}
            kernel = by_pid.get(proc.pid)
            if kernel is not None:
                row.update(mine=True, user=my_name, kernel=kernel_ref(kernel, sessions.get(kernel.kernel_id), now))
            else:
                owner = None if machine.host_pids else others.get(proc.pid)
                row.update(mine=owner is not None and owner.uid == me, user=owner.user if owner else None, kernel=None)
            rows.append(row)
        for kernel_id, figures in own_figures.items():
            if gpu.index in figures:
                kernel = kernels[kernel_id]
                rows.append({"pid": kernel.pid or 0, "gpu_memory": figures[gpu.index], "memory_source": "tensorflow",
                             "mine": True, "user": my_name, "kernel": kernel_ref(kernel, sessions.get(kernel_id), now)})
        gpus.append(_card(gpu, gpu.index in granted) | {"processes": rows})
    return {**GPUS_STAMP, "gpus": gpus, "gpu_status": gpu_status(machine)}


def _card(gpu: Gpu, granted: bool) -> dict[str, Any]:
    return {
        "index": gpu.index,
        "name": gpu.name,
        "uuid": gpu.uuid,
        "memory_total": _bytes(gpu.memory_total_mib),
        "memory_used": _bytes(gpu.memory_used_mib),
        "utilization": gpu.utilization_pct,
        "mig": [device.uuid for device in gpu.mig_devices],
        "granted": granted,
    }


def kernel_reply(kernel: KernelProcess, machine: Machine, session: KernelSession | None, now: datetime,
                 memory_history: dict[str, Any] | None = None) -> dict[str, Any]:
    """`GET /api/tfgpu/kernels/<id>`: the kernel's policy, TensorFlow's state, what waits for a restart,
    its GPUs (those its policy makes visible, else those it holds memory on, else every card), and its
    memory over time (`memory_history`, `history.KernelHistory.reply`; none kept where not given)."""
    state = kernel.state
    held: dict[int, int]
    if machine.host_pids:
        held, source = tensorflow_memory(kernel, machine), "tensorflow"
    else:
        held = {index: value or 0 for index, value in nvml_memory(kernel, machine).items()}
        source = "nvml"
    visible = _visible(state, machine.inventory)
    if visible is not None:
        named, gpus_from = visible, "policy"
    elif held:
        named, gpus_from = sorted(held), "memory"
    else:
        named, gpus_from = [gpu.index for gpu in machine.gpus], "all"
    cards = {gpu.index: gpu for gpu in machine.gpus}
    known = machine.inventory is not None and machine.inventory.error is None
    error = {"code": kernel.invalid_code, "message": kernel.invalid[:1000]} if kernel.invalid else None
    return {
        **KERNEL_STAMP,
        "kernel": kernel_ref(kernel, session, now),
        "pid": kernel.pid,
        "published": state is not None,
        "policy": state["policy"] if state else None,
        "directives": policy_directives(state["policy"]) if state else None,
        "tensorflow": state["tensorflow"] if state else None,
        "pending": state["pending"] if state else [],
        "restart_needed": state["restart_needed"] if state else False,
        "keep": state["keep"] if state else False,
        "frameworks": state["frameworks"] if state else None,
        "gpus_from": gpus_from,
        "gpus": [{"index": index, "name": cards[index].name, "memory_total": _bytes(cards[index].memory_total_mib),
                  "kernel_memory": held.get(index, 0) if known else None, "memory_source": source if known else None}
                 for index in named if index in cards],
        "gpu_status": gpu_status(machine),
        "error": error,
        "history": history.empty_reply(None, history.SAMPLE_SECONDS) if memory_history is None else memory_history,
    }


def policy_directives(record: dict[str, Any]) -> list[str] | None:
    """The published policy (`$defs/policy`) as the directive lines that make it again (what the
    front end saves into a notebook's `metadata.tfgpu.policy`); None for a record that is no valid policy."""
    from ..errors import PolicyError
    from ..language.directives import policy_lines

    try:
        return policy_lines(kernelstate.policy_from_record(record))
    except PolicyError:
        return None


def _visible(state: dict[str, Any] | None, inventory: Inventory | None) -> list[int] | None:
    """The nvidia-smi indices the published policy makes visible (UUIDs resolved through the
    inventory); None without a `visible` setting."""
    refs = state["policy"]["visible"] if state else None
    if refs is None:
        return None
    indices = []
    for ref in refs:
        index = inventory.card_index(ref) if inventory is not None else None
        if index is not None:
            indices.append(index)
        elif is_index(ref):
            indices.append(int(ref))
    return sorted(set(indices))
