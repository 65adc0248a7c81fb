"""The seam: the handful of `tf.config` calls we make, as `ConfigAPI`, and `TensorFlowConfig` over the
real TensorFlow (imported on first use). Tests without a GPU substitute a fake of it that enforces
TensorFlow's real rules (tests/fake_tf.py), checked against real TensorFlow on CPU.
"""

from __future__ import annotations

import logging
import os
import sys
from typing import Any, Callable, NamedTuple, Protocol, Sequence

from ..errors import PolicyError
from .runtime import NO_TENSORFLOW, Logical, RuntimeState, logical_entries, record_devices_created, runtime_state

class ConfigAPI(Protocol):
    """The seam: the `tf.config` calls the runtime needs, with TensorFlow's rules."""

    def state(self) -> RuntimeState: ...
    def devices(self, kind: str) -> list[Any]: ...
    def name(self, device: Any) -> str: ...
    def get_growth(self, device: Any) -> bool | None: ...
    def set_growth(self, device: Any, enable: bool) -> None: ...
    def get_logical(self, device: Any) -> Logical | None: ...
    def set_logical(self, device: Any, limits: Sequence[int | None]) -> None: ...
    def get_visible(self, kind: str) -> list[Any]: ...
    def set_visible(self, devices: list[Any], kind: str) -> None: ...
    def details(self, device: Any) -> dict[str, Any]: ...
    def getenv(self, name: str) -> str | None:
        """The variable as TensorFlow's C++ side reads it (the process environment)."""
    def errors(self) -> tuple[type[BaseException], ...]:
        """TensorFlow's C++-side error types (`tf.errors.OpError`)."""
    def new_session_config(self) -> Any:
        """An empty `ConfigProto`."""
    def device_routes(self) -> list[Route]:
        """The module attributes that create devices outside the eager context."""
    def record_devices_created(self, route: str) -> None:
        """Remember (once, process-wide) that `route` created GPU devices; `state()` reports it."""
    def set_loglevel(self, level: str | None) -> list[str]:
        """Set TensorFlow's Python loggers to `level` (None: back to how they were); what changed."""


class Route(NamedTuple):
    """A TensorFlow callable that creates devices (and so the process's GPU allocators) itself.

    `position`/`keyword`: where its config argument is; `fill_default`: a missing config gets the
    policy's (device_lib); else None stays None (a Session then uses the eager context's config,
    which carries the policy). `gpus_created(result, args)` says whether GPU devices came of it."""

    owner: Any
    attribute: str
    label: str
    position: int
    keyword: str
    fill_default: bool
    gpus_created: Callable[[Any, tuple], bool]


class TensorFlowConfig:
    """`ConfigAPI` over the real `tf.config`. Imports TensorFlow on first use, not before."""

    @property
    def tf(self) -> Any:
        """The `tensorflow` module; a missing TensorFlow is one `PolicyError` line saying how to install it."""
        try:
            import tensorflow
        except ModuleNotFoundError as err:
            if err.name != "tensorflow":
                raise
            raise PolicyError(NO_TENSORFLOW.format(python=sys.executable)) from None
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

    def get_logical(self, device: Any) -> Logical | None:
        return logical_entries(self.tf.config.get_logical_device_configuration(device))

    def set_logical(self, device: Any, limits: Sequence[int | None]) -> None:
        make = self.tf.config.LogicalDeviceConfiguration
        self.tf.config.set_logical_device_configuration(device, [make(memory_limit=mib) for mib in limits])

    def get_visible(self, kind: str) -> list[Any]:
        return self.tf.config.get_visible_devices(kind)

    def set_visible(self, devices: list[Any], kind: str) -> None:
        self.tf.config.set_visible_devices(devices, kind)

    def details(self, device: Any) -> dict[str, Any]:
        return self.tf.config.experimental.get_device_details(device)

    def getenv(self, name: str) -> str | None:
        return os.environ.get(name)

    def errors(self) -> tuple[type[BaseException], ...]:
        return (self.tf.errors.OpError,)

    def new_session_config(self) -> Any:
        return self.tf.compat.v1.ConfigProto()

    def record_devices_created(self, route: str) -> None:
        record_devices_created(route)

    def set_loglevel(self, level: str | None) -> list[str]:
        return set_python_loglevel(level)

    def device_routes(self) -> list[Route]:
        try:
            from tensorflow.python.client import device_lib, session
        except ImportError:  # a TensorFlow without these private modules: nothing to wrap
            return []

        def listed_gpu(result: Any, args: tuple) -> bool:
            return any(getattr(d, "device_type", "") == "GPU" for d in result or ())

        def session_gpu(result: Any, args: tuple) -> bool:
            return any(d.device_type == "GPU" for d in args[0].list_devices())

        return [
            Route(device_lib, "list_local_devices", "device_lib.list_local_devices()", 0, "session_config", True,
                  listed_gpu),
            Route(session.BaseSession, "__init__", "tf.compat.v1.Session()", 3, "config", False, session_gpu),
        ]


PYTHON_LOGGERS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING, "error": logging.ERROR}
"""The `logging` level of each `loglevel` (absl's Python verbosity follows the same names)."""

_python_defaults: dict[str, Any] = {}
"""The loggers' levels before this tool first set them, restored by `loglevel off`."""


def set_python_loglevel(level: str | None) -> list[str]:
    """Set the `tensorflow` logger (and absl's, when absl is loaded) to `level`; None restores the
    levels they had before. Unlike the C++ level these stay settable for the whole process.
    Returns one line per logger that changed."""
    loggers: dict[str, tuple[Callable[[], Any], Callable[[Any], None]]] = {}
    tf_logger = logging.getLogger("tensorflow")
    loggers["tensorflow"] = (lambda: tf_logger.level, tf_logger.setLevel)
    absl = sys.modules.get("absl.logging")
    if absl is not None and hasattr(absl, "get_verbosity") and hasattr(absl, "set_verbosity"):
        loggers["absl"] = (absl.get_verbosity, absl.set_verbosity)
    changed = []
    for name, (get, put) in loggers.items():
        if level is None and name not in _python_defaults:
            continue
        _python_defaults.setdefault(name, get())
        if level is None:
            wanted = _python_defaults.pop(name)
        else:
            wanted = PYTHON_LOGGERS[level] if name == "tensorflow" else _absl_verbosity(absl, level)
        if get() != wanted:
            put(wanted)
            shown = f"{level} and above" if level is not None else "back to its own level"
            changed.append(f"Python logger {name}: {shown}")
    return changed


def _absl_verbosity(absl: Any, level: str) -> Any:
    """absl's verbosity for `level` (its own constants: DEBUG 1 … ERROR -2)."""
    return getattr(absl, level.upper())
