"""The GPU inventory from NVIDIA's own library (NVML, `nvidia-ml-py`): the only module that imports it.

Every NVML call goes through `Nvml.call`, which turns an NVML error, or a function the installed
binding does not have, into None ("unknown"), never a crash. Everything works without NVML:
`read_inventory()` then reports why there is none.
"""

from __future__ import annotations

import functools
import os
import sys
import time
from typing import Any, NamedTuple

from ..errors import PolicyError
from ..language.policy import is_index
from ..language.sizes import MIB

CACHE_SECONDS = 2.0
PERCENT_UNKNOWN = "a size in % needs the card's total memory, which is unknown"


class GpuProcess(NamedTuple):
    pid: int
    used_mib: int | None
    is_self: bool


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

    @property
    def ref(self) -> str:
        return str(self.index)


class Inventory(NamedTuple):
    """What NVML says about this machine; `error` says why there is no list when there is none."""

    gpus: tuple[Gpu, ...] = ()
    driver_version: str | None = None
    error: str | None = None

    @property
    def available(self) -> bool:
        return self.error is None

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
        """GPUs with the most free memory first; ties: lower utilization, then index."""
        return sorted(self._require("`visible auto` needs the GPU inventory, which is unavailable").gpus,
                      key=freest_first)

    def uuid_to_index(self) -> dict[str, str]:
        inventory = self.inventory
        return {gpu.uuid: gpu.ref for gpu in inventory.gpus} if inventory.available else {}


def self_mib(gpu: Gpu) -> int | None:
    """MiB this process holds on `gpu` by NVML's process list: 0 when not listed, None when a figure
    is unknown."""
    mine = [proc.used_mib for proc in gpu.processes if proc.is_self]
    return None if None in mine else sum(mine)  # type: ignore[arg-type]


def freest_first(gpu: Gpu) -> tuple[int, int, int]:
    """Sort key: most free memory first; ties: lower utilization (unknown last), then index."""
    return -(gpu.memory_free_mib or 0), 101 if gpu.utilization_pct is None else gpu.utilization_pct, gpu.index


NO_BINDING = "nvidia-ml-py is not installed (`pip install nvidia-ml-py`)"
"""`Inventory.error` where NVML's Python binding is missing (the doctor's fix depends on it)."""

DRIVER_MARKERS = ("/proc/driver/nvidia", "/dev/nvidiactl", "/dev/dxg")
"""Any of these exists where an NVIDIA driver is loaded (the last one under WSL2)."""


@functools.cache
def driver_present() -> bool:
    """Cheap check before importing pynvml (an 8,000-line module) on a machine without a driver;
    asked once per process, like NVML is started once (`shared_nvml`)."""
    return sys.platform != "linux" or any(os.path.exists(marker) for marker in DRIVER_MARKERS)


class Nvml:
    """The one chokepoint for NVML: `call` returns None instead of raising NVML errors."""

    def __init__(self, module: Any = None) -> None:
        self.module = module
        self.error: str | None = None
        if module is None:
            if not driver_present():
                self.error = f"NVML unavailable: no NVIDIA driver here (none of {', '.join(DRIVER_MARKERS)} exists)"
                return
            try:
                import pynvml
            except ImportError:
                self.error = NO_BINDING
                return
            self.module = pynvml
        try:
            self.module.nvmlInit()
        except self.module.NVMLError as err:
            self.error = f"NVML could not start: {err} (no NVIDIA driver, or no GPU in this container)"
        except OSError as err:
            self.error = f"NVML could not start: {err}"

    def call(self, name: str, *args: Any) -> Any:
        """`pynvml.<name>(*args)`, or None when NVML says no or the binding lacks `name` (an older
        nvidia-ml-py than the function: unknown, like a driver that does not support it)."""
        if self.error is not None:
            return None
        function = getattr(self.module, name, None)
        if function is None:
            return None
        try:
            return function(*args)
        except self.module.NVMLError:
            return None


@functools.cache
def shared_nvml() -> Nvml:
    """The process's NVML session: initialised once (NVML counts every nvmlInit), never per read."""
    return Nvml()


def read_inventory(nvml: Nvml | None = None) -> Inventory:
    """A fresh inventory of every GPU NVML sees."""
    nvml = nvml or shared_nvml()
    if nvml.error is not None:
        return Inventory(error=nvml.error)
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
    processes = nvml.call("nvmlDeviceGetComputeRunningProcesses", handle) or []
    me = os.getpid()
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
            GpuProcess(p.pid, _mib(getattr(p, "usedGpuMemory", None)), p.pid == me) for p in processes
        ),
        mig_devices=tuple(_read_mig(nvml, handle)),
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
