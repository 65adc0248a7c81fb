"""The selftest's child processes, and how each one ends: none may outlive the run that started it.

Each child starts in a session of its own (its own process group, out of reach of a kernel
interrupt that signals the kernel's group), so that stopping it reaches every process it started.
It is stopped (SIGTERM to its group, SIGKILL after `GRACE`) when its time is up, when the process
waiting on it is interrupted or raises, when `Children.close()` ends a run, and at interpreter exit;
once it has exited, whatever it left in its group is killed too. Its stdin is a pipe that only the
starting process holds open: when that process ends, even by SIGKILL, the child reads EOF and ends
itself (`probes.PRELUDE`; `watch_parent` for the selftest's own process).
"""

from __future__ import annotations

import atexit
import contextlib
import os
import selectors
import signal
import subprocess
import threading
import time
import weakref
from typing import Any, Callable, Iterator, Mapping, NamedTuple, Sequence

from .frames import Reader

GRACE = 2.0
"""Seconds between SIGTERM and SIGKILL."""
STDERR_LIMIT = 1024 * 1024
"""Bytes of a child's stderr kept (the first ones); the rest is counted, not held."""
CHUNK = 65536
POLL = 0.02
QUIET = 0.5
"""Seconds without output after which an exited child's pipes are not waited on any more."""
SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
"""What interrupts a wait; held back while children are being stopped."""
STOPPED = "stopped"
TIMED_OUT = "timed out"


class Finished(NamedTuple):
    """One child's run: its framed results (`reader`), its stderr lines, its exit status (negative:
    the signal that ended it), how long it ran, and `cut` (TIMED_OUT, STOPPED) when it was stopped."""

    reader: Reader
    stderr: tuple[str, ...]
    returncode: int | None
    seconds: float
    cut: str | None = None


class Children:
    """The children of one run. `run` starts one and waits for it; `close` stops every one still
    running and refuses new ones (from any thread: `run` may be waiting in another)."""

    def __init__(self, grace: float = GRACE) -> None:
        self.grace = grace
        self._lock = threading.Lock()
        self._running: dict[int, subprocess.Popen[bytes]] = {}
        self._closed = False
        _OPEN.add(self)

    def run(self, argv: Sequence[str], env: Mapping[str, str], timeout: float, reader: Reader) -> Finished:
        """Run `argv` with `env` for at most `timeout` seconds, its stdout fed to `reader`."""
        start = time.monotonic()
        errors = _Head(STDERR_LIMIT)
        started = None
        try:
            # An interrupt while it starts (Popen waits for the exec) is raised once it is in hand, so that
            # it is stopped below; raised inside Popen, it would leave the child running.
            with held_signals():
                started = self._start(argv, env)
            if started is None:
                return Finished(reader, (), None, 0.0, STOPPED)
            process = started[0]
            ended = _collect(process, reader, errors, start + timeout)
            if ended:  # both pipes closed: it has exited, or is about to
                ended = _exited(process.pid, start + timeout)
            _end([process], self.grace, terminate=not ended)
        except BaseException:
            if started is not None:
                with held_signals():
                    _end([started[0]], self.grace)
            raise
        finally:
            if started is not None:
                with self._lock:
                    self._running.pop(started[0].pid, None)
                os.close(started[1])
                for pipe in (started[0].stdout, started[0].stderr):
                    if pipe is not None:
                        pipe.close()
        cut = None if ended else TIMED_OUT
        if process.returncode is not None and process.returncode < 0 and self._closed:
            cut = STOPPED
        return Finished(reader, errors.lines(), process.returncode, time.monotonic() - start, cut)

    def _start(self, argv: Sequence[str], env: Mapping[str, str]) -> tuple[subprocess.Popen[bytes], int] | None:
        """The running child and the write end of its stdin pipe; None once closed."""
        child_end, parent_end = os.pipe()
        try:
            with self._lock:
                if self._closed:
                    os.close(parent_end)
                    return None
                try:
                    process = subprocess.Popen(list(argv), env=dict(env), stdin=child_end, stdout=subprocess.PIPE,
                                               stderr=subprocess.PIPE, start_new_session=True)
                except BaseException:
                    os.close(parent_end)
                    raise
                self._running[process.pid] = process
        finally:
            os.close(child_end)
        return process, parent_end

    def close(self) -> None:
        """Stop every child still running (their groups: SIGTERM, SIGKILL after the grace); start no more."""
        with held_signals():
            with self._lock:
                self._closed = True
                running = list(self._running.values())
            _end(running, self.grace)
        _OPEN.discard(self)


_OPEN: weakref.WeakSet[Children] = weakref.WeakSet()
"""Runs not yet closed: what `atexit` stops."""


@atexit.register
def _close_all() -> None:
    for children in list(_OPEN):
        children.close()


class _Head:
    """The first `limit` bytes written to it, and a count of the rest."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.kept = bytearray()
        self.dropped = 0

    def feed(self, chunk: bytes) -> None:
        room = self.limit - len(self.kept)
        self.kept += chunk[:max(room, 0)]
        self.dropped += max(len(chunk) - max(room, 0), 0)

    def lines(self) -> tuple[str, ...]:
        lines = self.kept.decode(errors="replace").splitlines()
        return tuple(lines + [f"[{self.dropped} more bytes on stderr, not kept]"] if self.dropped else lines)


def _collect(process: subprocess.Popen[bytes], reader: Reader, errors: _Head, deadline: float) -> bool:
    """Read the child's stdout into `reader` and its stderr into `errors` until both close, or the
    child has exited and a pause shows nothing more coming (a process it started may hold them):
    True; False once `deadline` passes."""
    with selectors.DefaultSelector() as selector:
        selector.register(process.stdout, selectors.EVENT_READ, reader.feed)  # type: ignore[arg-type]
        selector.register(process.stderr, selectors.EVENT_READ, errors.feed)  # type: ignore[arg-type]
        while selector.get_map():
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            events = selector.select(min(left, QUIET))
            if not events and _exited(process.pid, 0):
                return True
            for key, _ in events:
                chunk = os.read(key.fd, CHUNK)
                if chunk:
                    key.data(chunk)
                else:
                    selector.unregister(key.fileobj)
    return True


def _exited(pid: int, until: float) -> bool:
    """Whether our child `pid` has exited by `until`, left unreaped: its id, and so its group's,
    stays taken while we signal that group."""
    while True:
        try:
            if os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None:
                return True
        except ChildProcessError:  # already reaped
            return True
        if time.monotonic() >= until:
            return False
        time.sleep(POLL)


def _end(processes: list[subprocess.Popen[bytes]], grace: float, terminate: bool = True) -> None:
    """With `terminate`, SIGTERM each child's group and give them `grace` seconds together; then
    SIGKILL what is left of each group and reap the children."""
    if terminate:
        for process in processes:
            _signal_group(process.pid, signal.SIGTERM)
        until = time.monotonic() + grace
        for process in processes:
            _exited(process.pid, until)
    for process in processes:
        _signal_group(process.pid, signal.SIGKILL)
    for process in processes:
        with contextlib.suppress(subprocess.TimeoutExpired):  # stuck in the kernel (a driver call): let it be
            process.wait(grace)


def _signal_group(pgid: int, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signum)


@contextlib.contextmanager
def held_signals() -> Iterator[None]:
    """In the main thread, hold SIGINT, SIGTERM and SIGHUP back while children are stopped (a second
    Ctrl-C must not cut that short), then deliver them to the handlers they had."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    caught: list[int] = []
    saved: dict[int, Any] = {}
    for signum in SIGNALS:
        handler = signal.getsignal(signum)
        if handler is not None:  # None: set outside Python, and it could not be put back
            saved[signum] = signal.signal(signum, lambda number, frame: caught.append(number))
    try:
        yield
    finally:
        for signum, handler in saved.items():
            signal.signal(signum, handler)
        for signum in dict.fromkeys(caught):
            signal.raise_signal(signum)


def watch_parent(on_gone: Callable[[], None]) -> None:
    """Call `on_gone` (in a daemon thread) once stdin reaches EOF: the process that started this one,
    and holds the other end of that pipe, has ended."""

    def wait() -> None:
        with contextlib.suppress(OSError):
            while os.read(0, CHUNK):
                pass
        on_gone()

    threading.Thread(target=wait, name="tfgpu-selftest-parent", daemon=True).start()
