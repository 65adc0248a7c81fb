"""GPU memory after initialization, per visible GPU: TensorFlow's tensors (now and peak), this
process's pool on the card (NVML), the card's total and free, other processes, and the cap in force.

TensorFlow is read from `sys.modules`, never imported, and its memory statistics only once its
runtime is initialized: `get_memory_info` and `list_logical_devices` would initialize it themselves
(DESIGN §2). Before that, the cap is what the plan would apply. `MemoryAPI` is the seam that tests
fill with a fake (tests/fake_memory.py); the cards' figures come from the NVML inventory.
"""

from __future__ import annotations

import re
import sys
from typing import Any, Mapping, NamedTuple, Protocol, Sequence

from ..gpus.cudaenv import parse_cuda_visible
from ..gpus.inventory import MIB, Gpu, Inventory, self_mib
from ..language.policy import ALL_GPUS
from .envvars import CUDA_VISIBLE_DEVICES, TF_FORCE_GPU_ALLOW_GROWTH, TF_GPU_ALLOCATOR
from .plan import Plan
from .runtime import ASYNC_ALLOCATOR, ConfigAPI, RuntimeState, eager_flags

NO_GPU_HINT = "`%tfgpu doctor` says why"
WATCH_ATTRIBUTE = "_tfgpu_watch"
"""The shell attribute holding `%tfgpu watch`'s hooks while it is on (its peaks are per cell then)."""


class Catalog(Protocol):
    def uuid_to_index(self) -> dict[str, str]: ...


class Controller(Protocol):
    """What the figures read of the controller (`tfgpu_magic.controller.Controller`); a protocol, so
    that the controller can reach this module from its import hook without an import cycle."""

    policy: Any
    api: ConfigAPI
    catalog: Catalog
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
    def logical_gpus(self) -> list[str]: ...
    """TensorFlow's logical GPUs (`GPU:0`, ...) in its order."""
    def info(self, device: str) -> tuple[int, int] | None: ...
    """(current, peak) bytes of TensorFlow's tensors on `device`; None where TF keeps no statistics."""
    def reset(self, device: str) -> None: ...
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


def oom_types() -> tuple[type[BaseException], ...]:
    """TensorFlow's `ResourceExhaustedError`, once TensorFlow is imported (else nothing can raise it)."""
    errors = getattr(sys.modules.get("tensorflow"), "errors", None)
    found = getattr(errors, "ResourceExhaustedError", None)
    return (found,) if isinstance(found, type) else ()


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


def _cap_source(controller: Controller, ref: str | None) -> str:
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


def _growth_wanted(controller: Controller, plan: Any) -> bool:
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
def cuda_order(controller: Controller, inventory: Inventory, state: RuntimeState, plan: Plan) -> list[str]:
    """nvidia-smi indices of the GPUs CUDA shows this process, in TensorFlow's order (GPU:0 first).

    `CUDA_VISIBLE_DEVICES` as CUDA read it once started, else as the plan will set it. The policy
    sets `CUDA_DEVICE_ORDER=PCI_BUS_ID` whenever it has GPU settings, so the order is nvidia-smi's."""
    plan_env = plan.env_map
    raw = (plan_env[CUDA_VISIBLE_DEVICES] if CUDA_VISIBLE_DEVICES in plan_env and not state.cuda_fixed
           else controller.environ.get(CUDA_VISIBLE_DEVICES))
    if raw is None:
        return [gpu.ref for gpu in inventory.gpus]
    by_uuid = {device.uuid.lower(): gpu.ref for gpu in inventory.gpus for device in (gpu, *gpu.mig_devices)}
    order = []
    for entry in parse_cuda_visible(raw, inventory.known_refs()).entries:
        if entry.isdigit():
            order.append(entry)
            continue
        matches = [ref for uuid, ref in by_uuid.items() if uuid.startswith(entry.lower())]
        if matches:
            order.append(matches[0])
    return order


class Card(NamedTuple):
    """One visible GPU: the NVML card (None when only TensorFlow lists it) and TensorFlow's index."""

    gpu: Gpu | None
    tf_index: int


def visible_cards(controller: Controller, inventory: Inventory, state: RuntimeState, plan: Plan) -> list[Card]:
    """The GPUs this process uses (or will), NVML's when it has them, else TensorFlow's once listed."""
    if inventory.available and inventory.gpus:
        by_ref = {gpu.ref: gpu for gpu in inventory.gpus}
        cards = [Card(by_ref[ref], index) for index, ref in enumerate(cuda_order(controller, inventory, state, plan))
                 if ref in by_ref]
    elif state.devices_listed:
        cards = [Card(None, index) for index, _ in enumerate(controller.api.devices("GPU"))]
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


def logical_ids(controller: Controller, cards: Sequence[Card], state: RuntimeState) -> dict[int, list[str]]:
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


def cap_for(controller: Controller, card: Card, state: RuntimeState, plan: Plan) -> Cap:
    """The cap of `card`: TensorFlow's record once initialized, else what the plan would apply."""
    ref = card.gpu.ref if card.gpu is not None else None
    soft = (plan.env_map.get(TF_GPU_ALLOCATOR) or controller.environ.get(TF_GPU_ALLOCATOR)) == ASYNC_ALLOCATOR
    wanted = plan.config_for(card.tf_index)
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
def memory(controller: Controller, api: MemoryAPI | None = None, inventory: Inventory | None = None) -> list[dict]:
    """One plain dict per visible GPU (TensorFlow's order); empty without GPUs. Never imports or
    initializes TensorFlow: TensorFlow's figures are None until its runtime is initialized."""
    api = api or TensorFlowMemory()
    inventory = inventory or controller.inventory()
    state = controller.state()
    plan = controller.plan(state)
    cards = visible_cards(controller, inventory, state, plan)
    logical = logical_ids(controller, cards, state)
    stats = _tensor_stats(api, [device for devices in logical.values() for device in devices])
    rows = []
    for card in cards:
        gpu, devices = card.gpu, logical.get(card.tf_index, [])
        figures = [stats[device] for device in devices if stats.get(device) is not None]
        cap = cap_for(controller, card, state, plan)
        others = [proc for proc in gpu.processes if not proc.is_self] if gpu is not None else []
        rows.append({
            "gpu": gpu.ref if gpu is not None else None,
            "tf_device": f"GPU:{card.tf_index}",
            "logical_devices": devices,
            "name": gpu.name if gpu is not None else None,
            "uuid": gpu.uuid if gpu is not None else None,
            "initialized": state.initialized,
            "tensors_bytes": sum(f[0] for f in figures) if figures else None,
            "peak_bytes": sum(f[1] for f in figures) if figures else None,
            "process_mib": self_mib(gpu) if gpu is not None else None,
            "total_mib": gpu.memory_total_mib if gpu is not None else None,
            "free_mib": gpu.memory_free_mib if gpu is not None else None,
            "others_mib": None if gpu is None or any(p.used_mib is None for p in others)
            else sum(p.used_mib or 0 for p in others),
            "other_processes": [{"pid": proc.pid, "mib": proc.used_mib} for proc in others],
            "cap_mib": cap.mib,
            "cap_parts_mib": list(cap.parts_mib) if cap.parts_mib is not None else None,
            "cap_source": cap.source,
            "cap_in_force": cap.in_force,
            "cap_soft": cap.soft,
            "growth": cap.growth,
            "cap_text": cap.describe(gpu.memory_total_mib if gpu is not None else None),
        })
    return rows


def _tensor_stats(api: MemoryAPI, devices: list[str]) -> dict[str, tuple[int, int] | None]:
    if not devices or not api.initialized():
        return {}
    return {device: api.info(device) for device in devices}


def no_gpu_line(controller: Controller, inventory: Inventory | None = None) -> str:
    """The one line without GPUs: why NVML and TensorFlow list none."""
    inventory = inventory or controller.inventory()
    state = controller.state()
    nvml = inventory.error or "NVML sees none"
    if state.devices_listed:
        return f"No GPU: TensorFlow lists none, and {nvml}. {NO_GPU_HINT}."
    return f"No GPU found: {nvml}. {NO_GPU_HINT}."


# ----- text -------------------------------------------------------------------------------------------
def mib_text(mib: float | None) -> str:
    """MiB as people read it: `512 MiB`, `3.5 GiB`; `?` when unknown."""
    if mib is None:
        return "?"
    if abs(mib) >= 1024 * 1024:
        return f"{mib / 1024 / 1024:.1f} TiB"
    return f"{mib / 1024:.1f} GiB" if abs(mib) >= 1024 else f"{mib:.0f} MiB"


def bytes_text(count: int | None) -> str:
    return "?" if count is None else (mib_text(count / MIB) if abs(count) >= MIB else f"{count / 1024:.0f} KiB")


def summary(row: dict) -> str:
    """One GPU's figures in a phrase, for the panel's GPU row: `tensors 1.6 GiB (peak 2.1 GiB) · cap
    4.0 GiB (limit on GPU 0, 5% of the card)`; the cap alone before initialization."""
    cap = f"cap {row['cap_text']}" if row["cap_in_force"] else f"cap at initialization {row['cap_text']}"
    if row["tensors_bytes"] is None:
        return cap
    return f"tensors {bytes_text(row['tensors_bytes'])} (peak {bytes_text(row['peak_bytes'])}) · {cap}"


HEADERS = ("GPU", "TF", "tensors now / peak", "this process", "others", "free / total", "cap")


def memory_text(controller: Controller, api: MemoryAPI | None = None, inventory: Inventory | None = None) -> str:
    """`%tfgpu memory`: one compact row per visible GPU, or the one line without GPUs."""
    inventory = inventory or controller.inventory()
    rows = memory(controller, api, inventory)
    if not rows:
        return no_gpu_line(controller, inventory)
    return render(rows, controller.state())


def render(rows: list[dict], state: RuntimeState) -> str:
    """The table of `memory()`'s rows, columns aligned, and a line on what the figures mean."""
    table = [HEADERS]
    for row in rows:
        tensors = ("—" if not row["initialized"] else
                   f"{bytes_text(row['tensors_bytes'])} / {bytes_text(row['peak_bytes'])}"
                   if row["tensors_bytes"] is not None else "no statistics")
        table.append((
            row["gpu"] if row["gpu"] is not None else "?",
            row["tf_device"],
            tensors,
            mib_text(row["process_mib"]) if row["gpu"] is not None else "?",
            mib_text(row["others_mib"]) if row["gpu"] is not None else "?",
            f"{mib_text(row['free_mib'])} / {mib_text(row['total_mib'])}",
            row["cap_text"],
        ))
    widths = [max(len(line[i]) for line in table) for i in range(len(HEADERS))]
    lines = ["  ".join(cell.ljust(width) for cell, width in zip(line, widths)).rstrip() for line in table]
    if not state.imported:
        lines.append("TensorFlow is not imported: no tensors yet; the cap is what will apply at initialization.")
    elif not state.initialized:
        lines.append("TensorFlow's runtime is not initialized: no tensors yet; the cap is what will apply then.")
    else:
        lines.append("tensors: TensorFlow's own count; this process: its pool on the card (NVML), tensors or not.")
    return "\n".join(lines)


# ----- what an OOM asked for --------------------------------------------------------------------------
DTYPE_BYTES = {
    "float": 4, "double": 8, "half": 2, "bfloat16": 2, "float8_e4m3fn": 1, "float8_e5m2": 1,
    "int8": 1, "int16": 2, "int32": 4, "int64": 8, "uint8": 1, "uint16": 2, "uint32": 4, "uint64": 8,
    "bool": 1, "complex64": 8, "complex128": 16, "qint8": 1, "quint8": 1, "qint16": 2, "quint16": 2,
    "qint32": 4,
}
"""Bytes per element of TensorFlow's type names as its OOM message writes them (`DataTypeString`)."""

_OOM = re.compile(
    r"OOM when allocating tensor with shape\[(?P<shape>[\d,\s]*)\] and type (?P<dtype>\w+)"
    r"(?: on (?P<device>\S+))?(?: by allocator (?P<allocator>\S+))?"
)


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
    match = _OOM.search(message)
    if match is None:
        return None
    shape = tuple(int(dim) for dim in match["shape"].replace(" ", "").split(",") if dim)
    device = match["device"]
    if device is not None:
        device = device.rstrip(".,;:").rsplit("device:", 1)[-1]
    return OomRequest(shape, match["dtype"], device, match["allocator"])
