"""The GPU inventory from NVIDIA's own library (NVML, `nvidia-ml-py`): the only module that imports it.

Every NVML call goes through `Nvml.call`, which turns an NVML error, or a function the installed
binding does not have, into None ("unknown"), never a crash. Every read of NVML (`nvmlInit`, a whole
inventory, the doctor's compute capabilities) goes through `Nvml.run`, with a deadline: a wedged
driver holds an NVML call in the kernel for as long as it likes (nvidia-smi too: an ioctl in state D,
https://github.com/leptonai/gpud/pull/117), so the call runs in a daemon thread that nothing waits on
past the deadline, nor at exit; meanwhile the last good inventory is served, marked stale.
Everything works without NVML: `read_inventory()` then reports why there is none.
"""

from __future__ import annotations

import functools
import os
import sys
import threading
import time
from typing import Any, Callable, NamedTuple

from ..errors import PolicyError
from ..language.policy import is_index
from ..language.sizes import MIB
from . import processes

CACHE_SECONDS = 2.0
DEADLINE_SECONDS = 3.0
"""How long one read of NVML may take before the driver counts as not answering (a whole inventory
of eight cards takes milliseconds)."""
NOT_ANSWERING = "the NVIDIA driver is not answering"
DOCTOR_HINT = "`%tfgpu doctor` says what to do"
PERCENT_UNKNOWN = "a size in % needs the card's total memory, which is unknown"


class GpuProcess(NamedTuple):
    """A compute process as NVML lists it: `pid` as the host numbers it (NVML knows no other)."""

    pid: int
    used_mib: int | None
    is_self: bool | None
    """This process; None: cannot be told, because this process runs in a pid namespace of its own
    (a container) where NVML's host pids are not ours (`processes.foreign_pid_namespace`)."""


class MigDevice(NamedTuple):
    uuid: str
    memory_total_mib: int | None


class Gpu(NamedTuple):
    """One GPU, numbered as nvidia-smi numbers it (PCI bus order)."""

    index: int
    uuid: str
    name: str | None = None
    pci_bus_id: str | None = None
    memory_total_mib: int | None = None
    memory_used_mib: int | None = None
    memory_free_mib: int | None = None
    utilization_pct: int | None = None
    processes: tuple[GpuProcess, ...] = ()
    mig_devices: tuple[MigDevice, ...] = ()
    minor: int | None = None
    """N of the card's `/dev/nvidiaN` (NVML's minor number): how Slurm's gres numbers it
    (`gpus.slurm`); None where NVML does not tell."""

    @property
    def ref(self) -> str:
        return str(self.index)


class Inventory(NamedTuple):
    """What NVML says about this machine; `error` says why there is no list when there is none. A
    reading served while the driver does not answer is still `available`, with `stale_seconds` and
    a `warning` saying so."""

    gpus: tuple[Gpu, ...] = ()
    driver_version: str | None = None
    error: str | None = None
    stale_seconds: float | None = None
    """The figures' age where they are the last good reading, served because NVML stopped answering;
    None: fresh."""
    blocked_seconds: float | None = None
    """How long an NVML call has been waiting, where the driver is not answering; None: it answers."""
    warning: str | None = None
    """What must be said with the figures (that they are stale, and why)."""
    error_code: str | None = None
    """What `error` (or a stale reading's `warning`) is, as a code (`NVML_MISSING` ..., the schema's
    `$defs/errorCode`): set where it happens, so nobody compares messages; None with neither."""

    @property
    def available(self) -> bool:
        return self.error is None

    @property
    def stale(self) -> bool:
        return self.stale_seconds is not None

    def find(self, ref: str) -> Gpu | MigDevice:
        """The GPU (or MIG device) `ref` names: an index, a UUID or a unique UUID prefix."""
        if is_index(ref):
            for gpu in self.gpus:
                if gpu.index == int(ref):
                    return gpu
            raise PolicyError(f"there is no GPU {ref}; this machine has {self.describe_choices()}")
        matches = [d for d in self.devices() if d.uuid.lower().startswith(ref.lower())]
        exact = [d for d in matches if d.uuid.lower() == ref.lower()]
        if len(exact) == 1 or len(matches) == 1:
            return (exact or matches)[0]
        if not matches:
            raise PolicyError(f"no GPU has a UUID starting with {ref}; this machine has {self.describe_choices()}")
        candidates = ", ".join(d.uuid for d in matches)
        raise PolicyError(f"{ref} matches {len(matches)} devices ({candidates}); give more of the UUID")

    def card_index(self, ref: str) -> int | None:
        """The nvidia-smi index of the card `ref` (an index, a GPU or MIG UUID or prefix) names, a MIG
        instance's card for a MIG UUID; None where this inventory does not tell."""
        if not self.available:
            return None
        try:
            device = self.find(ref)
        except PolicyError:
            return None
        if isinstance(device, Gpu):
            return device.index
        return next((gpu.index for gpu in self.gpus if device in gpu.mig_devices), None)

    def known_refs(self) -> set[str] | None:
        """Every GPU index and GPU/MIG UUID, for `parse_cuda_visible`; None without an inventory."""
        if not self.available:
            return None
        return {gpu.ref for gpu in self.gpus} | {device.uuid for device in self.devices()}

    def devices(self) -> list[Gpu | MigDevice]:
        return [d for gpu in self.gpus for d in (gpu, *gpu.mig_devices)]

    def describe_choices(self) -> str:
        if not self.gpus:
            return "no GPU"
        return ", ".join(f"GPU {g.index} ({g.uuid[:12]})" for g in self.gpus)


class InventoryCatalog:
    """`grammar.GpuCatalog` over the inventory, read on first use (so `%load_ext` never loads NVML).

    Without NVML, references pass through unchecked and what needs real numbers is a `PolicyError`
    that says why the inventory is missing."""

    def __init__(self, inventory: Inventory | None = None) -> None:
        self._inventory = inventory

    @property
    def inventory(self) -> Inventory:
        return self._inventory if self._inventory is not None else cached_inventory()

    def _require(self, why: str) -> Inventory:
        inventory = self.inventory
        if not inventory.available:
            raise PolicyError(f"{why}: {inventory.error}")
        return inventory

    def resolve(self, ref: str) -> str:
        inventory = self.inventory
        if not inventory.available:
            return ref
        device = inventory.find(ref)
        return device.ref if is_index(ref) and isinstance(device, Gpu) else device.uuid

    def total_mib(self, ref: str) -> int | None:
        return self._require(PERCENT_UNKNOWN).find(ref).memory_total_mib

    def refs(self) -> list[str]:
        return [gpu.ref for gpu in self._require(PERCENT_UNKNOWN).gpus]

    def is_mig(self, ref: str) -> bool:
        inventory = self.inventory
        if inventory.available:
            return isinstance(inventory.find(ref), MigDevice)
        return ref.upper().startswith("MIG-")

    def by_free_memory(self) -> list[Gpu]:
        """GPUs with the most free memory first; ties: lower utilization, then index. Never from a
        stale reading: its free memory may be long gone."""
        inventory = self._require("`visible auto` needs the GPU inventory, which is unavailable")
        if inventory.stale:
            raise PolicyError(f"`visible auto` needs current GPU figures: {inventory.warning}")
        return sorted(inventory.gpus, key=freest_first)

    def uuid_to_index(self) -> dict[str, str]:
        inventory = self.inventory
        return {gpu.uuid: gpu.ref for gpu in inventory.gpus} if inventory.available else {}

    def scope(self) -> str:
        """How many GPUs there are to choose from, for a message (`gpus.cudaenv.GrantedCatalog` names a grant)."""
        return f"this machine has only {len(self.inventory.gpus)} GPU(s)"


def self_mib(gpu: Gpu) -> int | None:
    """MiB this process holds on `gpu` by NVML's process list: 0 when not listed, None when a figure
    is unknown or NVML's pids cannot be told apart from ours (a container)."""
    if any(proc.is_self is None for proc in gpu.processes):
        return None
    mine = [proc.used_mib for proc in gpu.processes if proc.is_self]
    return None if None in mine else sum(mine)  # type: ignore[arg-type]


def freest_first(gpu: Gpu) -> tuple[int, int, int]:
    """Sort key: most free memory first; ties: lower utilization (unknown last), then index."""
    return -(gpu.memory_free_mib or 0), 101 if gpu.utilization_pct is None else gpu.utilization_pct, gpu.index


NVML_MISSING, NO_DRIVER_FOUND, NVML_FAILED, DRIVER_NOT_ANSWERING = (
    "nvml_missing", "no_driver", "nvml_failed", "driver_not_answering")
"""`Inventory.error_code`s (`$defs/errorCode` of jupyter/tfgpu-state.schema.json)."""

NO_BINDING = "nvidia-ml-py is not installed (`pip install nvidia-ml-py`)"
"""`Inventory.error` where NVML's Python binding is missing (the doctor's fix depends on it)."""

DRIVER_MARKERS = ("/proc/driver/nvidia", "/dev/nvidiactl", "/dev/dxg")
"""Any of these exists where an NVIDIA driver is loaded (the last one under WSL2)."""
NO_DRIVER = f"NVML unavailable: no NVIDIA driver here (none of {', '.join(DRIVER_MARKERS)} exists)"
"""`Inventory.error` where no NVIDIA driver is loaded."""


@functools.cache
def driver_present() -> bool:
    """Cheap check before importing pynvml (an 8,000-line module) on a machine without a driver;
    asked once per process, like NVML is started once (`shared_nvml`)."""
    return sys.platform != "linux" or any(os.path.exists(marker) for marker in DRIVER_MARKERS)


class Answer(NamedTuple):
    """What `Nvml.run` got: `value` when `done`; else how long the call under way has been waiting."""

    done: bool
    value: Any = None
    blocked_seconds: float = 0.0


class _Flight:
    """One job of `Nvml.run`, in its own daemon thread."""

    __slots__ = ("job", "kind", "started", "finished", "value", "error")

    def __init__(self, job: Callable[[], Any], kind: str) -> None:
        self.job, self.kind, self.started = job, kind, time.monotonic()
        self.finished = threading.Event()
        self.value: Any = None
        self.error: BaseException | None = None

    def fly(self) -> None:
        try:
            self.value = self.job()
        except BaseException as err:  # handed to whoever waits for it
            self.error = err
        finally:
            self.finished.set()


class Nvml:
    """The one chokepoint for NVML: `call` returns None instead of raising NVML errors; `run` bounds
    a read by `deadline` seconds. `last_good` is the session's last complete inventory."""

    def __init__(self, module: Any = None, deadline: float = DEADLINE_SECONDS) -> None:
        self.module = module
        self.deadline = deadline
        self.error: str | None = None
        self.error_code: str | None = None
        """`error` as a code (`NVML_MISSING`, `NO_DRIVER_FOUND`, `NVML_FAILED`)."""
        self.started = False
        self.last_good: Inventory | None = None
        self._last_good_at = 0.0
        self._lock = threading.Lock()
        self._flight: _Flight | None = None
        if module is None:
            if not driver_present():
                self.error, self.error_code = NO_DRIVER, NO_DRIVER_FOUND
                return
            try:
                import pynvml
            except ImportError:
                self.error, self.error_code = NO_BINDING, NVML_MISSING
                return
            self.module = pynvml
        self.run(self._start, "start")  # past the deadline, the start goes on; reads wait for it

    def _start(self) -> None:
        try:
            self.module.nvmlInit()
        except self.module.NVMLError as err:
            self.error = f"NVML could not start: {err} (no NVIDIA driver, or no GPU in this container)"
            self.error_code = NVML_FAILED
        except OSError as err:
            self.error, self.error_code = f"NVML could not start: {err}", NVML_FAILED
        else:
            self.started = True

    def call(self, name: str, *args: Any) -> Any:
        """`pynvml.<name>(*args)`, or None when NVML says no, has not started, or the binding lacks
        `name` (an older nvidia-ml-py than the function: unknown, like a driver that does not
        support it). Unbounded: call it inside a job of `run`."""
        if self.error is not None or not self.started:
            return None
        function = getattr(self.module, name, None)
        if function is None:
            return None
        try:
            return function(*args)
        except self.module.NVMLError:
            return None

    def run(self, job: Callable[[], Any], kind: str) -> Answer:
        """`job()` in a daemon thread, waited on for at most `deadline` seconds from its start.

        One job at a time: a caller finding a job of its `kind` under way shares that job's answer,
        one of another kind waits for it and then runs its own. A job past its deadline (a wedged
        call) is neither waited on again nor stacked on: every caller gets `done=False` at once
        until it returns. A thread (never a ThreadPoolExecutor's, which is joined at exit) so that a
        process with a call stuck in the driver still exits."""
        while True:
            with self._lock:
                flight = self._flight
                if flight is None or flight.finished.is_set():
                    flight = self._flight = _Flight(job, kind)
                    threading.Thread(target=flight.fly, name=f"tfgpu-nvml-{kind}", daemon=True).start()
            left = flight.started + self.deadline - time.monotonic()
            if not flight.finished.wait(max(left, 0.0)):
                return Answer(False, blocked_seconds=time.monotonic() - flight.started)
            if flight.kind == kind:  # ours, or the same read begun by another caller
                if flight.error is not None:
                    raise flight.error
                return Answer(True, flight.value)

    def keep(self, reading: Inventory) -> Inventory:
        """Remember a complete reading as the last good one."""
        if reading.available:
            self.last_good, self._last_good_at = reading, time.monotonic()
        return reading

    def stale(self, blocked_seconds: float) -> Inventory:
        """The last good reading marked stale, saying the driver is not answering; an error without one."""
        if self.last_good is None:
            return Inventory(error=not_answering(blocked_seconds), blocked_seconds=blocked_seconds,
                             error_code=DRIVER_NOT_ANSWERING)
        age = time.monotonic() - self._last_good_at
        return self.last_good._replace(stale_seconds=age, blocked_seconds=blocked_seconds,
                                       warning=not_answering(blocked_seconds, age), error_code=DRIVER_NOT_ANSWERING)


def not_answering(blocked_seconds: float, age: float | None = None) -> str:
    """Why NVML gave nothing new: its first clause (before " (") is the reason, then the doctor's hint."""
    shown = "" if age is None else f"; these GPU figures are from {age:.0f} s ago"
    return f"{NOT_ANSWERING}: an NVML call has waited {blocked_seconds:.0f} s{shown} ({DOCTOR_HINT})"


@functools.cache
def shared_nvml() -> Nvml:
    """The process's NVML session: initialised once (NVML counts every nvmlInit), never per read."""
    return Nvml()


def read_inventory(nvml: Nvml | None = None) -> Inventory:
    """A fresh inventory of every GPU NVML sees, within the session's deadline; past it the last good
    one, marked stale (or an error where there is none)."""
    nvml = nvml or shared_nvml()
    if nvml.error is not None:
        return Inventory(error=nvml.error, error_code=nvml.error_code)
    answer = nvml.run(lambda: nvml.keep(_read_all(nvml)), "inventory")
    return answer.value if answer.done else nvml.stale(answer.blocked_seconds)


def _read_all(nvml: Nvml) -> Inventory:
    if nvml.error is not None:  # the start, having outlived a deadline, failed since
        return Inventory(error=nvml.error, error_code=nvml.error_code)
    count = nvml.call("nvmlDeviceGetCount") or 0
    gpus = []
    for index in range(count):
        handle = nvml.call("nvmlDeviceGetHandleByIndex", index)
        if handle is not None:
            gpus.append(_read_gpu(nvml, index, handle))
    return Inventory(gpus=tuple(gpus), driver_version=_text(nvml.call("nvmlSystemGetDriverVersion")))


def _read_gpu(nvml: Nvml, index: int, handle: Any) -> Gpu:
    memory = nvml.call("nvmlDeviceGetMemoryInfo", handle)
    utilization = nvml.call("nvmlDeviceGetUtilizationRates", handle)
    pci = nvml.call("nvmlDeviceGetPciInfo", handle)
    processes_there = nvml.call("nvmlDeviceGetComputeRunningProcesses", handle) or []
    me = None if processes.foreign_pid_namespace() else os.getpid()
    return Gpu(
        index=index,
        uuid=_text(nvml.call("nvmlDeviceGetUUID", handle)) or f"unknown-{index}",
        name=_text(nvml.call("nvmlDeviceGetName", handle)),
        pci_bus_id=_text(getattr(pci, "busId", None)),
        memory_total_mib=_mib(getattr(memory, "total", None)),
        memory_used_mib=_mib(getattr(memory, "used", None)),
        memory_free_mib=_mib(getattr(memory, "free", None)),
        utilization_pct=getattr(utilization, "gpu", None),
        processes=tuple(
            GpuProcess(p.pid, _mib(getattr(p, "usedGpuMemory", None)), None if me is None else p.pid == me)
            for p in processes_there
        ),
        mig_devices=tuple(_read_mig(nvml, handle)),
        minor=_minor(nvml.call("nvmlDeviceGetMinorNumber", handle)),
    )


def _read_mig(nvml: Nvml, handle: Any) -> list[MigDevice]:
    mode = nvml.call("nvmlDeviceGetMigMode", handle)
    if not mode or not mode[0]:
        return []
    devices = []
    for slot in range(nvml.call("nvmlDeviceGetMaxMigDeviceCount", handle) or 0):
        mig = nvml.call("nvmlDeviceGetMigDeviceHandleByIndex", handle, slot)
        uuid = _text(nvml.call("nvmlDeviceGetUUID", mig)) if mig is not None else None
        if uuid:
            memory = nvml.call("nvmlDeviceGetMemoryInfo", mig)
            devices.append(MigDevice(uuid, _mib(getattr(memory, "total", None))))
    return devices


def _minor(value: Any) -> int | None:
    """A minor number as NVML gives it (an int), anything else unknown."""
    return value if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 1 << 20 else None


def _mib(value: Any) -> int | None:
    return None if value is None else int(value) // MIB


def _text(value: Any) -> str | None:
    if value is None:
        return None
    return value.decode() if isinstance(value, bytes) else str(value)


_cache: tuple[float, Inventory] | None = None


def cached_inventory(max_age: float = CACHE_SECONDS) -> Inventory:
    """`read_inventory()`, reused for `max_age` seconds (status and panel refresh often)."""
    global _cache
    now = time.monotonic()
    if _cache is None or now - _cache[0] > max_age:
        _cache = (now, read_inventory())
    return _cache[1]
