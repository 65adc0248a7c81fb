"""Text views: the `%tfgpu` status and the message after an edit or apply (pure formatting)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .cudaenv import parse_cuda_visible
from .plan import OUR_ENV
from .policy import ALL_GPUS, Policy
from .inventory import Inventory
from .runtime import ApplyReport, pending_changes, recorded_settings

if TYPE_CHECKING:
    from .controller import Controller

RESTART_HINT = "Run `%tfgpu restart` to restart the kernel with the policy in force."
SCRIPT_RESTART_HINT = "Start a new Python process and call configure() before TensorFlow is imported."


def describe_policy(policy: Policy) -> list[str]:
    """The policy as directive-like phrases, e.g. `growth on`, `limit 4096 MiB on all GPUs`."""
    parts = []
    if policy.visible is not None:
        parts.append(f"visible {','.join(policy.visible) or 'none'}")
    if policy.growth is not None:
        parts.append(f"growth {'on' if policy.growth else 'off'}")
    for gpu, mib in policy.limits:
        parts.append(f"limit {mib} MiB on {'all GPUs' if gpu == ALL_GPUS else 'GPU ' + gpu}")
    for gpu, sizes in policy.splits:
        parts.append(f"split GPU {gpu} into {' + '.join(f'{mib} MiB' for mib in sizes)}")
    if policy.cpu_devices is not None:
        parts.append(f"split cpu into {policy.cpu_devices} logical devices")
    if policy.allocator is not None:
        parts.append(f"allocator {policy.allocator}")
    for field, why in policy.sources:
        parts.append(f"({field}: {why})")
    return parts


def describe_report(report: ApplyReport, restart_hint: str = RESTART_HINT) -> str:
    """What an edit or apply did, in a few lines; names what is locked and how to get past it."""
    lines = []
    if report.locked:
        lines.append(
            "TensorFlow's runtime is already initialized in this process, so these settings cannot change now:"
            if report.state.initialized
            else "TensorFlow cannot change these settings in this process any more:"
        )
        lines += [f"  - {item}" for item in report.locked]
        lines.append("The policy is recorded. " + restart_hint)
    if report.failed:
        lines.append("TensorFlow refused part of the policy:")
        lines += [f"  - {item}" for item in report.failed]
    if report.applied:
        lines.append("Applied: " + "; ".join(report.applied))
    if report.failed or report.locked:
        if not report.applied:
            lines.append("Nothing else was applied.")
    elif report.waiting:
        lines.append("Recorded; the rest applies when TensorFlow is imported.")
    elif not report.applied:
        lines.append("Already in force.")
    lines += [f"Note: {note}" for note in report.notes]
    return "\n".join(lines)


def describe_status(controller: Controller) -> str:
    """The full `%tfgpu` status: TensorFlow state, desired policy, environment, what TF recorded."""
    state = controller.api.state()
    lines = [f"TensorFlow: {state.label}"]
    policy = describe_policy(controller.policy)
    lines.append("Policy: " + ("; ".join(policy) if policy else "none (TensorFlow defaults)"))
    env = [f"{name}={controller.environ[name]}" for name in OUR_ENV if name in controller.environ]
    lines.append("Environment: " + (", ".join(env) if env else f"none of {', '.join(OUR_ENV)} set"))
    inventory = controller.inventory()
    lines += describe_cuda_visible(controller.environ.get("CUDA_VISIBLE_DEVICES"), inventory)
    lines += describe_gpus(inventory)
    if state.imported:
        recorded = recorded_settings(controller.api)
        lines.append("TensorFlow recorded:" + ("" if recorded else " nothing yet (devices not listed)"))
        lines += [f"  {line}" for line in recorded]
    for title, items in pending_groups(controller):
        lines.append(f"{title}:")
        lines += [f"  - {item}" for item in items]
    lines += [f"Note: {note}" for note in controller.plan().notes]
    return "\n".join(lines)


def describe_cuda_visible(raw: str | None, inventory: Inventory) -> list[str]:
    """`CUDA_VISIBLE_DEVICES` resolved the way CUDA reads it (nothing when unset)."""
    if raw is None:
        return []
    parsed = parse_cuda_visible(raw, inventory.known_refs())
    if parsed.hides_all:
        return [f"CUDA_VISIBLE_DEVICES={raw!r} hides every GPU" + (f" (CUDA stops at {parsed.stopped_at!r})"
                                                                    if parsed.stopped_at else "")]
    stop = f"; CUDA stops at {parsed.stopped_at!r} and ignores the rest" if parsed.stopped_at else ""
    return [f"CUDA_VISIBLE_DEVICES={raw!r} → CUDA uses GPU {', '.join(parsed.entries)}{stop}"]


def describe_gpus(inventory: Inventory) -> list[str]:
    """Live memory per GPU and per process, nvidia-smi numbering; why there is no list if none."""
    if not inventory.available:
        return [f"GPUs: no NVML inventory ({inventory.error})"]
    if not inventory.gpus:
        return ["GPUs: NVML sees none"]
    lines = [f"GPUs (NVML, driver {inventory.driver_version}, nvidia-smi numbering):"]
    for gpu in inventory.gpus:
        busy = "" if gpu.utilization_pct is None else f", {gpu.utilization_pct}% busy"
        lines.append(
            f"  {gpu.index}  {gpu.name}  {_mib(gpu.memory_used_mib)} / {_mib(gpu.memory_total_mib)} MiB used"
            f"{busy}  {gpu.uuid}" + (f"  bus {gpu.pci_bus_id}" if gpu.pci_bus_id else "")
        )
        for mig in gpu.mig_devices:
            lines.append(f"       MIG {mig.uuid}  {_mib(mig.memory_total_mib)} MiB")
        for proc in gpu.processes:
            lines.append(f"       pid {proc.pid}: {_mib(proc.used_mib)} MiB{' (this kernel)' if proc.is_self else ''}")
    return lines


def _mib(value: int | None) -> str:
    return "?" if value is None else str(value)


def pending_groups(controller: Controller) -> list[tuple[str, list[str]]]:
    """Settings TensorFlow has not taken yet, as (title, descriptions) groups: those only a restart
    can make, and those `%tfgpu apply` still can. Empty before CUDA started (nothing to compare)."""
    state = controller.api.state()
    if not state.devices_listed:
        return []
    changes, _ = pending_changes(controller.plan(), controller.api)
    restart = [c.describe() for c in changes if state.initialized or c.needs_restart]
    apply = [c.describe() for c in changes if not (state.initialized or c.needs_restart)]
    groups = [("Pending, needs a restart", restart), ("Not applied yet (`%tfgpu apply`)", apply)]
    return [(title, items) for title, items in groups if items]
