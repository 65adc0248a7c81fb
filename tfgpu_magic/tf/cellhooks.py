"""What starts when TensorFlow is imported in an IPython shell: the watch for the initializing cell,
the OOM explanation and the record of each cell's memory (`cellmemory`). Nothing of it exists before
the import, so cells before it pay nothing.

Called by the controller's import-hook callback, and by `Controller.apply` when it finds TensorFlow
imported already (both idempotent); outside IPython it does nothing. The OOM hook speaks in the words
the views gave `oom.settings` (`views.hookup`), since this room renders nothing.
"""

from __future__ import annotations

from functools import partial
from typing import Any

from . import cellmemory, events, initcell, oom
from .memory import MemorySource
from .runtime import current_shell


def on_tensorflow_import(controller: MemorySource, shell: Any = None) -> None:
    shell = shell if shell is not None else current_shell()
    if shell is None or not hasattr(shell, "events"):
        return
    initcell.watch_initialization(shell)
    cellmemory.record_cells(shell)
    oom.install(shell, controller, peak_from_cell=partial(cellmemory.peaks_per_cell, shell))
    events.changed()  # TensorFlow imported: a published state says so
