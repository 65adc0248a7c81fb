"""Each kernel's GPU memory over time, kept by the server extension for `GET /api/tfgpu/kernels/<id>`
(`$defs/memoryHistory` in `jupyter/tfgpu-state.schema.json`): what the sidebar's chart draws.

Kept per kernel: a ring of samples (`collections.deque`, `SAMPLES` long: the last hour at one sample every
`SAMPLE_SECONDS`), each the time and the kernel's figures per card (`gather.memory_figures`: NVML's for its
process, each framework's own from its published state), and the cells it ran (from its published state,
`CELLS_KEPT` at most). `handlers.Sampler` decides when to sample; this module only keeps and answers, and
a kernel's history goes with the kernel (`History.keep_only`).

Bounds, in CPython's sizes: a sample is a 3-tuple (64 B) in the deque (8 B), its time (a float, 24 B), its
series' names (one tuple shared by every sample while they do not change) and its values (an
`array('q')`: 64 B + 8 B a value, also shared with the sample before while they do not change). With
`MAX_SERIES` values that is at most 480 B a sample, 864 KB for a full ring; with a cell every sample
(`CELLS_KEPT` 4-tuples of about 200 B) 1.1 MB a kernel, 33 MB for 30 kernels at the very worst. Measured
(`benchmarks/bench_serverext.py`, tracemalloc): an hour of a kernel on one card with TensorFlow (3 values),
every figure moving at every sample, 390 KB; of the widest samples, 800 KB.
"""

from __future__ import annotations

import bisect
import math
from array import array
from collections import deque
from typing import Any, Iterable

from ..jupyter.kernelstate import MEMORY_SECONDS

SAMPLE_SECONDS = 2.0
"""Seconds between two samples of a busy kernel (`TFGPUServer.history_seconds` can change it)."""
SAMPLES = 1800
"""Samples kept per kernel: an hour of sampling at `SAMPLE_SECONDS`."""
MAX_SERIES = 32
"""Figures kept per sample (8 cards with 4 figures each); a kernel with more keeps the first, by card."""
CELLS_KEPT = 1024
"""Cells remembered per kernel (the oldest go first)."""
SETTLE_SECONDS = 3 * MEMORY_SECONDS
"""How long after its last busy sample a kernel's published state is still read: the kernel publishes a
cell's end (and a short cell altogether) with its next look, up to `MEMORY_SECONDS` later."""
OPEN_CELL_SECONDS = 30 * MEMORY_SECONDS
"""How long after its last busy sample the state of a kernel whose last cell has no end yet is still read:
a kernel on a loaded machine may publish that end late. One that never will (its publisher stopped, its
process died) costs a state read a round for this long; its cell ends where the next one starts."""
SOURCES = ("nvml", "tensorflow", "jax", "torch")
"""`$defs/memorySeries/source`, in the order a reply lists them."""
FIGURES = ("used", "current", "peak", "reserved")
"""`$defs/memorySeries/figure`, in the order a reply lists them."""
_NULL = -1
"""A figure the sample lacks, in the values array (bytes are never negative)."""

Key = tuple[int, str, str]
"""(nvidia-smi index, source, figure): one series."""
Figures = tuple[tuple[Key, "int | None"], ...]
"""One sample's figures, ordered by `order`."""
Cell = tuple["int | None", float, "float | None", float]
"""(In [n], start, end or None while running, the stamp of the last change)."""


def order(item: tuple[Key, Any]) -> tuple[int, int, int]:
    """The sort key of a figure: by card, then source, then figure."""
    (gpu, source, figure), _ = item
    return gpu, SOURCES.index(source), FIGURES.index(figure)


class KernelHistory:
    """One kernel's ring of samples and its cells."""

    __slots__ = ("samples", "cells", "busy", "last_busy", "stamp", "_starts", "_sorted")

    def __init__(self) -> None:
        self.samples: deque[tuple[float, tuple[Key, ...], array[int]]] = deque(maxlen=SAMPLES)
        self.cells: dict[float, Cell] = {}
        self.busy = False
        """The kernel was busy at its last sample: the next sample is taken even if nothing moved."""
        self.last_busy = -math.inf
        """The stamp of its last busy sample: its state is read for `SETTLE_SECONDS` more (`settling`)."""
        self.stamp = -math.inf
        """The newest stamp given (a sample's time, a cell's change): `?since=` compares against these."""
        self._sorted: list[Cell] | None = None
        self._starts: list[float] = []

    def next_stamp(self, now: float) -> float:
        """`now` to the millisecond (shorter JSON, and `?since=` compares what it sent), made later than
        every stamp before (the clock may step back): one per round of samples."""
        self.stamp = max(round(now, 3), round(self.stamp + 0.001, 3))
        return self.stamp

    def add(self, stamp: float, figures: Figures, busy: bool) -> bool:
        """Take a sample at `stamp` if the kernel is or was busy, or its figures moved, or it has none yet;
        True when it did. Unchanged names and values share the objects of the sample before."""
        keys = tuple(key for key, _ in figures)
        values = array("q", [_NULL if value is None else value for _, value in figures])
        was_busy, self.busy = self.busy, busy
        if busy:
            self.last_busy = stamp
        if self.samples:
            _, last_keys, last_values = self.samples[-1]
            keys = last_keys if keys == last_keys else keys
            same = keys is last_keys and values == last_values
            if same and not busy and not was_busy:
                return False
            values = last_values if same else values
        self.samples.append((stamp, keys, values))
        return True

    def mark(self, cells: Iterable[dict[str, Any]], stamp: float) -> None:
        """Take the cells a kernel published (`$defs/cellRun`): new ones, and known ones whose end or count
        changed, stamped `stamp`. One cell runs at a time: an earlier cell still open ends where a later
        one starts (its end was not published: the kernel restarted, or it fell out of the state's list)."""
        changed = False
        for cell in cells:
            start, record = cell["start"], (cell["execution_count"], cell["start"], cell["end"])
            known = self.cells.get(start)
            if known is None or known[:3] != record:
                self.cells[start] = (*record, stamp)
                changed = True
        if not changed:
            return
        ordered = sorted(self.cells.values(), key=lambda cell: cell[1])
        for earlier, later in zip(ordered, ordered[1:]):
            if earlier[2] is None:
                self.cells[earlier[1]] = (earlier[0], earlier[1], later[1], stamp)
        while len(self.cells) > CELLS_KEPT:
            del self.cells[min(self.cells)]
        self._sorted = None

    def settling(self, now: float) -> bool:
        """Whether its state may still bring the end of its last cell: for `SETTLE_SECONDS` after its last
        busy sample, and while that cell has no end, for up to `OPEN_CELL_SECONDS`."""
        since_busy = now - self.last_busy
        return since_busy < SETTLE_SECONDS or (
            since_busy < OPEN_CELL_SECONDS and bool(self.cells) and self.cells[max(self.cells)][2] is None)

    def _running(self, when: float) -> int | None:
        """The In [n] of the cell running at `when`, by the cells known now."""
        if self._sorted is None:
            self._sorted = sorted(self.cells.values(), key=lambda cell: cell[1])
            self._starts = [cell[1] for cell in self._sorted]
        found = bisect.bisect_right(self._starts, when) - 1
        if found < 0:
            return None
        count, _, end, _ = self._sorted[found]
        return count if end is None or end >= when else None

    def reply(self, since: float | None, interval: float) -> dict[str, Any]:
        """`$defs/memoryHistory`: the samples and cells stamped after `since` (all without it)."""
        after = -math.inf if since is None else since
        samples = []
        for sample in reversed(self.samples):  # newest first: a poll reads only what is new
            if sample[0] <= after:
                break
            samples.append(sample)
        samples.reverse()
        columns: dict[Key, list[int | None]] = {}
        positions: dict[int, list[tuple[int, list[int | None]]]] = {}
        for _, keys, _ in samples:
            for key in keys:
                columns.setdefault(key, [])
        named = sorted(columns.items(), key=order)
        for column in columns.values():
            column.extend([None] * len(samples))
        for row, (_, keys, values) in enumerate(samples):
            where = positions.get(id(keys))
            if where is None:
                where = positions[id(keys)] = [(slot, columns[key]) for slot, key in enumerate(keys)]
            for slot, column in where:
                value = values[slot]
                column[row] = None if value == _NULL else value
        cells = sorted((cell for cell in self.cells.values() if cell[3] > after), key=lambda cell: cell[1])
        stamps = [cell[3] for cell in cells] + [sample[0] for sample in samples[-1:]]
        return {
            **empty_reply(since, interval),
            "next_since": max(stamps) if stamps else since,
            "oldest": self.samples[0][0] if self.samples else None,
            "times": [sample[0] for sample in samples],
            "running": [self._running(sample[0]) for sample in samples],
            "series": [{"gpu": gpu, "source": source, "figure": figure, "values": values}
                       for (gpu, source, figure), values in named],
            "cells": [{"execution_count": count, "start": round(start, 3), "end": None if end is None else round(end, 3)}
                      for count, start, end, _ in cells],
        }


def empty_reply(since: float | None, interval: float) -> dict[str, Any]:
    """`$defs/memoryHistory` of a kernel with nothing kept."""
    return {"interval_seconds": interval, "span_seconds": SAMPLES * interval, "since": since, "next_since": since,
            "oldest": None, "times": [], "running": [], "series": [], "cells": []}


class History:
    """Every kernel's history on this server."""

    def __init__(self, interval: float = SAMPLE_SECONDS) -> None:
        self.interval = interval
        self.kernels: dict[str, KernelHistory] = {}

    def keep_only(self, kernel_ids: set[str]) -> None:
        """Forget the kernels that are gone."""
        for gone in set(self.kernels) - kernel_ids:
            del self.kernels[gone]

    def wants_reading(self, kernel_ids: set[str], busy: set[str]) -> bool:
        """Whether a kernel's memory may have moved since its last sample: it is busy, or was at its
        last sample, or has none yet. Otherwise nothing changes, and nothing need be read."""
        return any(kernel_id in busy or kernel_id not in self.kernels or self.kernels[kernel_id].busy
                   for kernel_id in kernel_ids)

    def settling(self, kernel_ids: set[str], now: float) -> bool:
        """Whether a kernel's state may still bring the end of its last cell (`KernelHistory.settling`)."""
        return any(kernel_id in self.kernels and self.kernels[kernel_id].settling(now) for kernel_id in kernel_ids)

    def record(self, kernel_id: str, now: float, figures: Figures | None, cells: Iterable[dict[str, Any]],
               busy: bool) -> bool:
        """A sample of kernel `kernel_id` (`KernelHistory.add`; none where `figures` is None: no NVML
        reading yet) and the cells it published; True when a sample was taken."""
        kernel = self.kernels.get(kernel_id)
        if kernel is None:
            kernel = self.kernels[kernel_id] = KernelHistory()
        stamp = kernel.next_stamp(now)
        kernel.mark(cells, stamp)
        return figures is not None and kernel.add(stamp, figures, busy)

    def reply(self, kernel_id: str, since: float | None) -> dict[str, Any]:
        """`$defs/memoryHistory` of kernel `kernel_id` after `since`."""
        kernel = self.kernels.get(kernel_id)
        return empty_reply(since, self.interval) if kernel is None else kernel.reply(since, self.interval)
