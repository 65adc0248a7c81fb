"""PyTorch in this process, through one seam (`TorchAPI`; tests substitute a fake that follows torch's
rules, tests/fake_torch.py): whether it is imported and its CUDA started, and the policy's per-device
memory fraction, which it takes through `torch.cuda.set_per_process_memory_fraction` (a soft cap: its
caching allocator refuses to grow past it; CUDA's context and other libraries' memory are not counted).

That call initializes CUDA itself (`_lazy_init` in torch/cuda/memory.py), which must not happen just
because the policy was set: the fractions are queued with `torch.cuda._lazy_call`, which torch runs as
its CUDA starts (torch/cuda/__init__.py: `_lazy_init` runs `_queued_calls`; a call that re-enters
`_lazy_init` there returns at once), or calls at once where CUDA has started. One queued call per
process reads the fractions the policy asks for at that moment (`Fractions`). The allocator backend
(`backend:cudaMallocAsync`) is an environment variable, which PyTorch's CUDA library reads as it loads,
at `import torch` (`BackendStaticInitializer` in c10/cuda/CUDACachingAllocator.cpp; a different backend
read as its CUDA starts fails: pytorch#104801).
"""

from __future__ import annotations

import functools
import sys
from typing import Any, Callable, NamedTuple, Protocol

DEFAULT_FRACTION = 1.0
"""PyTorch's own fraction: the whole device."""


class TorchState(NamedTuple):
    imported: bool = False
    cuda_started: bool = False
    """`torch.cuda.is_initialized()`: its allocator configuration and `CUDA_VISIBLE_DEVICES` were read."""
    version: str | None = None
    cuda_build: str | None = None
    """`torch.version.cuda`; None for a CPU-only build."""


class TorchAPI(Protocol):
    """The torch calls the policy needs; each answers without starting CUDA except where it says so."""

    def state(self) -> TorchState: ...
    def device_count(self) -> int:
        """`torch.cuda.device_count()` (NVML or cudaGetDeviceCount: no CUDA start)."""
    def when_cuda_starts(self, call: Callable[[], None]) -> None:
        """`torch.cuda._lazy_call(call)`: now if CUDA started, else as it starts."""
    def set_fraction(self, fraction: float, device: int) -> None:
        """`torch.cuda.set_per_process_memory_fraction` on `device`, the current device kept (starts
        CUDA: call it only once started)."""
    def fraction(self, device: int) -> float:
        """`torch.cuda.get_per_process_memory_fraction` (starts CUDA: only once started)."""
    def memory(self, device: int) -> tuple[int, int]:
        """(`memory_allocated`, `memory_reserved`) of `device`, once CUDA started."""


class Torch:
    """`TorchAPI` over the torch already in `sys.modules` (callers check `state()` first)."""

    @property
    def torch(self) -> Any:
        return sys.modules["torch"]

    def state(self) -> TorchState:
        torch = sys.modules.get("torch")
        cuda = getattr(torch, "cuda", None)
        if torch is None or cuda is None:
            return TorchState(imported=torch is not None)
        return TorchState(True, bool(cuda.is_initialized()), getattr(torch, "__version__", None),
                          getattr(getattr(torch, "version", None), "cuda", None))

    def device_count(self) -> int:
        return int(self.torch.cuda.device_count())

    def when_cuda_starts(self, call: Callable[[], None]) -> None:
        self.torch.cuda._lazy_call(call)

    def set_fraction(self, fraction: float, device: int) -> None:
        # The caching allocator's setMemoryFraction selects `device` (cudaSetDevice, in
        # c10/cuda/CUDACachingAllocator.cpp) and leaves it selected: without the guard, a plain
        # `device="cuda"` after CUDA started would go to the last device given a fraction.
        cuda = self.torch.cuda
        with cuda.device(device):
            cuda.set_per_process_memory_fraction(fraction, device)

    def fraction(self, device: int) -> float:
        return float(self.torch.cuda.get_per_process_memory_fraction(device))

    def memory(self, device: int) -> tuple[int, int]:
        cuda = self.torch.cuda
        return int(cuda.memory_allocated(device)), int(cuda.memory_reserved(device))


class FractionSet(NamedTuple):
    """A fraction given to PyTorch's device `device` (CUDA's index): `wanted` now (CUDA started), or
    queued for when its CUDA starts (`queued`)."""

    device: int
    wanted: float
    queued: bool = False


class Fractions:
    """The policy's fractions for PyTorch, given once per process: `apply` queues one call for when
    its CUDA starts (which reads `wanted()` then) and, once started, sets what changed at once."""

    def __init__(self, wanted: Callable[[], dict[int, float]], api: TorchAPI | None = None) -> None:
        self.wanted = wanted
        """CUDA index → fraction the policy asks for now (a device it does not name: the whole device)."""
        self.api: TorchAPI = api or Torch()
        self.queued = False
        self.given: dict[int, float] = {}

    def apply(self) -> list[FractionSet]:
        """Give PyTorch the fractions the policy asks for: queued before its CUDA starts, set after."""
        state = self.api.state()
        if not state.imported:
            return []
        if not state.cuda_started:
            if not self.queued:
                self.api.when_cuda_starts(self._at_cuda_start)
                self.queued = True
            return [FractionSet(device, fraction, queued=True) for device, fraction in sorted(self.wanted().items())]
        return self._set_all()

    def _at_cuda_start(self) -> None:
        self._set_all()

    def _set_all(self) -> list[FractionSet]:
        wanted = self.wanted()
        done = []
        for device in range(self.api.device_count()):
            fraction = wanted.get(device, DEFAULT_FRACTION)
            if self.given.get(device, DEFAULT_FRACTION) != fraction:
                self.api.set_fraction(fraction, device)
                self.given[device] = fraction
                done.append(FractionSet(device, fraction))
        return done

    def memory(self) -> list[tuple[int, int, int]]:
        """(device, allocated, reserved) for each device once its CUDA started; [] before."""
        if not self.api.state().cuda_started:
            return []
        return [(device, *self.api.memory(device)) for device in range(self.api.device_count())]


@functools.cache
def installed() -> bool:
    """Whether this Python can import PyTorch (found, not imported; asked once per process)."""
    import importlib.util

    return "torch" in sys.modules or importlib.util.find_spec("torch") is not None
