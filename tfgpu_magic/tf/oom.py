"""OOMs that explain themselves and let go.

After a cell raised TensorFlow's `ResourceExhaustedError` for memory, IPython has already shown its
traceback; a `post_run_cell` hook then prints a short `tfgpu:` explanation (what was asked for, where,
the cap and its source, the peak, who else holds memory, what to do), and clears the frames of the
failed cell's traceback, so that tensors only those frames held are freed before the next cell. The
same error for a quota, a rate limit or a full queue, and any error whose text cannot be read, pass
untouched: the hook never adds an error of its own.

Why `post_run_cell` and not `set_custom_exc`: IPython shows the traceback itself, untouched (`%xmode`,
`%pdb` — which debugs the intact frames before this hook runs —, the kernel's error reply); the
shell's single custom-exception slot stays free for other tools; and an OOM in the very cell that
imports TensorFlow is caught too (the exception class does not exist before the import).

The same hook recognises cuDNN / cuBLAS start-up failures by their message (any exception type:
TensorFlow raises them as UnknownError, InternalError, NotFoundError ...). They are usually memory
contention, not a broken install (tensorflow#24828, #36025): the library could not allocate its
workspace because another process, or this one's pool, holds the card; one `tfgpu:` line says so.

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
from typing import Any, Callable

from ..errors import error_text
from ..language.sizes import bytes_text, mib_text
from .memory import MemoryAPI, TensorFlowMemory, memory_rows, oom_types, parse_oom
from .memory import MemorySource

RELEASE_DEFAULT = True
"""Default of the magics' config trait `TFGPUMagics.release_oom_frames` (`%config` can turn it off)."""
CONFIG_TRAIT = "release_oom_frames"
CAP_MARGIN = 0.9
"""An allocation fails before the tensors reach the cap (the BFC allocator's fragmentation and its own
bookkeeping), so a request plus what is held above this share of the cap counts as the cap running out."""


class OomSettings:
    """What the magics' config sets (one per process, like IPython's shell)."""

    def __init__(self, release: bool = RELEASE_DEFAULT) -> None:
        self.release = release


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
DNN_STARTUP_HINT = ("tfgpu: cuDNN/cuBLAS could not start, which usually means the GPU's memory is taken (another "
                    "process, or this one's pool grabbed it all): `%tfgpu who` shows who holds it; `%tfgpu growth on` "
                    "then `%tfgpu restart` lets TensorFlow take only what it needs.")


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


# ----- the explanation -----------------------------------------------------------------------------
def explain(error: BaseException, controller: MemorySource, api: MemoryAPI | None = None,
            peak_from_cell: bool = False) -> list[str]:
    """The `tfgpu:` lines after an OOM's traceback. `peak_from_cell`: the peak was reset before the
    cell (`%tfgpu watch on`), else it is the process's peak so far."""
    request = parse_oom(readable_text(error) or "")
    device = request.device if request else None
    lines = []
    if request is None:
        lines.append("TensorFlow ran out of memory (ResourceExhaustedError); its message names no tensor size.")
    else:
        shape = ", ".join(str(dim) for dim in request.shape)
        asked = bytes_text(request.bytes) if request.bytes is not None else f"? ({request.dtype}: size unknown)"
        lines.append(f"TensorFlow ran out of memory on {device or 'an unnamed device'}: "
                     f"it asked for {asked} (shape [{shape}], {request.dtype}).")
    rows = memory_rows(controller, api) if device is None or device.startswith("GPU") else []
    row = next((r for r in rows if device in r.logical_devices or device == r.tf_device), None)
    cap_is_cause = False
    if device is not None and device.startswith("CPU"):
        lines.append("That is host memory (RAM), not a GPU: GPU caps do not apply.")
    elif row is not None:
        holds = f"this process holds {mib_text(row.process_mib)} of the card's {mib_text(row.total_mib)}"
        others = row.other_processes
        who = ", ".join(f"pid {p.pid} {mib_text(p.mib)}" for p in others) if others else "none"
        lines.append(f"Cap in force: {row.cap_text}; {holds}; other processes: {who}.")
        if row.peak_bytes is not None:
            since = "the cell's peak" if peak_from_cell else "peak so far (`%tfgpu watch on` resets it per cell)"
            lines.append(f"Tensors now {bytes_text(row.tensors_bytes)}, {since} {bytes_text(row.peak_bytes)}.")
        held = max(row.tensors_bytes or 0, (row.peak_bytes or 0) if peak_from_cell else 0)
        need = (request.bytes or 0) + held if request is not None else 0
        cap_is_cause = row.cap_mib is not None and need > row.cap_mib * 1024 * 1024 * CAP_MARGIN and (
            row.total_mib is None or row.cap_mib < row.total_mib)
    steps = ["a smaller batch or tensor"]
    if cap_is_cause:
        steps.append("`%tfgpu limit off` (the cap is what ran out)")
    if row is not None and not row.growth:
        steps.append("`%tfgpu growth on`, so the pool grows only as needed")
    if row is not None:
        changed = cap_is_cause or not row.growth
        steps.append(f"`%tfgpu restart` to {'apply that and ' if changed else ''}give TensorFlow's pool back to the card")
    lines.append("Next: " + "; ".join(steps) + ".")
    return [f"tfgpu: {line}" for line in lines]


class OomHook:
    """The `post_run_cell` callback: explain a cell's OOM, then release its frames (if `settings`);
    after a cuDNN / cuBLAS start-up failure, the one hint line. `peak_from_cell` is true while
    `%tfgpu watch on` resets the peak before each cell."""

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
                print(DNN_STARTUP_HINT, file=self.out or sys.stderr)
            return
        try:
            lines = explain(error, self.controller, self.api, self.peak_from_cell())
        except Exception as err:  # the explanation must never hide the user's own error
            lines = [f"tfgpu: (no explanation: {type(err).__name__}: {err})"]
        if settings.release:
            before = self._tensors()
            count = release_frames(error)
            after = self._tensors()
            freed = f": tensors {bytes_text(before)} → {bytes_text(after)}" if before is not None else ""
            lines.append(f"tfgpu: released what only the failed cell's frames held ({count} frames cleared{freed}); "
                         f"`%debug` on this error sees cleared frames (`%config TFGPUMagics.{CONFIG_TRAIT} = False` "
                         "keeps them).")
        print("\n".join(lines), file=self.out or sys.stderr)

    def _tensors(self) -> int | None:
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
