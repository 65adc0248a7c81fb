"""JAX in this process, read without importing it: whether it is imported, whether its backends have
started (they read the `XLA_*` variables then: jaxlib's `xla_client.generate_pjrt_gpu_plugin_options`),
which name of the memory-fraction variable the installed jaxlib reads, and its devices' memory figures.

Facts from jax 0.10's source: `jax._src.xla_bridge.backends_are_initialized()` says whether any backend
started (its first op or `jax.devices()`), never starting one; jaxlib raises at backend start where both
`XLA_CLIENT_MEM_FRACTION` and the older `XLA_PYTHON_CLIENT_MEM_FRACTION` are set.
"""

from __future__ import annotations

import functools
import importlib.util
import sys
from pathlib import Path
from typing import Any, Mapping, NamedTuple

from ..envvars import XLA_CLIENT_MEM_FRACTION, XLA_PYTHON_CLIENT_MEM_FRACTION

BRIDGE = "jax._src.xla_bridge"
"""The module that keeps JAX's backends (and says whether they started)."""
CLIENT_SOURCE_BYTES = 1 << 20
"""Most of jaxlib's `xla_client.py` read to learn which variable names it reads (it is ~60 KiB)."""


class JaxState(NamedTuple):
    imported: bool = False
    started: bool = False
    """Its backends started: the `XLA_*` variables were read."""
    version: str | None = None


def state() -> JaxState:
    """JAX as this process has it now (no import, no backend start)."""
    jax = sys.modules.get("jax")
    if jax is None:
        return JaxState()
    bridge = sys.modules.get(BRIDGE)
    started = bool(bridge is not None and getattr(bridge, "backends_are_initialized", lambda: False)())
    return JaxState(True, started, getattr(jax, "__version__", None))


@functools.cache
def installed() -> bool:
    """Whether this Python can import JAX (found, not imported)."""
    return "jax" in sys.modules or importlib.util.find_spec("jax") is not None


@functools.cache
def _client_reads_new_name() -> bool:
    """Whether the installed jaxlib reads `XLA_CLIENT_MEM_FRACTION` (its `xla_client.py` names it); True
    without jaxlib: a JAX installed later is a current one."""
    from .. import safefile
    from ..errors import PolicyError

    spec = importlib.util.find_spec("jaxlib")
    folders = list(spec.submodule_search_locations or []) if spec is not None else []
    for folder in folders:
        try:
            text = safefile.read_text(Path(folder) / "xla_client.py", CLIENT_SOURCE_BYTES)
        except PolicyError:
            continue
        if text is not None:
            return XLA_CLIENT_MEM_FRACTION in text
    return True


def fraction_variable(environ: Mapping[str, str]) -> str:
    """The one memory-fraction variable to set (never both: jaxlib refuses that): the older name where
    the environment already sets it or the installed jaxlib reads only that, else the current one."""
    if XLA_PYTHON_CLIENT_MEM_FRACTION in environ and XLA_CLIENT_MEM_FRACTION not in environ:
        return XLA_PYTHON_CLIENT_MEM_FRACTION
    return XLA_CLIENT_MEM_FRACTION if _client_reads_new_name() else XLA_PYTHON_CLIENT_MEM_FRACTION


class DeviceMemory(NamedTuple):
    """One JAX device's allocator figures (`Device.memory_stats()`), in bytes."""

    device: str
    in_use: int
    peak: int
    limit: int | None


def memory() -> list[DeviceMemory]:
    """Each local GPU device's figures once the backends started; [] before (asking would start them),
    and for devices that keep none (a CPU)."""
    if not state().started:
        return []
    jax: Any = sys.modules["jax"]
    found = []
    for device in jax.local_devices():
        stats = device.memory_stats() if hasattr(device, "memory_stats") else None
        if stats and "bytes_in_use" in stats:
            found.append(DeviceMemory(str(device), int(stats["bytes_in_use"]), int(stats.get("peak_bytes_in_use", 0)),
                                      int(stats["bytes_limit"]) if "bytes_limit" in stats else None))
    return found
