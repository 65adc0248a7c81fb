"""The only module that imports TensorFlow: read its runtime state, apply a plan through `tf.config`.

Everything TensorFlow-specific goes through `TensorFlowConfig`, a thin seam over the handful of
`tf.config` calls we make. Tests without a GPU substitute a fake of that seam that enforces
TensorFlow's real rules (tests/fake_tf.py), and check the fake against real TensorFlow on CPU.
"""

from __future__ import annotations

import functools
import logging
import os
import sys
from dataclasses import dataclass, field
from types import FrameType
from typing import Any, Callable, NamedTuple, Protocol, Sequence

from ..errors import PolicyError, error_text, warn
from ..gpus.inventory import driver_present
from ..language.words import ALLOCATORS
from . import envvars
from .envvars import TF_FORCE_GPU_ALLOW_GROWTH, TF_GPU_ALLOCATOR, Moment
from .plan import Plan

LOCKED_MARKER = "cannot be modified after"
"""Text of TensorFlow's RuntimeError when a device setting changes after initialization."""

ASYNC_ALLOCATOR = ALLOCATORS["async"]

NO_TENSORFLOW = ("TensorFlow is not installed in this Python ({python}): pip install tensorflow "
                 "(on a GPU machine: pip install 'tensorflow[and-cuda]')")
"""The one line a call that needs TensorFlow itself gives where it cannot be imported."""

NO_GPU = "TensorFlow sees no GPU in this process (`%tfgpu doctor` says why)"
NO_GPU_NOTE = f"{NO_GPU}: the policy's GPU settings have nothing to apply to here"


class RuntimeState(NamedTuple):
    """Where TensorFlow is in its life, read without side effects."""

    imported: bool = False
    devices_listed: bool = False
    """TensorFlow listed its devices (CUDA has started)."""
    initialized: bool = False
    """The runtime exists: device settings are locked until the process ends."""
    devices_created: str | None = None
    """Which route created GPU devices outside the eager context (e.g. "`device_lib.list_local_devices()`
    in In [3]"): the GPU allocators are fixed from then on, though `tf.config` still accepts changes."""
    cuda_elsewhere: str | None = None
    """Why CUDA looks started in this process before TensorFlow listed devices (another library,
    or a route above): `CUDA_*` variables no longer take effect."""

    @property
    def cuda_fixed(self) -> bool:
        """`CUDA_VISIBLE_DEVICES` / `CUDA_DEVICE_ORDER` were read already (CUDA reads them once)."""
        return self.devices_listed or self.cuda_elsewhere is not None or self.devices_created is not None

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
        }[moment]

    @property
    def label(self) -> str:
        if self.initialized:
            return "initialized: device settings are locked until the kernel restarts"
        if self.devices_created is not None:
            return f"GPU devices created by {self.devices_created}: memory settings are fixed until restart"
        if not self.imported:
            base = "not imported"
        else:
            base = "imported, runtime not initialized: settings can still change"
        if self.cuda_elsewhere is not None and not self.devices_listed:
            return f"{base}, but CUDA already started ({self.cuda_elsewhere}): CUDA_* changes no longer take effect"
        return base


def too_late(name: str, state: RuntimeState) -> str | None:
    """Why a change of environment variable `name` no longer takes effect, None while it still does
    (the table's read time against TensorFlow's state). On a machine without GPUs the allocator
    variables are never read, and stay harmless."""
    moment = envvars.read_at(name)
    return moment.too_late if state.passed(moment) else None


_created_by: str | None = None
"""Process-wide, like TensorFlow's GPU allocators: the first route that created GPU devices."""


def devices_created() -> str | None:
    return _created_by


def record_devices_created(route: str) -> None:
    """Remember the first route that created GPU devices (`route` names it and the cell)."""
    global _created_by
    if _created_by is None:
        _created_by = route


def current_shell() -> Any:
    """The running IPython shell, None outside IPython (never imports IPython)."""
    ipython = sys.modules.get("IPython")
    return ipython.get_ipython() if ipython is not None and hasattr(ipython, "get_ipython") else None


def where() -> str:
    """The input cell running now, read at call time (no per-cell hook), else 'outside IPython'.

    The cell's number is the last stored input's: IPython stores the input before running it, while
    `execution_count` moved from "this cell" (IPython 8) to "the next one" (IPython 9) during a cell."""
    shell = current_shell()
    if shell is None:
        return "outside IPython"
    inputs = getattr(getattr(shell, "history_manager", None), "input_hist_parsed", None)
    count = len(inputs) - 1 if isinstance(inputs, list) and len(inputs) > 1 else None
    return f"in In [{count}]" if count is not None else "in IPython"


CUDA_DRIVER_LIBRARY = b"/libcuda.so"
"""The CUDA driver library, as the maps name it: it is loaded when CUDA starts (cuInit reads `CUDA_*` then)."""
PROC_MAPS = "/proc/self/maps"
LIBCUDA_LOADED = "libcuda is loaded in this process"
_libcuda_seen = False
"""Set once libcuda was seen in this process's maps: CUDA's driver library is never unloaded."""


def cuda_loaded(maps: str = PROC_MAPS, driver: Callable[[], bool] = driver_present) -> str | None:
    """Why CUDA looks started in this process (the driver library is mapped), None if it does not.

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
    instead (see `apply_plan`). A few attribute reads: cheap enough for the per-cell hooks."""
    if "tensorflow" not in sys.modules:
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


class ConfigAPI(Protocol):
    """The seam: the `tf.config` calls the runtime needs, with TensorFlow's rules."""

    def state(self) -> RuntimeState: ...
    def devices(self, kind: str) -> list[Any]: ...
    def name(self, device: Any) -> str: ...
    def get_growth(self, device: Any) -> bool | None: ...
    def set_growth(self, device: Any, enable: bool) -> None: ...
    def get_logical(self, device: Any) -> Logical | None: ...
    def set_logical(self, device: Any, limits: Sequence[int | None]) -> None: ...
    def get_visible(self, kind: str) -> list[Any]: ...
    def set_visible(self, devices: list[Any], kind: str) -> None: ...
    def details(self, device: Any) -> dict[str, Any]: ...
    def getenv(self, name: str) -> str | None: ...
    """The variable as TensorFlow's C++ side reads it (the process environment)."""
    def errors(self) -> tuple[type[BaseException], ...]: ...
    """TensorFlow's C++-side error types (`tf.errors.OpError`)."""
    def new_session_config(self) -> Any: ...
    """An empty `ConfigProto`."""
    def device_routes(self) -> list[Route]: ...
    """The module attributes that create devices outside the eager context."""
    def record_devices_created(self, route: str) -> None: ...
    """Remember (once, process-wide) that `route` created GPU devices; `state()` reports it."""
    def set_loglevel(self, level: str | None) -> list[str]: ...
    """Set TensorFlow's Python loggers to `level` (None: back to how they were); what changed."""


class Route(NamedTuple):
    """A TensorFlow callable that creates devices (and so the process's GPU allocators) itself.

    `position`/`keyword`: where its config argument is; `fill_default`: a missing config gets the
    policy's (device_lib); else None stays None (a Session then uses the eager context's config,
    which carries the policy). `gpus_created(result, args)` says whether GPU devices came of it."""

    owner: Any
    attribute: str
    label: str
    position: int
    keyword: str
    fill_default: bool
    gpus_created: Callable[[Any, tuple], bool]


class TensorFlowConfig:
    """`ConfigAPI` over the real `tf.config`. Imports TensorFlow on first use, not before."""

    @property
    def tf(self) -> Any:
        """The `tensorflow` module; a missing TensorFlow is one `PolicyError` line saying how to install it."""
        try:
            import tensorflow
        except ModuleNotFoundError as err:
            if err.name != "tensorflow":
                raise
            raise PolicyError(NO_TENSORFLOW.format(python=sys.executable)) from None
        return tensorflow

    def state(self) -> RuntimeState:
        return runtime_state()

    def devices(self, kind: str) -> list[Any]:
        return self.tf.config.list_physical_devices(kind)

    def name(self, device: Any) -> str:
        return device.name.replace("/physical_device:", "")

    def get_growth(self, device: Any) -> bool | None:
        return self.tf.config.experimental.get_memory_growth(device)

    def set_growth(self, device: Any, enable: bool) -> None:
        self.tf.config.experimental.set_memory_growth(device, enable)

    def get_logical(self, device: Any) -> Logical | None:
        return logical_entries(self.tf.config.get_logical_device_configuration(device))

    def set_logical(self, device: Any, limits: Sequence[int | None]) -> None:
        make = self.tf.config.LogicalDeviceConfiguration
        self.tf.config.set_logical_device_configuration(device, [make(memory_limit=mib) for mib in limits])

    def get_visible(self, kind: str) -> list[Any]:
        return self.tf.config.get_visible_devices(kind)

    def set_visible(self, devices: list[Any], kind: str) -> None:
        self.tf.config.set_visible_devices(devices, kind)

    def details(self, device: Any) -> dict[str, Any]:
        return self.tf.config.experimental.get_device_details(device)

    def getenv(self, name: str) -> str | None:
        return os.environ.get(name)

    def errors(self) -> tuple[type[BaseException], ...]:
        return (self.tf.errors.OpError,)

    def new_session_config(self) -> Any:
        return self.tf.compat.v1.ConfigProto()

    def record_devices_created(self, route: str) -> None:
        record_devices_created(route)

    def set_loglevel(self, level: str | None) -> list[str]:
        return set_python_loglevel(level)

    def device_routes(self) -> list[Route]:
        try:
            from tensorflow.python.client import device_lib, session
        except ImportError:  # a TensorFlow without these private modules: nothing to wrap
            return []

        def listed_gpu(result: Any, args: tuple) -> bool:
            return any(getattr(d, "device_type", "") == "GPU" for d in result or ())

        def session_gpu(result: Any, args: tuple) -> bool:
            return any(d.device_type == "GPU" for d in args[0].list_devices())

        return [
            Route(device_lib, "list_local_devices", "device_lib.list_local_devices()", 0, "session_config", True,
                  listed_gpu),
            Route(session.BaseSession, "__init__", "tf.compat.v1.Session()", 3, "config", False, session_gpu),
        ]


class Change(NamedTuple):
    """One `tf.config` setting that differs from what TensorFlow has recorded."""

    what: str
    current: Any
    desired: Any
    run: Callable[[], None] | None
    """The `tf.config` call; None when TensorFlow has no call for it (`needs_restart`)."""
    why: str = ""
    """Why it cannot change any more, when that is not initialization."""

    @property
    def needs_restart(self) -> bool:
        """TensorFlow cannot make this change in this process even before initialization."""
        return self.run is None

    def describe(self) -> str:
        return f"{self.what}: {show(self.current)} → {show(self.desired)}" + (f" ({self.why})" if self.why else "")


@dataclass
class ApplyReport:
    """What applying a plan did, step by step."""

    state: RuntimeState
    waiting: bool = False
    """TensorFlow is not imported yet: the import hook will apply the rest."""
    applied: list[str] = field(default_factory=list)
    locked: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    earlier: list[str] = field(default_factory=list)
    """The `locked` items the previous report already named (an edit names only its own)."""
    absent: list[str] = field(default_factory=list)
    """Notes on the part of the policy that has no device to apply to (`NO_GPU_NOTE`, missing GPUs),
    every time, while `notes` holds only what was not said before."""
    gpu_edits: list[str] = field(default_factory=list)
    """The GPU settings an edit asked for anew (status phrases), named where `absent` applies."""

    @property
    def ok(self) -> bool:
        return not self.locked and not self.failed


def show(value: Any) -> str:
    """Human form of a recorded or desired setting."""
    if value is None:
        return "TF default"
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, tuple) and value and all(v is None for v in value):
        return f"{len(value)} logical devices"
    if isinstance(value, tuple):
        return " + ".join(_show_entry(entry) for entry in value)
    if isinstance(value, list):
        return ", ".join(map(str, value)) or "none"
    return str(value)


def _show_entry(entry: int | None | LogicalSpec) -> str:
    if not isinstance(entry, LogicalSpec):
        return "one logical device" if entry is None else f"{entry} MiB"
    extras = [f"{name} {value}" for name, value in zip(("priority", "ordinal"), entry[1:]) if value is not None]
    return f"{_show_entry(entry.memory_limit)} ({', '.join(extras)})"


def locked_env_lines(plan: Plan) -> list[str]:
    """`env_changes` as the report's lines."""
    return [change.describe() for change in env_changes(plan)]


def env_changes(plan: Plan) -> list[Change]:
    """The plan's environment variables TensorFlow or CUDA already read (`Plan.locked_env`)."""
    return [Change(name, current or "unset", target or "unset", None, why) for name, current, target, why in
            plan.locked_env]


def pending_changes(plan: Plan, api: ConfigAPI) -> tuple[list[Change], list[str]]:
    """Every `tf.config` call the plan needs that TensorFlow has not recorded yet, and notes on what
    part of the plan has no device to apply to (`ApplyReport.absent`)."""
    gpus, cpus = api.devices("GPU"), api.devices("CPU")
    state = api.state()
    gpu_changes = [
        *_visible_changes(plan, api, gpus),
        *_logical_changes(plan, api, gpus, []),
        *_growth_changes(plan, api, gpus, state.initialized),
    ]
    if state.devices_created is not None and not state.initialized:
        # GPUProcessState::GetGPUAllocator (gpu_process_state.cc) builds each GPU's allocator once per
        # process and GpuIdManager keeps the first TF-to-CUDA id mapping: tf.config still accepts a
        # change, but the GPUs will not follow it (a changed split even fails at initialization).
        why = f"GPU devices were created by {state.devices_created}"
        gpu_changes = [Change(c.what, c.current, c.desired, None, why) for c in gpu_changes]
    changes = [*env_changes(plan), *gpu_changes, *_logical_changes(plan, api, [], cpus)]
    notes = []
    missing = sorted(i for i, _ in plan.gpu_configs if i is not None and i >= len(gpus))
    wants_gpu = plan.growth is not None or plan.gpu_configs or plan.visible_gpus
    if not gpus and (wants_gpu or plan.env_map.get(TF_FORCE_GPU_ALLOW_GROWTH) == "true"):
        notes.append(NO_GPU_NOTE)
    elif missing:
        notes.append(f"TensorFlow sees {len(gpus)} GPU(s); no GPU:{', GPU:'.join(map(str, missing))} to configure")
    return changes, notes


def _visible_changes(plan: Plan, api: ConfigAPI, gpus: list[Any]) -> list[Change]:
    if plan.visible_gpus is None:
        return []
    wanted = [gpus[i] for i in sorted(set(plan.visible_gpus)) if i < len(gpus)]  # TF keeps physical order
    current = api.get_visible("GPU")
    if [api.name(d) for d in current] == [api.name(d) for d in wanted]:
        return []
    return [Change("visible GPUs", [api.name(d) for d in current], [api.name(d) for d in wanted],
                   lambda: api.set_visible(wanted, "GPU"))]


def _logical_changes(plan: Plan, api: ConfigAPI, gpus: list[Any], cpus: list[Any]) -> list[Change]:
    """Logical-device configurations to set, and recorded ones the plan no longer wants (which
    TensorFlow cannot remove: they stay until the process restarts)."""
    targets = [(f"logical devices of {api.name(gpu)}", gpu, plan.config_for(i)) for i, gpu in enumerate(gpus)]
    if cpus:
        wanted_cpus = None if plan.cpu_devices is None else (None,) * plan.cpu_devices
        targets.append(("logical CPU devices", cpus[0], wanted_cpus))
    changes = []
    for what, device, wanted in targets:
        recorded = api.get_logical(device)
        if recorded == wanted or (recorded is None and wanted == (None,)):
            continue  # as TF compares: a recorded priority or ordinal (a LogicalSpec entry) never equals
        if wanted is None:
            changes.append(Change(what, recorded, None, None))  # TF has no call to remove them
        else:
            changes.append(Change(what, recorded, wanted, lambda device=device, wanted=wanted: api.set_logical(device, wanted)))
    return changes


def _growth_changes(plan: Plan, api: ConfigAPI, gpus: list[Any], initialized: bool) -> list[Change]:
    """Growth on every GPU without logical devices. Before initialization the recorded value must
    equal the wanted one exactly (TF refuses a mix of None and False at init); after, None == off."""
    if plan.growth is None:
        return []
    changes = []
    for index, gpu in enumerate(gpus):
        if plan.config_for(index) is not None or api.get_logical(gpu) is not None:
            continue
        recorded = api.get_growth(gpu)
        if (bool(recorded) if initialized else recorded) == plan.growth:
            continue
        changes.append(Change(f"memory growth of {api.name(gpu)}", recorded, plan.growth,
                              lambda gpu=gpu: api.set_growth(gpu, plan.growth)))
    return changes


def any_logical_recorded(api: ConfigAPI) -> bool:
    """True if TensorFlow holds any logical-device configuration (which drops GPU growth)."""
    devices = api.devices("GPU") + api.devices("CPU")[:1]
    return any(api.get_logical(device) is not None for device in devices)


def apply_plan(plan: Plan, api: ConfigAPI | None = None) -> ApplyReport:
    """Make TensorFlow's recorded device settings match the plan, or say precisely why not.

    Once the runtime is initialized nothing is called: differing settings are reported as locked.
    Before that, each call runs in turn; a TensorFlow error stops nothing else and is reported.
    """
    api = api or TensorFlowConfig()
    report = ApplyReport(state=api.state())
    if report.state.imported:
        report.applied += api.set_loglevel(plan.loglevel)
    if not plan.has_tf_steps and not report.state.devices_listed:
        report.locked = locked_env_lines(plan)
        return report  # nothing for tf.config, and listing devices would start CUDA for nothing
    tf_errors = api.errors()
    try:
        changes, report.notes = pending_changes(plan, api)
        report.absent = list(report.notes)
    except tf_errors as err:  # C++ side, e.g. CUDA failing to start while listing devices
        report.locked = locked_env_lines(plan)
        report.failed.append(f"listing TensorFlow's devices: TensorFlow said: {_first_line(err)}")
        return report
    for change in changes:
        if report.state.initialized or change.run is None:
            report.locked.append(change.describe())
            continue
        try:
            change.run()
        except RuntimeError as err:
            if LOCKED_MARKER not in str(err):
                raise
            report.locked.append(change.describe())
        except (ValueError, *tf_errors) as err:
            report.failed.append(f"{change.describe()}: TensorFlow said: {_first_line(err)}")
        else:
            report.applied.append(change.describe())
    return report


PYTHON_LOGGERS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING, "error": logging.ERROR}
"""The `logging` level of each `loglevel` (absl's Python verbosity follows the same names)."""

_python_defaults: dict[str, Any] = {}
"""The loggers' levels before this tool first set them, restored by `loglevel off`."""


def set_python_loglevel(level: str | None) -> list[str]:
    """Set the `tensorflow` logger (and absl's, when absl is loaded) to `level`; None restores the
    levels they had before. Unlike the C++ level these stay settable for the whole process.
    Returns one line per logger that changed."""
    loggers: dict[str, tuple[Callable[[], Any], Callable[[Any], None]]] = {}
    tf_logger = logging.getLogger("tensorflow")
    loggers["tensorflow"] = (lambda: tf_logger.level, tf_logger.setLevel)
    absl = sys.modules.get("absl.logging")
    if absl is not None and hasattr(absl, "get_verbosity") and hasattr(absl, "set_verbosity"):
        loggers["absl"] = (absl.get_verbosity, absl.set_verbosity)
    changed = []
    for name, (get, put) in loggers.items():
        if level is None and name not in _python_defaults:
            continue
        _python_defaults.setdefault(name, get())
        if level is None:
            wanted = _python_defaults.pop(name)
        else:
            wanted = PYTHON_LOGGERS[level] if name == "tensorflow" else _absl_verbosity(absl, level)
        if get() != wanted:
            put(wanted)
            shown = f"{level} and above" if level is not None else "back to its own level"
            changed.append(f"Python logger {name}: {shown}")
    return changed


def _absl_verbosity(absl: Any, level: str) -> Any:
    """absl's verbosity for `level` (its own constants: DEBUG 1 … ERROR -2)."""
    return getattr(absl, level.upper())


def _first_line(err: BaseException) -> str:
    """TensorFlow's C++ errors carry multi-line context; the report keeps one line each."""
    text = error_text(err).strip()
    return text.splitlines()[0] if text else type(err).__name__


def recorded_settings(api: ConfigAPI | None = None) -> list[str]:
    """What TensorFlow has recorded, one line per device; empty while CUDA has not started.

    Listing devices starts CUDA (after which `CUDA_*` variables are too late), so this only looks
    once TensorFlow has listed them itself.
    """
    api = api or TensorFlowConfig()
    if not api.state().devices_listed:
        return []
    lines = []
    visible = {api.name(d) for d in api.get_visible("GPU")}
    # GPUProcessState::GetGPUAllocator (gpu_process_state.cc): under cuda_malloc_async the BFC allocator
    # is not built, so allow_growth has no effect and a memory limit only sets the pool's release
    # threshold (GpuCudaMallocAsyncAllocator, gpu_cudamallocasync_allocator.cc). Read, not run.
    pool = api.getenv(TF_GPU_ALLOCATOR) == ASYNC_ALLOCATOR
    for gpu in api.devices("GPU"):
        hidden = "" if api.name(gpu) in visible else ", hidden"
        logical = api.get_logical(gpu)
        growth = "moot (cuda_malloc_async)" if pool else show(api.get_growth(gpu))
        memory = "whole GPU" if logical is None else "logical GPUs " + show(logical)
        lines.append(f"{api.name(gpu)}: memory growth {growth}, {memory}"
                     f"{' (soft: the cuda_malloc_async pool is shared)' if pool and logical else ''}{hidden}")
    shown = {api.name(d) for d in api.get_visible("CPU")}
    for cpu in api.devices("CPU")[:1]:
        logical = api.get_logical(cpu)
        lines.append(f"{api.name(cpu)}: {'one logical device' if logical is None else show(logical)}")
        if api.name(cpu) not in shown:  # two lines, each within the status's width
            name = api.name(cpu)
            lines.append(f"{name}: hidden by set_visible_devices (not by this tool); the first op will fail with")
            lines.append(f"{name}: \"No CPU devices are available in this process\" unless it is made visible again")
    return lines


def session_config(plan: Plan, api: ConfigAPI | None = None) -> Any:
    """A `tf.compat.v1.ConfigProto` carrying the plan, for TF1-style `Session(config=...)`."""
    api = api or TensorFlowConfig()
    config = api.new_session_config()
    gpus = api.devices("GPU")
    if plan.visible_gpus is not None:
        config.gpu_options.visible_device_list = ",".join(str(i) for i in plan.visible_gpus)
    if plan.gpu_configs:  # one entry per visible GPU, in visible_device_list's order (TF requires it)
        for index in plan.visible_gpus if plan.visible_gpus is not None else range(len(gpus)):
            virtual = config.gpu_options.experimental.virtual_devices.add()
            virtual.memory_limit_mb.extend(float(mib) for mib in plan.config_for(index) or ())
    if plan.growth is not None:
        config.gpu_options.allow_growth = plan.growth
    if plan.cpu_devices is not None:
        config.device_count["CPU"] = plan.cpu_devices
    return config


# ----- routes that create devices outside the eager context ----------------------------------------
def merge_session_config(user: Any | None, policy: Any | None, api: ConfigAPI) -> tuple[Any | None, str | None]:
    """The config a route should create devices with, and a warning when the user's GPU options win.

    The GPU options are taken as a whole (TF checks them together: virtual devices against
    visible_device_list and per_process_gpu_memory_fraction in VerifyVirtualDeviceSettings,
    gpu_device.cc); the CPU count is taken unless the user's config has one."""
    if policy is None or user is None:
        return (policy if user is None else user), None
    merged = api.new_session_config()
    merged.CopyFrom(user)
    wins = []
    wanted = policy.gpu_options.ListFields()
    if wanted and not user.gpu_options.ListFields():
        merged.gpu_options.CopyFrom(policy.gpu_options)
    elif wanted and user.gpu_options != policy.gpu_options:
        names = ", ".join(f.name for f, _ in user.gpu_options.ListFields())
        wins.append(f"the config's own gpu_options ({names}) win over the policy's for the GPU devices it "
                    "creates; they stay fixed until restart")
    if "CPU" in policy.device_count and "CPU" not in user.device_count:
        merged.device_count["CPU"] = policy.device_count["CPU"]
    elif "CPU" in policy.device_count and user.device_count["CPU"] != policy.device_count["CPU"]:
        wins.append(f"the config's own CPU device count ({user.device_count['CPU']}) wins over the policy's "
                    f"({policy.device_count['CPU']}) in this session")
    return merged, "; ".join(wins) or None


WRAPPED = "__tfgpu_original__"
"""Attribute on our wrappers holding the TensorFlow function they replace (idempotent, reversible)."""

CALLERS = {"is_gpu_available": "tf.test.is_gpu_available()", "gpu_device_name": "tf.test.gpu_device_name()"}
"""tf.test functions that call device_lib.list_local_devices() (framework/test_util.py), named in the state."""


def install_routes(api: ConfigAPI, policy_config: Callable[[], Any | None]) -> None:
    """Make every device-creating route use the policy (`policy_config()`, None for none) and record
    that GPU devices were created. Re-installing replaces our wrapper; `uninstall_routes` undoes it."""
    for route in api.device_routes():
        current = getattr(route.owner, route.attribute, None)
        if current is None:
            continue
        original = getattr(current, WRAPPED, current)
        setattr(route.owner, route.attribute, _wrap(route, original, api, policy_config))


def uninstall_routes(api: ConfigAPI) -> None:
    """Put TensorFlow's own functions back."""
    for route in api.device_routes():
        current = getattr(route.owner, route.attribute, None)
        if hasattr(current, WRAPPED):
            setattr(route.owner, route.attribute, getattr(current, WRAPPED))


def _wrap(route: Route, original: Callable, api: ConfigAPI, policy_config: Callable[[], Any | None]) -> Callable:
    @functools.wraps(original)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        positional = len(args) > route.position
        given = args[route.position] if positional else kwargs.get(route.keyword)
        label = CALLERS.get(sys._getframe(1).f_code.co_name, route.label)
        config = given
        if given is not None or route.fill_default:
            try:
                policy = policy_config()
            except Exception as err:  # the policy must never break the user's own call
                print(f"tfgpu_magic: {label}: the policy was not passed on: {err}", file=sys.stderr)
                policy = None
            config, warning = merge_session_config(given, policy, api)
            if warning:
                print(f"tfgpu_magic: {label}: {warning}", file=sys.stderr)
        if positional:
            args = (*args[:route.position], config, *args[route.position + 1:])
        elif config is not None:
            kwargs[route.keyword] = config
        try:
            result = original(*args, **kwargs)
        except api.errors() as err:  # C++ side, e.g. "Not enough GPUs to create virtual devices"
            used = "its own config" if given is not None else "the policy's options"
            print(f"tfgpu_magic: {label} could not create devices with {used}: {_first_line(err)}", file=sys.stderr)
            raise
        if api.state().devices_created is None and route.gpus_created(result, args):
            api.record_devices_created(f"`{label}` {where()}")
        return result

    setattr(wrapper, WRAPPED, original)
    return wrapper
