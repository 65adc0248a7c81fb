"""What a kernel starts with: the policy `%load_ext` applies before any cell runs.

Sources, later ones replacing earlier ones: the `default_policy` config, the saved default
(`%tfgpu default save`), a tfgpu kernelspec's environment, a pending restart of this very kernel.
This module is on the `%load_ext` path: it checks cheaply whether any source exists and imports
the policy machinery only then. Every source is read as hostile: a broken one is one warning line
naming it, and the kernel starts.

A kernel is known across a restart by its connection file, which every jupyter_client manager
(servers, front ends, autorestarters, nbclient) reuses when it restarts a kernel: the server's
kernel id where the file is named `kernel-<id>.json`, else a hash of the file's real path.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from . import persist
from ..errors import short_error, warn

if TYPE_CHECKING:
    from ..language.policy import Policy

POLICY_ENV = "TFGPU_MAGIC_POLICY"
"""Environment variable through which a tfgpu kernelspec hands its policy to the kernel."""
LAUNCH_WARNING_ENV = "TFGPU_MAGIC_LAUNCH_WARNING"
"""One line the tfgpu provisioner leaves for the kernel's first cell (e.g. `visible auto` without NVML)."""


def connection_file(shell: Any) -> Path | None:
    """The real path of this kernel's connection file; None outside an ipykernel kernel."""
    if getattr(shell, "kernel", None) is None:
        return None
    try:
        from ipykernel.connect import get_connection_file

        return Path(os.path.realpath(get_connection_file()))
    except (ImportError, RuntimeError, OSError, AttributeError):
        return None


def kernel_key(path: Path) -> str:
    """What names the kernel on connection file `path` across restarts (see the module docstring)."""
    from ..gpus.processes import server_kernel_id  # only in a kernel: `%load_ext` elsewhere skips it

    kernel_id = server_kernel_id(path)
    if kernel_id is not None:
        return kernel_id
    import hashlib

    return "cf-" + hashlib.sha256(str(path).encode("utf-8", "surrogateescape")).hexdigest()[:24]


def current_kernel_key(shell: Any) -> str | None:
    """`kernel_key` of this kernel; None outside a kernel (terminal IPython) or without a connection file."""
    path = connection_file(shell)
    return None if path is None else kernel_key(path)


def load_if_pending(shell: Any) -> None:
    """Run from the profile's startup file (`persist.PENDING_STARTUP_CODE`): load the extension in a
    kernel that a `%tfgpu restart` left a pending policy for, before any cell runs. A policy that is
    pending but cannot be applied is one line naming its file; the kernel starts regardless, and no
    error of ours stops the profile's later startup files (IPython skips them all after one raises)."""
    try:
        _load_if_pending(shell)
    except Exception as err:  # noqa: BLE001 (the user's own startup files come after this one)
        warn(f"could not check for a pending policy: {short_error(err)}")


def _load_if_pending(shell: Any) -> None:
    if "tfgpu_magic" in shell.extension_manager.loaded:
        return  # its `%load_ext` brought the startup files up to date
    key = current_kernel_key(shell)
    path = persist.pending_path(key) if key is not None else None
    if path is None or not _present(path):
        # this file only: an autoload file is brought up to date by the `%load_ext` it runs
        persist.upgrade_startup_files(shell.profile_dir.location, (persist.PENDING_STARTUP_NAME,))
        return
    try:
        shell.run_line_magic("load_ext", "tfgpu_magic")
    except Exception as err:  # noqa: BLE001 (a kernel must start whatever happens here)
        warn(f"could not apply the pending policy {path}: {err}")


def say(shell: Any, text: str, warning: bool = False) -> None:
    """Print `text` (a warning to stderr) now, or, while a kernel is still starting (no request to
    answer, so nobody would see it), at the start of the first cell."""
    stream = "stderr" if warning else "stdout"

    def show() -> None:
        print(text, file=getattr(sys, stream))

    if getattr(shell, "kernel", None) is None or getattr(shell, "parent_header", None):
        show()
    else:
        on_next(shell, "pre_run_cell", show)


def on_next(shell: Any, event: str, callback: Callable[[], None]) -> None:
    """Call `callback` the next time IPython fires `event`, then never again."""

    def once(*_: Any) -> None:
        shell.events.unregister(event, once)
        callback()

    shell.events.register(event, once)


def startup_policy(
    edit_policy: Callable[[list[str], Policy], Policy], configured: list[str], profile_dir: str, shell: Any
) -> tuple[Policy | None, list[str]]:
    """The policy this kernel starts with (None: no source), and one-line warnings. `edit_policy` is
    the controller's (`Controller.edit_policy`), asked only when directives are configured."""
    persist.upgrade_startup_files(profile_dir)
    default_file = persist.default_path(profile_dir)
    connection = connection_file(shell)
    key = kernel_key(connection) if connection is not None else None
    pending_file = persist.pending_path(key) if key else None
    launch = os.environ.get(LAUNCH_WARNING_ENV, "").strip()
    if not (configured or _present(default_file) or os.environ.get(POLICY_ENV) or launch
            or (pending_file and _present(pending_file))):
        return None, []

    from ..language.policy import Policy

    policy: Policy | None = None
    warnings: list[str] = []

    def attempt(source: str, read: Callable[[], Policy | None]) -> None:
        nonlocal policy
        try:
            found = read()
        except (ValueError, OSError, RecursionError) as err:  # PolicyError is a ValueError
            warnings.append(f"ignoring the {source}: {err}")
            return
        if found is not None:
            policy = found

    if configured:
        attempt("configured default_policy", lambda: edit_policy(configured, Policy()))
    attempt("saved default", lambda: persist.read_policy(default_file))
    attempt("policy of this kernelspec", lambda: policy_from_env(os.environ))
    if key is not None:
        attempt("pending policy", lambda: persist.take_pending(key, connection_file=connection))
    if launch:
        warnings.append(launch.splitlines()[0][:300])
    return policy, warnings


def _present(path: Path) -> bool:
    """Something is at `path` (a dangling link or a FIFO too: reading it then gives the warning)."""
    return os.path.lexists(path)


def policy_from_env(environ: Any) -> Policy | None:
    """The policy a tfgpu kernelspec put in the environment; `PolicyError` if malformed."""
    from .. import safefile
    from ..language.policy import Policy

    raw = environ.get(POLICY_ENV)
    if not raw:
        return None
    return Policy.from_dict(safefile.loads(raw, POLICY_ENV))
