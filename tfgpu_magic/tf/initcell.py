"""Which cell initialized TensorFlow's runtime (so the locked-settings message can name it).

Nothing runs before TensorFlow is imported: the import hook's callback calls `watch_initialization`,
which registers a `pre_run_cell`/`post_run_cell` pair. Each reads whether the runtime is initialized
(`memory.initialized`: no TensorFlow call, a few attribute reads); the first that sees it initialized
records where, and both unregister: no per-cell work once it is known. The record is process-wide,
like the runtime. Which line of the cell did it comes from `runtime.call_at_initialization`: the
frame of the call that initialized the runtime, walked out to the cell's own code.
"""

from __future__ import annotations

import linecache
from types import FrameType
from typing import Any, Callable, Literal, NamedTuple

from . import events
from .memory import initialized
from .runtime import call_at_initialization, where

LINE_CHARS = 40
"""How much of the cell's first line the record keeps."""


class InitRecord(NamedTuple):
    """Where the runtime was initialized: in cell In [`execution_count`] by `line`; outside any cell
    (`execution_count`: the next cell's, where known); or before the watch began (`execution_count`:
    the cell running when it began, `where()`'s, where known). `views.tfstate.init_text` words it."""

    where: Literal["cell", "outside_cell", "before_watch"]
    execution_count: int | None = None
    line: str | None = None


_record: InitRecord | None = None


def initialized_record() -> InitRecord | None:
    """Where the runtime was initialized; None while unknown (not initialized yet, or never watched)."""
    return _record


def first_line(cell: str) -> str:
    """The cell's first line of Python (not a magic, shell escape or comment; else its first non-blank
    line), cut short (`short_line`): the fallback where the initializing line is not known."""
    lines = [line.strip() for line in cell.splitlines() if line.strip()]
    return short_line(next((line for line in lines if line[0] not in "%!#"), lines[0] if lines else ""))


def short_line(line: str) -> str:
    """`line` cut after a word to at most `LINE_CHARS` (`model.fit(x, y, ...`)."""
    line = line.strip()
    if len(line) <= LINE_CHARS:
        return line
    cut = line[:LINE_CHARS - 4]
    cut = cut[:cut.rfind(" ")] if " " in cut else cut  # at a word's end
    return cut.rstrip() + (" ..." if cut.endswith(",") else "...")


class CellLine(NamedTuple):
    """The line of a cell that was running when the runtime initialized, as IPython compiled it."""

    number: int
    text: str
    """The line as compiled (a magic is already `get_ipython().run_line_magic(...)`)."""
    lines: int
    """How many lines the compiled cell has (the raw cell has as many unless a cell magic ran)."""


_line: CellLine | None = None
"""Set by the initialization watch; read by the next `post_run_cell`."""


def cell_line(frame: FrameType | None, namespace: object) -> CellLine | None:
    """The innermost frame of the stack from `frame` outwards that is a cell's own code: module-level
    code run in the user's `namespace` whose source IPython cached (not `%%time`'s inner exec, not
    `%run`'s script, not a function defined in an earlier cell)."""
    while frame is not None:
        code = frame.f_code
        if code.co_name == "<module>" and frame.f_globals is namespace:
            lines = linecache.getlines(code.co_filename)
            if lines and 0 < frame.f_lineno <= len(lines):
                return CellLine(frame.f_lineno, lines[frame.f_lineno - 1].strip(), len(lines))
        frame = frame.f_back
    return None


def _record_once(record: InitRecord) -> None:
    global _record
    if _record is None:
        _record = record
        events.changed()  # a published state names the initializing cell


class InitWatch:
    """The hook pair on one shell; `initialized` reads the runtime (a fake's in tests)."""

    def __init__(self, shell: Any, initialized: Callable[[], bool] = initialized) -> None:
        self.shell = shell
        self.initialized = initialized

    def pre(self, info: Any = None) -> None:
        if self.initialized():
            inputs = getattr(getattr(self.shell, "history_manager", None), "input_hist_parsed", None)
            count = len(inputs) if isinstance(inputs, list) else None  # this cell's input is stored later
            _record_once(InitRecord("outside_cell", count or None))
            self.stop()

    def post(self, result: Any = None) -> None:
        if self.initialized():
            count = getattr(result, "execution_count", None)
            cell = getattr(getattr(result, "info", None), "raw_cell", None) or ""
            _record_once(InitRecord("cell", count, initializing_line(cell)) if count is not None
                         else InitRecord("outside_cell"))
            self.stop()

    def seen(self, frame: FrameType) -> None:
        """The runtime was just initialized by a call from `frame`: remember the cell's line."""
        global _line
        _line = cell_line(frame, getattr(self.shell, "user_global_ns", None))

    def start(self) -> None:
        self.shell.events.register("pre_run_cell", self.pre)
        self.shell.events.register("post_run_cell", self.post)
        call_at_initialization(self.seen)

    def stop(self) -> None:
        for event, callback in (("pre_run_cell", self.pre), ("post_run_cell", self.post)):
            if callback in self.shell.events.callbacks[event]:
                self.shell.events.unregister(event, callback)
        if getattr(self.shell, _ATTRIBUTE, None) is self:
            delattr(self.shell, _ATTRIBUTE)


_ATTRIBUTE = "_tfgpu_init_watch"


def watch_initialization(shell: Any, initialized: Callable[[], bool] = initialized) -> InitWatch | None:
    """Start watching for the initializing cell on `shell` (idempotent); None when there is nothing to
    watch: no shell (a script: the record stays unknown), already known, or already initialized (then
    the record says so now, as far as it can)."""
    if shell is None or _record is not None:
        return None
    if initialized():
        _record_once(InitRecord("before_watch", where(shell).cell))
        return None
    watch = getattr(shell, _ATTRIBUTE, None)
    if watch is None:
        watch = InitWatch(shell, initialized)
        watch.start()
        setattr(shell, _ATTRIBUTE, watch)
    return watch


def initializing_line(cell: str) -> str:
    """The line of `cell` (its raw text) that initialized the runtime, cut short; the cell's first
    line of Python where that line is not known."""
    if _line is None:
        return first_line(cell)
    raw = cell.splitlines()
    line = raw[_line.number - 1] if len(raw) == _line.lines and raw[_line.number - 1].strip() else _line.text
    return short_line(line)


def forget() -> None:
    """Tests only: drop the record."""
    global _record, _line
    _record = _line = None
