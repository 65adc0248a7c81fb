"""Run a callback right after a framework's top-level package finishes importing, before the importing
code goes on: `import tensorflow`, `import torch` (`import keras` or a submodule import included).

A `sys.meta_path` finder for one top-level name wraps the real loader's `exec_module`; it works with the
import and the first op in one cell. The hook removes itself once used, puts the loader back, and never
breaks the import: a failing callback becomes a warning; a failing import re-arms it. `around` (a
context manager factory) wraps the import itself (TensorFlow's quiet import: `tf.quietimport`). Imports
nothing: `%load_ext` arms hooks cheaply.
"""

from __future__ import annotations

import contextlib
import sys
import warnings
from types import ModuleType
from typing import Any, Callable, ContextManager, Iterator

MARKER = "_tfgpu_magic_import_hook"
"""Class attribute that identifies a hook. Not `isinstance`: `importlib.reload` of this module makes a
new class, and a hook of the old class must still be found (else two hooks wrap one loader and each
finds the other: `RecursionError`)."""

Around = Callable[[], ContextManager[Any]]


class ImportHook:
    """`sys.meta_path` finder that arms `callback` on the loader of the real package `target`.

    Each spec it finds gets a wrapped loader, but the hook only removes itself when a loader really
    runs, so asking whether the package exists (`importlib.util.find_spec`) leaves it armed. A plain
    class with `find_spec` (no `importlib.abc` base, whose import costs `%load_ext` time)."""

    _tfgpu_magic_import_hook = True

    def __init__(self, target: str, callback: Callable[[], None], around: Around = contextlib.nullcontext) -> None:
        self.target = target
        self.callback = callback
        self.around = around

    def find_spec(self, fullname: str, path: object = None, target: ModuleType | None = None):  # noqa: ANN201
        if fullname != self.target:
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
            disarm(self.target)  # only now: a mere `importlib.util.find_spec` keeps the hook armed
            try:
                with self.around(), _running(self.target):
                    original(module)
            except BaseException:
                _restore(loader, original, had_own)
                arm(self.target, self.callback, self.around)  # the import failed: try again at the next import
                raise
            _restore(loader, original, had_own)
            try:
                self.callback()
            except Exception as err:  # a policy failure must never break the user's import
                warnings.warn(f"tfgpu_magic: could not apply the GPU policy on `import {self.target}`: {err}",
                              stacklevel=2)

        loader.exec_module = exec_module  # type: ignore[method-assign]


_bodies: set[str] = set()
"""Packages whose `__init__` runs now under a hook: half made, in `sys.modules` already (TensorFlow's
imports JAX, whose hook then must not take TensorFlow for imported)."""


@contextlib.contextmanager
def _running(target: str) -> Iterator[None]:
    _bodies.add(target)
    try:
        yield
    finally:
        _bodies.discard(target)


def importing(target: str) -> bool:
    """Whether `target`'s package body is running now under a hook (its import is not finished)."""
    return target in _bodies


def _restore(loader: Any, original: Callable, had_own: bool) -> None:
    if had_own:
        loader.exec_module = original  # type: ignore[method-assign]
    else:
        vars(loader).pop("exec_module", None)


def arm(target: str, callback: Callable[[], None], around: Around = contextlib.nullcontext) -> None:
    """Install the hook for `target` (replacing an earlier one); no-op for the import if it is imported."""
    disarm(target)
    sys.meta_path.insert(0, ImportHook(target, callback, around))


def disarm(target: str) -> None:
    """Remove the hook for `target` if installed (one from before a reload of this module too)."""
    sys.meta_path[:] = [f for f in sys.meta_path if not (is_hook(f) and getattr(f, "target", None) == target)]


def is_armed(target: str) -> bool:
    return any(is_hook(f) and getattr(f, "target", None) == target for f in sys.meta_path)


def is_hook(finder: object) -> bool:
    """True for a hook of this module, whichever copy of the class made it."""
    return getattr(type(finder), MARKER, False) is True
