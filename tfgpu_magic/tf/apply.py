"""Diffing a plan against what TensorFlow recorded and applying it through the `ConfigAPI` seam; the
TF1 `ConfigProto` of a plan; TensorFlow's Python loggers.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, NamedTuple

from ..errors import short_error
from .configapi import ConfigAPI, TensorFlowConfig
from .envvars import TF_FORCE_GPU_ALLOW_GROWTH, TF_GPU_ALLOCATOR
from .plan import Plan
from .runtime import ASYNC_ALLOCATOR, LOCKED_MARKER, NO_GPU_NOTE, LogicalSpec, RuntimeState

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
        report.failed.append(f"listing TensorFlow's devices: TensorFlow said: {short_error(err, None)}")
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
            report.failed.append(f"{change.describe()}: TensorFlow said: {short_error(err, None)}")
        else:
            report.applied.append(change.describe())
    return report


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
