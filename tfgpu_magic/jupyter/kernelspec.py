"""`%tfgpu kernelspec NAME`: a user-level Jupyter kernel whose environment and startup carry the policy.

The kernel starts with the policy's environment variables already set and `--ext=tfgpu_magic`; the
extension reads the policy from `TFGPU_MAGIC_POLICY` when it loads, before any cell runs.

A kernelspec folder is this project's only if it holds nothing but a `kernel.json` carrying our
marker: anything else under that name (a user's notes, another tool's kernel, a malformed file) is
never replaced or removed. jupyter_client's own install/remove wipe the whole folder, so the file is
written here, atomically, and removal deletes only that one file and the then-empty folder.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import PolicyError
from ..plan import build_plan
from ..language.policy import Policy
from ..safefile import read_json, write_atomic
from ..language.directives import describe_policy
from .startup import POLICY_ENV

if TYPE_CHECKING:
    from jupyter_client.kernelspec import KernelSpecManager

MARKER = "tfgpu_magic"
SPEC_FILE = "kernel.json"
SPEC_BYTES = 1 << 20
"""Largest kernel.json read when deciding whether a folder is ours (ours are a few KiB)."""


def kernel_json(policy: Policy, display_name: str | None = None, slurm: str | None = None) -> dict:
    """The kernel.json of a kernel that starts with `policy` in force. A `visible auto[:N]` pick is
    not frozen into the spec: the provisioner picks the freest GPUs again at every launch. With
    `slurm` (sbatch options, `slurm_args`), the kernel runs as a Slurm job (`slurm_provisioner`),
    whose GPUs Slurm grants: N of `visible auto:N` or the options' own GPU request, not both."""
    from .provisioner import provisioner_metadata

    auto = f"auto:{len(policy.visible or ())}" if policy.picked_automatically else None
    fixed = policy.edited(visible=None, sources=()) if auto else policy
    env = {name: value for name, value in build_plan(fixed).env if value is not None}
    env[POLICY_ENV] = json.dumps(fixed.to_dict(), separators=(",", ":"))
    summary = ", ".join(describe_policy(fixed) + ([f"visible {auto}"] if auto else [])) or "TensorFlow defaults"
    ours: dict = {"policy": fixed.to_dict(), **({"visible": auto} if auto else {})}
    provisioner = provisioner_metadata(fixed, auto)
    if slurm is not None:
        provisioner = slurm_metadata(fixed, auto, slurm)
        ours["slurm"] = provisioner["config"]["slurm"]
        summary = f"Slurm · {summary}"
    return {
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}", "--ext=tfgpu_magic"],
        "display_name": display_name or f"TensorFlow · {summary}",
        "language": "python",
        "env": env,
        "metadata": {MARKER: ours, "kernel_provisioner": provisioner},
    }


def slurm_metadata(policy: Policy, auto: str | None, slurm: str) -> dict:
    """The `kernel_provisioner` stanza of a Slurm kernel; `PolicyError` for options that do not pass
    (`slurm_args`), a fixed `visible` list (Slurm grants the GPUs) or a GPU count given twice."""
    from .slurm_args import gpu_request, parse_slurm_args
    from .slurm_provisioner import NAME

    args = parse_slurm_args(slurm)
    if policy.visible is not None:
        raise PolicyError("--slurm: Slurm grants the job's GPUs, so the policy cannot name them (visible "
                          f"{','.join(policy.visible)}); ask for a count: visible auto:N or --gres=gpu:N")
    if auto is not None and gpu_request(args).count is not None:
        raise PolicyError(f"--slurm: the policy asks for visible {auto} and the options for GPUs too; give the count once")
    config: dict = {"policy": policy.to_dict(), "slurm": list(args), **({"visible": auto} if auto else {})}
    return {"provisioner_name": NAME, "config": config}


def install(name: str, policy: Policy, display_name: str | None = None, slurm: str | None = None) -> str:
    """Install (or replace) our user kernelspec `name` (a Slurm job's with `slurm`, sbatch options);
    returns where it went."""
    from jupyter_client.kernelspec import NATIVE_KERNEL_NAME

    manager = _manager()
    destination = Path(manager.user_kernel_dir, name)
    if name == NATIVE_KERNEL_NAME:
        raise PolicyError(f"kernelspec {name!r} is Jupyter's standard Python kernel; choose another name")
    namesake = _namesake(manager, name)
    if namesake:
        raise PolicyError(f"Jupyter already has a kernelspec {name!r} in {namesake}; choose another name")
    text = json.dumps(kernel_json(policy, display_name, slurm), indent=2)
    if os.path.lexists(destination):
        _check_ours(destination, name, "choose another name")
        write_atomic(destination / SPEC_FILE, text, mode=0o644)
        return str(destination)
    destination.parent.mkdir(parents=True, exist_ok=True)
    try:
        destination.mkdir()  # claims the name: fails, rather than replaces, if it appeared meanwhile
    except FileExistsError:
        raise PolicyError(f"kernelspec {name!r}: {destination} appeared meanwhile; nothing written") from None
    try:
        write_atomic(destination / SPEC_FILE, text, mode=0o644)
    except BaseException:
        with contextlib.suppress(OSError):
            destination.rmdir()  # the folder we just made, still empty
        raise
    return str(destination)


def remove(name: str) -> str:
    """Remove our user kernelspec `name`; returns the folder removed."""
    manager = _manager()
    destination = Path(manager.user_kernel_dir, name)
    if not os.path.lexists(destination):
        namesake = _namesake(manager, name)
        if namesake:
            raise PolicyError(
                f"kernelspec {name!r} is in {namesake}, not in {destination.parent}; tfgpu_magic removes only its own"
            )
        raise PolicyError(f"kernelspec {name!r} is not installed")
    _check_ours(destination, name, "not removing it")
    (destination / SPEC_FILE).unlink()
    destination.rmdir()  # empty now: `_check_ours` saw nothing else in it
    return str(destination)


def _manager() -> KernelSpecManager:
    """jupyter_client's view of the kernelspec folders (JUPYTER_DATA_DIR, JUPYTER_PATH, ... honoured)."""
    from jupyter_client.kernelspec import KernelSpecManager

    return KernelSpecManager()


def _check_ours(folder: Path, name: str, refusal: str) -> None:
    """`PolicyError` unless `folder` is a kernelspec this project wrote."""
    reason = _not_ours(folder)
    if reason:
        raise PolicyError(f"kernelspec {name!r}: {folder} was not made by tfgpu_magic ({reason}); {refusal}")


def _not_ours(folder: Path) -> str | None:
    """Why `folder` is not ours (a real folder holding only a kernel.json with our marker); None if it is."""
    if folder.is_symlink():
        return "it is a symbolic link"
    if not folder.is_dir():
        return "it is not a folder"
    entries = sorted(os.listdir(folder))
    others = [entry for entry in entries if entry != SPEC_FILE]
    if others:
        shown = ", ".join(repr(entry)[:40] for entry in others[:3])
        return f"it holds {shown}" + (f" and {len(others) - 3} more" if len(others) > 3 else "")
    path = folder / SPEC_FILE
    if not entries:
        return f"it has no {SPEC_FILE}"
    if path.is_symlink():
        return f"its {SPEC_FILE} is a symbolic link"
    try:
        spec = read_json(path, SPEC_BYTES)
    except PolicyError as err:
        return str(err)
    metadata = spec.get("metadata") if isinstance(spec, dict) else None
    if not isinstance(metadata, dict) or not isinstance(metadata.get(MARKER), dict):
        return f"its {SPEC_FILE} has no {MARKER} marker"
    return None


def _namesake(manager: KernelSpecManager, name: str) -> Path | None:
    """Another kernelspec folder than our user folder that Jupyter finds under `name` (in JUPYTER_PATH,
    the environment's or the system's share/jupyter, IPython's kernels, or the user folder under
    another case): one of the two would hide the other."""
    user_dir = os.path.realpath(manager.user_kernel_dir)
    for kernel_dir in manager.kernel_dirs:
        try:
            entries = os.listdir(kernel_dir)
        except OSError:
            continue  # missing or unreadable: Jupyter finds nothing there either
        same_dir = os.path.realpath(kernel_dir) == user_dir
        for entry in entries:
            path = Path(kernel_dir, entry)
            # Jupyter's own test for a kernelspec: a folder with a regular kernel.json, names compared lower-case
            if entry.lower() == name and not (same_dir and entry == name) and (path / SPEC_FILE).is_file():
                return path
    return None
