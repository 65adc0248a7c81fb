"""TensorFlow's runtime state, read without side effects: imported, initialized, devices listed or
created, libcuda loaded; and what TensorFlow recorded of a logical configuration (`LogicalSpec`).

The `tf.config` seam and applying a plan through it are `tf.apply`, the device-creating routes
`tf.routes`. Only the `tf` room imports TensorFlow.
"""

from __future__ import annotations

import functools
import sys
from types import FrameType
from typing import Any, Callable, Literal, NamedTuple, Sequence

from ..errors import warn
from ..gpus.inventory import driver_present
from ..language.words import ALLOCATORS
from .. import envvars, importhooks
from ..envvars import Moment


LOCKED_MARKER = "cannot be modified after"
"""Text of TensorFlow's RuntimeError when a device setting changes after initialization."""

ASYNC_ALLOCATOR = ALLOCATORS["async"]

WRAPPED = "__tfgpu_original__"
"""Attribute on our wrappers holding the TensorFlow function they replace (idempotent, reversible)."""

CudaSign = Literal["libcuda", "nvml"]
"""What shows that CUDA started in this process (`RuntimeState.cuda_elsewhere`; `views.tfstate.CUDA_SIGNS`)."""
Stage = Literal["not_imported", "imported", "devices_created", "initialized"]
"""Where TensorFlow is in its life, as the views word it (`RuntimeState.stage`; `views.tfstate.STAGES`)."""


class Place(NamedTuple):
    """Where a call ran, read at call time (`where`): in input cell In [`cell`], in IPython with no cell
    known (`cell` None), or outside IPython (`ipython` False). `views.tfstate.place_text` words it."""

    ipython: bool
    cell: int | None = None


class CreatedBy(NamedTuple):
    """The route that created GPU devices outside the eager context, and where it was called.
    `views.tfstate.route_text` words it ("`device_lib.list_local_devices()` in In [3]")."""

    route: str
    """The call as the user wrote it: a `tf.apply.Route.label` or a `tf.routes.CALLERS` value."""
    place: Place


class RuntimeState(NamedTuple):
    """Where TensorFlow is in its life, read without side effects."""

    imported: bool = False
    devices_listed: bool = False
    """TensorFlow listed its devices (CUDA has started)."""
    initialized: bool = False
    """The runtime exists: device settings are locked until the process ends."""
    devices_created: CreatedBy | None = None
    """Which route created GPU devices outside the eager context, and where: the GPU allocators are
    fixed from then on, though `tf.config` still accepts changes."""
    cuda_elsewhere: CudaSign | None = None
    """What shows CUDA started in this process before TensorFlow listed devices (another library did
    it): `CUDA_*` variables no longer take effect."""
    jax_started: bool = False
    """JAX's backends have started: its `XLA_*` variables were read (`frameworks.jax`)."""
    torch_cuda: bool = False
    """PyTorch's CUDA has started: `CUDA_VISIBLE_DEVICES` was read (`frameworks.torch`)."""
    torch_imported: bool = False
    """PyTorch is imported: its allocator backend was picked (`envvars.TORCH_IMPORT`)."""

    @property
    def cuda_fixed(self) -> bool:
        """`CUDA_VISIBLE_DEVICES` / `CUDA_DEVICE_ORDER` were read already (CUDA reads them once)."""
        return (self.devices_listed or self.cuda_elsewhere is not None or self.devices_created is not None
                or self.torch_cuda)

    @property
    def gpu_memory_fixed(self) -> bool:
        """The GPU allocators exist: growth, limits, splits and `TF_*` allocator variables are fixed."""
        return self.initialized or self.devices_created is not None

    def passed(self, moment: Moment) -> bool:
        """Whether `moment` (when a reader reads its environment variables) lies behind us."""
        return {
            envvars.IMPORT: self.imported,
            envvars.CUDA_START: self.cuda_fixed,
            envvars.ALLOCATOR_CREATION: self.gpu_memory_fixed,
            envvars.JAX_BACKENDS: self.jax_started,
            envvars.TORCH_CUDA: self.torch_cuda,
            envvars.TORCH_IMPORT: self.torch_imported,
        }[moment]

    @property
    def stage(self) -> Stage:
        """The furthest point of TensorFlow's life reached: initialized, else GPU devices created by a
        route, else imported or not."""
        if self.initialized:
            return "initialized"
        if self.devices_created is not None:
            return "devices_created"
        return "imported" if self.imported else "not_imported"

    @property
    def cuda_started_first(self) -> bool:
        """CUDA started before TensorFlow listed its devices (`cuda_elsewhere` says why): its `CUDA_*`
        variables no longer take effect, though TensorFlow's own settings still may."""
        return self.cuda_elsewhere is not None and not self.devices_listed


def too_late(name: str, state: RuntimeState, ignoring: tuple[str, ...] = ()) -> str | None:
    """Why a change of environment variable `name` no longer takes effect (the moment's code, a
    `tf.apply.LockReason`), None while it still does (the table's read time against TensorFlow's
    state), leaving out the moments `ignoring` names (their codes: moments that never come here). On a
    machine without GPUs the allocator variables are never read, and stay harmless."""
    return next((moment.code for moment in envvars.read_at(name)
                 if moment.code not in ignoring and state.passed(moment)), None)


_created_by: CreatedBy | None = None
"""Process-wide, like TensorFlow's GPU allocators: the first route that created GPU devices."""


def devices_created() -> CreatedBy | None:
    return _created_by


def record_devices_created(route: CreatedBy) -> None:
    """Remember the first route that created GPU devices (`route` names it and where it was called)."""
    global _created_by
    if _created_by is None:
        _created_by = route


def current_shell() -> Any:
    """The running IPython shell, None outside IPython (never imports IPython)."""
    ipython = sys.modules.get("IPython")
    return ipython.get_ipython() if ipython is not None and hasattr(ipython, "get_ipython") else None


def where(shell: Any = None) -> Place:
    """The input cell running now in `shell` (the running IPython shell by default), read at call time
    (no per-cell hook); or no cell, in or outside IPython.

    The cell's number is the last stored input's: IPython stores the input before running it, while
    `execution_count` moved from "this cell" (IPython 8) to "the next one" (IPython 9) during a cell."""
    shell = shell if shell is not None else current_shell()
    if shell is None:
        return Place(ipython=False)
    inputs = getattr(getattr(shell, "history_manager", None), "input_hist_parsed", None)
    return Place(ipython=True, cell=len(inputs) - 1 if isinstance(inputs, list) and len(inputs) > 1 else None)


CUDA_DRIVER_LIBRARY = b"/libcuda.so"
"""The CUDA driver library, as the maps name it: it is loaded when CUDA starts (cuInit reads `CUDA_*` then)."""
PROC_MAPS = "/proc/self/maps"
LIBCUDA_LOADED: CudaSign = "libcuda"
"""libcuda is loaded in this process (`cuda_loaded`)."""
NVML_LISTS_SELF: CudaSign = "nvml"
"""NVML lists this process on a GPU (the controller's sign)."""
_libcuda_seen = False
"""Set once libcuda was seen in this process's maps: CUDA's driver library is never unloaded."""


def cuda_loaded(maps: str = PROC_MAPS, driver: Callable[[], bool] = driver_present) -> CudaSign | None:
    """`LIBCUDA_LOADED` where CUDA looks started in this process (the driver library is mapped), None if not.

    Read, not run (no GPU here): TensorFlow, PyTorch, JAX and CuPy load libcuda when CUDA starts,
    not at import (TF: `GpuDriver::Init` in stream_executor/cuda/cuda_driver.cc via the dso loader).
    The maps cost about 0.7 µs a line to read (thousands once TensorFlow is imported), so they are
    not read where no NVIDIA driver is loaded (CUDA cannot start there), nor again once libcuda
    was seen."""
    global _libcuda_seen
    if maps == PROC_MAPS and _libcuda_seen:
        return LIBCUDA_LOADED
    if not driver():
        return None
    try:
        with open(maps, "rb") as file:
            text = file.read()
    except OSError:
        return None
    if CUDA_DRIVER_LIBRARY not in text:
        return None
    if maps == PROC_MAPS:
        _libcuda_seen = True
    return LIBCUDA_LOADED


def eager_flags() -> tuple[bool, bool] | None:
    """(devices listed, runtime initialized) from TensorFlow's eager context; None before import.

    With `call_at_initialization`, the one place that reads TensorFlow's private `context_safe()`,
    `_physical_devices` and `_context_handle` (the same test TensorFlow's own setters make, stable
    from 2.10 to 2.21). If they ever go away, both read False and the setters' RuntimeError is caught
    instead (see `apply_plan`). A few attribute reads: cheap enough for the per-cell hooks. While
    `tensorflow/__init__` still runs (a framework it imports is being set up), it is not imported yet."""
    if "tensorflow" not in sys.modules or importhooks.importing("tensorflow"):
        return None
    module = sys.modules.get("tensorflow.python.eager.context")
    context = module.context_safe() if module is not None and hasattr(module, "context_safe") else None
    if context is None:
        return False, False
    return (getattr(context, "_physical_devices", None) is not None,
            getattr(context, "_context_handle", None) is not None)


def call_at_initialization(callback: Callable[[FrameType], None]) -> bool:
    """Call `callback(frame)` once, right after the call that initializes TensorFlow's runtime, with
    the frame that made that call (so the cell line that initialized it can be named); False where
    this cannot be watched (TensorFlow not imported, or its private `Context.ensure_initialized` gone).

    Every initialization goes through `Context.ensure_initialized` (eager/context.py: ops, tensors,
    `list_logical_devices`, ...); the wrapper puts TensorFlow's method back once the runtime exists,
    so it costs nothing after the first op."""
    module = sys.modules.get("tensorflow.python.eager.context") if "tensorflow" in sys.modules else None
    owner = getattr(module, "Context", None)
    current = getattr(owner, "ensure_initialized", None)
    if current is None:
        return False
    original = getattr(current, WRAPPED, current)

    @functools.wraps(original)
    def ensure_initialized(context: Any, *args: Any, **kwargs: Any) -> Any:
        if getattr(context, "_context_handle", None) is not None:
            return original(context, *args, **kwargs)
        caller = sys._getframe(1)
        try:
            return original(context, *args, **kwargs)
        finally:
            if getattr(context, "_context_handle", None) is not None:
                setattr(owner, "ensure_initialized", original)
                try:
                    callback(caller)
                except Exception as err:  # naming the cell must never break the user's first op
                    warn(f"could not tell which line initialized TensorFlow: {err}")

    setattr(ensure_initialized, WRAPPED, original)
    setattr(owner, "ensure_initialized", ensure_initialized)
    return True


def runtime_state() -> RuntimeState:
    """Read TensorFlow's state from `sys.modules`; never imports or initializes anything."""
    created = devices_created()
    flags = eager_flags()
    if flags is None:
        return RuntimeState(cuda_elsewhere=cuda_loaded())
    listed, initialized = flags
    return RuntimeState(
        imported=True,
        devices_listed=listed,
        initialized=initialized,
        devices_created=created,
        cuda_elsewhere=None if listed else cuda_loaded(),
    )


class LogicalSpec(NamedTuple):
    """A `tf.config.LogicalDeviceConfiguration` as TensorFlow compares it: all three fields."""

    memory_limit: int | None = None
    priority: int | None = None
    ordinal: int | None = None


Logical = tuple["int | None | LogicalSpec", ...]
"""A recorded logical configuration: each entry's memory limit, or the whole `LogicalSpec` when it
carries a priority or ordinal (so a user's own such config never equals a plan's plain limits)."""


def logical_entries(configs: Sequence[Any] | None) -> Logical | None:
    """What `get_logical` returns for TensorFlow's recorded `LogicalDeviceConfiguration` list."""
    if configs is None:
        return None
    specs = [LogicalSpec(*config) for config in configs]
    return tuple(spec.memory_limit if spec[1:] == (None, None) else spec for spec in specs)
