"""`tfgpu-provisioner`: a kernel provisioner that resolves a kernelspec's policy at every launch.

A kernelspec names it in `metadata.kernel_provisioner` (jupyter_client ≥ 7 looks it up in the entry
point group `jupyter_client.kernel_provisioners`), with a `config` of `policy` (a policy dict) and
`visible` (`"auto"` or `"auto:N"`, or absent). Every front end that starts kernels through
jupyter_client's `KernelManager` uses it: JupyterLab's launcher, `jupyter console --kernel NAME`,
nbclient/papermill `-k NAME`, JupyterHub single-user servers. `visible auto[:N]` picks the freest
GPUs when the kernel is launched (not when the spec was written), through a reservation in the
runtime dir so simultaneous launches spread out (`gpus.reservations`). The kernel gets the plan's
environment and the policy in `startup.POLICY_ENV`, so the extension applies it before the first cell.
A notebook started through a Jupyter server can carry its own policy (`notebook_request`): its lines
edit the kernelspec's policy for that kernel.
Without NVML the kernel starts anyway, with every GPU visible, and a one-line warning in
`WARNING_ENV` for its first cell.

Like jupyter_client's `LocalProvisioner` (its pid, pgid and ip), the provisioner hands its state to
`get_provisioner_info` and takes it back in `load_provisioner_info`: a manager that saves provisioner
info (a server that keeps its kernels across its own restart) restores the pick, so a restart keeps
the kernel's GPUs and the kernel's end still removes its reservation.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
from pathlib import Path
from typing import Any, Mapping

from jupyter_client.provisioning import LocalProvisioner
from traitlets import Dict, Unicode

from ..errors import PolicyError
from ..gpus import inventory as gpu_inventory
from ..gpus import reservations
from ..language.grammar import parse_count
from ..language.policy import Policy
from ..gpus.cudaenv import grant_of
from ..envvars import CUDA_DEVICE_ORDER, CUDA_VISIBLE_DEVICES
from ..plan import build_plan
from . import persist
from .notebook_request import NotebookRequest, apply_lines, read_request, refusal_line
from .startup import LAUNCH_WARNING_ENV as WARNING_ENV
from .startup import POLICY_ENV

NAME = "tfgpu-provisioner"
PLACED_ENV = "TFGPU_MAGIC_PLACED"
"""Which GPUs `visible auto` gave the kernel, and why (for the status and `who`)."""
INHERITS = "the kernel starts with the GPUs it inherits"
NO_INVENTORY = "visible auto: no GPU inventory at launch ({error}); " + INHERITS
NO_RESERVATION = "visible auto: could not record the pick in the runtime dir ({error}); " + INHERITS
TOO_FEW = "visible auto:{count}: {scope}; " + INHERITS
NOT_GRANTED = ("visible auto: the launch environment sets CUDA_VISIBLE_DEVICES={value!r}, which names GPUs "
               "the inventory cannot place (a GPU it does not list, or indices in CUDA's default order, which is "
               "not nvidia-smi's: CUDA_DEVICE_ORDER=PCI_BUS_ID makes them so); the kernel keeps that setting")
INFO_KEY = "tfgpu"
"""The key of the pick in `get_provisioner_info()` (beside jupyter_client's own keys)."""


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


def granted_gpus(found: gpu_inventory.Inventory, inherited: str | None, order: str | None = None,
                 environ: Mapping[str, str] | None = None) -> gpu_inventory.Inventory | None:
    """The inventory narrowed to what `CUDA_VISIBLE_DEVICES=inherited` (with `CUDA_DEVICE_ORDER=order`)
    grants in the launching environment `environ` (a Slurm job's record), as `gpus.cudaenv.Grant.devices`
    gives it (all of it when unset); None where an entry cannot be placed on the inventory's cards."""
    if inherited is None:
        return found
    devices = grant_of(inherited, order, found, environ).devices(found)
    return None if devices is None else found._replace(gpus=devices)


def with_request(policy: Policy, count: int | None,
                 request: NotebookRequest | None) -> tuple[Policy, int | None, str | None]:
    """The kernelspec's `policy` and `visible auto:N` (`count`) edited by the notebook's `request`,
    and the notebook's refusal (then both as they were)."""
    if request is None or request.refusal is not None or not request.lines:
        return policy, count, None if request is None else request.refusal
    try:
        edited, count_after = apply_lines(request.lines, policy, count)
    except PolicyError as err:  # lines fine alone, contradicting the kernelspec's policy
        return policy, count, refusal_line(request.source or "", f"on top of the kernelspec's policy, {err}")
    return edited, count_after, None


def put_policy(env: dict[str, str], policy: Policy, warning: str | None, placed: str | None) -> None:
    """Write `policy` into a kernel's launch environment `env`: the plan's variables (a grant by index
    in `env` keeps its order), `POLICY_ENV` for the extension, and `WARNING_ENV`/`PLACED_ENV` for the
    first cell (removed where None). `TFGPUProvisioner.pre_launch` calls it, for the Slurm provisioner
    (`slurm_provisioner`, its subclass) too."""
    for name, value in build_plan(policy, env.get(CUDA_VISIBLE_DEVICES)).env:
        if value is None:
            env.pop(name, None)
        else:
            env[name] = value
    env[POLICY_ENV] = json.dumps(policy.to_dict(), separators=(",", ":"))
    for name, value in ((WARNING_ENV, warning), (PLACED_ENV, placed)):
        if value:
            env[name] = value
        else:
            env.pop(name, None)


def read_inventory() -> gpu_inventory.Inventory:
    """A fresh inventory (not the status's cache): the pick must see this moment."""
    return gpu_inventory.read_inventory()


Pick = tuple[Policy | None, str | None, reservations.Reservation | None]
"""What a launch resolved: the policy in force (None: not resolved yet), its warning, the reservation."""


def pick_info(pick: Pick) -> dict[str, Any]:
    """`pick` as JSON-ready values for `get_provisioner_info` (the reservation without its path: its
    folder, the name follows from the kernel id)."""
    policy, warning, reservation = pick
    saved = None
    if reservation is not None:
        saved = {name: value for name, value in dataclasses.asdict(reservation).items() if name != "path"}
        saved.update(gpus=list(reservation.gpus), directory=str(reservation.path.parent))
    return {"policy": None if policy is None else policy.to_dict(), "warning": warning, "reservation": saved}


def pick_from_info(info: Any) -> Pick:
    """The inverse of `pick_info`; `PolicyError` for anything it would not have written. The record's
    path is rebuilt from the kernel id (`reservations.path_for`), so saved info names no other file."""
    if not isinstance(info, dict) or not {"policy", "warning", "reservation"} <= set(info):
        raise PolicyError(f"provisioner info {INFO_KEY!r} must be an object with policy, warning and reservation")
    policy = None if info["policy"] is None else Policy.from_dict(info["policy"])
    warning, saved = info["warning"], info["reservation"]
    if warning is not None and not isinstance(warning, str):
        raise PolicyError(f"provisioner info {INFO_KEY!r}: the warning must be a string or null")
    if saved is None:
        return policy, warning, None
    types = {"kernel_id": (str,), "gpus": (list,), "why": (str,), "launcher_pid": (int,),
             "kernel_pid": (int, type(None)), "created": (int, float), "directory": (str,)}
    wrong = not isinstance(saved, dict) or set(saved) != set(types) or any(
        not isinstance(saved[name], kinds) or isinstance(saved[name], bool) for name, kinds in types.items())
    if wrong or not all(isinstance(gpu, str) for gpu in saved["gpus"]):
        raise PolicyError(f"provisioner info {INFO_KEY!r}: the reservation is not one this provisioner saved")
    reservation = reservations.Reservation(
        saved["kernel_id"], tuple(saved["gpus"]), saved["why"], saved["launcher_pid"], saved["kernel_pid"],
        float(saved["created"]), reservations.path_for(saved["kernel_id"], Path(saved["directory"])))
    return policy, warning, reservation


class TFGPUProvisioner(LocalProvisioner):  # type: ignore[misc]  (jupyter_client is untyped)
    """`LocalProvisioner` that resolves the tfgpu policy in `pre_launch` (module docstring)."""

    policy = Dict(config=True, help="The kernel's policy, as `Policy.to_dict()` gives it.")
    visible = Unicode(None, allow_none=True, config=True, help="`auto` or `auto:N`: pick GPUs at launch.")

    _reservation: reservations.Reservation | None = None
    _resolved: Policy | None = None
    _warning: str | None = None

    def resolve(self, inherited_visible: str | None = None, inherited_order: str | None = None,
                request: NotebookRequest | None = None,
                environ: Mapping[str, str] | None = None) -> tuple[Policy, str | None]:
        """The policy in force for this launch, and a warning for the first cell. A restart keeps the
        GPUs of the first launch (the kernel's pending policy, if any, comes on top).

        `request`: the policy the notebook carries (`notebook_request`); its lines edit the
        kernelspec's policy, later ones winning (the notebook's `visible auto:N` replaces the spec's
        `visible`). A notebook the grammar refuses, alone or on top of the spec's policy, is left out
        with its one-line refusal as the warning. Colab's `accelerator: "GPU"` asks `visible auto:1`
        only where there is an inventory: without NVML it is dropped without a warning.

        `inherited_visible`, `inherited_order`: `CUDA_VISIBLE_DEVICES` and `CUDA_DEVICE_ORDER` of the
        launching environment. Where a scheduler (Slurm, a Kubernetes device plugin) granted GPUs that
        way, `auto` picks among them only (`gpus.cudaenv.Grant`, as the magic's `visible auto`); an
        entry the inventory cannot place leaves the grant as it is. `environ`: the launching
        environment, for what it says of the grant (a Slurm job's record)."""
        if self._resolved is not None:
            return self._resolved, self._warning
        policy = Policy.from_dict(self.policy) if self.policy else Policy()
        count = auto_count(self.visible) if self.visible else None
        policy, count, refusal = with_request(policy, count, request)
        policy, warning = self._place_gpus(policy, count, request, refusal, inherited_visible, inherited_order, environ)
        policy.validate()
        warning = "; ".join(filter(None, (refusal, warning))) or None
        self._resolved, self._warning = policy, warning
        return policy, warning

    def _place_gpus(self, policy: Policy, count: int | None, request: NotebookRequest | None, refusal: str | None,
                    inherited_visible: str | None, inherited_order: str | None,
                    environ: Mapping[str, str] | None) -> tuple[Policy, str | None]:
        """`policy` with the GPUs this launch gets (`count`: N of the `visible auto:N` in force, the
        notebook's `request` and its `refusal` applied), and a warning for the first cell: here, a pick
        among this host's GPUs (`resolve`). The Slurm provisioner leaves the GPUs to the job's grant."""
        warning = None
        if count:
            found = read_inventory()
            granted = granted_gpus(found, inherited_visible, inherited_order, environ) if found.available else None
            if not found.available and request is not None and request.from_accelerator:
                count = None  # a Colab notebook opened where there is no NVIDIA GPU: nothing to say
            elif not found.available:
                warning = NO_INVENTORY.format(error=found.error)
            elif granted is None:
                warning = NOT_GRANTED.format(value=inherited_visible)
            elif len(granted.gpus) < count:
                scope = (grant_of(inherited_visible).words() if inherited_visible is not None
                         else f"only {len(granted.gpus)} GPU(s) here")
                warning = TOO_FEW.format(count=count, scope=scope)
            else:
                try:
                    self._reservation = reservations.reserve(self._key(), count, granted, persist.runtime_dir())
                except (OSError, PolicyError) as err:  # an odd runtime dir must not stop the kernel
                    warning = NO_RESERVATION.format(error=err)
            if warning is not None or self._reservation is None:  # every GPU stays visible, with the warning
                policy = policy.edited(visible=None)
            else:
                policy = policy.edited(visible=self._reservation.gpus, sources=(("visible", self._reservation.why),))
        return policy, warning

    def _key(self) -> str:
        return str(self.kernel_id or id(self))

    async def pre_launch(self, **kwargs: Any) -> dict[str, Any]:
        """Perform any steps in preparation for kernel process launch: `LocalProvisioner`'s (the
        connection file, ports), then the policy resolved for this launch (`resolve`, with the policy
        the notebook carries: `notebook_request`, read at the first launch only) into the kernel's
        environment: the plan's variables, `POLICY_ENV`, `WARNING_ENV` and `PLACED_ENV`."""
        # NVML and the reservation lock may take seconds: off the server's event loop, which must
        # keep answering every other request meanwhile
        launching = kwargs.get("env") or os.environ
        request = None if self._resolved is not None else await asyncio.to_thread(read_request, launching, kwargs.get("cwd"))
        policy, warning = await asyncio.to_thread(self.resolve, launching.get(CUDA_VISIBLE_DEVICES),
                                                  launching.get(CUDA_DEVICE_ORDER), request, launching)
        kwargs = await super().pre_launch(**kwargs)
        put_policy(kwargs["env"], policy, warning, self._reservation.why if self._reservation else None)
        return kwargs

    async def post_launch(self, **kwargs: Any) -> None:
        """Perform any steps following the kernel process launch: the reservation records the
        kernel's pid (the kernel's end then frees it even if nothing calls `cleanup`)."""
        await super().post_launch(**kwargs)
        if self._reservation is not None:
            try:
                await asyncio.to_thread(reservations.set_kernel_pid, self._reservation, self.pid)
            except (OSError, PolicyError):  # the record stays as it was; cleanup still removes it
                pass

    async def cleanup(self, restart: bool = False) -> None:
        """Clean up the resources used by the provisioner (`LocalProvisioner`'s cached ports) and,
        unless the kernel restarts, its reservation; a restart keeps the pick."""
        await super().cleanup(restart=restart)
        if not restart:
            self._release()

    async def shutdown_requested(self, restart: bool = False) -> None:
        """The kernel's shutdown was requested: unless it restarts, its GPUs are free for the next
        launch now, not only once the process has gone."""
        await super().shutdown_requested(restart=restart)
        if not restart:
            self._release()

    async def get_provisioner_info(self) -> dict[str, Any]:
        """Captures the base information necessary for persistence relative to this instance
        (`LocalProvisioner`'s pid, pgid and ip), and the pick under `INFO_KEY`: the policy resolved at
        launch, its warning and the reservation, as JSON-ready values."""
        info = await super().get_provisioner_info()
        info[INFO_KEY] = pick_info((self._resolved, self._warning, self._reservation))
        return info

    async def load_provisioner_info(self, provisioner_info: dict) -> None:
        """Loads the base information necessary for persistence relative to this instance, and the
        pick: a restart keeps the GPUs of the first launch, and `cleanup` removes its reservation.
        The reservation's record then names this process as its launcher (the one that saved the
        info, a server since restarted, is gone: `reservations` would count the kernel as ended and
        give its GPUs to the next launch). Info without a pick (saved by `LocalProvisioner`, or an
        older tfgpu_magic) or with one this provisioner would not write leaves the next launch to
        pick again; the latter is logged."""
        await super().load_provisioner_info(provisioner_info)
        if INFO_KEY not in provisioner_info:
            return
        try:
            self._resolved, self._warning, self._reservation = pick_from_info(provisioner_info[INFO_KEY])
        except PolicyError as err:
            self.log.warning("%s: %s; the next launch picks again", NAME, err)
            return
        if self._reservation is not None:
            await asyncio.to_thread(self._adopt)

    def _adopt(self) -> None:
        """Record this process as the reservation's launcher (and the kernel's pid, if known)."""
        assert self._reservation is not None
        self._reservation = dataclasses.replace(self._reservation, launcher_pid=os.getpid(),
                                                kernel_pid=self._reservation.kernel_pid or self.pid)
        try:
            reservations.set_kernel_pid(self._reservation, self._reservation.kernel_pid)
        except (OSError, PolicyError):  # the record stays as it was; cleanup still removes it
            pass

    def _release(self) -> None:
        if self._reservation is not None:
            reservations.release(self._reservation.kernel_id, self._reservation.path.parent)
            self._reservation = None
        self._resolved = None
