"""What the views ask of the controller, answered as records (the views word them): the GPUs to list,
what the policy asks of each, what TensorFlow recorded and has not taken yet, the other frameworks and
their own memory figures.

Each query takes the plan it needs where its caller built one already (a status builds one per call).
"""

from __future__ import annotations

from typing import Iterable, MutableMapping, NamedTuple, Protocol

from ..envvars import told_to
from ..frameworks import FrameworkMemory, FrameworkView, jax, keras
from ..frameworks import torch as torch_room
from ..frameworks.torch import Fractions, TorchAPI
from ..gpus.cudaenv import GrantedCatalog
from ..gpus.inventory import Inventory
from ..language.policy import ALL_GPUS, Policy
from ..plan import Plan
from ..tf.apply import ConfigAPI, Pending, Recorded, env_changes, pending_changes, recorded_settings
from ..tf.runtime import RuntimeState
from .moments import JAX, TORCH


class Source(Protocol):
    """What the queries read of the controller (`Controller`, which hands itself in)."""

    api: ConfigAPI
    torch: TorchAPI
    fractions: Fractions
    policy: Policy
    catalog: GrantedCatalog
    environ: MutableMapping[str, str]

    def inventory(self) -> Inventory: ...
    def state(self) -> RuntimeState: ...
    def plan(self, state: RuntimeState | None = None, probe: bool = False, imports: bool = False) -> Plan: ...
    def environment(self) -> dict[str, str]: ...


class ListedGpu(NamedTuple):
    """A GPU as the views list it: NVML's card (`gpus.inventory.Gpu`, cut to what a list shows) when
    NVML works, else only TensorFlow's physical device, which has no figures; hence a record of its own."""

    ref: str
    name: str
    used_mib: int | None = None
    total_mib: int | None = None


class NoGpu(NamedTuple):
    """Why there is no GPU to list (`views.status.no_gpu_reason` words it)."""

    tensorflow_lists_none: bool
    """TensorFlow is imported and lists no GPU either."""
    nvml: str | None
    """NVML's error; None: NVML works and sees none."""


class GpuSettings(NamedTuple):
    """What the policy asks of one GPU (nvidia-smi index), precedence already worked out."""

    visible: bool
    limit_mib: int | None
    """Its own limit, else the every-GPU limit unless it has a split (a split sizes each part)."""
    split: tuple[int, ...] | None


def recorded(source: Source, state: RuntimeState) -> list[Recorded] | None:
    """What TensorFlow has recorded, a record per device; None while it is not imported."""
    return recorded_settings(source.api) if state.imported else None


def pending(source: Source, state: RuntimeState, plan: Plan) -> list[Pending]:
    """Settings TensorFlow has not taken yet: those only a restart can make first, then those
    `%tfgpu apply` still can. Before CUDA started only the variables a reader read already (JAX's at its
    backend start): there is no `tf.config` to compare yet."""
    if not (state.devices_listed or state.devices_created):
        return [Pending(change, change.why, True) for change in env_changes(plan)]
    steps, _ = pending_changes(plan, source.api)
    found = [Pending(step.change, step.change.why or ("initialized" if state.initialized else "no_call"), True)
             if state.initialized or step.needs_restart else Pending(step.change, None, False) for step in steps]
    return sorted(found, key=lambda item: not item.needs_restart)


def gpus(source: Source) -> tuple[list[ListedGpu], NoGpu | None]:
    """The GPUs to list (NVML's, else TensorFlow's once imported), and why there are none. Listing TF's
    devices never initializes its runtime."""
    inventory = source.inventory()
    if inventory.available and inventory.gpus:
        return [ListedGpu(gpu.ref, gpu.name or "GPU", gpu.memory_used_mib, gpu.memory_total_mib)
                for gpu in inventory.gpus], None
    if source.state().imported:
        found = source.api.devices("GPU")
        if found:
            return [ListedGpu(str(i), source.api.name(gpu)) for i, gpu in enumerate(found)], None
        return [], NoGpu(True, inventory.error)
    return [], NoGpu(False, inventory.error)


def gpu_settings(source: Source, refs: Iterable[str]) -> dict[str, GpuSettings]:
    """What the policy asks of each GPU in `refs` (nvidia-smi indices); entries the policy gives by
    UUID are matched through the inventory."""
    policy, aliases = source.policy, source.catalog.uuid_to_index()
    visible = None if policy.visible is None else {aliases.get(gpu, gpu) for gpu in policy.visible}
    limits = {aliases.get(gpu, gpu): mib for gpu, mib in policy.limits}
    splits = {aliases.get(gpu, gpu): sizes for gpu, sizes in policy.splits}
    return {ref: GpuSettings(visible is None or ref in visible,
                             limits.get(ref, None if ref in splits else limits.get(ALL_GPUS)), splits.get(ref))
            for ref in refs}


def other_frameworks(source: Source, plan: Plan | None = None) -> list[FrameworkView]:
    """JAX and PyTorch where imported (what they were told), or installed and told something by the
    policy (what their import will bring); Keras where imported or set to another backend than
    TensorFlow. `plan`: this process's, built with what an import will bring (`imports`), where the
    caller built it."""
    jax_state, torch_state = jax.state(), source.torch.state()
    plan = plan or source.plan(imports=True)
    planned = {name: value for name, value in (*plan.env, *plan.at_import.env) if value is not None}
    environment = source.environment()

    def told(name: str, imported: bool) -> tuple[tuple[str, str], ...]:
        names = told_to(name)
        return tuple((var, value) for var, value in (environment if imported else planned).items() if var in names)

    views = []
    jax_told = told(JAX, jax_state.imported)
    if jax_state.imported or (jax_told and jax.installed()):
        views.append(FrameworkView(JAX, jax_state.version, jax_state.imported, jax_state.started, jax_told))
    torch_told = told(TORCH, torch_state.imported)
    fractions = plan.torch_fractions if torch_state.imported else plan.at_import.torch_fractions
    if torch_state.imported or ((torch_told or fractions) and torch_room.installed()):
        views.append(FrameworkView(TORCH, torch_state.version, torch_state.imported, torch_state.cuda_started,
                                   torch_told, fractions, torch_state.cuda_build is not None
                                   if torch_state.imported else None))
    keras_state = keras.state(source.environ)
    if keras_state.imported or keras_state.backend != keras.DEFAULT_BACKEND:
        views.append(FrameworkView("keras", None, keras_state.imported, False, backend=keras_state.backend,
                                   backend_source=keras_state.source))
    return views


def framework_memory(source: Source, state: RuntimeState | None = None,
                     plan: Plan | None = None) -> dict[str, list[FrameworkMemory]]:
    """JAX's and PyTorch's own figures per GPU once started, the card (UUID) placed by CUDA's order of
    this process's GPUs; {} for a framework not started. `state` and `plan`: where the caller read them."""
    found: dict[str, list[FrameworkMemory]] = {}
    figures = {JAX: [(index, f"gpu:{index}", d.in_use, d.peak, d.limit) for index, d in enumerate(jax.memory())],
               TORCH: [(device, f"cuda:{device}", allocated, None, reserved)
                       for device, allocated, reserved in source.fractions.memory()]}
    if not any(figures.values()):
        return found
    from ..tf.memory import cuda_order

    inventory = source.inventory()
    state = state or source.state()
    order = cuda_order(source, inventory, state, plan or source.plan(state))
    uuids = {gpu.ref: gpu.uuid for gpu in inventory.gpus}
    for name, rows in figures.items():
        found[name] = [FrameworkMemory(device, uuids.get(order[index]) if index < len(order) else None, current,
                                       peak, reserved)
                       for index, device, current, peak, reserved in rows]
    return found
