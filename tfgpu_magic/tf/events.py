"""What the TensorFlow room tells the rooms above it, without importing them: TensorFlow was imported,
the runtime was initialized (and by which cell). `jupyter.kernelstate` subscribes while it publishes
a kernel's state; `tf.cellhooks` and `tf.initcell` call `changed`."""

from __future__ import annotations

from typing import Callable

Listener = Callable[[str | None], object]
"""Called with the initializing cell's description, or None when only the import happened."""

_listeners: list[Listener] = []


def subscribe(listener: Listener) -> None:
    """Call `listener` on every change from now on (once, however often it subscribes)."""
    if listener not in _listeners:
        _listeners.append(listener)


def unsubscribe(listener: Listener) -> None:
    if listener in _listeners:
        _listeners.remove(listener)


def changed(initialized_by: str | None = None) -> None:
    """TensorFlow's state changed: imported (`initialized_by` None) or initialized by that cell."""
    for listener in list(_listeners):
        listener(initialized_by)
