"""OOMs that explain themselves and let go.

After a cell raised TensorFlow's `ResourceExhaustedError` for memory, IPython has already shown its
traceback; a `post_run_cell` hook then explains it (what was asked for, where, the cap in force, the
peak, who else holds memory: `OomNote`), and clears the frames of the failed cell's traceback, so that
tensors only those frames held are freed before the next cell. The hook finds; `views.oom` words what
it found (`Outcome`) into the short `tfgpu:` lines on stderr, through `settings.words`, which the views
fill (this room sits below them). The same error for a quota, a rate limit or a full queue, and any
error whose text cannot be read, pass untouched: the hook never adds an error of its own.

Why `post_run_cell` and not `set_custom_exc`: IPython shows the traceback itself, untouched (`%xmode`,
`%pdb` — which debugs the intact frames before this hook runs —, the kernel's error reply); the
shell's single custom-exception slot stays free for other tools; and an OOM in the very cell that
imports TensorFlow is caught too (the exception class does not exist before the import).

The same hook recognises cuDNN / cuBLAS start-up failures by their message (any exception type:
TensorFlow raises them as UnknownError, InternalError, NotFoundError ...). They are usually memory
contention, not a broken install (tensorflow#24828, #36025): the library could not allocate its
workspace because another process, or this one's pool, holds the card; the views say so in one line.

Why clearing frames is not enough: IPython keeps the exception (`sys.last_value`,
`sys.last_traceback`, `shell.last_execution_result`, the formatter's `tb`), and on Python ≤ 3.12 a
frame's `f_locals` snapshot, taken by the traceback formatter, still holds the locals after
`frame.clear()`; reading `f_locals` again after the clear re-syncs it to the (now empty) frame. The
exception and traceback objects stay (so `%tb` still prints), their frames empty (so `%debug` sees
no variables).
"""

from __future__ import annotations

import gc
import inspect
import re
import sys
from types import FrameType
from typing import TYPE_CHECKING, Any, Callable, NamedTuple

from ..errors import error_text

if TYPE_CHECKING:  # the figures load at the first OOM: the views fill `settings` when they hook up the controller
    from .memory import GpuMemory, MemoryAPI, MemorySource

RELEASE_DEFAULT = True
"""Default of the magics' config trait `TFGPUMagics.release_oom_frames` (`%config` can turn it off)."""
CONFIG_TRAIT = "release_oom_frames"
CAP_MARGIN = 0.9
"""An allocation fails before the tensors reach the cap (the BFC allocator's fragmentation and its own
bookkeeping), so a request plus what is held above this share of the cap counts as the cap running out."""


class OomSettings:
    """What the views set, one per process like IPython's shell: `release` (the magics' config), and
    `words`, which turns what the hook found into the text it prints (`views.oom`); without words the
    hook prints nothing."""

    def __init__(self, release: bool = RELEASE_DEFAULT, words: Callable[[Outcome], str] | None = None) -> None:
        self.release = release
        self.words = words


settings = OomSettings()


DNN_STARTUP_FAILURES = (
    "could not create cudnn handle",
    "cudnn_status_internal_error",
    "cudnn_status_not_initialized",
    "cudnn_status_alloc_failed",
    "cublas_status_not_initialized",
    "cublas_status_alloc_failed",
    "failed to create cublas handle",
    "cudnn failed to initialize",
    "blas gemm launch failed",
)
"""Lower-case fragments of TensorFlow's cuDNN / cuBLAS start-up errors that out-of-memory causes."""


def readable_text(error: BaseException) -> str | None:
    """`error_text(error)`; None when reading it raises (a `message` property or `__str__` that
    fails): such an error is not one the hook understands, so it is left alone."""
    try:
        return error_text(error)
    except Exception:  # noqa: BLE001 (any code can run in a user's exception class)
        return None


MEMORY_EXHAUSTION = (r"\bOOM\b|out of memory|ran out of memory|(?:unable|failed|fails|failure) to allocate"
                     r"|allocation failed|CUDA_ERROR_OUT_OF_MEMORY|memory exhausted")
"""What TensorFlow's messages say when memory ran out (the BFC allocator's "OOM when allocating
tensor", XLA's "Out of memory while trying to allocate", CUDA's `CUDA_ERROR_OUT_OF_MEMORY`).
`ResourceExhaustedError` also reports quotas, rate limits and full queues, which are not memory."""


def is_dnn_startup_failure(error: BaseException) -> bool:
    """A cuDNN / cuBLAS start-up error, by its message or that of its cause or context."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        text = (readable_text(current) or "").lower()
        if any(fragment in text for fragment in DNN_STARTUP_FAILURES):
            return True
        current = current.__cause__ or current.__context__
    return False


def oom_types() -> tuple[type[BaseException], ...]:
    """TensorFlow's `ResourceExhaustedError`, once TensorFlow is imported (else nothing can raise it)."""
    errors = getattr(sys.modules.get("tensorflow"), "errors", None)
    found = getattr(errors, "ResourceExhaustedError", None)
    return (found,) if isinstance(found, type) else ()


def is_oom(error: BaseException | None) -> bool:
    """A TensorFlow `ResourceExhaustedError` that says memory ran out (False while TensorFlow is not
    imported, and for the other resources that error reports)."""
    if error is None or not isinstance(error, oom_types()):
        return False
    text = readable_text(error)
    return text is not None and re.search(MEMORY_EXHAUSTION, text, re.IGNORECASE) is not None


def frames_of(error: BaseException) -> list[FrameType]:
    """Every frame in `error`'s traceback and those of its causes and contexts, each once."""
    frames: dict[int, FrameType] = {}
    seen: set[int] = set()
    pending: list[BaseException | None] = [error]
    while pending:
        current = pending.pop()
        if current is None or id(current) in seen:
            continue
        seen.add(id(current))
        tb = current.__traceback__
        while tb is not None:
            frames.setdefault(id(tb.tb_frame), tb.tb_frame)
            tb = tb.tb_next
        pending += [current.__context__, current.__cause__]
    return list(frames.values())


def release_frames(error: BaseException) -> int:
    """Clear the function frames of `error`'s tracebacks; the number cleared.

    Module-level frames are left alone: their locals are the user's namespace (the cell's globals),
    which the user still holds. A frame still running (never the case after the cell) is skipped."""
    cleared = 0
    for frame in frames_of(error):
        if not frame.f_code.co_flags & inspect.CO_OPTIMIZED:
            continue
        try:
            frame.clear()
        except RuntimeError:  # "cannot clear an executing frame"
            continue
        frame.f_locals  # noqa: B018 (re-syncs the Python ≤ 3.12 snapshot dict to the cleared frame)
        cleared += 1
    gc.collect()
    return cleared


# ----- what an OOM asked for --------------------------------------------------------------------------
DTYPE_BYTES = {
    "float": 4, "double": 8, "half": 2, "bfloat16": 2, "float8_e4m3fn": 1, "float8_e5m2": 1,
    "int8": 1, "int16": 2, "int32": 4, "int64": 8, "uint8": 1, "uint16": 2, "uint32": 4, "uint64": 8,
    "bool": 1, "complex64": 8, "complex128": 16, "qint8": 1, "quint8": 1, "qint16": 2, "quint16": 2,
    "qint32": 4,
}
"""Bytes per element of TensorFlow's type names as its OOM message writes them (`DataTypeString`)."""

OOM_REQUEST = (r"OOM when allocating tensor with shape\[(?P<shape>[\d,\s]*)\] and type (?P<dtype>\w+)"
               r"(?: on (?P<device>\S+))?(?: by allocator (?P<allocator>\S+))?")
"""The BFC allocator's message; compiled at the first OOM (`re`'s cache), not when this module loads."""


class OomRequest(NamedTuple):
    """What the failed allocation asked for, read from TensorFlow's message."""

    shape: tuple[int, ...]
    dtype: str
    device: str | None
    """`GPU:0` (TensorFlow's numbering)."""
    allocator: str | None

    @property
    def bytes(self) -> int | None:
        size = DTYPE_BYTES.get(self.dtype)
        if size is None:
            return None
        count = 1
        for dim in self.shape:
            count *= dim
        return count * size


def parse_oom(message: str) -> OomRequest | None:
    """The request in "OOM when allocating tensor with shape[...] and type ... on ... by allocator ...",
    None when the message has no such part (other resources: e.g. a full `tf.data` buffer)."""
    match = re.search(OOM_REQUEST, message)
    if match is None:
        return None
    shape = tuple(int(dim) for dim in match["shape"].replace(" ", "").split(",") if dim)
    device = match["device"]
    if device is not None:
        device = device.rstrip(".,;:").rsplit("device:", 1)[-1]
    return OomRequest(shape, match["dtype"], device, match["allocator"])


# ----- the explanation: data; `views.oom` words it ------------------------------------------------
class OomNote(NamedTuple):
    """What explains one OOM."""

    request: OomRequest | None
    """What the failed allocation asked for; None where the message names no tensor."""
    row: GpuMemory | None
    """The GPU it failed on, with its figures after the failure; None for the host or an unknown device."""
    peak_from_cell: bool
    """The peak was reset before the cell (`%tfgpu watch on`), else it is the process's peak so far."""
    cap_is_cause: bool
    """The request and what was held reach the card's cap (below the card's size): the cap ran out."""


def explain(error: BaseException, controller: MemorySource, api: MemoryAPI | None = None,
            peak_from_cell: bool = False) -> OomNote:
    """What explains `error`: the request, the card it failed on and its figures, whether the cap
    ran out."""
    from .memory import memory_rows

    request = parse_oom(readable_text(error) or "")
    device = request.device if request else None
    rows = memory_rows(controller, api) if device is None or device.startswith("GPU") else []
    row = next((r for r in rows if device in r.logical_devices or device == r.tf_device), None)
    cap_is_cause = False
    if row is not None:
        held = max(row.tensors_bytes or 0, (row.peak_bytes or 0) if peak_from_cell else 0)
        need = (request.bytes or 0) + held if request is not None else 0
        cap_is_cause = row.cap_mib is not None and need > row.cap_mib * 1024 * 1024 * CAP_MARGIN and (
            row.total_mib is None or row.cap_mib < row.total_mib)
    return OomNote(request, row, peak_from_cell, cap_is_cause)


class Released(NamedTuple):
    """What releasing the failed cell's frames did: frames cleared, TensorFlow's tensor bytes before
    and after (None while its runtime keeps no figures)."""

    frames: int
    before: int | None
    after: int | None


class Outcome(NamedTuple):
    """What the hook found after a failed cell, for `settings.words`: a cuDNN / cuBLAS start-up
    failure, or an OOM with its note (None where explaining it raised `failure`) and what was
    released (None with the release turned off)."""

    note: OomNote | None = None
    failure: BaseException | None = None
    released: Released | None = None
    dnn_startup: bool = False


class OomHook:
    """The `post_run_cell` callback: explain a cell's OOM, then release its frames (if `settings`);
    or note a cuDNN / cuBLAS start-up failure; `settings.words` words either onto `out` (stderr).
    `peak_from_cell` is true while `%tfgpu watch on` resets the peak before each cell."""

    def __init__(self, controller: MemorySource, api: MemoryAPI | None = None,
                 peak_from_cell: Callable[[], bool] = lambda: False, out: Any = None) -> None:
        self.controller = controller
        self.api = api
        self.peak_from_cell = peak_from_cell
        self.out = out

    def __call__(self, result: Any) -> None:
        try:
            self._after(getattr(result, "error_in_exec", None))
        except Exception:  # noqa: BLE001 (a hook never adds an error of its own to the user's cell)
            return

    def _after(self, error: BaseException | None) -> None:
        if error is None:
            return
        if not is_oom(error):
            if is_dnn_startup_failure(error):
                self._say(Outcome(dnn_startup=True))
            return
        note, failure = None, None
        try:
            note = explain(error, self.controller, self.api, self.peak_from_cell())
        except Exception as err:  # noqa: BLE001 (the explanation must never hide the user's own error)
            failure = err
        released = None
        if settings.release:
            before = self._tensors()
            count = release_frames(error)
            released = Released(count, before, self._tensors())
        self._say(Outcome(note, failure, released))

    def _say(self, outcome: Outcome) -> None:
        if settings.words is not None:
            print(settings.words(outcome), file=self.out or sys.stderr)

    def _tensors(self) -> int | None:
        from .memory import TensorFlowMemory

        api = self.api or TensorFlowMemory()
        if not api.initialized():
            return None
        figures = [api.info(device) for device in api.logical_gpus()]
        known = [f[0] for f in figures if f is not None]
        return sum(known) if known else None


_ATTRIBUTE = "_tfgpu_oom_hook"


def install(shell: Any, controller: MemorySource, api: MemoryAPI | None = None,
            peak_from_cell: Callable[[], bool] = lambda: False) -> OomHook:
    """Register the hook on `shell` once (call it when TensorFlow is imported); returns it."""
    hook = getattr(shell, _ATTRIBUTE, None)
    if hook is None:
        hook = OomHook(controller, api, peak_from_cell)
        shell.events.register("post_run_cell", hook)
        setattr(shell, _ATTRIBUTE, hook)
    return hook


def uninstall(shell: Any) -> None:
    hook = getattr(shell, _ATTRIBUTE, None)
    if hook is not None:
        shell.events.unregister("post_run_cell", hook)
        delattr(shell, _ATTRIBUTE)
