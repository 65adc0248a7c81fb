"""`%tfgpu watch on | off`: after each cell, one short line per GPU whose memory moved.

`on` registers a `pre_run_cell`/`post_run_cell` pair: before the cell each GPU's peak is reset
(`reset_memory_stats`) once, by the record of each cell's memory (`tf.cellmemory`) where it runs, else by
the watch, so both read the same per-cell peak; after it the line gives the cell's peak, the change in
what this process holds (NVML's per-process figure: TensorFlow's pool; TensorFlow's tensor count where
NVML has none) and the cap, plus a line when the held memory grew in each of the last cells. `off` (the default)
leaves no hook. Before TensorFlow's runtime is initialized both hooks only read its state.
"""

from __future__ import annotations

import sys
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable

from ..errors import PolicyError
from ..gpus.inventory import MIB, Inventory, read_inventory, self_mib
from ..language.sizes import bytes_text
from ..tf import cellmemory
from ..tf.memory import MemoryAPI, TensorFlowMemory, memory_rows, tensor_figures
from ..tf.memory import with_tensor_figures  # noqa: F401 (the panel's live refresh reads it here)

if TYPE_CHECKING:
    from ..controller import Controller

WATCH_ATTRIBUTE = "_tfgpu_watch"
"""The shell attribute holding `%tfgpu watch`'s hooks while it is on."""
GROWTH_CELLS = 4
"""Cells in a row whose held memory grew before the watch flags it."""


@dataclass(frozen=True)
class Lane:
    """One visible GPU as the watch follows it (fixed once the runtime is initialized)."""

    label: str
    ref: str | None
    devices: tuple[str, ...]
    cap: str


@dataclass
class Figures:
    tensors: int
    peak: int
    held: int | None
    """Bytes this process holds on the card (NVML), None where NVML cannot tell."""


@dataclass
class Watch:
    """The hook pair over one controller; `inventory` reads NVML afresh (no cache: deltas)."""

    controller: Controller
    api: MemoryAPI = field(default_factory=TensorFlowMemory)
    inventory: Callable[[], Inventory] = read_inventory
    out: Any = None
    shell: Any = None
    """The shell whose record of each cell's memory (`tf.cellmemory`) may reset the peaks for the watch."""
    lanes: list[Lane] | None = None
    before: dict[str, Figures] | None = None
    history: dict[str, deque] = field(default_factory=dict)

    def _lanes(self) -> list[Lane]:
        if self.lanes is None:
            rows = memory_rows(self.controller, self.api, self.inventory())
            self.lanes = [Lane(f"GPU {row.gpu}" if row.gpu is not None else row.tf_device, row.gpu,
                               tuple(row.logical_devices), row.cap_text) for row in rows]
        return self.lanes

    def _figures(self) -> dict[str, Figures]:
        lanes = self._lanes()
        if not lanes:
            return {}
        inventory = self.inventory() if any(lane.ref is not None for lane in lanes) else Inventory()
        held = {gpu.ref: self_mib(gpu) for gpu in inventory.gpus}
        figures = {}
        for lane in lanes:
            tensors, peak = tensor_figures(self.api, lane.devices) or (0, 0)
            mine = held.get(lane.ref or "")
            figures[lane.label] = Figures(tensors, peak, None if mine is None else mine * MIB)
        return figures

    def pre(self, info: Any = None) -> None:
        if not self.api.initialized():
            self.before = None
            return
        recorder = cellmemory.recorder(self.shell)
        if recorder is None or not recorder.resets_peaks():  # one reset a cell: the recorder's where it runs
            for lane in self._lanes():
                for device in lane.devices:
                    self.api.reset(device)
        self.before = self._figures()

    def post(self, result: Any = None) -> None:
        if not self.api.initialized():
            return
        lines = self.lines(self._figures())
        if lines:
            print("\n".join(lines), file=self.out or sys.stdout)

    def lines(self, after: dict[str, Figures]) -> list[str]:
        """One line per GPU whose memory moved during the cell, then the steady-growth flags."""
        lines, flags = [], []
        for lane in self._lanes():
            now = after.get(lane.label)
            if now is None:
                continue
            was = (self.before or {}).get(lane.label, Figures(0, 0, 0 if now.held is not None else None))
            held_now = now.held if now.held is not None else now.tensors
            held_was = was.held if was.held is not None and now.held is not None else was.tensors
            change = held_now - held_was
            tensors = now.tensors - was.tensors
            if not (change or tensors or now.peak > was.tensors):
                self._remember(lane.label, change)
                continue
            parts = [f"cell peak {bytes_text(now.peak)}", f"held {bytes_text(held_now)} ({signed(change)})"]
            if now.held is not None:
                parts.append(f"tensors {signed(tensors)}")
            parts.append(f"cap {lane.cap}")
            lines.append(f"tfgpu watch: {lane.label}: " + ", ".join(parts))
            grown = self._remember(lane.label, change)
            if grown is not None:
                flags.append(f"tfgpu watch: {lane.label}: held memory grew in each of the last {GROWTH_CELLS} cells "
                             f"({signed(grown)} in all): something keeps references across cells (a list of "
                             "results, a growing history, retraced tf.functions)")
        return lines + flags

    def _remember(self, label: str, change: int) -> int | None:
        """Record this cell's change; the total when the last `GROWTH_CELLS` all grew, else None."""
        changes = self.history.setdefault(label, deque(maxlen=GROWTH_CELLS))
        changes.append(change)
        return sum(changes) if len(changes) == GROWTH_CELLS and all(c > 0 for c in changes) else None


def signed(count: int) -> str:
    return ("+" if count >= 0 else "-") + bytes_text(abs(count))


def current(shell: Any) -> Watch | None:
    """The watch running on `shell`, None when off."""
    return getattr(shell, WATCH_ATTRIBUTE, None)


def watch_on(shell: Any, controller: Controller, api: MemoryAPI | None = None,
             inventory: Callable[[], Inventory] | None = None, out: Any = None) -> str:
    """Register the pair on `shell` (once); `api`, `inventory` and `out` replace TensorFlow, NVML and
    stdout (tests)."""
    if current(shell) is not None:
        return "Memory watch is already on."
    watch = Watch(controller, api if api is not None else TensorFlowMemory(), inventory or read_inventory, out, shell)
    shell.events.register("pre_run_cell", watch.pre)
    shell.events.register("post_run_cell", watch.post)
    setattr(shell, WATCH_ATTRIBUTE, watch)
    cellmemory.peaks_per_cell(shell, True)
    return "Memory watch on: after each cell, one line per GPU whose memory moved. `%tfgpu watch off` stops it."


def watch_off(shell: Any) -> str:
    """Unregister the pair: no hook of the watch stays."""
    watch = current(shell)
    if watch is None:
        return "Memory watch is off."
    for event, callback in (("pre_run_cell", watch.pre), ("post_run_cell", watch.post)):
        while callback in shell.events.callbacks[event]:
            shell.events.unregister(event, callback)
    delattr(shell, WATCH_ATTRIBUTE)
    cellmemory.peaks_per_cell(shell, False)
    return "Memory watch off: no hook left."


def watch(controller: Controller, shell: Any, arg: str | None = None) -> str:
    """`%tfgpu watch on | off` (the action: `actions.ACTIONS["watch"]`)."""
    if shell is None or not hasattr(shell, "events"):
        raise PolicyError("watch needs an IPython shell (it runs after each cell)")
    if arg == "on":
        return watch_on(shell, controller)
    if arg == "off":
        return watch_off(shell)
    raise PolicyError("usage: %tfgpu watch on | off")
