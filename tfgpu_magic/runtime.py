"""The only module that imports TensorFlow: read its runtime state, apply a plan through `tf.config`.

Everything TensorFlow-specific goes through `TensorFlowConfig`, a thin seam over the handful of
`tf.config` calls we make. Tests without a GPU substitute a fake of that seam that enforces
TensorFlow's real rules (tests/fake_tf.py), and check the fake against real TensorFlow on CPU.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol, Sequence

from .plan import Plan

LOCKED_MARKER = "cannot be modified after"
"""Text of TensorFlow's RuntimeError when a device setting changes after initialization."""


@dataclass(frozen=True)
class RuntimeState:
    """Where TensorFlow is in its life, read without side effects."""

    imported: bool = False
    devices_listed: bool = False
    """CUDA has started: `CUDA_*` variables set from now on have no effect."""
    initialized: bool = False
    """The runtime exists: device settings are locked until the process ends."""

    @property
    def label(self) -> str:
        if not self.imported:
            return "not imported"
        if self.initialized:
            return "initialized: device settings are locked until the kernel restarts"
        return "imported, runtime not initialized: settings can still change"


def runtime_state() -> RuntimeState:
    """Read TensorFlow's state from `sys.modules`; never imports or initializes anything.

    Uses TensorFlow's private `context_safe()`, `_context_handle` and `_physical_devices` (the same
    test TensorFlow's own setters make, stable from 2.10 to 2.21). If they ever go away, the state
    reads as 'not initialized' and the setters' RuntimeError is caught instead (see `apply_plan`).
    """
    if "tensorflow" not in sys.modules:
        return RuntimeState()
    module = sys.modules.get("tensorflow.python.eager.context")
    context = module.context_safe() if module is not None and hasattr(module, "context_safe") else None
    if context is None:
        return RuntimeState(imported=True)
    return RuntimeState(
        imported=True,
        devices_listed=getattr(context, "_physical_devices", None) is not None,
        initialized=getattr(context, "_context_handle", None) is not None,
    )


class ConfigAPI(Protocol):
    """The seam: the `tf.config` calls the runtime needs, with TensorFlow's rules."""

    def state(self) -> RuntimeState: ...
    def devices(self, kind: str) -> list[Any]: ...
    def name(self, device: Any) -> str: ...
    def get_growth(self, device: Any) -> bool | None: ...
    def set_growth(self, device: Any, enable: bool) -> None: ...
    def get_logical(self, device: Any) -> tuple[int | None, ...] | None: ...
    def set_logical(self, device: Any, limits: Sequence[int | None]) -> None: ...
    def get_visible(self, kind: str) -> list[Any]: ...
    def set_visible(self, devices: list[Any], kind: str) -> None: ...


class TensorFlowConfig:
    """`ConfigAPI` over the real `tf.config`. Imports TensorFlow on first use, not before."""

    @property
    def tf(self) -> Any:
        import tensorflow

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

    def get_logical(self, device: Any) -> tuple[int | None, ...] | None:
        configs = self.tf.config.get_logical_device_configuration(device)
        return None if configs is None else tuple(c.memory_limit for c in configs)

    def set_logical(self, device: Any, limits: Sequence[int | None]) -> None:
        make = self.tf.config.LogicalDeviceConfiguration
        self.tf.config.set_logical_device_configuration(device, [make(memory_limit=mib) for mib in limits])

    def get_visible(self, kind: str) -> list[Any]:
        return self.tf.config.get_visible_devices(kind)

    def set_visible(self, devices: list[Any], kind: str) -> None:
        self.tf.config.set_visible_devices(devices, kind)


@dataclass(frozen=True)
class Change:
    """One `tf.config` setting that differs from what TensorFlow has recorded."""

    what: str
    current: Any
    desired: Any
    run: Callable[[], None] | None = field(repr=False, compare=False)
    """The `tf.config` call; None when TensorFlow has no call for it (`needs_restart`)."""

    @property
    def needs_restart(self) -> bool:
        """TensorFlow cannot make this change in this process even before initialization."""
        return self.run is None

    def describe(self) -> str:
        return f"{self.what}: {show(self.current)} → {show(self.desired)}"


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
        return " + ".join(f"{mib} MiB" for mib in value)
    if isinstance(value, list):
        return ", ".join(map(str, value)) or "none"
    return str(value)


def pending_changes(plan: Plan, api: ConfigAPI) -> tuple[list[Change], list[str]]:
    """Every `tf.config` call the plan needs that TensorFlow has not recorded yet, and notes."""
    gpus, cpus = api.devices("GPU"), api.devices("CPU")
    changes = [
        *_visible_changes(plan, api, gpus),
        *_logical_changes(plan, api, gpus, cpus),
        *_growth_changes(plan, api, gpus, api.state().initialized),
    ]
    notes = []
    missing = sorted(i for i, _ in plan.gpu_configs if i is not None and i >= len(gpus))
    if missing:
        notes.append(f"TensorFlow sees {len(gpus)} GPU(s); no GPU:{', GPU:'.join(map(str, missing))} to configure")
    wants_gpu = plan.growth is not None or plan.gpu_configs or plan.visible_gpus
    if not gpus and (wants_gpu or plan.env_map.get("TF_FORCE_GPU_ALLOW_GROWTH") == "true"):
        notes.append("TensorFlow sees no GPU: the GPU settings have nothing to apply to here")
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
            continue
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
    if not plan.has_tf_steps and not report.state.devices_listed:
        return report  # nothing for tf.config, and listing devices would start CUDA for nothing
    changes, report.notes = pending_changes(plan, api)
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
        except ValueError as err:
            report.failed.append(f"{change.describe()}: TensorFlow said: {err}")
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
    for gpu in api.devices("GPU"):
        hidden = "" if api.name(gpu) in visible else ", hidden"
        logical = api.get_logical(gpu)
        lines.append(
            f"{api.name(gpu)}: memory growth {show(api.get_growth(gpu))}, "
            f"{'whole GPU' if logical is None else 'logical GPUs ' + show(logical)}{hidden}"
        )
    for cpu in api.devices("CPU")[:1]:
        logical = api.get_logical(cpu)
        lines.append(f"{api.name(cpu)}: {'one logical device' if logical is None else show(logical)}")
    return lines


def session_config(plan: Plan, api: TensorFlowConfig | None = None) -> Any:
    """A `tf.compat.v1.ConfigProto` carrying the plan, for TF1-style `Session(config=...)`."""
    api = api or TensorFlowConfig()
    tf = api.tf
    config = tf.compat.v1.ConfigProto()
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
