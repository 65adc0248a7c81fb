"""Run a callback right after `import tensorflow` finishes, before the importing code goes on.

A `sys.meta_path` finder for the top-level name `tensorflow` wraps the real loader's `exec_module`.
This works with the import and the first op in one cell, and when TensorFlow is pulled in by
`import keras` or a submodule import. The hook removes itself once used, puts the loader back,
and never breaks the import: a failing callback becomes a warning.
"""

from __future__ import annotations

import sys
import warnings
from types import ModuleType
from typing import Any, Callable

TARGET = "tensorflow"
MARKER = "_tfgpu_magic_import_hook"
"""Class attribute that identifies the hook. Not `isinstance`: `importlib.reload` of this module
makes a new class, and a hook of the old class must still be found (else two hooks wrap one loader
and each finds the other: `RecursionError`)."""


class TensorFlowImportHook:
    """`sys.meta_path` finder that arms `callback` on the loader of the real `tensorflow` package.

    Each spec it finds gets a wrapped loader, but the hook only removes itself when a loader really
    runs, so asking whether TensorFlow exists (`importlib.util.find_spec`) leaves it armed. A plain
    class with `find_spec` (no `importlib.abc` base, whose import costs `%load_ext` time)."""

    _tfgpu_magic_import_hook = True

    def __init__(self, callback: Callable[[], None]) -> None:
        self.callback = callback

    def find_spec(self, fullname: str, path: object = None, target: ModuleType | None = None):  # noqa: ANN201
        if fullname != TARGET:
            return None
        spec = None
        for finder in list(sys.meta_path):
            find = getattr(finder, "find_spec", None)
            if find is not None and not is_hook(finder):
                spec = find(fullname, path, target)
                if spec is not None:
                    break
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        self._wrap(spec.loader)
        return spec

    def _wrap(self, loader: Any) -> None:
        original = loader.exec_module
        had_own = "exec_module" in vars(loader)

        def exec_module(module: ModuleType) -> None:
            disarm()  # only now: a mere `importlib.util.find_spec("tensorflow")` keeps the hook armed
            try:
                original(module)
            except BaseException:
                _restore(loader, original, had_own)
                arm(self.callback)  # the import failed: try again at the next import
                raise
            _restore(loader, original, had_own)
            try:
                self.callback()
            except Exception as err:  # a policy failure must never break the user's import
                warnings.warn(f"tfgpu_magic: could not apply the GPU policy on import: {err}", stacklevel=2)

        loader.exec_module = exec_module  # type: ignore[method-assign]


def _restore(loader: Any, original: Callable, had_own: bool) -> None:
    if had_own:
        loader.exec_module = original  # type: ignore[method-assign]
    else:
        vars(loader).pop("exec_module", None)


def arm(callback: Callable[[], None]) -> None:
    """Install the hook (replacing an earlier one); no-op for the import if TF is already there."""
    disarm()
    sys.meta_path.insert(0, TensorFlowImportHook(callback))


def disarm() -> None:
    """Remove the hook if installed (one from before a reload of this module too)."""
    sys.meta_path[:] = [f for f in sys.meta_path if not is_hook(f)]


def is_armed() -> bool:
    return any(is_hook(f) for f in sys.meta_path)


def is_hook(finder: object) -> bool:
    """True for a hook of this module, whichever copy of the class made it."""
    return getattr(type(finder), MARKER, False) is True
