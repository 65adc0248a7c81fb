"""Keras 3's backend, read without importing Keras: `KERAS_BACKEND`, else the `backend` of its
`keras.json` (in `KERAS_HOME`, default `~/.keras`), else TensorFlow; once Keras is imported, what it
says (`keras.backend.backend()`). Keras reads both at `import keras` (keras/src/backend/config.py)."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Mapping, NamedTuple

KERAS_BACKEND = "KERAS_BACKEND"
DEFAULT_BACKEND = "tensorflow"
CONFIG_BYTES = 64 << 10
"""Most of `keras.json` read (a real one is a few lines)."""


class KerasState(NamedTuple):
    imported: bool
    backend: str
    source: str
    """Where the backend comes from: `keras` (imported), `KERAS_BACKEND`, `keras.json` or `default`."""


def imported() -> bool:
    """Whether Keras is imported (no file read: cheap enough for after every cell)."""
    return "keras" in sys.modules


def state(environ: Mapping[str, str] | None = None) -> KerasState:
    """Keras's backend now; `environ` is the process environment (tests pass their own)."""
    environ = os.environ if environ is None else environ
    keras = sys.modules.get("keras")
    backend_module = getattr(keras, "backend", None)
    if backend_module is not None and callable(getattr(backend_module, "backend", None)):
        return KerasState(True, str(backend_module.backend()), "keras")
    if environ.get(KERAS_BACKEND):
        return KerasState(keras is not None, environ[KERAS_BACKEND], KERAS_BACKEND)
    configured = _configured(environ)
    if configured:
        return KerasState(keras is not None, configured, "keras.json")
    return KerasState(keras is not None, DEFAULT_BACKEND, "default")


def _configured(environ: Mapping[str, str]) -> str | None:
    """The `backend` of `keras.json`, read as hostile (a regular file, capped); None where there is none."""
    from .. import safefile
    from ..errors import PolicyError

    home = Path(environ.get("KERAS_HOME") or Path(environ.get("HOME") or Path.home()) / ".keras")
    try:
        data = safefile.read_json(home / "keras.json", CONFIG_BYTES)
    except PolicyError:
        return None
    backend = data.get("backend") if isinstance(data, dict) else None
    return backend if isinstance(backend, str) and backend.isidentifier() else None
