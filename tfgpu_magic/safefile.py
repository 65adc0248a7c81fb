"""Files read as hostile and written atomically: the one place that opens policy and server files.

Reading never blocks (a FIFO is refused, not waited on), never follows into devices (`/dev/zero`),
never reads more than a cap, and never lets deeply nested JSON escape as `RecursionError`. Every
problem is one `PolicyError` line naming the file, for the caller to show as a warning.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any

from .errors import PolicyError

POLICY_BYTES = 1 << 20
"""Largest policy file read (1 MiB: far above any real policy, far below trouble)."""
SERVER_INFO_BYTES = 64 << 10
"""Largest `jpserver-*.json` read."""


def read_text(path: Path, max_bytes: int = POLICY_BYTES, private: bool = False) -> str | None:
    """The text of the regular file `path`; None when nothing is there.

    `private`: the file must belong to this user and not be writable by group or others (as Jupyter
    requires of connection files), since its content decides what a kernel does."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        return None
    except OSError as err:
        raise PolicyError(f"cannot read {path}: {err.strerror or err}") from None
    try:
        info = os.fstat(fd)
        reason = unfit(info, max_bytes, private)
        if reason is not None:
            hint = f" (chmod 600 {path})" if "writable by others" in reason else ""
            raise PolicyError(f"{path} {reason}; ignoring it{hint}")
        data = os.read(fd, max_bytes + 1)
    except OSError as err:
        raise PolicyError(f"cannot read {path}: {err.strerror or err}") from None
    finally:
        os.close(fd)
    if len(data) > max_bytes:
        raise PolicyError(f"{path} is larger than the {max_bytes} bytes allowed")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise PolicyError(f"{path} is not UTF-8 text") from None


def unfit(info: os.stat_result, max_bytes: int = POLICY_BYTES, private: bool = False) -> str | None:
    """Why the file `info` describes is not one to read (to follow the path in a message: "is not a
    regular file"); None when it is. `private`: see `read_text`."""
    if not stat.S_ISREG(info.st_mode):
        return "is not a regular file"
    if private:
        if hasattr(os, "getuid") and info.st_uid != os.getuid():
            return "belongs to another user"
        if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
            return f"is writable by others (mode {stat.S_IMODE(info.st_mode):04o})"
    if info.st_size > max_bytes:
        return f"is {info.st_size} bytes, more than the {max_bytes} allowed"
    return None


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def loads(text: str, what: str) -> Any:
    """`json.loads`, with every failure (nesting too deep, NaN or Infinity included) one `PolicyError`
    naming `what`."""
    try:
        return json.loads(text, parse_constant=_no_constant)
    except RecursionError:
        raise PolicyError(f"{what}: JSON nested too deeply") from None
    except ValueError as err:
        if "integer string conversion" in str(err):  # Python's digit limit, with advice meant for programmers
            raise PolicyError(f"{what}: a number with more than 4,300 digits") from None
        raise PolicyError(f"{what} is not valid JSON: {err}") from None


def dumps(value: Any, indent: int | None = None) -> str:
    """JSON as every file and reply of ours is written: NaN and Infinity are a `ValueError`, never JSON
    that other readers refuse."""
    return json.dumps(value, allow_nan=False, indent=indent)


def read_json(path: Path, max_bytes: int = POLICY_BYTES, private: bool = False) -> Any:
    """The JSON value in `path` (see `read_text`); None when there is no file."""
    text = read_text(path, max_bytes, private)
    return None if text is None else loads(text, str(path))


def private_dir(path: Path) -> None:
    """Create `path` (and its parents) with mode 0700 where missing; existing folders are left as they are."""
    path.mkdir(mode=0o700, parents=True, exist_ok=True)


def write_atomic(path: Path, text: str, mode: int = 0o600) -> None:
    """Write `text` to `path` through a temporary file and a rename: readers see the old or the new
    file, never half of one. A symbolic link at `path` is refused (we do not write through links)."""
    import tempfile

    if path.is_symlink():
        raise PolicyError(f"{path} is a symbolic link; not writing through it")
    private_dir(path.parent)
    fd, tmp = tempfile.mkstemp(prefix=".tfgpu-", dir=path.parent)
    try:
        os.fchmod(fd, mode)
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            out.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
