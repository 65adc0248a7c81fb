"""`tfgpu-provisioner`: a kernel provisioner that resolves a kernelspec's policy at every launch.

A kernelspec names it in `metadata.kernel_provisioner` (jupyter_client ≥ 7 looks it up in the entry
point group `jupyter_client.kernel_provisioners`), with a `config` of `policy` (a policy dict) and
`visible` (`"auto"` or `"auto:N"`, or absent). Every front end that starts kernels through
jupyter_client's `KernelManager` uses it: JupyterLab's launcher, `jupyter console --kernel NAME`,
nbclient/papermill `-k NAME`, JupyterHub single-user servers. `visible auto[:N]` picks the freest
GPUs when the kernel is launched (not when the spec was written), through a reservation in the
runtime dir so simultaneous launches spread out (`gpus.reservations`). The kernel gets the plan's
environment and the policy in `startup.POLICY_ENV`, so the extension applies it before the first cell.
Without NVML the kernel starts anyway, with every GPU visible, and a one-line warning in
`WARNING_ENV` for its first cell.
"""

from __future__ import annotations

import asyncio
import json
import os
from typing import Any

from jupyter_client.provisioning import LocalProvisioner
from traitlets import Dict, Unicode

from ..errors import PolicyError
from ..gpus import inventory as gpu_inventory
from ..gpus import reservations
from ..language.grammar import parse_count
from ..language.policy import Policy
from ..tf.envvars import CUDA_VISIBLE_DEVICES
from ..tf.plan import build_plan
from . import persist
from .startup import LAUNCH_WARNING_ENV as WARNING_ENV
from .startup import POLICY_ENV

NAME = "tfgpu-provisioner"
PLACED_ENV = "TFGPU_MAGIC_PLACED"
"""Which GPUs `visible auto` gave the kernel, and why (for the status and `who`)."""
INHERITS = "the kernel starts with the GPUs it inherits"
NO_INVENTORY = "visible auto: no GPU inventory at launch ({error}); " + INHERITS
NO_RESERVATION = "visible auto: could not record the pick in the runtime dir ({error}); " + INHERITS
TOO_FEW = "visible auto:{count}: only {found} GPU(s) here; " + INHERITS
NOT_GRANTED = ("visible auto: the launch environment sets CUDA_VISIBLE_DEVICES={value!r}, which names GPUs "
               "the inventory does not list; the kernel keeps that setting")


def provisioner_metadata(policy: Policy, visible: str | None = None) -> dict[str, Any]:
    """The `metadata.kernel_provisioner` stanza of a kernelspec for `policy` (`visible`: `auto[:N]`)."""
    config: dict[str, Any] = {"policy": policy.to_dict()}
    if visible is not None:
        auto_count(visible)
        config["visible"] = visible
    return {"provisioner_name": NAME, "config": config}


def auto_count(word: str) -> int:
    """N of `auto[:N]`; `PolicyError` for anything else."""
    word = word.strip().lower()
    if word != "auto" and not word.startswith("auto:"):
        raise PolicyError(f"provisioner config 'visible' must be auto or auto:N, not {word!r}")
    return parse_count(word.partition(":")[2] or "1", "visible auto:N")


def granted_gpus(found: gpu_inventory.Inventory, inherited: str | None) -> gpu_inventory.Inventory | None:
    """The inventory narrowed to the GPUs `CUDA_VISIBLE_DEVICES=inherited` grants (all of it when
    unset); None where an entry names no GPU of the inventory (a MIG instance, a renumbered grant)."""
    if inherited is None:
        return found
    wanted = [entry.strip() for entry in inherited.split(",") if entry.strip()]
    by_ref = {gpu.ref: gpu for gpu in found.gpus} | {gpu.uuid: gpu for gpu in found.gpus}
    if not all(entry in by_ref for entry in wanted):
        return None
    return found._replace(gpus=tuple(dict.fromkeys(by_ref[entry] for entry in wanted)))


def read_inventory() -> gpu_inventory.Inventory:
    """A fresh inventory (not the status's cache): the pick must see this moment."""
    return gpu_inventory.read_inventory()


class TFGPUProvisioner(LocalProvisioner):  # type: ignore[misc]  (jupyter_client is untyped)
    """`LocalProvisioner` that resolves the tfgpu policy in `pre_launch` (module docstring)."""

    policy = Dict(config=True, help="The kernel's policy, as `Policy.to_dict()` gives it.")
    visible = Unicode(None, allow_none=True, config=True, help="`auto` or `auto:N`: pick GPUs at launch.")

    _reservation: reservations.Reservation | None = None
    _resolved: Policy | None = None
    _warning: str | None = None

    def resolve(self, inherited_visible: str | None = None) -> tuple[Policy, str | None]:
        """The policy in force for this launch, and a warning for the first cell. A restart keeps the
        GPUs of the first launch (the kernel's pending policy, if any, comes on top).

        `inherited_visible`: `CUDA_VISIBLE_DEVICES` of the launching environment. Where a scheduler
        (Slurm, a Kubernetes device plugin) granted GPUs that way, `auto` picks among them only; an
        entry that names no GPU of the inventory leaves the grant as it is."""
        if self._resolved is not None:
            return self._resolved, self._warning
        policy = Policy.from_dict(self.policy) if self.policy else Policy()
        warning = None
        if self.visible:
            count = auto_count(self.visible)
            found = read_inventory()
            granted = granted_gpus(found, inherited_visible) if found.available else None
            if not found.available:
                warning = NO_INVENTORY.format(error=found.error)
            elif granted is None:
                warning = NOT_GRANTED.format(value=inherited_visible)
            elif len(granted.gpus) < count:
                warning = TOO_FEW.format(count=count, found=len(granted.gpus))
            else:
                try:
                    self._reservation = reservations.reserve(self._key(), count, granted, persist.runtime_dir())
                except (OSError, PolicyError) as err:  # an odd runtime dir must not stop the kernel
                    warning = NO_RESERVATION.format(error=err)
            if warning is not None or self._reservation is None:  # every GPU stays visible, with the warning
                policy = policy.edited(visible=None)
            else:
                policy = policy.edited(visible=self._reservation.gpus, sources=(("visible", self._reservation.why),))
        policy.validate()
        self._resolved, self._warning = policy, warning
        return policy, warning

    def _key(self) -> str:
        return str(self.kernel_id or id(self))

    async def pre_launch(self, **kwargs: Any) -> dict[str, Any]:
        # NVML and the reservation lock may take seconds: off the server's event loop, which must
        # keep answering every other request meanwhile
        inherited = (kwargs.get("env") or os.environ).get(CUDA_VISIBLE_DEVICES)
        policy, warning = await asyncio.to_thread(self.resolve, inherited)
        kwargs = await super().pre_launch(**kwargs)
        env = kwargs["env"]
        for name, value in build_plan(policy).env:
            if value is None:
                env.pop(name, None)
            else:
                env[name] = value
        env[POLICY_ENV] = json.dumps(policy.to_dict(), separators=(",", ":"))
        for name, value in ((WARNING_ENV, warning), (PLACED_ENV, self._reservation.why if self._reservation else None)):
            if value:
                env[name] = value
            else:
                env.pop(name, None)
        return kwargs

    async def post_launch(self, **kwargs: Any) -> None:
        await super().post_launch(**kwargs)
        if self._reservation is not None:
            try:
                await asyncio.to_thread(reservations.set_kernel_pid, self._reservation, self.pid)
            except (OSError, PolicyError):  # the record stays as it was; cleanup still removes it
                pass

    async def cleanup(self, restart: bool = False) -> None:
        await super().cleanup(restart=restart)
        if not restart:
            self._release()

    async def shutdown_requested(self, restart: bool = False) -> None:
        await super().shutdown_requested(restart=restart)
        if not restart:
            self._release()

    def _release(self) -> None:
        if self._reservation is not None:
            reservations.release(self._reservation.kernel_id, self._reservation.path.parent)
            self._reservation = None
        self._resolved = None
