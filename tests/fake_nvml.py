"""`FakeNvml`: a stand-in for the `pynvml` module, passed at the inventory's one chokepoint,
`tfgpu_magic.gpus.inventory.Nvml(module=FakeNvml(...))`.

It mirrors the shapes of nvidia-ml-py 13 (checked against the real module in tests/test_inventory.py):
memory in bytes on an object with `total`/`free`/`used`, `.gpu` utilization, `.busId` as bytes (a
ctypes `c_char` array), processes as objects with `.pid` and `.usedGpuMemory` (bytes, or None where
NVML cannot tell), `nvmlDeviceGetMigMode` → `[current, pending]`, opaque handles, and `NVMLError`
carrying an error code. UUIDs, names and the driver version come back as `str` (nvidia-ml-py ≥ 11.5)
or, with `text_as_bytes=True`, as `bytes` (older releases).

Failures are configurable: `init_error` makes `nvmlInit` raise (no driver), `fail` makes named calls
raise on every GPU, `FakeGpu.fail` on one GPU only, `block` makes named calls (`nvmlInit` included)
hang like a wedged driver's: for a number of seconds, or until the test sets an `Event`.
`OlderBinding` stands for an nvidia-ml-py that predates some functions (the module has no such
attribute).
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass, field
from types import SimpleNamespace

MIB = 1024 * 1024

NVML_ERROR_UNINITIALIZED = 1
NVML_ERROR_INVALID_ARGUMENT = 2
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NO_PERMISSION = 4
NVML_ERROR_NOT_FOUND = 6
NVML_ERROR_DRIVER_NOT_LOADED = 9
NVML_ERROR_LIBRARY_NOT_FOUND = 12
NVML_ERROR_FUNCTION_NOT_FOUND = 13
NVML_ERROR_GPU_IS_LOST = 15

_ERROR_TEXT = {
    NVML_ERROR_UNINITIALIZED: "Uninitialized",
    NVML_ERROR_INVALID_ARGUMENT: "Invalid Argument",
    NVML_ERROR_NOT_SUPPORTED: "Not Supported",
    NVML_ERROR_NO_PERMISSION: "Insufficient Permissions",
    NVML_ERROR_NOT_FOUND: "Not Found",
    NVML_ERROR_DRIVER_NOT_LOADED: "Driver Not Loaded",
    NVML_ERROR_LIBRARY_NOT_FOUND: "NVML Shared Library Not Found",
    NVML_ERROR_FUNCTION_NOT_FOUND: "Function Not Found",
    NVML_ERROR_GPU_IS_LOST: "GPU is lost",
}


class NVMLError(Exception):
    """Like `pynvml.NVMLError`: `.value` is the NVML error code, `str()` its text."""

    def __init__(self, value: int) -> None:
        super().__init__(value)
        self.value = value

    def __str__(self) -> str:
        return _ERROR_TEXT.get(self.value, f"NVML Error with code {self.value}")


@dataclass
class FakeMig:
    """One MIG instance of a MIG-enabled GPU, in slot `slot` of its parent."""

    uuid: str
    total_mib: float
    slot: int = 0


@dataclass
class FakeGpu:
    """One GPU as NVML reports it; `mig=None`: the card cannot do MIG (NVML says Not Supported)."""

    uuid: str
    name: str = "NVIDIA A100-SXM4-80GB"
    bus_id: str = "00000000:07:00.0"
    total_mib: float = 81920
    used_mib: float = 0
    utilization: int = 0
    processes: list[tuple[int, float | None]] = field(default_factory=list)
    """(pid, MiB used or None) of each compute process."""
    mig: list[FakeMig] | None = None
    mig_enabled: bool = False
    max_mig_slots: int = 7
    compute_capability: tuple[int, int] = (8, 0)
    """(major, minor) as `nvmlDeviceGetCudaComputeCapability` gives it (an A100 is 8.0)."""
    minor: int | None = None
    """N of its `/dev/nvidiaN`, as `nvmlDeviceGetMinorNumber` gives it (what Slurm's gres IDs name);
    None: its place in the fake's list, as the driver numbers cards on most machines."""
    fail: dict[str, int] = field(default_factory=dict)
    """Function name → NVML error code raised for this GPU only."""


@dataclass(frozen=True)
class Handle:
    """An opaque device handle (pynvml's are ctypes pointers): which GPU, and which MIG slot."""

    gpu: FakeGpu
    mig: FakeMig | None = None


class FakeNvml:
    """The `pynvml` functions the inventory calls, over `gpus`, recording each call in `calls`."""

    NVMLError = NVMLError

    def __init__(
        self,
        gpus: list[FakeGpu],
        *,
        driver: str = "550.54.15",
        init_error: BaseException | int | None = None,
        fail: dict[str, int] | None = None,
        text_as_bytes: bool = False,
        block: dict[str, float | threading.Event] | None = None,
    ) -> None:
        self.gpus = gpus
        self.driver = driver
        self.init_error = init_error
        self.fail = dict(fail or {})
        self.text_as_bytes = text_as_bytes
        self.block = dict(block or {})
        """Function name → seconds it sleeps, or an `Event` it waits for, before it answers."""
        self.initialized = False
        self.calls: list[str] = []

    # ----- plumbing ------------------------------------------------------------------------
    def _hang(self, name: str) -> None:
        """Block the calling thread as a wedged driver would, where `block` says so."""
        wait = self.block.get(name)
        if isinstance(wait, threading.Event):
            wait.wait()
        elif wait is not None:
            time.sleep(wait)

    def _enter(self, name: str, handle: Handle | None = None) -> None:
        """Record the call; hang where `block` says; raise what NVML would (not initialized, or a
        configured failure)."""
        self.calls.append(name)
        self._hang(name)
        if not self.initialized:
            raise NVMLError(NVML_ERROR_UNINITIALIZED)
        code = self.fail.get(name)
        if code is None and handle is not None:
            code = handle.gpu.fail.get(name)
        if code is not None:
            raise NVMLError(code)

    def _text(self, value: str) -> str | bytes:
        return value.encode() if self.text_as_bytes else value

    # ----- pynvml's API --------------------------------------------------------------------
    def nvmlInit(self) -> None:
        self.calls.append("nvmlInit")
        self._hang("nvmlInit")
        if isinstance(self.init_error, int):
            raise NVMLError(self.init_error)
        if self.init_error is not None:
            raise self.init_error
        self.initialized = True

    def nvmlShutdown(self) -> None:
        self._enter("nvmlShutdown")
        self.initialized = False

    def nvmlSystemGetDriverVersion(self) -> str | bytes:
        self._enter("nvmlSystemGetDriverVersion")
        return self._text(self.driver)

    def nvmlDeviceGetCount(self) -> int:
        self._enter("nvmlDeviceGetCount")
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> Handle:
        self._enter("nvmlDeviceGetHandleByIndex")
        if not 0 <= index < len(self.gpus):
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        handle = Handle(self.gpus[index])
        code = handle.gpu.fail.get("nvmlDeviceGetHandleByIndex")
        if code is not None:
            raise NVMLError(code)
        return handle

    def nvmlDeviceGetUUID(self, handle: Handle) -> str | bytes:
        self._enter("nvmlDeviceGetUUID", handle)
        return self._text(handle.mig.uuid if handle.mig else handle.gpu.uuid)

    def nvmlDeviceGetName(self, handle: Handle) -> str | bytes:
        self._enter("nvmlDeviceGetName", handle)
        return self._text(handle.gpu.name)

    def nvmlDeviceGetPciInfo(self, handle: Handle) -> SimpleNamespace:
        self._enter("nvmlDeviceGetPciInfo", handle)
        bus = handle.gpu.bus_id.encode()
        return SimpleNamespace(busId=bus, busIdLegacy=bus[-12:], domain=0, bus=int(bus[9:11], 16), device=0)

    def nvmlDeviceGetMemoryInfo(self, handle: Handle, version: int | None = None) -> SimpleNamespace:
        self._enter("nvmlDeviceGetMemoryInfo", handle)
        if handle.mig is not None:
            total, used = int(handle.mig.total_mib * MIB), 0
        else:
            total, used = int(handle.gpu.total_mib * MIB), int(handle.gpu.used_mib * MIB)
        return SimpleNamespace(total=total, free=total - used, used=used)

    def nvmlDeviceGetUtilizationRates(self, handle: Handle) -> SimpleNamespace:
        self._enter("nvmlDeviceGetUtilizationRates", handle)
        if handle.gpu.mig_enabled:  # NVML does not report utilization on a MIG-enabled GPU
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        return SimpleNamespace(gpu=handle.gpu.utilization, memory=0)

    def nvmlDeviceGetComputeRunningProcesses(self, handle: Handle) -> list[SimpleNamespace]:
        self._enter("nvmlDeviceGetComputeRunningProcesses", handle)
        return [
            SimpleNamespace(
                pid=pid,
                usedGpuMemory=None if mib is None else int(mib * MIB),
                gpuInstanceId=0xFFFFFFFF,
                computeInstanceId=0xFFFFFFFF,
            )
            for pid, mib in handle.gpu.processes
        ]

    def nvmlDeviceGetCudaComputeCapability(self, handle: Handle) -> tuple[int, int]:
        self._enter("nvmlDeviceGetCudaComputeCapability", handle)
        return handle.gpu.compute_capability

    def nvmlDeviceGetMinorNumber(self, handle: Handle) -> int:
        self._enter("nvmlDeviceGetMinorNumber", handle)
        if handle.mig is not None:  # a MIG instance has no device file of its own
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        return handle.gpu.minor if handle.gpu.minor is not None else self.gpus.index(handle.gpu)

    def nvmlDeviceGetMigMode(self, handle: Handle) -> list[int]:
        self._enter("nvmlDeviceGetMigMode", handle)
        if handle.gpu.mig is None:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        mode = int(handle.gpu.mig_enabled)
        return [mode, mode]

    def nvmlDeviceGetMaxMigDeviceCount(self, handle: Handle) -> int:
        self._enter("nvmlDeviceGetMaxMigDeviceCount", handle)
        return handle.gpu.max_mig_slots if handle.gpu.mig is not None else 0

    def nvmlDeviceGetMigDeviceHandleByIndex(self, handle: Handle, index: int) -> Handle:
        self._enter("nvmlDeviceGetMigDeviceHandleByIndex", handle)
        for mig in handle.gpu.mig or ():
            if mig.slot == index:
                return Handle(handle.gpu, mig)
        raise NVMLError(NVML_ERROR_NOT_FOUND)  # an empty slot, as NVML reports it


class OlderBinding:
    """A `pynvml` module from before the functions in `missing` were added: `fake` without them."""

    def __init__(self, fake: FakeNvml, missing: set[str]) -> None:
        self.fake = fake
        self.missing = missing

    def __getattr__(self, name: str) -> object:
        if name in self.missing:
            raise AttributeError(f"module 'pynvml' has no attribute {name!r}")
        return getattr(self.fake, name)


# ----- the standard machine of the tests ---------------------------------------------------------
UUIDS = (
    "GPU-0a6f8c2e-1d3b-4c5a-9e7f-112233445566",
    "GPU-b1c2d3e4-f5a6-4b7c-8d9e-0f1a2b3c4d5e",
    "GPU-b2d4f6a8-0c1e-4a3b-9c5d-6e7f8a9b0c1d",
    "GPU-c3e5a7b9-2d4f-4e6a-8b0c-1d2e3f4a5b6c",
)
MIG_UUIDS = (
    "MIG-5e6f7a8b-9c0d-5e1f-a2b3-c4d5e6f7a8b9",
    "MIG-7a8b9c0d-1e2f-5a3b-c4d5-e6f7a8b9c0d1",
)
OTHER_PID = 4242
"""A compute process of another user on GPU 0."""


def four_gpus(this_kernel: bool = True) -> list[FakeGpu]:
    """Four cards: GPU 0 busy (this kernel, unless `this_kernel` is False, and another process on it),
    GPUs 1 and 2 tied on free memory (2 is less busy), GPU 3 a 40 GB card in MIG mode with two
    instances (slots 0 and 2). This kernel on a GPU means CUDA has started in it."""
    mine = [(os.getpid(), 1024)] if this_kernel else [(OTHER_PID + 1, 1024)]
    return [
        FakeGpu(UUIDS[0], bus_id="00000000:07:00.0", used_mib=20480.5, utilization=50,
                processes=[*mine, (OTHER_PID, 19456)], mig=[]),
        FakeGpu(UUIDS[1], bus_id="00000000:0F:00.0", used_mib=1024, utilization=30, mig=[]),
        FakeGpu(UUIDS[2], bus_id="00000000:47:00.0", used_mib=1024, utilization=10),
        FakeGpu(UUIDS[3], name="NVIDIA A100-SXM4-40GB", bus_id="00000000:4E:00.0", total_mib=40960,
                mig=[FakeMig(MIG_UUIDS[0], 19968, slot=0), FakeMig(MIG_UUIDS[1], 9856, slot=2)],
                mig_enabled=True),
    ]
