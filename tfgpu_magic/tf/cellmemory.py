"""Each cell's GPU memory in this kernel, as TensorFlow counts its tensors: before the cell, the peak
during it and after it, per logical GPU (`%tfgpu memory` shows them per card and cell).

Why the kernel keeps this itself rather than asking the Jupyter server's history (serverext): it works
where there is no server (terminal IPython, VS Code, nbclient), and it needs nothing TensorFlow does not
already count. The server's history is the card's view (NVML) for the sidebar; this is the framework's.

Cost: nothing before TensorFlow is imported (`tf.cellhooks` registers the pair at the import); between
import and initialization each hook reads whether the runtime is initialized (a few attribute reads);
once initialized, `get_memory_info` twice and `reset_memory_stats` once per logical GPU a cell. With no
GPU in TensorFlow's runtime (a CPU build or no card) the pair unregisters itself: no hook stays.

Side effect, said in docs/labextension.md: the peak TensorFlow reports (`get_memory_info(...)["peak"]`)
starts afresh before each cell. `%tfgpu watch on` reads that same peak: it leaves the reset to the recorder
while the recorder resets (`resets_peaks`), so a cell pays one reset per logical GPU, not two.
"""

from __future__ import annotations

import time
from collections import deque
from typing import Any, Callable, NamedTuple, Sequence

from .memory import MemoryAPI, TensorFlowMemory

CELLS_KEPT = 500
"""Cells whose figures are kept (the oldest go first): a few KiB."""
_ATTRIBUTE = "_tfgpu_cell_memory"
_WATCH_RESETS = "_tfgpu_cell_peaks"
"""The shell attribute that says `%tfgpu watch` is on, resetting the peaks where the recorder does not."""


class DeviceFigures(NamedTuple):
    """One logical GPU during one cell, in bytes of TensorFlow's tensors."""

    before: int
    peak: int
    after: int


class CellMemory(NamedTuple):
    """One cell: its execution count (None for a cell outside the history), when it ran (`time.time()`)
    and each logical GPU's figures (`GPU:0` → figures)."""

    execution_count: int | None
    start: float
    end: float
    devices: dict[str, DeviceFigures]


class CellRecorder:
    """The `pre_run_cell`/`post_run_cell` pair on one shell; `api` reads TensorFlow (a fake in tests)."""

    def __init__(self, shell: Any, api: MemoryAPI, clock: Callable[[], float] = time.time) -> None:
        self.shell = shell
        self.api = api
        self.clock = clock
        self.cells: deque[CellMemory] = deque(maxlen=CELLS_KEPT)
        self.devices: tuple[str, ...] | None = None
        """TensorFlow's logical GPUs, read once its runtime is initialized (fixed from then on)."""
        self._before: tuple[float, dict[str, int]] | None = None

    def _devices(self) -> tuple[str, ...] | None:
        """The logical GPUs once initialized (None before); without any, the pair stops."""
        if self.devices is None and self.api.initialized():
            self.devices = tuple(self.api.logical_gpus())
            if not self.devices:
                self.stop()
        return self.devices

    def _current(self, devices: tuple[str, ...]) -> dict[str, tuple[int, int]]:
        return {device: figures for device in devices if (figures := self.api.info(device)) is not None}

    def pre(self, info: Any = None) -> None:
        try:
            self._pre()
        except Exception:  # noqa: BLE001 (a record is not worth an error under every cell: stop instead)
            self.stop()

    def post(self, result: Any = None) -> None:
        try:
            self._post(result)
        except Exception:  # noqa: BLE001 (as in `pre`)
            self.stop()

    def _pre(self) -> None:
        devices = self._devices()
        if not devices:
            self._before = None
            return
        now = {device: figures[0] for device, figures in self._current(devices).items()}
        for device in now:
            self.api.reset(device)
        self._before = (self.clock(), now)

    def _post(self, result: Any) -> None:
        started = self._before
        devices = self._devices()
        if not devices:
            return
        # the cell that initialized the runtime: TensorFlow held nothing before it, its peak is the cell's
        start, before = started if started is not None else (self.clock(), {})
        figures = {device: DeviceFigures(before.get(device, 0), max(peak, current), current)
                   for device, (current, peak) in self._current(devices).items()}
        self.cells.append(CellMemory(getattr(result, "execution_count", None), start, self.clock(), figures))
        self._before = None

    def start(self) -> None:
        self.shell.events.register("pre_run_cell", self.pre)
        self.shell.events.register("post_run_cell", self.post)
        setattr(self.shell, _ATTRIBUTE, self)

    def stop(self) -> None:
        """Unregister the pair (the records stay readable through `recorder`)."""
        for event, callback in (("pre_run_cell", self.pre), ("post_run_cell", self.post)):
            if callback in self.shell.events.callbacks[event]:
                self.shell.events.unregister(event, callback)

    @property
    def recording(self) -> bool:
        return self.pre in self.shell.events.callbacks["pre_run_cell"]

    def resets_peaks(self) -> bool:
        """Whether this recorder starts each logical GPU's peak afresh before this cell (running, its GPUs
        known): `%tfgpu watch` then leaves the reset to it. Asked once the runtime is initialized."""
        try:
            return self.recording and bool(self._devices())
        except Exception:  # noqa: BLE001 (as in `pre`)
            self.stop()
            return False


def record_cells(shell: Any, api: MemoryAPI | None = None, clock: Callable[[], float] = time.time) -> CellRecorder | None:
    """Start recording each cell's memory on `shell` (idempotent: the running recorder); None without
    an IPython shell."""
    if shell is None or not hasattr(shell, "events"):
        return None
    found = recorder(shell)
    if found is None:
        found = CellRecorder(shell, api if api is not None else TensorFlowMemory(), clock)
        found.start()
    return found


def recorder(shell: Any) -> CellRecorder | None:
    """The recorder of `shell`, running or stopped; None where none started."""
    return getattr(shell, _ATTRIBUTE, None)


def recording(shell: Any) -> bool:
    """Whether `shell`'s recorder runs, so TensorFlow's peaks start afresh before each cell."""
    found = recorder(shell)
    return found is not None and found.recording


def peaks_per_cell(shell: Any, on: bool | None = None) -> bool:
    """Whether the peaks start afresh before each cell of `shell` (what an OOM note says of the peak): the
    recorder on the shell now resets them while it runs, `%tfgpu watch` where it does not (`on`: the watch
    is on or off)."""
    if on is not None:
        setattr(shell, _WATCH_RESETS, on)
    return bool(getattr(shell, _WATCH_RESETS, False)) or recording(shell)


class CardCell(NamedTuple):
    """One cell on one card: its logical GPUs' figures summed."""

    execution_count: int | None
    start: float
    end: float
    before: int
    peak: int
    after: int


def per_card(cells: Sequence[CellMemory], devices: Sequence[str]) -> list[CardCell]:
    """The cells that read any of a card's logical GPUs (`devices`: `GpuMemory.logical_devices`), each
    with their figures summed (a split card's parts peak within one cell: the sum of the peaks bounds it)."""
    found = []
    for cell in cells:
        figures = [cell.devices[device] for device in devices if device in cell.devices]
        if figures:
            found.append(CardCell(cell.execution_count, cell.start, cell.end, sum(f.before for f in figures),
                                  sum(f.peak for f in figures), sum(f.after for f in figures)))
    return found
