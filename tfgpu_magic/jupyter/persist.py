"""Policies on disk: pending ones (per kernel, across one restart) and the user's default, and the
profile startup files that apply them.

Every file is read as hostile (`safefile`: regular files only, size cap, no blocking, this user's
and private) and written atomically with mode 0600, never through a symbolic link and never over a
file this project did not write. Reading never stops a kernel from starting: a missing file is no
policy; an unusable one is a one-line `PolicyError` for the caller to show as a warning, and the
file is left as it is. Nothing is ever `eval`-ed or unpickled.

The IPython profile is shared by every Python environment of the user, so the startup files written
here are silent and cheap wherever they have nothing to do: in an environment without tfgpu_magic,
in terminal IPython, and in any kernel with nothing pending (one directory listing, no import).
`safefile` is imported where a file is read or written, not on `%load_ext`'s path where none exists.
"""

from __future__ import annotations

import contextlib
import os
import re
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import PolicyError, warn

if TYPE_CHECKING:
    from ..language.policy import Policy

FORMAT = "tfgpu_magic/policy/1"
PENDING_PREFIX = "tfgpu-pending-"
STALE_SECONDS = 24 * 3600
"""A pending file older than this is removed even if its kernel's connection file is still there
(a server that died without cleaning up)."""
_SAFE_ID = r"[^A-Za-z0-9_.-]"


def runtime_dir() -> Path:
    """The user's Jupyter runtime dir (where kernels' connection files live)."""
    env = os.environ.get("JUPYTER_RUNTIME_DIR")
    if env:
        return Path(env)
    try:
        from jupyter_core.paths import jupyter_runtime_dir
    except ImportError:  # terminal IPython without Jupyter installed
        return Path.home() / ".local" / "share" / "jupyter" / "runtime"
    return Path(jupyter_runtime_dir())


def write_policy(path: Path, policy: Policy, **extra: Any) -> None:
    """Write `policy` (plus `extra` fields) as JSON, atomically, mode 0600, in a folder created 0700.
    `PolicyError` (nothing written) when something this project did not write is at `path`."""
    _replaceable(path)
    _write(path, policy, extra)


def _write(path: Path, policy: Policy, extra: dict[str, Any]) -> None:
    from .. import safefile

    data = {"format": FORMAT, "policy": policy.to_dict(), **extra}
    safefile.write_atomic(path, safefile.dumps(data, indent=2) + "\n")


def _replaceable(path: Path) -> dict[str, Any] | None:
    """The record of ours at `path` that a write may replace; None when nothing is there.
    `PolicyError`, one line, when something else is (a link, a FIFO, another user's file, one others
    may write, one too large to be ours, one not in our format): it is left exactly as it is.
    `OSError` where `path` cannot be looked at (its folder is a file), as writing would raise."""
    import stat

    from .. import safefile

    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return None
    link = stat.S_ISLNK(info.st_mode)
    reason = "is a symbolic link" if link else safefile.unfit(info, safefile.POLICY_BYTES, private=True)
    record = None
    if reason is None:
        try:
            record = read_record(path)
        except PolicyError:
            reason = "is not a tfgpu_magic policy file"
    if reason is not None:
        raise PolicyError(f"{path} {reason}: tfgpu_magic replaces only files it wrote; remove it by hand")
    return record


def read_record(path: Path) -> dict[str, Any] | None:
    """The JSON object of our policy file at `path`; None when there is no file. `PolicyError` (one
    line naming the file) when it is not a regular private file of ours in our format."""
    from .. import safefile

    data = safefile.read_json(path, safefile.POLICY_BYTES, private=True)
    if data is None:
        return None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise PolicyError(f"{path} is not a tfgpu_magic policy file; ignoring it")
    return data


def read_policy(path: Path) -> Policy | None:
    """The policy stored at `path`; None when there is no file; `PolicyError` naming the file when
    it is unusable (see `read_record`) or holds an invalid policy."""
    data = read_record(path)
    return None if data is None else _policy_in(path, data)


def _policy_in(path: Path, data: dict[str, Any]) -> Policy:
    from ..language.policy import Policy

    try:
        return Policy.from_dict(data.get("policy"))
    except (ValueError, RecursionError) as err:  # PolicyError is a ValueError
        raise PolicyError(f"{path} holds an invalid policy: {err}") from None


# ----- pending policies: one per kernel, across one restart ---------------------------------------
_NAME_LIMIT = 128
"""Longest kernel key used as it is in a pending file's name (a file name has at most 255 bytes)."""


def pending_path(kernel_key: str, directory: Path | None = None) -> Path:
    """Where the pending policy of the kernel `kernel_key` (`startup.kernel_key`) is kept: the key
    itself where it is a plain short name (a server's kernel id), else a readable prefix and a hash,
    so that keys differing only in characters a file name cannot hold (`a b`, `a_b`) or past the
    length a file name can have get files of their own."""
    safe = re.sub(_SAFE_ID, "_", kernel_key)
    if safe != kernel_key or len(kernel_key) > _NAME_LIMIT:
        import hashlib

        safe = f"{safe[:64]}-{hashlib.sha256(kernel_key.encode('utf-8', 'surrogateescape')).hexdigest()[:16]}"
    return (directory or runtime_dir()) / f"{PENDING_PREFIX}{safe}.json"


def store_pending(
    kernel_key: str, policy: Policy, connection_file: Path | None = None, directory: Path | None = None
) -> Path:
    """Keep `policy` for the next kernel started on this kernel's connection file, recording the key
    and the file's real path: only that kernel takes it (`take_pending`). Pending files of kernels
    that are gone are removed first. `PolicyError` (nothing written) when the file is another
    kernel's pending policy or not one of ours."""
    directory = directory or runtime_dir()
    clean_gone(directory)
    path = pending_path(kernel_key, directory)
    owner = _owner(kernel_key, connection_file)
    existing = _replaceable(path)
    if existing is not None and _owner_of(existing) != owner:
        raise PolicyError(f"{path} holds the pending policy of another kernel "
                          f"({existing.get('connection_file') or existing.get('kernel_id')}); not replacing it")
    extra: dict[str, Any] = {"kernel_id": kernel_key, "created": time.time()}
    if owner[1] is not None:
        extra["connection_file"] = owner[1]
    _write(path, policy, extra)
    return path


def take_pending(kernel_key: str, directory: Path | None = None, connection_file: Path | None = None) -> Policy | None:
    """The pending policy of the kernel `kernel_key` on `connection_file`, removing its file; then
    pending files of kernels that are gone are cleaned. A file recorded for another kernel (another
    key, or another connection file with the same name elsewhere) is left to it: None.
    `PolicyError` (file left in place) if the file is unusable."""
    directory = directory or runtime_dir()
    path = pending_path(kernel_key, directory)
    try:
        policy = read_pending(kernel_key, directory, connection_file)
        if policy is None:
            return None
        try:
            path.unlink()
        except OSError as err:
            warn(f"could not remove {path}: {err}")
        return policy
    finally:
        clean_gone(directory)


def read_pending(kernel_key: str, directory: Path | None = None, connection_file: Path | None = None) -> Policy | None:
    """The pending policy of the kernel `kernel_key` on `connection_file`, left in place (what the
    status shows as kept); None when there is none, or it is another kernel's. `PolicyError` if the
    file is unusable."""
    path = pending_path(kernel_key, directory)
    record = read_record(path)
    if record is None or _owner_of(record) != _owner(kernel_key, connection_file):
        return None
    return _policy_in(path, record)


def void_pending(kernel_key: str, policy: Policy, directory: Path | None = None,
                 connection_file: Path | None = None) -> bool:
    """Remove the pending policy of the kernel `kernel_key` on `connection_file` where it differs from
    `policy`, the one desired now: a restart must not bring back a policy changed since it was kept
    (a `%tfgpu reset`, say). True when one was removed. `PolicyError` (file left) if it is unusable."""
    kept = read_pending(kernel_key, directory, connection_file)
    if kept is None or kept == policy:
        return False
    pending_path(kernel_key, directory).unlink(missing_ok=True)
    return True


def _owner(kernel_key: str, connection_file: Path | str | None) -> tuple[str, str | None]:
    """Who a pending file is for: the kernel key and the real path of its connection file."""
    return kernel_key, None if connection_file is None else os.path.realpath(connection_file)


def _owner_of(record: dict[str, Any]) -> tuple[Any, Any]:
    return record.get("kernel_id"), record.get("connection_file")


def clean_gone(directory: Path) -> None:
    """Remove the pending files of kernels that are gone: their connection file no longer exists, or
    they are older than `STALE_SECONDS`. Only files that are provably ours are touched: our name
    prefix, a private regular file of this user, our format, and the key inside matching the name."""
    now = time.time()
    try:
        candidates = sorted(directory.glob(f"{PENDING_PREFIX}*.json"))
    except OSError:
        return
    for path in candidates:
        try:
            record = read_record(path)
        except PolicyError:
            continue  # not ours, or unusable: shown as a warning to its own kernel, left as it is
        if record is not None and _is_gone(path, record, now):
            with contextlib.suppress(OSError):
                path.unlink()


def _is_gone(path: Path, record: dict[str, Any], now: float) -> bool:
    key, created, connection = record.get("kernel_id"), record.get("created"), record.get("connection_file")
    if not isinstance(key, str) or pending_path(key, path.parent).name != path.name:
        return False  # our format, but not a file we named: leave it
    if isinstance(connection, str) and not os.path.exists(connection):
        return True
    return isinstance(created, (int, float)) and now - created > STALE_SECONDS


# ----- startup files in the IPython profile -----------------------------------------------------
DEFAULT_NAME = "tfgpu_magic_default.json"
AUTOLOAD_NAME = "50-tfgpu_magic.py"
AUTOLOAD_MARKER = "# Written by `%tfgpu autoload on`; `%tfgpu autoload off` removes it."
AUTOLOAD_CODE = f'''{AUTOLOAD_MARKER}
def _tfgpu_magic_autoload():
    # This profile may be shared by Python environments without tfgpu_magic: stay silent there.
    import importlib.util
    import sys

    if importlib.util.find_spec("tfgpu_magic") is None:
        return
    try:
        get_ipython().run_line_magic("load_ext", "tfgpu_magic")
    except Exception as err:  # a session must start whatever happens here
        print(f"tfgpu_magic: {AUTOLOAD_NAME} could not load tfgpu_magic: {{err}}", file=sys.stderr)


_tfgpu_magic_autoload()
del _tfgpu_magic_autoload
'''

PENDING_STARTUP_NAME = "00-tfgpu_magic_pending.py"
PENDING_STARTUP_MARKER = "# Written by `%tfgpu restart`: loads tfgpu_magic where a restart left a pending policy."
PENDING_STARTUP_CODE = f'''{PENDING_STARTUP_MARKER}
def _tfgpu_magic_pending():
    # Runs in every session of this profile, in every Python environment: outside a kernel, or with
    # no pending file in the runtime dir, it costs one directory listing and imports nothing.
    import os
    import sys

    shell = get_ipython()
    if getattr(shell, "kernel", None) is None:
        return
    try:
        runtime = os.environ.get("JUPYTER_RUNTIME_DIR")
        if not runtime:
            from jupyter_core.paths import jupyter_runtime_dir

            runtime = jupyter_runtime_dir()
        if not any(name.startswith("{PENDING_PREFIX}") for name in os.listdir(runtime)):
            return
    except (ImportError, OSError):
        return
    import importlib.util

    try:  # every later startup file must run, whatever happens here
        if importlib.util.find_spec("tfgpu_magic") is None:
            return
        from tfgpu_magic.jupyter.startup import load_if_pending

        load_if_pending(shell)
    except Exception as err:
        print(f"tfgpu_magic: could not check for a pending policy in {{runtime}}: {{err}}", file=sys.stderr)


_tfgpu_magic_pending()
del _tfgpu_magic_pending
'''

STARTUP_FILES = {PENDING_STARTUP_NAME: (PENDING_STARTUP_MARKER, PENDING_STARTUP_CODE),
                 AUTOLOAD_NAME: (AUTOLOAD_MARKER, AUTOLOAD_CODE)}  # fmt: skip
"""Our startup files: name → (the first line that proves we wrote one, its current code)."""
STARTUP_BYTES = 64 << 10


def startup_path(profile_dir: str | Path, name: str) -> Path:
    return Path(profile_dir) / "startup" / name


def _our_startup_text(path: Path, marker: str) -> str | None:
    """The text of our startup file at `path`, None when there is none; `PolicyError` when something
    else is there (a link, another program's file): we neither overwrite nor remove it."""
    if path.is_symlink():
        raise PolicyError(f"{path} is a symbolic link, not a file tfgpu_magic wrote; remove it by hand")
    from .. import safefile

    text = safefile.read_text(path, STARTUP_BYTES)
    if text is not None and not text.startswith(marker + "\n"):
        raise PolicyError(f"{path} exists and was not written by tfgpu_magic; remove it by hand")
    return text


def write_startup(profile_dir: str | Path, name: str) -> Path:
    """Create our startup file `name`, or bring one an older version wrote up to date."""
    marker, code = STARTUP_FILES[name]
    path = startup_path(profile_dir, name)
    if _our_startup_text(path, marker) != code:
        from .. import safefile

        safefile.write_atomic(path, code)
    return path


def upgrade_startup_files(profile_dir: str | Path, names: tuple[str, ...] = tuple(STARTUP_FILES)) -> None:
    """Rewrite, in place, startup files (`names`) that an older version of this project wrote (same
    marker line, other code): theirs may leak tracebacks into environments without tfgpu_magic.
    Anything that is not ours is left alone; problems are not worth a warning here."""
    for name in names:
        path = startup_path(profile_dir, name)
        if not path.is_file():  # the common case: one stat per file
            continue
        try:
            write_startup(profile_dir, name)
        except (PolicyError, OSError):
            continue


def set_pending_startup(profile_dir: str | Path) -> Path:
    """Make sure the profile's startup file that applies pending policies exists and is current."""
    return write_startup(profile_dir, PENDING_STARTUP_NAME)


def default_path(profile_dir: str | Path) -> Path:
    """Where `%tfgpu default save` keeps the default policy (plain JSON in the IPython profile)."""
    return Path(profile_dir) / DEFAULT_NAME


def autoload_path(profile_dir: str | Path) -> Path:
    """The profile startup file that loads the extension in every new IPython or kernel."""
    return startup_path(profile_dir, AUTOLOAD_NAME)


def set_autoload(profile_dir: str | Path, enable: bool) -> Path | None:
    """Add or remove our startup file; other startup files and config stay untouched. The file
    written or removed; None when there was none of ours to remove."""
    path = autoload_path(profile_dir)
    ours = _our_startup_text(path, AUTOLOAD_MARKER) is not None
    if enable:
        return write_startup(profile_dir, AUTOLOAD_NAME)
    if ours:
        path.unlink()
        return path
    return None
