"""What the TensorFlow room tells the rooms above it, without importing them: TensorFlow was imported,
the runtime was initialized (and by which cell). `jupyter.kernelstate` subscribes while it publishes
a kernel's state; `tf.cellhooks` and `tf.initcell` call `changed`."""

from __future__ import annotations

from typing import Callable

Listener = Callable[[], object]
"""Called when TensorFlow was imported or initialized (`tf.initcell.initialized_record` says where)."""

_listeners: list[Listener] = []


def subscribe(listener: Listener) -> None:
    """Call `listener` on every change from now on (once, however often it subscribes)."""
    if listener not in _listeners:
        _listeners.append(listener)


def unsubscribe(listener: Listener) -> None:
    if listener in _listeners:
        _listeners.remove(listener)


def changed() -> None:
    """TensorFlow's state changed: imported, or initialized (and `tf.initcell` knows by which cell)."""
    for listener in list(_listeners):
        listener()
