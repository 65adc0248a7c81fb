"""Run a callback right after `import tensorflow` finishes, before the importing code goes on.

A `sys.meta_path` finder for the top-level name `tensorflow` wraps the real loader's `exec_module`.
This works with the import and the first op in one cell, and when TensorFlow is pulled in by
`import keras` or a submodule import. The hook removes itself once used, puts the loader back,
and never breaks the import: a failing callback becomes a warning.

With a quiet level (`quiet("error")`) the import's own stderr lines below that level are dropped:
TensorFlow's C++ libraries print some (the absl preamble, the oneDNN notice) before
`TF_CPP_MIN_LOG_LEVEL` applies. File descriptor 2 goes to a temporary file while
`tensorflow/__init__` runs; every captured line at or above the level, and every line that is not
a log line, is written back afterwards (all of them if the import fails).
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import warnings
from types import ModuleType
from typing import Any, Callable, Iterator

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
                with filtered_stderr(_quiet_level):
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


# ----- the quiet import ------------------------------------------------------------------------------
SEVERITIES = ("debug", "info", "warning", "error", "fatal")
"""Lowest first; the policy's `loglevel` names the lowest one still shown."""

_GLOG = r"([IWEF])\d{4} [\d:.]+ +\d+ [^\]\s]+\] "
"""A C++ (glog/absl) or absl-Python log line: severity letter, date, time, thread, file:line]."""
_PY_LOG = r"(DEBUG|INFO|WARNING|ERROR|CRITICAL):(tensorflow|absl)\b"
"""A line of Python `logging`'s basic format from TensorFlow's or absl's logger."""
PREAMBLE = "WARNING: All log messages before absl::InitializeLog() is called are written to STDERR"
"""absl's notice before its logging is set up: says where the lines go, not that anything is wrong."""

_LETTERS = {"I": "info", "W": "warning", "E": "error", "F": "fatal"}
_PY_NAMES = {"DEBUG": "debug", "INFO": "info", "WARNING": "warning", "ERROR": "error", "CRITICAL": "fatal"}

_quiet_level: str | None = None


def quiet(level: str | None) -> None:
    """Drop the import's stderr log lines below `level` ("warning" or "error"; others: keep all)."""
    global _quiet_level
    _quiet_level = level if level in ("warning", "error") else None


def severity(line: str) -> str | None:
    """The severity of a log line, None for a line that is not recognisably one."""
    if line.strip() == PREAMBLE:
        return "info"
    glog = re.match(_GLOG, line)  # patterns kept as text: compiled (and cached by `re`) only when used
    if glog:
        return _LETTERS[glog.group(1)]
    python = re.match(_PY_LOG, line)
    return _PY_NAMES[python.group(1)] if python else None


def keep_lines(data: bytes, level: str) -> bytes:
    """The lines of `data` still shown at `level`: those at or above it and every unrecognised line
    (the user's, Python's, a multi-line message's continuation)."""
    floor = SEVERITIES.index(level)
    kept = []
    for line in data.splitlines(keepends=True):
        found = severity(line.decode("utf-8", errors="replace"))
        if found is None or SEVERITIES.index(found) >= floor:
            kept.append(line)
    return b"".join(kept)


@contextlib.contextmanager
def filtered_stderr(level: str | None) -> Iterator[None]:
    """File descriptor 2 into a temporary file for the block, then the lines `keep_lines` keeps
    written back (every line if the block raises). No-op for `level` None or without an fd 2."""
    if level is None:
        yield
        return
    import tempfile  # only here: its imports would cost every `%load_ext`

    try:
        capture = tempfile.TemporaryFile()
    except OSError:
        yield
        return
    try:
        saved = os.dup(2)
    except OSError:  # no fd 2 to redirect
        capture.close()
        yield
        return
    _flush_stderr()
    os.dup2(capture.fileno(), 2)
    failed = True
    try:
        yield
        failed = False
    finally:
        _flush_stderr()
        os.dup2(saved, 2)
        os.close(saved)
        with capture:
            capture.seek(0)
            data = capture.read()
        out = data if failed else keep_lines(data, level)
        if out:
            with contextlib.suppress(OSError):
                _write_all(2, out)


def _flush_stderr() -> None:
    """Python's buffered stderr text goes where fd 2 points now, not after the switch."""
    stream = sys.stderr
    if stream is not None:
        with contextlib.suppress(Exception):  # any object can be sys.stderr
            stream.flush()


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]
