"""GPU memory figures as text: `%tfgpu memory`'s table and the panel's one-phrase summary of a GPU
(the figures themselves come from `tf.memory.memory_rows`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..language.policy import short_uuid
from ..language.sizes import bytes_text, gib_pair, mib_text
from ..gpus.inventory import Inventory
from ..tf.cellmemory import recorder
from ..tf.memory import GpuMemory, MemoryAPI, memory_rows
from ..tf.runtime import RuntimeState
from .percell import card_cells
from .results import MemoryResult

if TYPE_CHECKING:
    from ..controller import Controller
    from ..frameworks import FrameworkMemory

NO_GPU_HINT = "`%tfgpu doctor` says why"


def no_gpu_line(controller: Controller, inventory: Inventory | None = None) -> str:
    """The one line without GPUs in this process: what NVML sees (none, or cards this process does not
    get) and what TensorFlow lists."""
    inventory = inventory or controller.inventory()
    state = controller.state()
    count = len(inventory.gpus)
    nvml = inventory.error or (f"NVML sees {count} GPU{'' if count == 1 else 's'}" if count else "NVML sees none")
    if state.devices_listed:
        return f"No GPU in this process: TensorFlow lists none, and {nvml}. {NO_GPU_HINT}."
    if count:
        return f"No GPU in this process: {nvml}, and CUDA_VISIBLE_DEVICES leaves it none. {NO_GPU_HINT}."
    return f"No GPU found: {nvml}. {NO_GPU_HINT}."


def summary(row: GpuMemory) -> str:
    """One GPU's figures in a phrase, for the panel's GPU row: `tensors 1.6 GiB (peak 2.1 GiB) · cap
    4.0 GiB (limit on GPU 0, 5% of the card)`; the cap alone before initialization."""
    cap = f"cap {row.cap_text}" if row.cap_in_force else f"cap at initialization {row.cap_text}"
    if row.tensors_bytes is None:
        return cap
    return f"tensors {bytes_text(row.tensors_bytes)} (peak {bytes_text(row.peak_bytes)}) · {cap}"


HEADERS = ("GPU", "TF", "tensors now / peak", "this process", "others", "free / total", "cap")


def memory_text(controller: Controller, api: MemoryAPI | None = None, inventory: Inventory | None = None) -> str:
    """`%tfgpu memory`: one compact row per visible GPU, or the one line without GPUs; then JAX's and
    PyTorch's own figures where they started."""
    inventory = inventory or controller.inventory()
    return _figures_text(controller, memory_rows(controller, api, inventory), inventory)


def _figures_text(controller: Controller, rows: list[GpuMemory], inventory: Inventory) -> str:
    text = render(rows, controller.state()) if rows else no_gpu_line(controller, inventory)
    return "\n".join([text, *framework_lines(controller.framework_memory())])


def memory_result(controller: Controller, shell: Any = None, api: MemoryAPI | None = None,
                  inventory: Inventory | None = None) -> MemoryResult:
    """`%tfgpu memory` whole: `memory_text`'s figures, then what `shell`'s cell hooks recorded of each
    cell (`tf.cellmemory`) on each of the rows' cards."""
    inventory = inventory or controller.inventory()
    rows = memory_rows(controller, api, inventory)
    found = recorder(shell)
    cards = card_cells(rows, list(found.cells)) if found is not None else []
    return MemoryResult(_figures_text(controller, rows, inventory), cards)


FRAMEWORK_FIGURES = {"jax": ("JAX", "in use", "peak", "pool limit"), "torch": ("PyTorch", "allocated", None, "reserved")}
"""How each framework's own figures are called (`Controller.framework_memory`)."""


def framework_lines(figures: dict[str, list[FrameworkMemory]]) -> list[str]:
    """A line per device of each framework that keeps its own figures: `JAX gpu:0 (GPU-b1c2d3e4…): in use
    1.2 GiB, peak 2.0 GiB, pool limit 60.0 GiB`."""
    lines = []
    for name, rows in figures.items():
        label, current, peak, reserved = FRAMEWORK_FIGURES[name]
        for device, card, now, top, pool in rows:  # a FrameworkMemory, or the tuple of its fields
            parts = [f"{current} {bytes_text(now)}"]
            parts += [f"{peak} {bytes_text(top)}"] if peak and top is not None else []
            parts += [f"{reserved} {bytes_text(pool)}"] if pool is not None else []
            where = f" ({short_uuid(card)})" if card else ""
            lines.append(f"{label} {device}{where}: {', '.join(parts)}")
    return lines


def render(rows: list[GpuMemory], state: RuntimeState) -> str:
    """The table of `memory_rows`'s rows, columns aligned, and a line on what the figures mean."""
    table = [HEADERS]
    for row in rows:
        tensors = ("—" if not row.initialized else
                   f"{bytes_text(row.tensors_bytes)} / {bytes_text(row.peak_bytes)}"
                   if row.tensors_bytes is not None else "no statistics")
        table.append((
            row.gpu if row.gpu is not None else "?",
            row.tf_device,
            tensors,
            mib_text(row.process_mib) if row.gpu is not None else "?",
            mib_text(row.others_mib) if row.gpu is not None else "?",
            gib_pair(row.free_mib, row.total_mib),
            row.cap_text,
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
