"""GPU memory after initialization, per visible GPU: TensorFlow's tensors (now and peak), this
process's pool on the card (NVML), the card's total and free, other processes, and the cap in force.

TensorFlow is read from `sys.modules`, never imported, and its memory statistics only once its
runtime is initialized: `get_memory_info` and `list_logical_devices` would initialize it themselves
(see `initialized` in TensorFlow's python/eager/context.py,
https://github.com/tensorflow/tensorflow/blob/master/tensorflow/python/eager/context.py). Before that, the cap is what the plan would apply. `MemoryAPI` is the seam that tests
fill with a fake (tests/fake_memory.py); the cards' figures come from the NVML inventory.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any, Mapping, NamedTuple, Protocol, Sequence

from ..gpus.cudaenv import grant_of
from ..gpus.inventory import Gpu, Inventory, self_mib
from ..language.policy import ALL_GPUS
from ..language.sizes import mib_text
from ..envvars import CUDA_DEVICE_ORDER, CUDA_VISIBLE_DEVICES, TF_FORCE_GPU_ALLOW_GROWTH, TF_GPU_ALLOCATOR
from ..plan import Plan
from .apply import ConfigAPI
from .runtime import ASYNC_ALLOCATOR, RuntimeState, eager_flags

if TYPE_CHECKING:
    from ..language.grammar import GpuCatalog

class MemorySource(Protocol):
    """What the figures read of the controller (`tfgpu_magic.controller.Controller`): the `tf` room
    sits below the controller, so it names the controller's surface instead of importing it."""

    policy: Any
    api: ConfigAPI
    catalog: GpuCatalog
    environ: Mapping[str, str]

    def state(self) -> RuntimeState: ...
    def plan(self, state: RuntimeState | None = None) -> Plan: ...
    def inventory(self) -> Inventory: ...


def initialized() -> bool:
    """`runtime_state().initialized` without its libcuda check, which reads /proc/self/maps (about
    1 ms once TensorFlow is loaded): the per-cell hooks ask this."""
    flags = eager_flags()
    return flags is not None and flags[1]


class MemoryAPI(Protocol):
    """The TensorFlow calls the memory figures need; called only once the runtime is initialized."""

    def initialized(self) -> bool: ...
    def logical_gpus(self) -> list[str]:
        """TensorFlow's logical GPUs (`GPU:0`, ...) in its order."""
    def info(self, device: str) -> tuple[int, int] | None:
        """(current, peak) bytes of TensorFlow's tensors on `device`; None where TF keeps no statistics."""
    def reset(self, device: str) -> None:
        """Start `device`'s peak afresh (`reset_memory_stats`)."""


class TensorFlowMemory:
    """`MemoryAPI` over the TensorFlow already in `sys.modules` (callers check `state()` first)."""

    @property
    def tf(self) -> Any:
        return sys.modules["tensorflow"]

    def initialized(self) -> bool:
        return initialized()

    def logical_gpus(self) -> list[str]:
        return [device.name.replace("/device:", "") for device in self.tf.config.list_logical_devices("GPU")]

    def info(self, device: str) -> tuple[int, int] | None:
        try:
            stats = self.tf.config.experimental.get_memory_info(device)
        except (ValueError, self.tf.errors.OpError):  # an allocator without statistics
            return None
        return int(stats["current"]), int(stats["peak"])

    def reset(self, device: str) -> None:
        try:
            self.tf.config.experimental.reset_memory_stats(device)
        except (ValueError, self.tf.errors.OpError):
            pass


# ----- the cap ------------------------------------------------------------------------------------
class Cap(NamedTuple):
    """The memory cap of one GPU: what TensorFlow recorded once initialized, else what would apply."""

    parts_mib: tuple[int, ...] | None
    """MiB of each logical GPU on the card; None: no cap."""
    source: str
    in_force: bool
    growth: bool = False
    soft: bool = False
    """cuda_malloc_async: a limit is the pool's release threshold, not a cap."""

    @property
    def mib(self) -> int | None:
        return None if self.parts_mib is None else sum(self.parts_mib)

    def describe(self, total_mib: int | None = None) -> str:
        """`4.0 GiB (limit on GPU 0, 5% of the card)`, `none (growth on)`."""
        if self.parts_mib is None:
            return f"none ({self.source})"
        share = f", {100 * self.mib / total_mib:.0f}% of the card" if total_mib else ""
        parts = f" in {len(self.parts_mib)} parts" if len(self.parts_mib) > 1 else ""
        soft = ", soft: cuda_malloc_async" if self.soft else ""
        return f"{mib_text(self.mib)}{parts} ({self.source}{share}{soft})"


def _cap_source(controller: MemorySource, ref: str | None) -> str:
    """Which part of the policy sets GPU `ref`'s cap, with how it was chosen (`policy.sources`)."""
    policy = controller.policy
    aliases = controller.catalog.uuid_to_index()
    own = ref is not None and any(aliases.get(gpu, gpu) == ref for gpu, _ in policy.limits if gpu != ALL_GPUS)
    split = ref is not None and any(aliases.get(gpu, gpu) == ref for gpu, _ in policy.splits)
    if split:
        words = f"split of GPU {ref}"
    elif own:
        words = f"limit on GPU {ref}"
    else:
        words = "limit on every visible GPU"
    why = [note for field, note in policy.sources if field in ("limit", "limits", "split", "splits")]
    return words + (f"; {'; '.join(why)}" if why else "")


def _growth_wanted(controller: MemorySource, plan: Any) -> bool:
    env = plan.env_map
    forced = env.get(TF_FORCE_GPU_ALLOW_GROWTH, controller.environ.get(TF_FORCE_GPU_ALLOW_GROWTH))
    return bool(plan.growth) or forced == "true"


def _no_cap(growth: bool, in_force: bool, soft: bool = False) -> str:
    if soft:
        return "cuda_malloc_async: the pool allocates on demand"
    if growth:
        return "growth on: the pool grows on demand"
    return "no growth: TF took nearly all free memory" if in_force else "no growth: TF will take nearly all free memory"


# ----- which GPUs, in TensorFlow's order --------------------------------------------------------
def cuda_order(controller: MemorySource, inventory: Inventory, state: RuntimeState, plan: Plan) -> list[str | None]:
    """nvidia-smi indices of the GPUs CUDA shows this process, in TensorFlow's order (GPU:0 first):
    `CUDA_VISIBLE_DEVICES` and `CUDA_DEVICE_ORDER` as CUDA read them once started, else as the plan
    will set them, placed on the cards as `gpus.cudaenv.grant_of` places a grant (None for an index
    in CUDA's default order: which card it is, nvidia-smi's numbering cannot tell)."""
    plan_env = {} if state.cuda_fixed else plan.env_map
    raw, order = ((plan_env[name] if name in plan_env else controller.environ.get(name))
                  for name in (CUDA_VISIBLE_DEVICES, CUDA_DEVICE_ORDER))
    if raw is None:
        return [gpu.ref for gpu in inventory.gpus]
    return [None if card is None else str(card) for card in grant_of(raw, order, inventory, controller.environ).cards]


class VisibleGpu(NamedTuple):
    """One GPU this process uses, in CUDA's order: NVML's card (`gpus.inventory.Gpu`; None when only
    TensorFlow lists it) paired with TensorFlow's index, which the card alone cannot know."""

    gpu: Gpu | None
    tf_index: int


def visible_cards(controller: MemorySource, inventory: Inventory, state: RuntimeState, plan: Plan) -> list[VisibleGpu]:
    """The GPUs this process uses (or will), NVML's when it has them, else TensorFlow's once listed."""
    if inventory.available and inventory.gpus:
        by_ref: dict[str | None, Gpu] = {gpu.ref: gpu for gpu in inventory.gpus}
        cards = [VisibleGpu(by_ref.get(ref), index)
                 for index, ref in enumerate(cuda_order(controller, inventory, state, plan))]
    elif state.devices_listed:
        cards = [VisibleGpu(None, index) for index, _ in enumerate(controller.api.devices("GPU"))]
    else:
        return []
    if state.devices_listed:  # set_visible_devices may hide some of them from TensorFlow
        physical = controller.api.devices("GPU")
        shown = {controller.api.name(device) for device in controller.api.get_visible("GPU")}
        cards = [card for card in cards if card.tf_index < len(physical)
                 and controller.api.name(physical[card.tf_index]) in shown]
    else:
        wanted = plan.visible_gpus
        cards = [card for card in cards if wanted is None or card.tf_index in wanted]
    return cards


def logical_ids(controller: MemorySource, cards: Sequence[VisibleGpu], state: RuntimeState) -> dict[int, list[str]]:
    """TF index of each card → its logical GPUs (`GPU:k`): TensorFlow numbers the logical GPUs of the
    visible cards in turn, each card's split in order. Once initialized only (read from TF's record)."""
    if not state.initialized:
        return {}
    ids: dict[int, list[str]] = {}
    physical = controller.api.devices("GPU")
    next_id = 0
    for card in sorted(cards, key=lambda c: c.tf_index):
        recorded = controller.api.get_logical(physical[card.tf_index]) if card.tf_index < len(physical) else None
        count = len(recorded) if recorded else 1
        ids[card.tf_index] = [f"GPU:{next_id + k}" for k in range(count)]
        next_id += count
    return ids


def cap_for(controller: MemorySource, card: VisibleGpu, state: RuntimeState, plan: Plan) -> Cap:
    """The cap of `card`: TensorFlow's record once initialized, else what the plan would apply."""
    ref = card.gpu.ref if card.gpu is not None else None
    soft = (plan.env_map.get(TF_GPU_ALLOCATOR) or controller.environ.get(TF_GPU_ALLOCATOR)) == ASYNC_ALLOCATOR
    wanted = plan.memory_limits(card.tf_index)
    if not state.initialized:
        growth = _growth_wanted(controller, plan)
        if wanted is None:
            return Cap(None, _no_cap(growth, False, soft), False, growth, soft)
        return Cap(tuple(wanted), _cap_source(controller, ref), False, growth, soft)
    physical = controller.api.devices("GPU")
    device = physical[card.tf_index] if card.tf_index < len(physical) else None
    recorded = controller.api.get_logical(device) if device is not None else None
    limits = None if recorded is None else tuple(part if isinstance(part, int) else part[0] for part in recorded)
    growth = (controller.environ.get(TF_FORCE_GPU_ALLOW_GROWTH) == "true"
              or (limits is None and device is not None and bool(controller.api.get_growth(device))))
    if limits is None or None in limits:
        return Cap(None, _no_cap(growth, True, soft), True, growth, soft)
    source = _cap_source(controller, ref) if wanted is not None and tuple(wanted) == limits else \
        "recorded by TensorFlow, not this policy's: set with tf.config, or the policy changed after initialization"
    return Cap(tuple(int(part) for part in limits), source, True, growth, soft)  # type: ignore[arg-type]


# ----- the figures ----------------------------------------------------------------------------------
class OtherProcess(NamedTuple):
    pid: int
    mib: int | None


class GpuMemory(NamedTuple):
    """One visible GPU's figures (`memory_rows`); `memory()` gives each as a plain dict."""

    gpu: str | None
    tf_device: str
    logical_devices: tuple[str, ...]
    name: str | None
    uuid: str | None
    initialized: bool
    tensors_bytes: int | None
    peak_bytes: int | None
    process_mib: int | None
    total_mib: int | None
    free_mib: int | None
    others_mib: int | None
    other_processes: tuple[OtherProcess, ...]
    cap_mib: int | None
    cap_parts_mib: tuple[int, ...] | None
    cap_source: str
    cap_in_force: bool
    cap_soft: bool
    growth: bool | None
    cap_text: str

    def as_dict(self) -> dict[str, Any]:
        """The public form: JSON-ready, lists where the row has tuples."""
        return {**self._asdict(), "logical_devices": list(self.logical_devices),
                "other_processes": [other._asdict() for other in self.other_processes],
                "cap_parts_mib": list(self.cap_parts_mib) if self.cap_parts_mib is not None else None}


def memory(controller: MemorySource, api: MemoryAPI | None = None, inventory: Inventory | None = None) -> list[dict]:
    """One plain dict per visible GPU (`tfgpu_magic.memory()`): `memory_rows` as dicts."""
    return [row.as_dict() for row in memory_rows(controller, api, inventory)]


def memory_rows(controller: MemorySource, api: MemoryAPI | None = None, inventory: Inventory | None = None,
                state: RuntimeState | None = None, plan: Plan | None = None) -> list[GpuMemory]:
    """One row per visible GPU (TensorFlow's order); empty without GPUs. Never imports or initializes
    TensorFlow: TensorFlow's figures are None until its runtime is initialized. `state` and `plan`: the
    controller's now, where the caller read them already."""
    api = api or TensorFlowMemory()
    inventory = inventory or controller.inventory()
    state = state or controller.state()
    plan = plan or controller.plan(state)
    cards = visible_cards(controller, inventory, state, plan)
    logical = logical_ids(controller, cards, state)
    stats = _tensor_stats(api, [device for devices in logical.values() for device in devices])
    rows = []
    for card in cards:
        gpu, devices = card.gpu, logical.get(card.tf_index, [])
        figures = [stats[device] for device in devices if stats.get(device) is not None]
        cap = cap_for(controller, card, state, plan)
        # is_self None: NVML's pids are the host's (a container), so which process is this one is unknown
        unknown = gpu is not None and any(proc.is_self is None for proc in gpu.processes)
        others = [proc for proc in gpu.processes if proc.is_self is False] if gpu is not None and not unknown else []
        rows.append(GpuMemory(
            gpu=gpu.ref if gpu is not None else None,
            tf_device=f"GPU:{card.tf_index}",
            logical_devices=tuple(devices),
            name=gpu.name if gpu is not None else None,
            uuid=gpu.uuid if gpu is not None else None,
            initialized=state.initialized,
            tensors_bytes=sum(f[0] for f in figures) if figures else None,
            peak_bytes=sum(f[1] for f in figures) if figures else None,
            process_mib=self_mib(gpu) if gpu is not None else None,
            total_mib=gpu.memory_total_mib if gpu is not None else None,
            free_mib=gpu.memory_free_mib if gpu is not None else None,
            others_mib=None if gpu is None or unknown or any(p.used_mib is None for p in others)
            else sum(p.used_mib or 0 for p in others),
            other_processes=tuple(OtherProcess(proc.pid, proc.used_mib) for proc in others),
            cap_mib=cap.mib,
            cap_parts_mib=tuple(cap.parts_mib) if cap.parts_mib is not None else None,
            cap_source=cap.source,
            cap_in_force=cap.in_force,
            cap_soft=cap.soft,
            growth=cap.growth,
            cap_text=cap.describe(gpu.memory_total_mib if gpu is not None else None),
        ))
    return rows


def _tensor_stats(api: MemoryAPI, devices: list[str]) -> dict[str, tuple[int, int] | None]:
    if not devices or not api.initialized():
        return {}
    return {device: api.info(device) for device in devices}


def tensor_figures(api: MemoryAPI, devices: tuple[str, ...]) -> tuple[int, int] | None:
    """TensorFlow's bytes in tensors now and at peak over `devices` (one card's logical devices); None
    where none has statistics."""
    stats = [s for s in map(api.info, devices) if s is not None]
    return (sum(s[0] for s in stats), sum(s[1] for s in stats)) if stats else None


def with_tensor_figures(rows: list[GpuMemory], api: MemoryAPI) -> list[GpuMemory] | None:
    """`rows` (`memory_rows`: cards, logical devices and caps, fixed once TensorFlow's runtime is
    initialized) with only TensorFlow's tensor figures read afresh: what a timer shows, without the plan
    or the state. None where the rows are stale (the runtime was initialized since: read them anew)."""
    if not rows or not api.initialized():
        return rows
    if not all(row.initialized for row in rows):
        return None
    fresh = []
    for row in rows:
        figures = tensor_figures(api, row.logical_devices)
        fresh.append(row._replace(tensors_bytes=figures[0] if figures else None,
                                  peak_bytes=figures[1] if figures else None))
    return fresh
