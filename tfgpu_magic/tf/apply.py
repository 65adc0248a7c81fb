"""TensorFlow's side of a plan: the seam (the handful of `tf.config` calls we make, as `ConfigAPI`, and
`TensorFlowConfig` over the real TensorFlow, imported on first use; tests without a GPU substitute a fake
of it that enforces TensorFlow's real rules, tests/fake_tf.py, checked against real TensorFlow on CPU),
diffing a plan against what TensorFlow recorded and applying it through the seam, the TF1 `ConfigProto`
of a plan, TensorFlow's Python loggers. The plan holds TensorFlow's arguments already (`Plan.tf_limits`,
derived once). What comes back is records (`Change`, `Refusal`, `Recorded`, `LoggerSet`, `plan.Note`);
`views.status` words them.
"""

from __future__ import annotations

import logging
import os
import sys
from typing import Any, Callable, Literal, NamedTuple, Protocol, Sequence

from ..envvars import TF_FORCE_GPU_ALLOW_GROWTH, TF_GPU_ALLOCATOR
from ..errors import PolicyError, short_error
from ..plan import Note, Plan, note
from .runtime import (ASYNC_ALLOCATOR, LOCKED_MARKER, CreatedBy, Logical, RuntimeState,
                      logical_entries, record_devices_created, runtime_state)

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
    def getenv(self, name: str) -> str | None:
        """The variable as TensorFlow's C++ side reads it (the process environment)."""
    def errors(self) -> tuple[type[BaseException], ...]:
        """TensorFlow's C++-side error types (`tf.errors.OpError`)."""
    def new_session_config(self) -> Any:
        """An empty `ConfigProto`."""
    def device_routes(self) -> list[Route]:
        """The module attributes that create devices outside the eager context."""
    def record_devices_created(self, route: CreatedBy) -> None:
        """Remember (once, process-wide) that `route` created GPU devices; `state()` reports it."""
    def set_loglevel(self, level: str | None) -> list[LoggerSet]:
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


NO_TENSORFLOW = ("TensorFlow is not installed in this Python ({python}): pip install tensorflow "
                 "(on a GPU machine: pip install 'tensorflow[and-cuda]')")
"""The one line a call that needs TensorFlow itself gives where it cannot be imported: a `PolicyError`'s
text, like every other, worded where it is raised, since a script's `configure()` or `session_config()`
shows `str(err)` with no view in between."""


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

    def record_devices_created(self, route: CreatedBy) -> None:
        record_devices_created(route)

    def set_loglevel(self, level: str | None) -> list[LoggerSet]:
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


PYTHON_LOGGERS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING, "error": logging.ERROR}
"""The `logging` level of each `loglevel` (absl's Python verbosity follows the same names)."""

_python_defaults: dict[str, Any] = {}
"""The loggers' levels before this tool first set them, restored by `loglevel off`."""


class LoggerSet(NamedTuple):
    """A Python logger of TensorFlow's set to `level` and above (None: back to its own level)."""

    logger: str
    level: str | None


class VariableSet(NamedTuple):
    """An environment variable this tool set to `value` (None: unset), or restored so."""

    name: str
    value: str | None


def set_python_loglevel(level: str | None) -> list[LoggerSet]:
    """Set the `tensorflow` logger (and absl's, when absl is loaded) to `level`; None restores the
    levels they had before. Unlike the C++ level these stay settable for the whole process.
    Returns a record per logger that changed."""
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
            changed.append(LoggerSet(name, level))
    return changed


def _absl_verbosity(absl: Any, level: str) -> Any:
    """absl's verbosity for `level` (its own constants: DEBUG 1 … ERROR -2)."""
    return getattr(absl, level.upper())


Setting = Literal["visible", "logical", "cpus", "growth", "variable"]
"""What a `Change` changes: which GPUs are visible, a GPU's logical devices, the first CPU's, a
GPU's memory growth, an environment variable."""


LockReason = Literal["initialized", "import", "cuda_start", "allocator_creation", "devices_created", "jax_backends",
                     "torch_cuda", "torch_import", "no_call"]
"""Why a change cannot be made in this process: the runtime is initialized; the variable's reader read
it at TensorFlow's import, CUDA's start, the GPU allocators' creation, JAX's backend start or PyTorch's
CUDA start (`envvars.Moment.code`); a route created GPU devices (`RuntimeState.devices_created`);
TensorFlow has no call for it."""


class Change(NamedTuple):
    """One setting that differs from what TensorFlow (or CUDA) has taken: `setting` of `device` (a
    device name; the device kind for `visible`; the name for a `variable`), from `current` to
    `desired` as TensorFlow or the environment holds them (None: TensorFlow's default, or unset)."""

    setting: Setting
    device: str
    current: Any
    desired: Any
    why: LockReason | None = None
    """Why it cannot change any more, when that is not initialization."""


class Pending(NamedTuple):
    """A change TensorFlow has not taken yet (`Controller.pending`): `why` it cannot be made now (None:
    `%tfgpu apply` still can), and whether only a new process can make it."""

    change: Change
    why: LockReason | None
    needs_restart: bool


class Step(NamedTuple):
    """A `Change` and the `tf.config` call that makes it."""

    change: Change
    run: Callable[[], None] | None
    """None when TensorFlow has no call for it in this process (`needs_restart`)."""

    @property
    def needs_restart(self) -> bool:
        """TensorFlow cannot make this change in this process even before initialization."""
        return self.run is None


class Refusal(NamedTuple):
    """A change TensorFlow refused, with its words; `change` None: listing the devices failed."""

    change: Change | None
    said: str


class Recorded(NamedTuple):
    """One physical device as TensorFlow recorded it (`recorded_settings`)."""

    name: str
    kind: Literal["GPU", "CPU"]
    logical: Logical | None
    growth: bool | None = None
    visible: bool = True
    pooled: bool = False
    """Under cuda_malloc_async: growth is moot, a memory limit soft."""


class ApplyReport:
    """What applying a plan did, step by step. (A plain class: it is on the `%load_ext` path, where a
    dataclass's code generation costs about a millisecond; docs/architecture.md, "Rows".)"""

    __slots__ = ("state", "waiting", "applied", "locked", "failed", "notes", "earlier", "absent", "gpu_edits", "left")

    def __init__(self, state: RuntimeState, waiting: bool = False, locked: list[Change] | None = None) -> None:
        self.state = state
        self.waiting = waiting
        """TensorFlow is not imported yet: the import hook will apply the rest."""
        self.applied: list[Change | LoggerSet | VariableSet | tuple] = []
        """Changes made, loggers and variables set, PyTorch's fractions (`frameworks.torch.FractionSet`)."""
        self.locked: list[Change] = locked or []
        self.failed: list[Refusal] = []
        self.notes: list[Note] = []
        self.earlier: list[Change] = []
        """The `locked` items the previous report already named (an edit names only its own)."""
        self.absent: list[Note] = []
        """Notes on the part of the policy that has no device to apply to (no GPU, missing GPUs),
        every time, while `notes` holds only what was not said before."""
        self.gpu_edits: list[str] = []
        """The GPU settings an edit asked for anew (status phrases), named where `absent` applies."""
        self.left: list[tuple[str, str | None]] = []
        """Variables (name, value now; None: unset) the user set after this tool did: left as they are,
        where the policy no longer wants them (`reset`), instead of restored."""

    def __repr__(self) -> str:
        return f"ApplyReport({', '.join(f'{name}={getattr(self, name)!r}' for name in self.__slots__)})"

    @property
    def ok(self) -> bool:
        return not self.locked and not self.failed


def env_changes(plan: Plan) -> list[Change]:
    """The plan's environment variables TensorFlow or CUDA already read (`Plan.locked_env`)."""
    return [Change("variable", name, current, target, why) for name, current, target, why in plan.locked_env]


def pending_changes(plan: Plan, api: ConfigAPI) -> tuple[list[Step], list[Note]]:
    """Every `tf.config` call the plan needs that TensorFlow has not recorded yet (variables read
    already first, with no call), and notes on what part of the plan has no device to apply to
    (`ApplyReport.absent`)."""
    gpus, cpus = api.devices("GPU"), api.devices("CPU")
    state = api.state()
    gpu_steps = [
        *_visible_changes(plan, api, gpus),
        *_logical_changes(plan, api, gpus, []),
        *_growth_changes(plan, api, gpus, state.initialized),
    ]
    if state.devices_created is not None and not state.initialized:
        # GPUProcessState::GetGPUAllocator (gpu_process_state.cc) builds each GPU's allocator once per
        # process and GpuIdManager keeps the first TF-to-CUDA id mapping: tf.config still accepts a
        # change, but the GPUs will not follow it (a changed split even fails at initialization).
        gpu_steps = [Step(step.change._replace(why="devices_created"), None) for step in gpu_steps]
    steps = [*(Step(change, None) for change in env_changes(plan)), *gpu_steps, *_logical_changes(plan, api, [], cpus)]
    notes: list[Note] = []
    missing = sorted(index for index, _ in plan.tf_limits if index >= len(gpus))
    wants_gpu = plan.growth is not None or plan.sized or plan.visible_gpus
    if not gpus and (wants_gpu or plan.env_map.get(TF_FORCE_GPU_ALLOW_GROWTH) == "true"):
        notes.append(note("no_gpu"))
    elif missing:
        notes.append(note("missing_gpus", seen=len(gpus), missing=tuple(missing)))
    return steps, notes


def _visible_changes(plan: Plan, api: ConfigAPI, gpus: list[Any]) -> list[Step]:
    if plan.visible_gpus is None:
        return []
    wanted = [gpus[i] for i in sorted(set(plan.visible_gpus)) if i < len(gpus)]  # TF keeps physical order
    current = api.get_visible("GPU")
    if [api.name(d) for d in current] == [api.name(d) for d in wanted]:
        return []
    return [Step(Change("visible", "GPU", [api.name(d) for d in current], [api.name(d) for d in wanted]),
                 lambda: api.set_visible(wanted, "GPU"))]


def _logical_changes(plan: Plan, api: ConfigAPI, gpus: list[Any], cpus: list[Any]) -> list[Step]:
    """Logical-device configurations to set, and recorded ones the plan no longer wants (which
    TensorFlow cannot remove: they stay until the process restarts)."""
    targets: list[tuple[Setting, Any, Any]] = [("logical", gpu, plan.memory_limits(i)) for i, gpu in enumerate(gpus)]
    if cpus:
        targets.append(("cpus", cpus[0], None if plan.cpu_devices is None else (None,) * plan.cpu_devices))
    steps = []
    for setting, device, wanted in targets:
        recorded = api.get_logical(device)
        if recorded == wanted or (recorded is None and wanted == (None,)):
            continue  # as TF compares: a recorded priority or ordinal (a LogicalSpec entry) never equals
        change = Change(setting, api.name(device), recorded, wanted)
        run = None if wanted is None else lambda device=device, wanted=wanted: api.set_logical(device, wanted)
        steps.append(Step(change, run))  # no call removes a recorded configuration
    return steps


def _growth_changes(plan: Plan, api: ConfigAPI, gpus: list[Any], initialized: bool) -> list[Step]:
    """Growth on every GPU without logical devices. Before initialization the recorded value must
    equal the wanted one exactly (TF refuses a mix of None and False at init); after, None == off."""
    if plan.growth is None:
        return []
    steps = []
    for index, gpu in enumerate(gpus):
        if plan.memory_limits(index) is not None or api.get_logical(gpu) is not None:
            continue
        recorded = api.get_growth(gpu)
        if (bool(recorded) if initialized else recorded) == plan.growth:
            continue
        steps.append(Step(Change("growth", api.name(gpu), recorded, plan.growth),
                          lambda gpu=gpu: api.set_growth(gpu, plan.growth)))
    return steps


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
        report.locked = env_changes(plan)
        return report  # nothing for tf.config, and listing devices would start CUDA for nothing
    tf_errors = api.errors()
    try:
        steps, report.notes = pending_changes(plan, api)
        report.absent = list(report.notes)
    except tf_errors as err:  # C++ side, e.g. CUDA failing to start while listing devices
        report.locked = env_changes(plan)
        report.failed.append(Refusal(None, short_error(err, None)))
        return report
    for change, run in steps:
        if report.state.initialized or run is None:
            report.locked.append(change)
            continue
        try:
            run()
        except RuntimeError as err:
            if LOCKED_MARKER not in str(err):
                raise
            report.locked.append(change)
        except (ValueError, *tf_errors) as err:
            report.failed.append(Refusal(change, short_error(err, None)))
        else:
            report.applied.append(change)
    return report


def recorded_settings(api: ConfigAPI | None = None) -> list[Recorded]:
    """What TensorFlow has recorded, one record per physical GPU and the first CPU; empty while CUDA
    has not started.

    Listing devices starts CUDA (after which `CUDA_*` variables are too late), so this only looks
    once TensorFlow has listed them itself.
    """
    api = api or TensorFlowConfig()
    if not api.state().devices_listed:
        return []
    visible = {api.name(d) for d in api.get_visible("GPU")}
    # GPUProcessState::GetGPUAllocator (gpu_process_state.cc): under cuda_malloc_async the BFC allocator
    # is not built, so allow_growth has no effect and a memory limit only sets the pool's release
    # threshold (GpuCudaMallocAsyncAllocator, gpu_cudamallocasync_allocator.cc). Read, not run.
    pooled = api.getenv(TF_GPU_ALLOCATOR) == ASYNC_ALLOCATOR
    records = [Recorded(api.name(gpu), "GPU", api.get_logical(gpu), api.get_growth(gpu), api.name(gpu) in visible,
                        pooled) for gpu in api.devices("GPU")]
    shown = {api.name(d) for d in api.get_visible("CPU")}
    return records + [Recorded(api.name(cpu), "CPU", api.get_logical(cpu), visible=api.name(cpu) in shown)
                      for cpu in api.devices("CPU")[:1]]


def session_config(plan: Plan, api: ConfigAPI | None = None) -> Any:
    """A `tf.compat.v1.ConfigProto` carrying the plan, for TF1-style `Session(config=...)`."""
    api = api or TensorFlowConfig()
    config = api.new_session_config()
    gpus = api.devices("GPU")
    if plan.visible_gpus is not None:
        config.gpu_options.visible_device_list = ",".join(str(i) for i in plan.visible_gpus)
    if plan.sized:  # one entry per visible GPU, in visible_device_list's order (TF requires it)
        for index in plan.visible_gpus if plan.visible_gpus is not None else range(len(gpus)):
            virtual = config.gpu_options.experimental.virtual_devices.add()
            virtual.memory_limit_mb.extend(float(mib) for mib in plan.memory_limits(index) or ())
    if plan.growth is not None:
        config.gpu_options.allow_growth = plan.growth
    if plan.cpu_devices is not None:
        config.device_count["CPU"] = plan.cpu_devices
    return config
