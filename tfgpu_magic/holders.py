"""`tfgpu_magic.who()` and `%tfgpu who`: which process holds which GPU, and which notebook it is.

Three sources, each read without touching the processes: NVML (who holds memory on which card),
/proc (owner, the kernel's connection file, whether TensorFlow is mapped: `gpus.processes`), and
the sessions of this user's own Jupyter servers (notebook path, last activity:
`jupyter.sessions`). Other users' processes show their user and memory only. In a container with a
pid namespace of its own, NVML's pids (the host's) are never matched to processes here: those rows
are memory only (`host_pid`), and this user's kernels are listed apart, with the GPU memory their
TensorFlow publishes (`jupyter.kernelstate`: its allocator's figure, where a server started them).
Nothing is ever shut down by itself; `shutdown` asks the owning server, only when told `yes`. The
rows (`Holder`) and what `shutdown` did (`ShutDown`) are worded by `views.who`.
(Not named `who.py`: importing a submodule `tfgpu_magic.who` would replace the function
`tfgpu_magic.who` with the module.)
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any, NamedTuple

from .errors import PolicyError, short_error
from .gpus.inventory import MIB, Inventory


class Holder(NamedTuple):
    """One process that is a Jupyter kernel of this user or holds GPU memory; `as_dict()` is the
    public form (`tfgpu_magic.who()`). Another user's process shows its user and memory only."""

    pid: int
    user: str | None
    kernel_id: str | None
    notebook: str | None
    tensorflow: bool | None
    """TensorFlow's library mapped; None: not readable (another user's)."""
    gpu_memory: dict[int, int | None]
    """GPU index → bytes (None where NVML cannot tell); {} without NVML, and for a process of ours
    where NVML's pids are the host's (see `host_pid`)."""
    idle_seconds: float | None
    this: bool
    """The process asking."""
    state: str | None
    """The server's execution state (`idle`, `busy`)."""
    placed: str | None
    """Why `visible auto` gave it its GPUs."""
    mine: bool
    """This user's."""
    is_kernel: bool
    """This user's and started with a connection file."""
    host_pid: bool = False
    """`pid` is NVML's, as the host numbers it, seen from a pid namespace of our own (a container):
    matched to no process here, so the row is its memory only."""
    tensorflow_figure: bool = False
    """`gpu_memory` is what the kernel's TensorFlow says its tensors use (its published state), not
    NVML's figure for the process: where NVML's pids are the host's."""
    frameworks: tuple[tuple[str, int], ...] = ()
    """(`jax` or `torch`, bytes in use on all its GPUs) as the kernel's published state says: each
    framework's own figure, where it started."""

    def as_dict(self) -> dict[str, Any]:
        """The public form: a plain dict with its own copy of `gpu_memory`."""
        return {**self._asdict(), "gpu_memory": dict(self.gpu_memory)}


class ShutDown(NamedTuple):
    """What `shutdown` did: kernel `kernel_id`, of notebook `notebook` (None: unknown), is shut down."""

    kernel_id: str
    notebook: str | None


def who(inventory: Inventory | None = None, runtime_dir: Path | None = None) -> list[Holder]:
    """One row per process that is a Jupyter kernel of this user or holds GPU memory, by pid (in a
    container of its own pid namespace: NVML's host pids first, then this user's kernels)."""
    from .gpus import inventory as gpu_inventory
    from .gpus import processes, reservations
    from .jupyter import kernelstate, persist, sessions

    found = inventory if inventory is not None else gpu_inventory.cached_inventory()
    directory = runtime_dir or persist.runtime_dir()
    foreign = processes.foreign_pid_namespace() is True
    memory: dict[int, dict[int, int | None]] = {}
    for gpu in found.gpus if found.available else ():
        for process in gpu.processes:
            memory.setdefault(process.pid, {})[gpu.index] = None if process.used_mib is None else process.used_mib * MIB
    mine = {info.pid: info for info in processes.my_kernels()}
    own = _own_connection()
    if own is not None:  # the process running this is a kernel, whatever command line started it
        here = mine.get(os.getpid()) or processes.describe(os.getpid())
        mine[os.getpid()] = here._replace(connection_file=own, kernel_id=processes.kernel_id_of(own))
    known = sessions.kernel_sessions(directory) if mine else {}
    placed = {r.kernel_pid: r.why for r in reservations.current(directory) if r.kernel_pid is not None}
    me = os.getuid() if hasattr(os, "getuid") else None
    rows = [host_row(pid, held) for pid, held in sorted(memory.items())] if foreign else []
    for pid in sorted(set(mine) if foreign else set(memory) | set(mine)):
        info = mine.get(pid) or processes.describe(pid)
        own = info.uid is not None and info.uid == me
        kernel_id = info.kernel_id if own else None
        session = known.get(kernel_id) if kernel_id else None
        state = _published(info) if kernel_id else None
        figures = kernelstate.memory_by_card(state, found) if foreign and state is not None else {}
        rows.append(Holder(
            pid=pid,
            user=info.user,
            kernel_id=kernel_id,
            notebook=session.notebook if session else None,
            tensorflow=info.tensorflow if own else None,
            gpu_memory=figures if foreign else memory.get(pid, {}),
            idle_seconds=session.idle_seconds() if session else None,
            this=pid == os.getpid(),
            state=session.execution_state if session else None,
            placed=placed.get(pid) if own else None,
            mine=own,
            is_kernel=own and info.is_kernel,
            tensorflow_figure=bool(figures),
            frameworks=_framework_figures(state),
        ))
    return rows


def _published(info: Any) -> dict[str, Any] | None:
    """The state kernel `info` publishes (its state file, next to its connection file); None where it
    publishes none or its file is not usable."""
    from .gpus.processes import runs_kernel
    from .jupyter import kernelstate

    try:
        return kernelstate.read_state(info.kernel_id, Path(info.connection_file).parent, runs_kernel)
    except kernelstate.StateInvalid:
        return None



def _framework_figures(state: dict[str, Any] | None) -> tuple[tuple[str, int], ...]:
    """(framework, bytes in use on all its GPUs) for JAX and PyTorch where the state has their figures."""
    frameworks = state["frameworks"] if state is not None else {}
    return tuple((name, sum(row["current"] for row in frameworks[name]["memory"]))
                 for name in ("jax", "torch") if frameworks.get(name) and frameworks[name]["memory"])


def host_row(pid: int, held: dict[int, int | None]) -> Holder:
    """NVML's process `pid` (a host pid) holding `held`, matched to nothing here."""
    return Holder(pid=pid, user=None, kernel_id=None, notebook=None, tensorflow=None, gpu_memory=held,
                  idle_seconds=None, this=False, state=None, placed=None, mine=False, is_kernel=False, host_pid=True)


def shutdown(kernel_id: str, yes: bool = False, runtime_dir: Path | None = None) -> ShutDown:
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
    return ShutDown(kernel_id, session.notebook)


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
