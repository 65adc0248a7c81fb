"""Diffing a plan against what TensorFlow recorded and applying it through the `ConfigAPI` seam; the
TF1 `ConfigProto` of a plan; TensorFlow's Python loggers. The plan keeps the policy's limits and
splits as the policy holds them: TensorFlow's arguments (`memory_limits`) are derived here, at the
call. What comes back is records (`Change`, `Refusal`, `Recorded`); `views.status` words them.
"""

from __future__ import annotations

from typing import Any, Callable, Literal, NamedTuple

from ..errors import short_error
from ..language.words import ALL_GPUS
from .configapi import ConfigAPI, TensorFlowConfig
from .envvars import TF_FORCE_GPU_ALLOW_GROWTH, TF_GPU_ALLOCATOR
from .plan import Plan
from .runtime import ASYNC_ALLOCATOR, LOCKED_MARKER, NO_GPU_NOTE, Logical, RuntimeState

Setting = Literal["visible", "logical", "cpus", "growth", "variable"]
"""What a `Change` changes: which GPUs are visible, a GPU's logical devices, the first CPU's, a
GPU's memory growth, an environment variable."""


LockReason = Literal["initialized", "import", "cuda_start", "allocator_creation", "devices_created", "no_call"]
"""Why a change cannot be made in this process: the runtime is initialized; the variable's reader read
it at TensorFlow's import, CUDA's start or the GPU allocators' creation (`envvars.Moment.code`); a route
created GPU devices (`RuntimeState.devices_created`); TensorFlow has no call for it."""


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

    __slots__ = ("state", "waiting", "applied", "locked", "failed", "notes", "earlier", "absent", "gpu_edits")

    def __init__(self, state: RuntimeState, waiting: bool = False, locked: list[Change] | None = None) -> None:
        self.state = state
        self.waiting = waiting
        """TensorFlow is not imported yet: the import hook will apply the rest."""
        self.applied: list[Change | str] = []
        """Changes made, and variables set (`NAME=value`, `unset NAME`) and loggers changed, as lines."""
        self.locked: list[Change] = locked or []
        self.failed: list[Refusal] = []
        self.notes: list[str] = []
        self.earlier: list[Change] = []
        """The `locked` items the previous report already named (an edit names only its own)."""
        self.absent: list[str] = []
        """Notes on the part of the policy that has no device to apply to (`NO_GPU_NOTE`, missing GPUs),
        every time, while `notes` holds only what was not said before."""
        self.gpu_edits: list[str] = []
        """The GPU settings an edit asked for anew (status phrases), named where `absent` applies."""

    def __repr__(self) -> str:
        return f"ApplyReport({', '.join(f'{name}={getattr(self, name)!r}' for name in self.__slots__)})"

    @property
    def ok(self) -> bool:
        return not self.locked and not self.failed


def limit_table(plan: Plan) -> tuple[dict[int, tuple[int, ...]], tuple[int, ...] | None]:
    """TensorFlow's `memory_limit`s (MiB, one per logical device) of each GPU index with a limit or
    split of its own, and of every other GPU (None: left alone), from the plan's policy entries."""
    index = dict(plan.tf_indices)
    own = {index[gpu]: (mib,) for gpu, mib in plan.limits if gpu != ALL_GPUS}
    own.update((index[gpu], sizes) for gpu, sizes in plan.splits)
    every = dict(plan.limits).get(ALL_GPUS)
    return own, None if every is None else (every,)


def memory_limits(plan: Plan, index: int) -> tuple[int, ...] | None:
    """TensorFlow's `memory_limit`s for the logical devices of its GPU `index`; None to leave it alone."""
    own, every = limit_table(plan)
    return own.get(index, every)


def env_changes(plan: Plan) -> list[Change]:
    """The plan's environment variables TensorFlow or CUDA already read (`Plan.locked_env`)."""
    return [Change("variable", name, current, target, why) for name, current, target, why in plan.locked_env]


def pending_changes(plan: Plan, api: ConfigAPI) -> tuple[list[Step], list[str]]:
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
    notes = []
    missing = sorted(index for index in limit_table(plan)[0] if index >= len(gpus))
    wants_gpu = plan.growth is not None or plan.limits or plan.splits or plan.visible_gpus
    if not gpus and (wants_gpu or plan.env_map.get(TF_FORCE_GPU_ALLOW_GROWTH) == "true"):
        notes.append(NO_GPU_NOTE)
    elif missing:
        notes.append(f"TensorFlow sees {len(gpus)} GPU(s); no GPU:{', GPU:'.join(map(str, missing))} to configure")
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
    own, every = limit_table(plan)
    targets: list[tuple[Setting, Any, Any]] = [("logical", gpu, own.get(i, every)) for i, gpu in enumerate(gpus)]
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
    own, every = limit_table(plan)
    steps = []
    for index, gpu in enumerate(gpus):
        if own.get(index, every) is not None or api.get_logical(gpu) is not None:
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
    if plan.limits or plan.splits:  # one entry per visible GPU, in visible_device_list's order (TF requires it)
        own, every = limit_table(plan)
        for index in plan.visible_gpus if plan.visible_gpus is not None else range(len(gpus)):
            virtual = config.gpu_options.experimental.virtual_devices.add()
            virtual.memory_limit_mb.extend(float(mib) for mib in own.get(index, every) or ())
    if plan.growth is not None:
        config.gpu_options.allow_growth = plan.growth
    if plan.cpu_devices is not None:
        config.device_count["CPU"] = plan.cpu_devices
    return config
