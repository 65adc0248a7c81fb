"""Which GPUs `visible auto` gave to which kernel: short-lived reservations in the Jupyter runtime dir.

NVML shows a kernel's memory only once TensorFlow has allocated some, seconds or minutes after
launch; two kernels launched together would both see the same card as freest. So the pick is made
under an exclusive lock on one file of the runtime dir, and recorded there as
`tfgpu-gpu-<kernel id>.json`: a GPU given away in the last `HOLD_SECONDS` ranks after every GPU that
was not, whatever NVML says. The record stays until its kernel ends (the provisioner's cleanup)
or its launcher or kernel process is gone, so `who` can say which GPU each kernel was given and why.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Iterator

from .. import safefile
from ..errors import PolicyError
from ..language.policy import auto_pick_note
from .inventory import Gpu, Inventory, freest_first

FORMAT = "tfgpu_magic/reservation/1"
PREFIX, SUFFIX = "tfgpu-gpu-", ".json"
LOCK_NAME = "tfgpu-gpu.lock"
HOLD_SECONDS = 120.0
"""How long a pick keeps other launches off its GPUs (time enough for TensorFlow to allocate)."""
RECORD_BYTES = 16 << 10
_SAFE_ID = re.compile(r"[^A-Za-z0-9_.-]")


@dataclass(frozen=True)
class Reservation:
    kernel_id: str
    gpus: tuple[str, ...]
    """GPU UUIDs given to the kernel."""
    why: str
    launcher_pid: int
    kernel_pid: int | None
    created: float
    path: Path

    def fresh(self, now: float | None = None) -> bool:
        return (now or time.time()) - self.created < HOLD_SECONDS


def path_for(kernel_id: str, directory: Path) -> Path:
    return directory / f"{PREFIX}{_SAFE_ID.sub('_', kernel_id)[:128]}{SUFFIX}"


LOCK_WAIT = 5.0
"""Seconds a launch waits for the lock (held by another launch for milliseconds; longer means a stuck
or hostile holder), after which the pick is not recorded and the kernel starts with the warning."""
LOCK_POLL = 0.05


@contextlib.contextmanager
def locked(directory: Path, wait: float | None = None) -> Iterator[None]:
    """An exclusive lock over the runtime dir's reservations (across processes: `fcntl.flock`).
    Waits at most `wait` seconds (`LOCK_WAIT`), then raises `PolicyError`: a lock held forever must
    never hang a launch."""
    import fcntl

    safefile.private_dir(directory)
    lock = directory / LOCK_NAME
    fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0), 0o600)
    try:
        wait = LOCK_WAIT if wait is None else wait
        deadline = time.monotonic() + wait
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise PolicyError(f"{lock} is still held by another process after {wait:g} s") from None
                time.sleep(LOCK_POLL)
        yield
    finally:
        os.close(fd)  # closing releases the lock


def _read(path: Path) -> Reservation | None:
    try:
        data = safefile.read_json(path, RECORD_BYTES, private=True)
    except PolicyError:
        return None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        return None
    gpus, pid, kernel_pid, created = data.get("gpus"), data.get("launcher_pid"), data.get("kernel_pid"), data.get("created")
    if not (isinstance(gpus, list) and all(isinstance(g, str) for g in gpus) and isinstance(pid, int)
            and isinstance(created, (int, float)) and (kernel_pid is None or isinstance(kernel_pid, int))):
        return None
    return Reservation(str(data.get("kernel_id")), tuple(gpus), str(data.get("why", "")), pid, kernel_pid, float(created), path)


def _live(reservation: Reservation) -> bool:
    from .processes import alive

    return alive(reservation.launcher_pid) and (reservation.kernel_pid is None or alive(reservation.kernel_pid))


def _all(directory: Path) -> list[Reservation]:
    try:
        paths = sorted(directory.glob(f"{PREFIX}*{SUFFIX}"))
    except OSError:
        return []
    return [r for r in (_read(p) for p in paths) if r is not None]


def current(directory: Path) -> list[Reservation]:
    """The live reservations (those of ended kernels are left out)."""
    return [r for r in _all(directory) if _live(r)]


def _prune(directory: Path) -> list[Reservation]:
    """Remove the reservations of ended kernels; the live ones."""
    live = []
    for reservation in _all(directory):
        if _live(reservation):
            live.append(reservation)
        else:
            with contextlib.suppress(OSError):
                reservation.path.unlink(missing_ok=True)
    return live


def held_counts(reservations: list[Reservation]) -> dict[str, int]:
    """GPU UUID → how many kernels were given it in the last `HOLD_SECONDS`."""
    held: dict[str, int] = {}
    for reservation in reservations:
        if reservation.fresh():
            for uuid in reservation.gpus:
                held[uuid] = held.get(uuid, 0) + 1
    return held


def rank(inventory: Inventory, reservations: list[Reservation]) -> list[Gpu]:
    """GPUs freest first, those given to a kernel in the last `HOLD_SECONDS` after all others."""
    held = held_counts(reservations)
    return sorted(inventory.gpus, key=lambda g: (held.get(g.uuid, 0), *freest_first(g)))


def reserve(kernel_id: str, count: int, inventory: Inventory, directory: Path) -> Reservation:
    """Pick the `count` freest GPUs not just given to another kernel, and record the pick.
    `PolicyError` when the machine has fewer GPUs."""
    if len(inventory.gpus) < count:
        raise PolicyError(f"visible auto:{count}: this machine has only {len(inventory.gpus)} GPU(s)")
    with locked(directory):
        others = [r for r in _prune(directory) if r.kernel_id != kernel_id]
        picked = rank(inventory, others)[:count]
        held = held_counts(others)
        why = auto_pick_note(picked, held)
        reservation = Reservation(kernel_id, tuple(g.uuid for g in picked), why, os.getpid(), None, time.time(),
                                  path_for(kernel_id, directory))
        safefile.write_atomic(reservation.path, _dumps(reservation))
    return reservation


def _dumps(reservation: Reservation) -> str:
    """The record of `reservation` as `_read` reads it."""
    return json.dumps({
        "format": FORMAT, "kernel_id": reservation.kernel_id, "gpus": list(reservation.gpus), "why": reservation.why,
        "launcher_pid": reservation.launcher_pid, "kernel_pid": reservation.kernel_pid, "created": reservation.created,
    })


def set_kernel_pid(reservation: Reservation, pid: int | None) -> None:
    """Record the kernel's process once launched (its end then frees the reservation)."""
    with locked(reservation.path.parent):
        if reservation.path.exists():
            safefile.write_atomic(reservation.path, _dumps(replace(reservation, kernel_pid=pid)))


def release(kernel_id: str, directory: Path) -> None:
    """Remove the kernel's reservation (it ended)."""
    with contextlib.suppress(OSError):
        path_for(kernel_id, directory).unlink(missing_ok=True)
