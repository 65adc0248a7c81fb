"""`%tfgpu kernelspec NAME`: a user-level Jupyter kernel whose environment and startup carry the policy.

The kernel starts with the policy's environment variables already set and `--ext=tfgpu_magic`; the
extension reads the policy from `TFGPU_MAGIC_POLICY` when it loads, before any cell runs.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

from .errors import PolicyError
from .plan import build_plan
from .policy import Policy
from .startup import POLICY_ENV
from .status import describe_policy

MARKER = "tfgpu_magic"


def kernel_json(policy: Policy, display_name: str | None = None) -> dict:
    """The kernel.json of a kernel that starts with `policy` in force."""
    env = {name: value for name, value in build_plan(policy).env if value is not None}
    env[POLICY_ENV] = json.dumps(policy.to_dict(), separators=(",", ":"))
    summary = ", ".join(describe_policy(policy)) or "TensorFlow defaults"
    return {
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}", "--ext=tfgpu_magic"],
        "display_name": display_name or f"TensorFlow · {summary}",
        "language": "python",
        "env": env,
        "metadata": {MARKER: {"policy": policy.to_dict()}},
    }


def install(name: str, policy: Policy, display_name: str | None = None) -> str:
    """Install (or replace) the user kernelspec `name`; returns where it went."""
    from jupyter_client.kernelspec import KernelSpecManager, NoSuchKernel

    manager = KernelSpecManager()
    try:
        existing = manager.get_kernel_spec(name)
    except NoSuchKernel:
        existing = None
    if existing is not None and MARKER not in (existing.metadata or {}):
        raise PolicyError(f"kernelspec {name!r} exists and was not made by tfgpu_magic; choose another name")
    with tempfile.TemporaryDirectory() as tmp:
        spec = kernel_json(policy, display_name)
        (Path(tmp) / "kernel.json").write_text(json.dumps(spec, indent=2), encoding="utf-8")
        return manager.install_kernel_spec(tmp, kernel_name=name, user=True)


def remove(name: str) -> str:
    """Remove the kernelspec `name` if tfgpu_magic made it."""
    from jupyter_client.kernelspec import KernelSpecManager, NoSuchKernel

    manager = KernelSpecManager()
    try:
        spec = manager.get_kernel_spec(name)
    except NoSuchKernel:
        raise PolicyError(f"kernelspec {name!r} is not installed") from None
    if MARKER not in (spec.metadata or {}):
        raise PolicyError(f"kernelspec {name!r} was not made by tfgpu_magic; not removing it")
    return manager.remove_kernel_spec(name)
