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


def read_policy(path: Path) -> Policy | None:
    """The policy stored at `path`; None when there is no file.

    A file that is there but unusable (corrupt, foreign, another user's, unreadable) is a one-line
    `PolicyError` for the caller to show as a warning; the file itself is left as it is."""
    from .policy import Policy

    try:
        owner = path.stat().st_uid
    except FileNotFoundError:
        return None
    except OSError as err:
        raise PolicyError(f"unusable policy file {path}: {err}") from None
    if owner != os.getuid():
        raise PolicyError(f"policy file {path} belongs to another user")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise PolicyError("not a tfgpu_magic policy file")
        return Policy.from_dict(data.get("policy"))
    except (OSError, ValueError) as err:  # PolicyError and JSONDecodeError are ValueErrors
        raise PolicyError(f"unusable policy file {path}: {err}") from None


def pending_path(kernel_id: str, directory: Path | None = None) -> Path:
    """Where the pending policy of kernel `kernel_id` is kept."""
    return (directory or runtime_dir()) / f"{PENDING_PREFIX}{_SAFE_ID.sub('_', kernel_id)}.json"


def store_pending(kernel_id: str, policy: Policy, directory: Path | None = None) -> Path:
    """Keep `policy` for the next kernel started under `kernel_id`."""
    path = pending_path(kernel_id, directory)
    write_policy(path, policy, kernel_id=kernel_id, created=time.time())
    return path


def take_pending(kernel_id: str, directory: Path | None = None) -> Policy | None:
    """The pending policy of `kernel_id`, removing the file; stale files of any kernel are cleaned.
    `PolicyError` (file left in place) if the file is unusable."""
    directory = directory or runtime_dir()
    clean_stale(directory)
    path = pending_path(kernel_id, directory)
    policy = read_policy(path)
    if policy is None:
        return None
    try:
        path.unlink()
    except OSError as err:
        warn(f"could not remove {path}: {err}")
    return policy


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


PENDING_STARTUP_NAME = "00-tfgpu_magic_pending.py"
PENDING_STARTUP_MARKER = "# Written by `%tfgpu restart`: loads tfgpu_magic where a restart left a pending policy."
PENDING_STARTUP_CODE = f"""{PENDING_STARTUP_MARKER}
try:
    from tfgpu_magic.startup import load_if_pending
    load_if_pending(get_ipython())
except Exception as err:  # a kernel must start whatever happens here
    print(f"tfgpu_magic: could not apply the pending policy: {{err}}")
"""


def set_pending_startup(profile_dir: str | Path) -> None:
    """Make sure the profile's startup file that applies pending policies exists (it costs a kernel
    one file check at start; the extension loads only where a policy is pending)."""
    path = Path(profile_dir) / "startup" / PENDING_STARTUP_NAME
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(PENDING_STARTUP_CODE, encoding="utf-8")


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
