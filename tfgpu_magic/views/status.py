"""Text views: the `%tfgpu` status and the message after an edit or apply (pure formatting).

The status reads a `StatusSource` (the controller's public surface) into a `StatusSnapshot`, and
renders that; `views.results.StatusResult` renders the same snapshot as HTML.
"""

from __future__ import annotations

from typing import Any, NamedTuple, Protocol

from ..gpus.cudaenv import parse_cuda_visible
from ..gpus.inventory import Inventory
from ..language.directives import describe_policy
from ..language.policy import Policy, quote
from ..tf.envvars import CUDA_VISIBLE_DEVICES, NAMES
from ..tf.plan import Plan
from ..tf import initcell
from ..tf.runtime import ApplyReport, RuntimeState

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
            f"TensorFlow's runtime is already initialized in this process{initialized_by()}, so these settings "
            "cannot change now:"
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


def initialized_by() -> str:
    """` (by In [7]: `model.fit(x, ...`)` once the initializing cell is known, else ''."""
    known = initcell.initialized_by()
    return f" ({known})" if known else ""


def _is_variable(item: str) -> bool:
    """True for an applied item that is one of our environment variables (`NAME=value`, `unset NAME`)."""
    return item.removeprefix("unset ").partition("=")[0] in NAMES


def row(label: str, value: str) -> str:
    """One status line, `label` and `value` in aligned columns."""
    return f"{label + ':':<{LABEL_WIDTH}}{value}"


class StatusSource(Protocol):
    """What the status reads: the controller's public surface."""

    policy: Policy

    def state(self) -> RuntimeState: ...
    def environment(self) -> dict[str, str]: ...
    def inventory(self) -> Inventory: ...
    def recorded(self, state: RuntimeState | None = None) -> list[str] | None: ...
    def pending(self, state: RuntimeState | None = None) -> list[tuple[str, list[str]]]: ...
    def plan(self, state: RuntimeState | None = None) -> Plan: ...


class StatusSnapshot(NamedTuple):
    """Everything the status shows, read once; the text and HTML forms both render this. (A
    NamedTuple, not a dataclass: it is built on the panel's import path, where a frozen dataclass
    costs a millisecond.)"""

    state: RuntimeState
    policy: tuple[str, ...]
    """The policy as directive-like phrases (`describe_policy`)."""
    environment: tuple[tuple[str, str], ...]
    """The variables this tool manages, as set now."""
    cuda_visible: tuple[str, ...]
    """`CUDA_VISIBLE_DEVICES` as CUDA reads it (`describe_cuda_visible`)."""
    inventory: Inventory
    recorded: tuple[str, ...] | None
    """What TensorFlow recorded; None while it is not imported."""
    pending: tuple[tuple[str, tuple[str, ...]], ...]
    notes: tuple[str, ...]

    @property
    def locked(self) -> bool:
        """GPU memory settings wait for a restart (TensorFlow initialized, or a route created devices)."""
        return self.state.gpu_memory_fixed


def snapshot(source: StatusSource) -> StatusSnapshot:
    """Read what the status shows from `source`, TensorFlow's state once."""
    state = source.state()
    environment = source.environment()
    inventory = source.inventory()
    recorded = source.recorded(state)
    return StatusSnapshot(
        state=state,
        policy=tuple(describe_policy(source.policy)),
        environment=tuple(environment.items()),
        cuda_visible=tuple(describe_cuda_visible(environment.get(CUDA_VISIBLE_DEVICES), inventory)),
        inventory=inventory,
        recorded=None if recorded is None else tuple(recorded),
        pending=tuple((title, tuple(items)) for title, items in source.pending(state)),
        notes=tuple(source.plan(state).notes),
    )


def status_text(snap: StatusSnapshot) -> str:
    """The full `%tfgpu` status as text: TensorFlow state, desired policy, environment, what TF recorded."""
    lines = [row("TensorFlow", initcell.label(snap.state.label))]
    lines.append(row("Policy", "; ".join(snap.policy) if snap.policy else "none (TensorFlow defaults)"))
    env = [f"{name}={value}" for name, value in snap.environment]
    lines.append(row("Variables", ", ".join(env) if env else "none set"))
    lines += snap.cuda_visible
    lines += describe_gpus(snap.inventory)
    if snap.recorded is not None:
        lines.append("TensorFlow recorded:" + ("" if snap.recorded else " nothing yet (devices not listed)"))
        lines += [f"  {line}" for line in snap.recorded]
    for title, items in snap.pending:
        lines.append(f"{title}:")
        lines += [f"  - {item}" for item in items]
    lines += [f"Note: {note}" for note in snap.notes]
    return "\n".join(lines)


def describe_status(source: StatusSource) -> str:
    """The full `%tfgpu` status of `source` (the controller), as text."""
    return status_text(snapshot(source))


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


def no_gpus_text(inventory: Inventory) -> str | None:
    """Why there is no GPU list (the error's first clause; the doctor has the rest); None with GPUs."""
    if not inventory.available:
        reason = (inventory.error or "").split(" (")[0]
        return f"none found: {reason} — `%tfgpu doctor` says more"
    return None if inventory.gpus else "none: NVML sees no GPU"


def describe_gpus(inventory: Inventory) -> list[str]:
    """Live memory per GPU and per process, nvidia-smi numbering; why there is no list if none."""
    why = no_gpus_text(inventory)
    if why is not None:
        return [row("GPUs", why)]
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
