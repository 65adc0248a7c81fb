"""TensorFlow's state in words: the TensorFlow row of the status and of the panel (`RuntimeState.stage`),
which route created GPU devices where (`tf.runtime.CreatedBy`, `tf.runtime.Place`), and where its runtime
was initialized (`tf.initcell.InitRecord`). The `tf` room returns these records; this module is the one
place that words them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..tf.initcell import InitRecord
    from ..tf.runtime import CreatedBy, Place, RuntimeState

STAGES = {
    "not_imported": "not imported",
    "imported": "imported, runtime not initialized: settings can still change",
    "devices_created": "GPU devices created by {route}: memory settings are fixed until restart",
    "initialized": "initialized{by}: device settings are locked until restart",
}
"""The words of each `tf.runtime.Stage`; `{route}`: which route created the devices, `{by}`: the
initializing cell where it is known (`init_text`)."""
CUDA_FIRST = "{stage}, but CUDA already started ({why}): CUDA_* changes no longer take effect"
"""A stage before devices were created, where CUDA started first (`RuntimeState.cuda_started_first`)."""
CUDA_SIGNS = {"libcuda": "libcuda is loaded in this process", "nvml": "NVML lists this process on a GPU"}
"""The words of each `tf.runtime.CudaSign`: what shows that CUDA started."""
OUTSIDE = "outside a cell (a startup file, an extension, a silent request such as a variable inspector's, or another thread)"


def place_text(place: Place) -> str:
    """Where a call ran, worded to follow what ran: `in In [3]`, `in IPython`, `outside IPython`."""
    return in_ipython(place.cell) if place.ipython else "outside IPython"


def in_ipython(cell: int | None) -> str:
    """In IPython, in input cell In [`cell`] where known: `in In [3]`, `in IPython`."""
    return f"in In [{cell}]" if cell is not None else "in IPython"


def route_text(created: CreatedBy | None) -> str | None:
    """The route that created GPU devices and where: "`device_lib.list_local_devices()` in In [3]"."""
    return None if created is None else f"`{created.route}` {place_text(created.place)}"


def init_text(record: InitRecord) -> str:
    """Where the runtime was initialized, worded to follow "initialized ": `by In [7]: `model.fit(x, ...``."""
    if record.where == "cell":
        return f"by In [{record.execution_count}]: `{record.line}`"
    if record.where == "outside_cell":
        return f"{OUTSIDE}, before In [{record.execution_count}]" if record.execution_count else OUTSIDE
    return f"before tfgpu_magic could watch ({in_ipython(record.execution_count)})"


def state_text(state: RuntimeState, record: InitRecord | None = None) -> str:
    """TensorFlow's state in one phrase, naming the initializing cell where `record` knows it:
    "initialized by In [7]: `...`: device settings are locked until restart"."""
    by = f" {init_text(record)}" if record is not None else ""
    text = STAGES[state.stage].format(route=route_text(state.devices_created), by=by)
    if state.stage in ("not_imported", "imported") and state.cuda_started_first:
        return CUDA_FIRST.format(stage=text, why=CUDA_SIGNS[state.cuda_elsewhere])
    return text
