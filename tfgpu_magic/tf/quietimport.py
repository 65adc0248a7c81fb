"""TensorFlow's quiet import: its import with the stderr lines below the policy's log level dropped, and
the callback run right after it finishes, before the importing code goes on (`importhooks`, which serves
every framework: this works with the import and the first op in one cell, and when TensorFlow is pulled
in by `import keras` or a submodule import).

With a quiet level (`quiet("error")`) the import's own stderr lines below that level are dropped:
TensorFlow's C++ libraries print some (the absl preamble, the oneDNN notice) before
`TF_CPP_MIN_LOG_LEVEL` applies. While `tensorflow/__init__` runs, file descriptor 2 is a pipe read
by a small forwarder process, which writes each line at or above the level, and every line that is
not a log line, to the real stderr as it arrives. A separate process, not a thread: whatever way the
import ends (an exception, `os.abort()`, a segfault's faulthandler report, a kill after a hang),
what was written is still in the pipe and the forwarder passes it on; and a child process started
during the import, whose fd 2 is that pipe, still reaches the real stderr after the import (the
forwarder passes everything unfiltered from then on, until the last writer closes the pipe).
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
from typing import Any, Callable, Iterator

TARGET = "tensorflow"


@contextlib.contextmanager
def _quiet_import() -> Iterator[None]:
    """TensorFlow's import with its stderr lines below the quiet level dropped (`quiet`)."""
    with filtered_stderr(_quiet_level):
        yield
        if _quiet_level is not None:
            silence_absl_preamble(_quiet_level)


def arm(callback: Callable[[], None]) -> None:
    """Run `callback` right after `import tensorflow` (`importhooks`), quietly as `quiet` says; no-op for
    the import if TensorFlow is imported already. (`importhooks` is imported in each function: the
    forwarder process loads this file by path, outside the package.)"""
    from .. import importhooks

    importhooks.arm(TARGET, callback, _quiet_import)


def disarm() -> None:
    from .. import importhooks

    importhooks.disarm(TARGET)


def is_armed() -> bool:
    from .. import importhooks

    return importhooks.is_armed(TARGET)


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


ABSL_LIBRARY = "libtensorflow_framework"
"""The library whose copy of absl logs TensorFlow's C++ messages (tsl's logging is absl's)."""
_SEVERITY_NUMBERS = {"info": 0, "warning": 1, "error": 2, "fatal": 3}
"""absl's `LogSeverityAtLeast` values, which are also `TF_CPP_MIN_LOG_LEVEL`'s."""


def silence_absl_preamble(level: str) -> bool:
    """Keep absl's "All log messages before absl::InitializeLog() is called…" line from appearing
    after the import; whether it was done.

    absl's stderr sink prints that line once, at the first message it is given while absl's logging
    is not initialized (TensorFlow never calls `absl::InitializeLog()`). With `TF_CPP_MIN_LOG_LEVEL`
    at 1 or 2, a CPU on which the import logs nothing at that level (no oneDNN notice: no AVX-512)
    leaves the line for the first warning or error after the import. Marking absl initialized (the
    half of `InitializeLog` that is not the time zone) means no preamble; from then on absl writes to
    stderr what reaches its stderr threshold, which TensorFlow sets to info — done only when that
    threshold is not above `level`, so no line at or above it is lost. Needs the library's exported
    absl symbols (read from its ELF dynamic symbol table); anything unexpected: nothing is done."""
    try:
        path = _mapped_library(ABSL_LIBRARY)
        names = _dynamic_names(path) if path is not None else b""
        found = re.search(rb"_ZN4absl(\d+lts_\d+)?12log_internal14SetInitializedEv", names)
        if path is None or found is None:
            return False
        threshold_name = b"_ZN4absl" + (found.group(1) or b"") + b"15StderrThresholdEv"
        if threshold_name not in names:
            return False
        import ctypes

        library = ctypes.CDLL(path, mode=os.RTLD_NOLOAD)
        threshold = getattr(library, threshold_name.decode())
        threshold.restype = ctypes.c_int
        if threshold() > _SEVERITY_NUMBERS[level]:
            return False
        getattr(library, found.group().decode())()
        return True
    except (OSError, ValueError, AttributeError, KeyError):
        return False


def _mapped_library(prefix: str) -> str | None:
    """The path of the loaded shared library whose file name starts with `prefix` (from /proc/self/maps)."""
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as maps:
            for line in maps:
                path = line.rstrip("\n").partition("/")[2]
                if path and os.path.basename(path).startswith(prefix):
                    return "/" + path
    except OSError:
        pass
    return None


def _dynamic_names(path: str) -> bytes:
    """The string table of a 64-bit little-endian ELF file's dynamic symbols (b"" for anything else)."""
    import struct

    with open(path, "rb") as elf:
        header = elf.read(64)
        if len(header) < 64 or header[:6] != b"\x7fELF\x02\x01":
            return b""
        (table,) = struct.unpack_from("<Q", header, 0x28)
        entry, count = struct.unpack_from("<HH", header, 0x3A)
        elf.seek(table)
        raw = elf.read(entry * count)
        sections = [struct.unpack_from("<IIQQQQII", raw, at) for at in range(0, len(raw) - 55, entry)]
        for section in sections:
            if section[1] == 11 and section[6] < len(sections):  # SHT_DYNSYM; its sh_link names the string table
                strings = sections[section[6]]
                elf.seek(strings[4])
                return elf.read(strings[5])
    return b""


FORWARD_WAIT = 5.0
"""Seconds the import waits for the forwarder to start, and at its end for the forwarder to have
passed on what the import wrote (so that later output comes after it)."""
_READY, _DONE = b"r", b"d"
_LINE_BYTES = 64 << 10
"""A line longer than this goes out in pieces (each piece classified alone) rather than waiting."""
_FORWARDER = (
    "import importlib.util, sys\n"
    "spec = importlib.util.spec_from_file_location('_tfgpu_magic_forwarder', sys.argv[1])\n"
    "module = importlib.util.module_from_spec(spec)\n"
    "spec.loader.exec_module(module)\n"
    "module.forward(sys.argv[2], bytes.fromhex(sys.argv[3]), int(sys.argv[4]))\n"
)
"""The forwarder's program: this very file, loaded by path (no site-packages needed), runs `forward`."""


@contextlib.contextmanager
def filtered_stderr(level: str | None) -> Iterator[None]:
    """File descriptor 2 into the forwarder for the block (module docstring): lines below `level`
    are dropped as they are written. fd 2 is always restored, even when the block or the restore's
    own flush is interrupted. No-op for `level` None, without an fd 2, or where the forwarder cannot
    start (then every line shows)."""
    forwarder = _Forwarder.start(level) if level is not None else None
    if forwarder is None:
        yield
        return
    try:
        _flush_stderr()
        os.dup2(forwarder.pipe, 2)
    except BaseException:
        forwarder.close()
        raise
    try:
        yield
    finally:
        try:
            _flush_stderr()
        finally:
            try:
                with contextlib.suppress(OSError):  # the forwarder is gone: nothing left to mark
                    _write_all(2, forwarder.marker)
            finally:
                os.dup2(forwarder.saved, 2)  # first in the innermost `finally`: nothing can skip it
                forwarder.finish()


class _Forwarder:
    """The forwarder process seen from the importing one: its pipe, the saved real fd 2, the marker
    that ends the filtered part, and the pipe on which it says it is ready and done."""

    def __init__(self, process: Any, pipe: int, saved: int, marker: bytes, ack: int) -> None:
        self.process, self.pipe, self.saved, self.marker, self.ack = process, pipe, saved, marker, ack

    @classmethod
    def start(cls, level: str) -> _Forwarder | None:
        """A running forwarder that said it is ready; None where one cannot start (no fd 2, no
        `sys.executable`, no POSIX pipes)."""
        if os.name != "posix" or not sys.executable:
            return None
        import secrets
        import subprocess

        try:
            saved = os.dup(2)
        except OSError:  # no fd 2 to redirect
            return None
        fds: list[int] = [saved]
        try:
            read_end, write_end = os.pipe()
            fds += [read_end, write_end]
            ack_read, ack_write = os.pipe()
            fds += [ack_read, ack_write]
            marker = b"\0tfgpu_magic-import-end-" + secrets.token_hex(8).encode() + b"\0"
            process = subprocess.Popen(
                [sys.executable, "-I", "-S", "-c", _FORWARDER, __file__, level, marker.hex(), str(ack_write)],
                stdin=read_end, stdout=saved, stderr=saved, pass_fds=(ack_write,), start_new_session=True,
            )  # its own session: a kernel interrupt (SIGINT to the process group) must not stop it
        except (OSError, ValueError, subprocess.SubprocessError):
            _close(*fds)
            return None
        _close(read_end, ack_write)
        forwarder = cls(process, write_end, saved, marker, ack_read)
        try:
            ready = forwarder._wait() == _READY
        except BaseException:  # an interrupt while it starts: nothing of it may stay behind
            forwarder.close()
            raise
        if not ready:
            forwarder.close()
            return None
        return forwarder

    def _wait(self) -> bytes:
        """One byte from the forwarder (b"" when it ended or `FORWARD_WAIT` passed)."""
        import select

        try:
            readable, _, _ = select.select([self.ack], [], [], FORWARD_WAIT)
            return os.read(self.ack, 1) if readable else b""
        except OSError:
            return b""

    def finish(self) -> None:
        """After fd 2 is restored: wait until the forwarder has passed on the import's lines, then let
        it run on by itself (reaped in the background) while children may still write to the pipe."""
        _close(self.pipe)
        try:
            self._wait()  # `_DONE`, or b"" once it ended or took too long
        finally:
            _close(self.ack, self.saved)
            _reap(self.process)

    def close(self) -> None:
        """Give up on a forwarder that never got fd 2."""
        with contextlib.suppress(OSError):
            self.process.kill()
        _close(self.pipe, self.ack, self.saved)
        _reap(self.process)


def _close(*fds: int) -> None:
    for fd in fds:
        with contextlib.suppress(OSError):
            os.close(fd)


def _reap(process: Any) -> None:
    """Wait for `process` in a daemon thread, so it never lingers as a zombie."""
    if process.poll() is None:
        import threading

        threading.Thread(target=process.wait, name="tfgpu_magic-forwarder", daemon=True).start()


def forward(level: str, marker: bytes, ack: int) -> None:
    """The forwarder process: stdin is the pipe, stdout the real stderr. Lines before `marker` are
    filtered (`keep_lines`) as they arrive; after it, everything passes until the last writer closes
    the pipe. Writes `_READY` on `ack` once running, `_DONE` once the filtered part is out."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    held = b""
    try:
        os.write(ack, _READY)
        while True:
            chunk = os.read(0, 1 << 16)
            if not chunk:
                _write_all(1, keep_lines(held, level))
                return
            held += chunk
            at = held.find(marker)
            if at >= 0:
                _write_all(1, keep_lines(held[:at], level))
                os.write(ack, _DONE)
                os.close(ack)
                _write_all(1, held[at + len(marker):])
                break
            cut = held.rfind(b"\n") + 1
            if not cut and len(held) > _LINE_BYTES:
                cut = len(held) - len(marker)  # the marker may have begun in this tail
            if cut:
                _write_all(1, keep_lines(held[:cut], level))
                held = held[cut:]
        while chunk := os.read(0, 1 << 16):
            _write_all(1, chunk)
    except OSError:  # the real stderr is gone (a closed terminal): nothing left to write to
        return


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
