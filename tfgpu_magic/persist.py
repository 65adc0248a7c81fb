"""Policies on disk: pending ones (per kernel, across one restart) and the user's default.

Files are plain JSON, written atomically with mode 0600. Reading never stops a kernel from
starting: a missing file is no policy; a corrupt, foreign or unreadable one is a warning.
Nothing is ever `eval`-ed or unpickled.
"""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .errors import PolicyError, warn

if TYPE_CHECKING:
    from .policy import Policy

FORMAT = "tfgpu_magic/policy/1"
PENDING_PREFIX = "tfgpu-pending-"
STALE_SECONDS = 24 * 3600
_SAFE_ID = re.compile(r"[^A-Za-z0-9_.-]")


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
    """Write `policy` (plus `extra` fields) as JSON, atomically, mode 0600."""
    import tempfile

    path.parent.mkdir(parents=True, exist_ok=True)
    data = {"format": FORMAT, "policy": policy.to_dict(), **extra}
    fd, tmp = tempfile.mkstemp(prefix=".tfgpu-", dir=path.parent)
    try:
        os.fchmod(fd, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            json.dump(data, out, indent=2)
            out.write("\n")
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def read_policy(path: Path) -> tuple[Policy, dict[str, Any]] | None:
    """The policy stored at `path` and the file's other fields; None (with a warning if the file is
    there but unusable) when there is none."""
    from .policy import Policy

    try:
        if path.stat().st_uid != os.getuid():
            warn(f"ignoring {path}: it belongs to another user")
            return None
        data = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise PolicyError("not a tfgpu_magic policy file")
        return Policy.from_dict(data.get("policy")), data
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as err:  # PolicyError and JSONDecodeError are ValueErrors
        warn(f"ignoring unusable policy file {path}: {err}")
        return None


def pending_path(kernel_id: str, directory: Path | None = None) -> Path:
    """Where the pending policy of kernel `kernel_id` is kept."""
    return (directory or runtime_dir()) / f"{PENDING_PREFIX}{_SAFE_ID.sub('_', kernel_id)}.json"


def store_pending(kernel_id: str, policy: Policy, directory: Path | None = None) -> Path:
    """Keep `policy` for the next kernel started under `kernel_id`."""
    path = pending_path(kernel_id, directory)
    write_policy(path, policy, kernel_id=kernel_id, created=time.time())
    return path


def take_pending(kernel_id: str, directory: Path | None = None) -> Policy | None:
    """The pending policy of `kernel_id`, removing the file; stale files of any kernel are cleaned."""
    directory = directory or runtime_dir()
    clean_stale(directory)
    path = pending_path(kernel_id, directory)
    found = read_policy(path)
    if found is None:
        return None
    try:
        path.unlink()
    except OSError as err:
        warn(f"could not remove {path}: {err}")
    return found[0]


def clean_stale(directory: Path, max_age: float = STALE_SECONDS) -> None:
    """Remove our pending files older than `max_age` seconds (their kernel is long gone)."""
    now = time.time()
    try:
        candidates = list(directory.glob(f"{PENDING_PREFIX}*.json"))
    except OSError:
        return
    for path in candidates:
        try:
            if path.stat().st_uid == os.getuid() and now - path.stat().st_mtime > max_age:
                path.unlink()
        except OSError:
            continue


DEFAULT_NAME = "tfgpu_magic_default.json"
AUTOLOAD_NAME = "50-tfgpu_magic.py"
AUTOLOAD_MARKER = "# Written by `%tfgpu autoload on`; `%tfgpu autoload off` removes it."
AUTOLOAD_CODE = f'{AUTOLOAD_MARKER}\nget_ipython().run_line_magic("load_ext", "tfgpu_magic")\n'


def default_path(profile_dir: str | Path) -> Path:
    """Where `%tfgpu default save` keeps the default policy (plain JSON in the IPython profile)."""
    return Path(profile_dir) / DEFAULT_NAME


def autoload_path(profile_dir: str | Path) -> Path:
    """The profile startup file that loads the extension in every new IPython or kernel."""
    return Path(profile_dir) / "startup" / AUTOLOAD_NAME


def set_autoload(profile_dir: str | Path, enable: bool) -> str:
    """Add or remove our startup file; other startup files and config stay untouched."""
    path = autoload_path(profile_dir)
    ours = path.exists() and path.read_text(encoding="utf-8").startswith(AUTOLOAD_MARKER)
    if path.exists() and not ours:
        raise PolicyError(f"{path} exists and was not written by tfgpu_magic; remove it by hand")
    if enable:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(AUTOLOAD_CODE, encoding="utf-8")
        return f"Every new IPython session and kernel of this profile loads tfgpu_magic ({path})."
    if ours:
        path.unlink()
        return f"Removed {path}: new kernels no longer load tfgpu_magic by themselves."
    return "Autoload was not on; nothing to remove."
