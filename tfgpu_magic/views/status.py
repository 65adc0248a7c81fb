"""Text views: the `%tfgpu` status and the message after an edit or apply (pure formatting)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..gpus.cudaenv import parse_cuda_visible
from ..tf.plan import OUR_ENV
from ..language.policy import ALL_GPUS, Policy, quote
from ..gpus.inventory import Inventory
from ..tf.runtime import ApplyReport, pending_changes, recorded_settings

if TYPE_CHECKING:
    from ..controller import Controller

RESTART_HINT = "Run `%tfgpu restart` to restart the kernel with the policy in force."
TERMINAL_RESTART_HINT = (
    "Restart IPython to get it: run `%tfgpu default save` first so the new session starts with this "
    "policy, or run these directives there before importing TensorFlow."
)
SCRIPT_RESTART_HINT = "Start a new Python process and call configure() before TensorFlow is imported."
RECORDED = "Recorded; the rest applies when TensorFlow is imported."
NOT_IMPORTED = "Nothing to apply yet: TensorFlow is not imported; the policy applies at `import tensorflow`."
LABEL_WIDTH = len("TensorFlow: ")
"""The status is label / value lines, values aligned."""


def restart_hint(shell: Any) -> str:
    """How to get a locked setting in force: a kernel can restart itself, terminal IPython cannot."""
    return RESTART_HINT if getattr(shell, "kernel", None) is not None else TERMINAL_RESTART_HINT


def describe_policy(policy: Policy) -> list[str]:
    """The policy as directive-like phrases, e.g. `growth on`, `limit 4096 MiB on all GPUs`."""
    parts = []
    if policy.visible is not None:
        parts.append(f"visible {','.join(policy.visible) or 'none'}")
    if policy.growth is not None:
        parts.append(f"growth {'on' if policy.growth else 'off'}")
    limits = policy.limit_map
    default = limits.pop(ALL_GPUS, None)
    own = [f"{mib} MiB on GPU {gpu}" for gpu, mib in limits.items()]
    if default is not None:  # a split GPU is sized by its split, not by the limit on every GPU
        other = "every other visible GPU" if own or policy.splits else "every visible GPU"
        own.append(f"{default} MiB on {other}")
    if own:
        parts.append("limit " + ", ".join(own))
    for gpu, sizes in policy.splits:
        parts.append(f"split GPU {gpu} into {' + '.join(f'{mib} MiB' for mib in sizes)}")
    if policy.cpu_devices is not None:
        parts.append(f"split cpu into {policy.cpu_devices} logical devices")
    if policy.allocator is not None:
        parts.append(f"allocator {policy.allocator}")
    for field, why in policy.sources:
        parts.append(f"({field}: {why})")
    return parts


def describe_report(report: ApplyReport, restart_hint: str = RESTART_HINT, action: str = "edit") -> str:
    """What an edit, `apply` or `reset` (`action`) did, in a few lines; names what is locked and
    how to get past it."""
    lines = []
    applied = list(report.applied)
    if action == "reset":
        restored = [item for item in applied if _is_variable(item)]
        applied = [item for item in applied if item not in restored]
        lines.append("Policy cleared: TensorFlow's defaults from now on.")
        lines.append(
            "Restored what this tool had set: " + ", ".join(restored) if restored else "No variable needed restoring."
        )
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
    if applied:
        lines.append("Applied: " + "; ".join(applied))
    if report.failed and not applied:
        lines.append("Nothing else was applied.")
    elif not (report.failed or report.locked) and action != "reset":
        if report.waiting:
            lines.append(NOT_IMPORTED if action == "apply" and not applied else RECORDED)
        elif not applied:
            lines.append("Already in force.")
    lines += [f"Note: {note}" for note in report.notes]
    return "\n".join(lines)


def _is_variable(item: str) -> bool:
    """True for an applied item that is one of our environment variables (`NAME=value`, `unset NAME`)."""
    return item.removeprefix("unset ").partition("=")[0] in OUR_ENV


def row(label: str, value: str) -> str:
    """One status line, `label` and `value` in aligned columns."""
    return f"{label + ':':<{LABEL_WIDTH}}{value}"


def describe_status(controller: Controller) -> str:
    """The full `%tfgpu` status: TensorFlow state, desired policy, environment, what TF recorded."""
    state = controller.state()
    lines = [row("TensorFlow", state.label)]
    policy = describe_policy(controller.policy)
    lines.append(row("Policy", "; ".join(policy) if policy else "none (TensorFlow defaults)"))
    env = [f"{name}={controller.environ[name]}" for name in OUR_ENV if name in controller.environ]
    lines.append(row("Variables", ", ".join(env) if env else "none set"))
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
    stopped = quote(parsed.stopped_at) if parsed.stopped_at else ""
    if parsed.hides_all:
        where = f" (CUDA stops at {stopped})" if stopped else ""
        return [f"CUDA_VISIBLE_DEVICES={quote(raw)} hides every GPU{where}"]
    stop = f"; CUDA stops at {stopped} and ignores the rest" if stopped else ""
    shown = ", ".join(parsed.entries[:16])
    if len(parsed.entries) > 16:  # never a huge line, whatever the environment holds
        shown += f", … ({len(parsed.entries):,} in all)"
    return [f"CUDA_VISIBLE_DEVICES={quote(raw)} → CUDA uses GPU {shown}{stop}"]


def describe_gpus(inventory: Inventory) -> list[str]:
    """Live memory per GPU and per process, nvidia-smi numbering; why there is no list if none."""
    if not inventory.available:  # the first clause says it; the doctor has the rest
        reason = (inventory.error or "").split(" (")[0]
        return [row("GPUs", f"none found: {reason} — `%tfgpu doctor` says more")]
    if not inventory.gpus:
        return [row("GPUs", "none: NVML sees no GPU")]
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
    state = controller.state()
    if not (state.devices_listed or state.devices_created):
        return []
    changes, _ = pending_changes(controller.plan(), controller.api)
    restart = [c.describe() for c in changes if state.initialized or c.needs_restart]
    apply = [c.describe() for c in changes if not (state.initialized or c.needs_restart)]
    groups = [("Pending, needs a restart", restart), ("Not applied yet (`%tfgpu apply`)", apply)]
    return [(title, items) for title, items in groups if items]
