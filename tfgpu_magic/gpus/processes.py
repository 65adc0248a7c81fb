"""This machine's processes as `who` needs them: owner, Jupyter kernel id, TensorFlow loaded — read from /proc only.

Nothing here signals, attaches to or asks a process anything: a kernel's command line names its
connection file (`-f …/kernel-<id>.json` when a Jupyter server started it), its memory map shows
whether TensorFlow's native library is loaded, its status gives its owner. /proc files are read as
hostile: opened without blocking, never more than a byte cap (their size is 0 in `stat`, so the cap
is on what is read, not on `st_size`), undecodable bytes replaced. Another user's maps are unreadable
(and not ours to read): their `tensorflow` is None.

NVML's pids are the host's, always: the driver knows no pid namespace
(https://github.com/NVIDIA/nvidia-docker/issues/1483). In a container with a pid namespace of its
own (`foreign_pid_namespace`), they name other processes than /proc here does, or none.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path
from typing import NamedTuple

PROC = Path("/proc")
CMDLINE_BYTES = 64 << 10
STATUS_BYTES = 16 << 10
MAPS_BYTES = 16 << 20
"""A TensorFlow process maps a few thousand regions (~1 MiB of text); 16 MiB bounds a hostile one."""
TF_MARKERS = ("libtensorflow", "_pywrap_tensorflow_internal")
"""File names in /proc/PID/maps that only a process with TensorFlow imported has mapped."""
KERNEL_MODULES = ("ipykernel_launcher", "ipykernel")
SERVER_PREFIX, SERVER_SUFFIX = "kernel-", ".json"
"""How a Jupyter server names a kernel's connection file: `kernel-<id>.json`."""


PROC_PID_INIT_INO = 0xEFFFFFFC
"""The inode of the host's pid namespace (the initial one), fixed in Linux (`include/linux/proc_ns.h`)."""


@functools.cache
def foreign_pid_namespace() -> bool | None:
    """Whether this process runs in a pid namespace other than the host's (a container started
    without `--pid=host`), where NVML's pids must never be matched to /proc's. None where
    /proc/self/ns/pid cannot be read (not Linux, /proc not mounted): unknown."""
    try:
        return os.stat(PROC / "self" / "ns" / "pid").st_ino != PROC_PID_INIT_INO
    except OSError:
        return None


def server_kernel_id(path: Path) -> str | None:
    """The kernel id in a connection file named by a Jupyter server (`kernel-<id>.json`). Here, the
    lowest room that needs it: `who` reads it from other kernels' command lines, `jupyter` from its own."""
    name = path.name
    if name.startswith(SERVER_PREFIX) and name.endswith(SERVER_SUFFIX) and len(name) > len(SERVER_PREFIX + SERVER_SUFFIX):
        return name[len(SERVER_PREFIX) : -len(SERVER_SUFFIX)]
    return None


class ProcessInfo(NamedTuple):
    """One process as /proc shows it. `tensorflow` None: its map could not be read (another user's)."""

    pid: int
    uid: int | None
    user: str | None
    connection_file: str | None
    kernel_id: str | None
    tensorflow: bool | None

    @property
    def is_kernel(self) -> bool:
        """A process started with a connection file (`-f FILE`): an IPython/Jupyter kernel."""
        return self.connection_file is not None


def read_capped(path: Path, max_bytes: int) -> bytes | None:
    """At most `max_bytes` of `path`; None when it cannot be read (gone, not ours, not a regular
    /proc entry). Never blocks: a FIFO planted where /proc should be is not waited on."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError:
        return None
    try:
        chunks: list[bytes] = []
        left = max_bytes
        while left > 0:
            chunk = os.read(fd, min(left, 1 << 16))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)
    except OSError:
        return None
    finally:
        os.close(fd)


def cmdline(pid: int, proc: Path = PROC) -> list[str]:
    """The argv of `pid` ([] when unreadable or a kernel thread)."""
    data = read_capped(proc / str(pid) / "cmdline", CMDLINE_BYTES)
    if not data:
        return []
    return [arg.decode("utf-8", "replace") for arg in data.rstrip(b"\0").split(b"\0")]


def connection_file_of(argv: list[str]) -> str | None:
    """The connection file a kernel's command line names (`-f FILE`, `-f=FILE`, `--f=FILE`); None for
    anything else. ipykernel in argv makes any such argument one; a wrapper that starts a kernel
    (`conda run`, a custom kernelspec's script) is known by the argument alone, which must then name
    a `.json` file."""
    ipykernel = any(os.path.basename(arg).startswith(KERNEL_MODULES) for arg in argv)
    for at, arg in enumerate(argv):
        value = None
        if arg == "-f" and at + 1 < len(argv):
            value = argv[at + 1]
        for prefix in ("-f=", "--f="):
            if arg.startswith(prefix) and len(arg) > len(prefix):
                value = arg[len(prefix):]
        if value is not None and (ipykernel or value.endswith(".json")):
            return value
    return None


def kernel_id_of(connection_file: str | None) -> str | None:
    """The server's kernel id where the file is named `kernel-<id>.json`; other front ends' names give None."""
    if connection_file is None:
        return None
    return server_kernel_id(Path(connection_file))


def runs_kernel(pid: int, kernel_id: str, proc: Path = PROC) -> bool:
    """Whether /proc shows `pid` as the kernel on connection file `kernel-<kernel_id>.json`."""
    return kernel_id_of(connection_file_of(cmdline(pid, proc))) == kernel_id


def uid_of(pid: int, proc: Path = PROC) -> int | None:
    """The real uid in /proc/PID/status."""
    data = read_capped(proc / str(pid) / "status", STATUS_BYTES)
    if data is None:
        return None
    for line in data.decode("ascii", "replace").splitlines():
        if line.startswith("Uid:"):
            fields = line.split()
            if len(fields) > 1 and fields[1].isdigit():
                return int(fields[1])
    return None


def user_name(uid: int | None) -> str | None:
    """The login name of `uid` (the number as text where the password database has none)."""
    if uid is None:
        return None
    try:
        import pwd

        return pwd.getpwuid(uid).pw_name
    except (ImportError, KeyError):
        return str(uid)


def tensorflow_loaded(pid: int, proc: Path = PROC) -> bool | None:
    """Whether TensorFlow's native library is mapped in `pid`; None when its map is unreadable."""
    data = read_capped(proc / str(pid) / "maps", MAPS_BYTES)
    if data is None:
        return None
    return any(marker.encode() in data for marker in TF_MARKERS)


def describe(pid: int, proc: Path = PROC) -> ProcessInfo:
    """`ProcessInfo` of `pid`; its memory map is looked at only for this user's processes."""
    return _info(pid, uid_of(pid, proc), connection_file_of(cmdline(pid, proc)), proc)


def _info(pid: int, uid: int | None, connection: str | None, proc: Path) -> ProcessInfo:
    mine = uid is not None and hasattr(os, "getuid") and uid == os.getuid()
    tensorflow = tensorflow_loaded(pid, proc) if mine else None
    return ProcessInfo(pid, uid, user_name(uid), connection, kernel_id_of(connection), tensorflow)


def all_pids(proc: Path = PROC) -> list[int]:
    """Every pid /proc lists ([] without /proc)."""
    try:
        return sorted(int(entry.name) for entry in proc.iterdir() if entry.name.isdigit())
    except OSError:
        return []


def my_kernels(proc: Path = PROC) -> list[ProcessInfo]:
    """This user's kernel processes (those started with a connection file)."""
    me = os.getuid() if hasattr(os, "getuid") else None
    found = []
    for pid in all_pids(proc):
        uid = uid_of(pid, proc)
        connection = connection_file_of(cmdline(pid, proc)) if uid == me else None
        if connection is not None:
            found.append(_info(pid, uid, connection, proc))
    return found


PID_MAX = (1 << 22) - 1
"""Linux's largest possible pid (`/proc/sys/kernel/pid_max` is at most 2**22)."""


def alive(pid: int, proc: Path = PROC) -> bool:
    """Whether `pid` is a running process: it exists (signal 0 checks, it delivers nothing) and is
    not a zombie (state Z or X in /proc/PID/stat: it has finished, only its parent has not reaped
    it). A number that cannot be a pid (0, negative, beyond `PID_MAX`, not an int) is dead."""
    if isinstance(pid, bool) or not isinstance(pid, int) or not 0 < pid <= PID_MAX:
        return False
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, OverflowError):
        return False
    except PermissionError:
        pass  # another user's process: it exists
    return not finished(pid, proc)


def finished(pid: int, proc: Path = PROC) -> bool:
    """Whether /proc shows `pid` as a zombie (False where /proc cannot tell)."""
    data = read_capped(proc / str(pid) / "stat", STATUS_BYTES)
    if not data:
        return False
    fields = data.rpartition(b")")[2].split()  # the command name, in parentheses, may hold anything
    return bool(fields) and fields[0] in (b"Z", b"X")
