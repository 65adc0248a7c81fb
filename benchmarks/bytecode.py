"""Bytecode for the processes a benchmark starts, as a user's install has it.

pip compiles a package's .pyc files when it installs a wheel; an editable install has none, and an
environment that sets PYTHONDONTWRITEBYTECODE (this project's test machines do) never writes them,
so every fresh interpreter would compile tfgpu_magic from source while IPython, Jupyter and TensorFlow
load their installed .pyc files: a cold package against warm ones. With the cache on, fresh
interpreters keep bytecode in a private folder (PYTHONPYCACHEPREFIX) that the first of them fills.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

CACHE = Path(tempfile.gettempdir()) / "tfgpu_magic-bench-pycache"


def with_bytecode_cache(env: dict[str, str], on: bool = True) -> dict[str, str]:
    """`env` for a fresh interpreter, caching bytecode in `CACHE` when `on` (else unchanged)."""
    if not on:
        return env
    env = {name: value for name, value in env.items() if name != "PYTHONDONTWRITEBYTECODE"}
    env["PYTHONPYCACHEPREFIX"] = str(CACHE)
    return env


def caches_bytecode(env: dict[str, str] | None = None) -> bool:
    """Whether `env` (default: this process's) is one `with_bytecode_cache` turned on."""
    return (os.environ if env is None else env).get("PYTHONPYCACHEPREFIX") == str(CACHE)
