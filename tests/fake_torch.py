"""`FakeTorch`: the `tfgpu_magic.frameworks.torch.TorchAPI` seam with PyTorch's rules, for its GPU paths
without a GPU (PyTorch's CUDA wheels carry about 3 GB of CUDA libraries; the CPU wheel cannot start CUDA).

Each rule is read from PyTorch 2.13's source, named where it is used: torch/cuda/__init__.py (`_lazy_init`,
`_lazy_call`, `is_initialized`, `device_count`, `_parse_visible_devices`, `class device`),
torch/cuda/memory.py (`set_per_process_memory_fraction`, `get_per_process_memory_fraction`,
`memory_stats`), and the C++ side it calls: c10/cuda/CUDACachingAllocator.cpp (`BackendStaticInitializer`,
which picks the allocator backend as the library loads, at `import torch`; `setMemoryFraction`),
c10/cuda/CUDAAllocatorConfig.h (`CUDAAllocatorConfig::instance`, which variable wins) and
CUDAAllocatorConfig.cpp (`parseAllocatorConfig`: a backend read at CUDA start that differs from the one
picked at load time is an internal assert, pytorch#104801). tests/test_torch.py checks the rules that a
CPU-only torch can show against real torch (the queue before CUDA starts, the calls that start it).

The fake plays torch's life around the seam: `import_torch()` (the library loads), `start_cuda()` (what
a user's first CUDA call does), `allocate()` (a tensor on a device, refused past the fraction). The seam
calls that start CUDA in real torch (`set_fraction`, `fraction`) raise `CudaStartedByCode` when CUDA has
not started: the code under test would have started it, so settings read at CUDA start would be read
before the policy meant them to be.
"""

from __future__ import annotations

from typing import Callable, MutableMapping, Sequence

from fake_tf import FakeTF, SeamMisuse, cuda_visible_ids, fake_uuid
from tfgpu_magic.frameworks.torch import TorchState

VERSION = "2.13.0"
CUDA_VERSION = "12.8"
"""`torch.version.cuda` of the CUDA build the fake stands for (None for the CPU build)."""
NATIVE, ASYNC = "native", "cudaMallocAsync"
"""The allocator backends (`CUDAAllocator::name()`); `backend:cudaMallocAsync` picks the second."""
ALLOC_CONF_ORDER = ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF")
"""`CUDAAllocatorConfig::instance()` (c10/cuda/CUDAAllocatorConfig.h in the 2.13 wheel) reads the old
name first and the new one only where the old is unset; set to '' counts as set. The device-generic
`AcceleratorAllocatorConfig` does the same in 2.13 (real torch shows it: tests/test_torch.py)."""
MIB = 1024 * 1024
OWN_QUEUED = ("_check_capability", "_check_cubins", "_register_triton_kernels")
"""What `import torch` queues itself with `_lazy_call`, in order (torch/cuda/__init__.py in 2.13)."""


class CudaStartedByCode(SeamMisuse):
    """The code under test made a call that starts PyTorch's CUDA (`_lazy_init`) before the user did."""


class DeferredCudaCallError(Exception):
    """torch.cuda.DeferredCudaCallError: a queued call failed as CUDA started (torch/cuda/__init__.py)."""


class FakeOutOfMemoryError(RuntimeError):
    """torch.OutOfMemoryError: the caching allocator refused an allocation (past the fraction, here)."""


def torch_visible(value: str | None, machine: int, uuids: Sequence[str]) -> int:
    """`torch.cuda.device_count()` before CUDA starts with NVML working: `_device_count_nvml` over
    `_parse_visible_devices` (torch/cuda/__init__.py). Indices are read like strtoul ('1gpu' is 1), a
    repeated one empties the list, a negative one ends it, the list stops at the first index past the
    machine's count; a `GPU-` list keeps entries while they have the prefix and maps each through
    NVML's UUIDs (`_transform_uuid_to_ordinals`: a unique prefix, stopping at the first that is not, a
    repeated card empties it); unset means every GPU. (A `MIG-` list makes NVML's count fail; not modelled.)"""
    if value is None:
        return machine
    if value.startswith("GPU-"):
        entries: list[str] = []
        for entry in value.split(","):  # parse_list_with_prefix
            if entry in entries:
                return 0
            if not entry.startswith("GPU-"):
                break
            entries.append(entry)
        found: list[int] = []
        for entry in entries:  # _transform_uuid_to_ordinals
            matches = [i for i, uuid in enumerate(uuids) if uuid.startswith(entry)]
            if len(matches) != 1:
                break
            if matches[0] in found:
                return 0
            found.append(matches[0])
        return len(found)
    indices: list[int] = []
    for entry in value.split(","):
        digits = entry.strip()
        head = digits[:1] if digits[:1] in "+-" else ""
        rest = digits[len(head):]
        number = rest[:len(rest) - len(rest.lstrip("0123456789"))]
        index = int(head + number) if number else -1
        if index in indices:
            return 0
        if index < 0:
            break
        indices.append(index)
    return next((position for position, index in enumerate(indices) if index >= machine), len(indices))


class FakeTorch:
    """PyTorch in a process on a machine with `gpus` NVIDIA cards, seen through the `TorchAPI` seam.

    `environ` is the process's environment (the controller's); `tf`, when given, is the FakeTF of the
    same process: CUDA's driver starts once per process, so whichever framework starts it first fixes
    the GPUs it enumerates for both (`FakeTF.start_cuda`). `nvml=False`: NVML cannot be loaded, so
    `device_count()` asks the CUDA runtime, which starts the driver."""

    def __init__(
        self,
        gpus: int = 4,
        *,
        imported: bool = False,
        cuda_build: bool = True,
        environ: MutableMapping[str, str] | None = None,
        tf: FakeTF | None = None,
        totals_mib: Sequence[int] | None = None,
        uuids: Sequence[str] | None = None,
        nvml: bool = True,
    ) -> None:
        self.environ = {} if environ is None else environ
        self.tf = tf
        self.uuids = tuple(uuids or (tf.uuids if tf is not None else [fake_uuid(i) for i in range(gpus)]))
        self.totals_mib = tuple(totals_mib or [81920] * len(self.uuids))
        self.cuda_build = cuda_build
        self.nvml = nvml
        self.imported = False
        self.loaded_backend: str | None = None
        """The backend `BackendStaticInitializer` picked as the CUDA library loaded (at import)."""
        self.queued: list[Callable[[], None]] = []
        """`torch.cuda._queued_calls`, callables only, in order (torch's own `OWN_QUEUED` first)."""
        self.initialized = False
        """`torch.cuda._initialized`."""
        self.initializing = False
        """`torch.cuda._tls.is_initializing`: queued calls are running."""
        self.started_by: str | None = None
        """The seam call that started CUDA before the user did (the trap; None: no such call)."""
        self.alloc_conf: str | None = None
        """The allocator configuration as read at CUDA start (`CUDAAllocatorConfig::instance`)."""
        self.fractions: dict[int, float] = {}
        """`_cuda_getMemoryFraction` per device (absent: 1.0, the whole device)."""
        self.current = 0
        """`torch.cuda.current_device()`: where a plain `device="cuda"` goes."""
        self.contexts: set[int] = set()
        """Devices with a CUDA context of this process (cudaSetDevice, an allocation)."""
        self.allocated: dict[int, int] = {}
        self.reserved: dict[int, int] = {}
        self.calls: list[tuple] = []
        """Every seam call that reached torch, with its arguments, in order."""
        self._cuda_ids: list[int] | None = None
        if imported:
            self.import_torch()

    # ----- PyTorch's life ------------------------------------------------------------------------
    def import_torch(self) -> None:
        """`import torch` finishes: torch/cuda/__init__.py queues its own `OWN_QUEUED` with `_lazy_call`,
        and a CUDA build's c10 library loads, whose `BackendStaticInitializer`
        (c10/cuda/CUDACachingAllocator.cpp) picks the allocator backend from the environment now."""
        if self.imported:
            return
        self.imported = True
        self.queued += [getattr(self, name) for name in OWN_QUEUED]
        if self.cuda_build:
            self.loaded_backend = _backend(self._read_alloc_conf()) or NATIVE

    def _check_capability(self) -> None:
        """torch's own queued call: warns about cards too old or too new for the build."""

    def _check_cubins(self) -> None:
        """torch's own queued call: warns where no kernel of the build fits a card."""

    def _register_triton_kernels(self) -> None:
        """torch's own queued call: registers Triton's kernels."""

    def start_cuda(self) -> None:
        """`torch.cuda._lazy_init` (torch/cuda/__init__.py), what a user's first CUDA call runs: nothing
        if started or starting (`_tls.is_initializing`: a queued call re-entering); else
        `torch._C._cuda_init()` (the driver reads `CUDA_VISIBLE_DEVICES`, the caching allocator reads its
        configuration), then every queued call in order, a call queued meanwhile included; one that
        raises becomes `DeferredCudaCallError` and CUDA counts as not started (the next call tries again)."""
        self._needs_import("torch.cuda")
        if self.initialized or self.initializing:
            return
        if not self.cuda_build:
            raise AssertionError("Torch not compiled with CUDA enabled")
        self._cuda_init()
        self.initializing = True
        try:
            position = 0
            while position < len(self.queued):  # `for ... in _queued_calls` sees calls appended meanwhile
                call = self.queued[position]
                position += 1
                try:
                    call()
                except Exception as err:
                    raise DeferredCudaCallError(f"CUDA call failed lazily at initialization with error: {err}") from err
        finally:
            self.initializing = False
        self.initialized = True

    def _cuda_init(self) -> None:
        """`torch._C._cuda_init()`: the driver enumerates the GPUs (once per process), then the caching
        allocator reads its configuration: `CUDAAllocatorConfig::parseAllocatorConfig`
        (c10/cuda/CUDAAllocatorConfig.cpp) asserts that its backend is the one picked at load time."""
        ids = self._driver_ids()
        if not ids:
            raise RuntimeError("No CUDA GPUs are available")
        conf = self._read_alloc_conf()
        backend = _backend(conf)
        if backend is not None and backend != self.loaded_backend:
            raise RuntimeError(
                f"tokenizer[i] == get()->name() INTERNAL ASSERT FAILED at \"c10/cuda/CUDAAllocatorConfig.cpp\", "
                f"please report a bug to PyTorch. Allocator backend parsed at runtime != allocator backend parsed "
                f"at load time, {backend} != {self.loaded_backend}")
        self.alloc_conf = conf

    def _driver_ids(self) -> list[int]:
        """The machine's GPUs CUDA enumerates, fixed at the process's first cuInit (FakeTF's when shared)."""
        if self.tf is not None:
            self.tf.start_cuda()  # libcuda loads, whichever library starts CUDA
            return list(self.tf.cuda_ids)
        if self._cuda_ids is None:
            self._cuda_ids = cuda_visible_ids(self.environ.get("CUDA_VISIBLE_DEVICES"), self.uuids)
        return self._cuda_ids

    def _read_alloc_conf(self) -> str | None:
        return next((self.environ[name] for name in ALLOC_CONF_ORDER if name in self.environ), None)

    def is_initialized(self) -> bool:
        """`torch.cuda.is_initialized()`: False while the queued calls run."""
        return self.initialized

    def allocate(self, device: int, mib: int) -> None:
        """A tensor of `mib` MiB on `device` (a user's CUDA op: it starts CUDA). The caching allocator
        refuses to reserve past the fraction of the device's total (`DeviceCachingAllocator::malloc`,
        `allowed_memory_maximum`): a soft cap, CUDA's context is not counted."""
        self.start_cuda()
        self._valid_device(device)
        total = self.totals_mib[self._driver_ids()[device]] * MIB
        wanted = self.reserved.get(device, 0) + mib * MIB
        if wanted > self.fractions.get(device, 1.0) * total:
            raise FakeOutOfMemoryError(f"CUDA out of memory. Tried to allocate {mib} MiB on device {device}: "
                                       "the process's memory fraction does not allow it")
        self.contexts.add(device)
        self.allocated[device] = self.allocated.get(device, 0) + mib * MIB
        self.reserved[device] = wanted

    # ----- the seam (TorchAPI) -------------------------------------------------------------------
    def state(self) -> TorchState:
        if not self.imported:
            return TorchState()
        return TorchState(True, self.is_initialized(), f"{VERSION}+{'cu128' if self.cuda_build else 'cpu'}",
                          CUDA_VERSION if self.cuda_build else None)

    def device_count(self) -> int:
        """`torch.cuda.device_count()`: 0 on a CPU build; once CUDA started (or while it starts) the
        runtime's count, cached; before, NVML's over `CUDA_VISIBLE_DEVICES` as the environment holds it
        now, not cached ("the number of devices can change due to changes to CUDA_VISIBLE_DEVICES
        prior to CUDA initialization"); without NVML the runtime's count, which starts the driver."""
        self._needs_import("torch.cuda.device_count")
        self.calls.append(("device_count",))
        if not self.cuda_build:
            return 0
        if self.initialized or self.initializing or not self.nvml:
            return len(self._driver_ids())
        return torch_visible(self.environ.get("CUDA_VISIBLE_DEVICES"), len(self.uuids), self.uuids)

    def when_cuda_starts(self, call: Callable[[], None]) -> None:
        """`torch.cuda._lazy_call`: now once initialized, else appended to `_queued_calls` (also while
        the queue runs: `is_initialized()` is still False then)."""
        self._needs_import("torch.cuda._lazy_call")
        self.calls.append(("when_cuda_starts", call))
        if self.is_initialized():
            call()
        else:
            self.queued.append(call)

    def set_fraction(self, fraction: float, device: int) -> None:
        """`Torch.set_fraction`: `with torch.cuda.device(device)` (`_exchange_device`, which starts CUDA
        and selects the device; the previous one comes back on exit) around
        `set_per_process_memory_fraction` (torch/cuda/memory.py: `_lazy_init`, then the type and range
        checks, then `_cuda_setMemoryFraction`, whose `setMemoryFraction` checks the device and makes a
        context on it)."""
        self.calls.append(("set_fraction", fraction, device))
        self._lazy_init_by("torch.cuda.device / set_per_process_memory_fraction")
        previous = self.current
        if device >= 0:
            if device >= len(self._driver_ids()):
                raise RuntimeError("CUDA error: invalid device ordinal")
            self.current = device
        try:
            if not isinstance(fraction, float):
                raise TypeError("Invalid type for fraction argument, must be `float`")
            if fraction < 0 or fraction > 1:
                raise ValueError(f"Invalid fraction value: {fraction}. Allowed range: 0~1")
            self._valid_device(device)
            self.contexts.add(device)
            self.fractions[device] = fraction
        finally:
            self.current = previous

    def fraction(self, device: int) -> float:
        """`get_per_process_memory_fraction` (torch/cuda/memory.py): `_lazy_init`, then the allocator's."""
        self.calls.append(("fraction", device))
        self._lazy_init_by("get_per_process_memory_fraction")
        self._valid_device(device)
        return self.fractions.get(device, 1.0)

    def memory(self, device: int) -> tuple[int, int]:
        """(`memory_allocated`, `memory_reserved`): `memory_stats` answers {} (so 0) before CUDA started,
        without starting it (torch/cuda/memory.py `memory_stats_as_nested_dict`)."""
        self._needs_import("torch.cuda.memory_allocated")
        if not self.is_initialized():
            return 0, 0
        self._valid_device(device)
        return self.allocated.get(device, 0), self.reserved.get(device, 0)

    # ----- the rules' building blocks ------------------------------------------------------------
    def _needs_import(self, what: str) -> None:
        if not self.imported:
            raise SeamMisuse(f"{what} used before torch was imported (the real seam reads sys.modules['torch'])")

    def _lazy_init_by(self, call: str) -> None:
        """A seam call that runs `_lazy_init`: fine while starting or started; before, the code under
        test would start CUDA itself."""
        self._needs_import(call)
        if not (self.initialized or self.initializing):
            self.started_by = call
            raise CudaStartedByCode(f"{call} before PyTorch's CUDA started: real torch would start CUDA here "
                                    "(`_lazy_init`), reading CUDA_VISIBLE_DEVICES and the allocator settings now")

    def _valid_device(self, device: int) -> None:
        """The caching allocator's device check (c10/cuda/CUDACachingAllocator.cpp `setMemoryFraction`)."""
        if not 0 <= device < len(self._driver_ids()):
            raise RuntimeError(f"Invalid device argument {device}: did you call init?")


def _backend(conf: str | None) -> str | None:
    """The `backend:` of an allocator configuration, None where it names none."""
    for item in (conf or "").split(","):
        key, _, value = item.strip().partition(":")
        if key.strip() == "backend":
            return value.strip()
    return None
