"""`FakeMemory`: the `tfgpu_magic.tf.memory.MemoryAPI` seam over a `FakeTF`, for GPU memory figures
without a GPU.

What it decides, since no GPU can show it here: TensorFlow's logical GPUs are numbered across the
visible cards in turn, each card's split in order (as `list_logical_devices` numbers them); each logical
GPU keeps `current`/`peak` bytes of its tensors (`get_memory_info`), `reset` sets the peak to the
current figure (`reset_memory_stats`). Like TensorFlow, asking before initialization would initialize
the runtime: the fake refuses instead (`SeamMisuse`), since the code under test must never do it.
"""

from __future__ import annotations

from fake_tf import FakeTF, SeamMisuse


class FakeMemory:
    """Tensor bytes per logical GPU of `fake`; `allocate`/`free` play a cell's work."""

    def __init__(self, fake: FakeTF) -> None:
        self.fake = fake
        self.current: dict[str, int] = {}
        self.peak: dict[str, int] = {}
        self.calls: list[tuple[str, str]] = []

    def initialized(self) -> bool:
        return self.fake.state().initialized

    def _initialized(self, what: str) -> None:
        if not self.fake.state().initialized:
            raise SeamMisuse(f"{what} before initialization would initialize TensorFlow's runtime")

    def logical_gpus(self) -> list[str]:
        self._initialized("list_logical_devices")
        count = sum(len(gpu.limits or (None,)) for gpu in self.fake.in_force().gpus)
        return [f"GPU:{i}" for i in range(count)]

    def info(self, device: str) -> tuple[int, int] | None:
        self._initialized("get_memory_info")
        self.calls.append(("info", device))
        return self.current.get(device, 0), self.peak.get(device, 0)

    def reset(self, device: str) -> None:
        self._initialized("reset_memory_stats")
        self.calls.append(("reset", device))
        self.peak[device] = self.current.get(device, 0)

    # ----- a cell's work ---------------------------------------------------------------------------
    def allocate(self, device: str, count: int) -> None:
        self.current[device] = self.current.get(device, 0) + count
        self.peak[device] = max(self.peak.get(device, 0), self.current[device])

    def free(self, device: str, count: int) -> None:
        self.current[device] = self.current.get(device, 0) - count
