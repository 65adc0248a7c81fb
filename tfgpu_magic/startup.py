"""What a kernel starts with: the policy `%load_ext` applies before any cell runs.

Sources, later ones replacing earlier ones: the `default_policy` config, the saved default
(`%tfgpu default save`), a tfgpu kernelspec's environment, a pending restart of this very kernel.
This module is on the `%load_ext` path: it checks cheaply whether any source exists and imports
the policy machinery only then.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from . import persist
from .errors import PolicyError

if TYPE_CHECKING:
    from .controller import Controller
    from .policy import Policy

POLICY_ENV = "TFGPU_MAGIC_POLICY"
"""Environment variable through which a tfgpu kernelspec hands its policy to the kernel."""


def current_kernel_id(shell: Any) -> str | None:
    """This kernel's id (from its connection file's name `kernel-<id>.json`), None outside a kernel."""
    if getattr(shell, "kernel", None) is None:
        return None
    try:
        from ipykernel.connect import get_connection_file

        connection_file = get_connection_file()
    except (ImportError, RuntimeError, OSError):
        return None
    name = Path(connection_file).name
    if not (name.startswith("kernel-") and name.endswith(".json")):
        return None
    return name[len("kernel-") : -len(".json")]


def load_if_pending(shell: Any) -> None:
    """Run from the profile's startup file (see `persist.set_pending_startup`): load the extension in
    a kernel that a `%tfgpu restart` left a pending policy for, before any cell runs."""
    kernel_id = current_kernel_id(shell)
    if kernel_id is not None and persist.pending_path(kernel_id).exists():
        shell.run_line_magic("load_ext", "tfgpu_magic")


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
    controller_factory: Callable[[], Controller], configured: list[str], profile_dir: str, shell: Any
) -> tuple[Policy | None, list[str]]:
    """The policy this kernel starts with (None: no source), and one-line warnings."""
    default_file = persist.default_path(profile_dir)
    kernel_id = current_kernel_id(shell)
    pending_file = persist.pending_path(kernel_id) if kernel_id else None
    if not (configured or default_file.exists() or os.environ.get(POLICY_ENV) or (pending_file and pending_file.exists())):
        return None, []

    from .policy import Policy

    policy: Policy | None = None
    warnings: list[str] = []

    def attempt(source: str, read: Callable[[], Policy | None]) -> None:
        nonlocal policy
        try:
            found = read()
        except (PolicyError, OSError) as err:
            warnings.append(f"ignoring the {source}: {err}")
            return
        if found is not None:
            policy = found

    if configured:
        attempt("configured default_policy", lambda: controller_factory().edit_policy(configured, Policy()))
    attempt("saved default", lambda: persist.read_policy(default_file))
    attempt("policy of this kernelspec", lambda: policy_from_env(os.environ))
    if kernel_id is not None:
        attempt("pending policy", lambda: persist.take_pending(kernel_id))
    return policy, warnings


def policy_from_env(environ: Any) -> Policy | None:
    """The policy a tfgpu kernelspec put in the environment; `PolicyError` if malformed."""
    import json

    from .policy import Policy

    raw = environ.get(POLICY_ENV)
    if not raw:
        return None
    try:
        return Policy.from_dict(json.loads(raw))
    except json.JSONDecodeError as err:
        raise PolicyError(f"{POLICY_ENV} is not valid JSON: {err}") from None
