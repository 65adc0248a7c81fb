"""Text views: the `%tfgpu` status and the message after an edit or apply (pure formatting), and the
words for what `tf.apply` returns as records (`Change`, `Refusal`, `Recorded`).

The status reads the controller's public surface into a `StatusSnapshot`, and
renders that; `views.results.StatusResult` renders the same snapshot as HTML.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any, Mapping, NamedTuple

from ..gpus.cudaenv import Grant, grant_of, parse_cuda_visible
from ..gpus.inventory import Gpu, Inventory
from ..language.directives import describe_policy
from ..language.policy import quote, short_uuid
from ..language.sizes import directive_size, gib_pair, mib_text
from ..envvars import CUDA_DEVICE_ORDER, CUDA_VISIBLE_DEVICES, NAMES
from ..tf import initcell
from ..tf.initcell import InitRecord
from ..frameworks import FrameworkView
from ..frameworks.torch import FractionSet
from ..plan import Plan
from ..tf.apply import ApplyReport, Change, LoggerSet, Recorded, Refusal, VariableSet
from ..tf.runtime import CreatedBy, LogicalSpec, RuntimeState, current_shell
from .notes import NO_GPU, note_text
from .tfstate import init_text, route_text, state_text

if TYPE_CHECKING:
    from ..controller import Controller, NoGpu  # only hints: `%load_ext` imports this module, not the controller

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
WIDTH = 100
"""Longest status line: one screen width, even with four GPUs named by UUID."""


def restart_hint(shell: Any) -> str:
    """How to get a locked setting in force: a kernel can restart itself (and in JupyterLab with the
    labextension, restart and run its cells again), terminal IPython cannot."""
    if getattr(shell, "kernel", None) is None:
        return TERMINAL_RESTART_HINT
    from .restarting import command_sentence

    command = command_sentence(shell)
    return f"{RESTART_HINT}\n{command}" if command else RESTART_HINT


def warn_import_failure(report: ApplyReport) -> None:
    """What applying at `import tensorflow` left undone, on stderr: restart a kernel, rerun a script."""
    shell = current_shell()
    print(describe_report(report, restart_hint(shell) if shell is not None else SCRIPT_RESTART_HINT), file=sys.stderr)


def edit_report(report: ApplyReport, shell: Any = None, action: str = "edit") -> str:
    """The lines an edit (`action` "edit"), `reset` or `apply` prints about its `ApplyReport`, with
    the way to a restart that fits `shell`."""
    return describe_report(report, restart_hint(shell), action)


def describe_report(report: ApplyReport, restart_hint: str = RESTART_HINT, action: str = "edit") -> str:
    """What an edit, `apply` or `reset` (`action`) did, in a few lines; names what is locked and
    how to get past it. An edit names what it changed: settings an earlier report named as waiting
    for a restart are one line, and a GPU setting TensorFlow has no GPU for says so."""
    lines = []
    applied = [item_text(item) for item in report.applied]
    locked = [item for item in report.locked if action != "edit" or item not in report.earlier]
    earlier = len(report.locked) - len(locked)
    if action == "reset":
        restored = [item for item in applied if _is_variable(item)]
        applied = [item for item in applied if item not in restored]
        lines.append("Policy cleared." if report.locked else "Policy cleared: TensorFlow's defaults from now on.")
        if restored:
            lines.append("Restored what this tool had set: " + ", ".join(restored))
        elif not (report.left or any(item.setting == "variable" for item in report.locked)):
            lines.append("No variable needed restoring.")
    if report.left:
        lines.append(left_text(report.left))
    if locked:
        lines.append(
            f"TensorFlow's runtime is already initialized in this process{initialized_by()}, so these settings "
            "cannot change now:"
            if report.state.initialized
            else f"{readers(locked)} cannot change these settings in this process any more:"
        )
        lines += [f"  - {item_text(item, report.state.devices_created)}" for item in locked]
        lines.append(restart_hint if action == "reset" else "The policy is recorded. " + restart_hint)
    if earlier:
        lines.append(f"{earlier} earlier change{'s' if earlier > 1 else ''} still wait{'' if earlier > 1 else 's'} "
                     "for a restart (`%tfgpu` lists them).")
    if report.failed:
        lines.append("TensorFlow refused part of the policy:")
        lines += [f"  - {item_text(item)}" for item in report.failed]
    if applied:
        lines.append("Applied: " + "; ".join(map(_shown_applied, applied)))
    absent = nothing_to_apply(report) if action == "edit" else list(map(note_text, report.absent)) \
        if action == "apply" else []
    lines += absent
    if report.failed and not applied:
        lines.append("Nothing else was applied.")
    elif not (report.failed or report.locked or absent) and action != "reset":
        if report.waiting:
            lines.append(NOT_IMPORTED if action == "apply" and not applied else RECORDED)
        elif not applied:
            lines.append("Already in force.")
    lines += [f"Note: {note_text(note)}" for note in report.notes if not (absent and note in report.absent)]
    return "\n".join(lines)


def left_text(left: list[tuple[str, str | None]]) -> str:
    """One line on variables set after this tool set them: they are the user's, left as they are."""
    values = ", ".join(f"{name} unset" if value is None else shown_variable(name, value) for name, value in left)
    return f"Left as you set them after this tool did (not restored): {values}"


READERS = {"jax_backends": "JAX", "torch_cuda": "PyTorch", "torch_import": "PyTorch"}
"""Which framework read a variable, by why its change is locked (`Change.why`); TensorFlow otherwise."""


def readers(items: list[Any]) -> str:
    """`TensorFlow`, `JAX`, `TensorFlow and JAX`: the frameworks that read what `items` would change."""
    return " and ".join(dict.fromkeys(READERS.get(getattr(item, "why", None) or "", "TensorFlow") for item in items))


def nothing_to_apply(report: ApplyReport) -> list[str]:
    """Where an edit asked for GPU settings and TensorFlow lacks the GPUs: what that means for them
    (instead of calling them in force; `apply` gives the notes on all of them)."""
    if not (report.gpu_edits and report.absent):
        return []
    if [note.code for note in report.absent] == ["no_gpu"]:
        asked = " and ".join(f"`{phrase}`" for phrase in report.gpu_edits)
        return [f"{NO_GPU}: {asked} {'has' if len(report.gpu_edits) == 1 else 'have'} nothing to apply to here."]
    return list(map(note_text, report.absent))



def shown(value: Any) -> str:
    """Human form of a recorded or desired setting (a growth flag, a logical configuration, devices)."""
    if value is None:
        return "TF default"
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, tuple) and value and all(v is None for v in value):
        return f"{len(value)} logical devices"
    if isinstance(value, tuple):
        return " + ".join(_shown_entry(entry) for entry in value)
    if isinstance(value, list):
        return ", ".join(map(str, value)) or "none"
    return str(value)


def _shown_entry(entry: int | None | LogicalSpec) -> str:
    if not isinstance(entry, LogicalSpec):
        return "one logical device" if entry is None else directive_size(entry)
    extras = [f"{name} {value}" for name, value in zip(("priority", "ordinal"), entry[1:]) if value is not None]
    return f"{_shown_entry(entry.memory_limit)} ({', '.join(extras)})"


SETTINGS = {"visible": "visible GPUs", "logical": "logical devices of {device}", "cpus": "logical CPU devices",
            "growth": "memory growth of {device}", "variable": "{device}"}
"""What each kind of `Change` is called (`tf.apply.Setting`)."""


WHY = {"import": "read when TensorFlow was imported", "cuda_start": "read when CUDA started",
       "allocator_creation": "read when TensorFlow created the GPU allocators",
       "devices_created": "GPU devices were created by {route}",
       "jax_backends": "read when JAX's backends started", "torch_cuda": "read when PyTorch's CUDA started",
       "torch_import": "read when PyTorch was imported"}
"""Why a `Change` cannot be made any more (`tf.apply.LockReason`), where that is not initialization."""
PENDING_TITLES = {True: "Pending, needs a restart", False: "Not applied yet (`%tfgpu apply`)"}
"""The groups of `Controller.pending()`, by `needs_restart`."""


def change_text(change: Change, route: CreatedBy | None = None) -> str:
    """`logical devices of GPU:0: TF default → 1024 MiB` (and why it cannot change, if not initialization;
    `route`: what created the GPU devices, `RuntimeState.devices_created`)."""
    word = (lambda value: value or "unset") if change.setting == "variable" else shown
    text = f"{SETTINGS[change.setting].format(device=change.device)}: {word(change.current)} → {word(change.desired)}"
    why = WHY.get(change.why or "")
    return text + (f" ({why.format(route=route_text(route))})" if why else "")


def item_text(item: Change | Refusal | FractionSet | LoggerSet | VariableSet, route: CreatedBy | None = None) -> str:
    """An `ApplyReport` item as its message words it: a change, a change TensorFlow refused (with
    TensorFlow's words), a PyTorch memory fraction, a logger or a variable set (`NAME=value`, `unset NAME`)."""
    if isinstance(item, VariableSet):
        return f"{item.name}={item.value}" if item.value is not None else f"unset {item.name}"
    if isinstance(item, LoggerSet):
        return f"Python logger {item.logger}: {item.level + ' and above' if item.level else 'back to its own level'}"
    if isinstance(item, FractionSet):
        when = " when its CUDA starts" if item.queued else ""
        return f"PyTorch's memory fraction of GPU {item.device}: {item.wanted:g}{when} (a soft cap)"
    if isinstance(item, Refusal):
        what = "listing TensorFlow's devices" if item.change is None else change_text(item.change, route)
        return f"{what}: TensorFlow said: {item.said}"
    return item if isinstance(item, str) else change_text(item, route)


def recorded_lines(records: list[Recorded]) -> list[str]:
    """What TensorFlow recorded, a line per device (two more for a CPU hidden by set_visible_devices)."""
    lines = []
    for device in records:
        if device.kind == "CPU":
            lines.append(f"{device.name}: {'one logical device' if device.logical is None else shown(device.logical)}")
            if not device.visible:  # two lines, each within the status's width
                lines.append(f"{device.name}: hidden by set_visible_devices (not by this tool); the first op will fail with")
                lines.append(f"{device.name}: \"No CPU devices are available in this process\" unless it is made visible again")
            continue
        growth = "moot (cuda_malloc_async)" if device.pooled else shown(device.growth)
        memory = "whole GPU" if device.logical is None else "logical GPUs " + shown(device.logical)
        soft = " (soft: the cuda_malloc_async pool is shared)" if device.pooled and device.logical else ""
        lines.append(f"{device.name}: memory growth {growth}, {memory}{soft}{'' if device.visible else ', hidden'}")
    return lines


def pending_lines(source: Controller, state: RuntimeState | None = None,
                  plan: Plan | None = None) -> list[tuple[str, list[str]]]:
    """`Controller.pending()` in its two groups (needs a restart, `%tfgpu apply` can), each titled and
    each change worded; `plan`: the plan for `state`, where the caller built it already."""
    state = state or source.state()
    pending = source.pending(state, plan)
    groups = [(title, [change_text(item.change, state.devices_created) for item in pending if item.needs_restart is restart])
              for restart, title in PENDING_TITLES.items()]
    return [(title, items) for title, items in groups if items]


def initialized_by() -> str:
    """` (by In [7]: `model.fit(x, ...`)` once the initializing cell is known, else ''."""
    record = initcell.initialized_record()
    return f" ({init_text(record)})" if record is not None else ""


def _is_variable(item: str) -> bool:
    """True for an applied item that is one of our environment variables (`NAME=value`, `unset NAME`)."""
    return item.removeprefix("unset ").partition("=")[0] in NAMES


def _shown_applied(item: str) -> str:
    """An applied item as the message shows it: a variable's GPU UUIDs cut short (`shown_variable`)."""
    name, is_set, value = item.partition("=")
    return shown_variable(name, value) if is_set and _is_variable(item) else item


def row(label: str, value: str | list[str], separator: str = "; ") -> str:
    """One status row, `label` and `value` in aligned columns. A value given as parts that do not fit
    one line puts each part on a line of its own in that column."""
    parts = [value] if isinstance(value, str) else value
    head = f"{label + ':':<{LABEL_WIDTH}}"
    if len(head) + len(separator.join(parts)) <= WIDTH:
        return head + separator.join(parts)
    return "\n".join(fit((head if at == 0 else " " * LABEL_WIDTH) + part, LABEL_WIDTH + 2)
                     for at, part in enumerate(parts))


def fit(line: str, indent: int = 4) -> str:
    """`line` broken at spaces into lines of at most `WIDTH`, the rest indented by `indent` (a status
    stays within one screen width; a UUID or path is never cut)."""
    if len(line) <= WIDTH:
        return line
    import textwrap

    return "\n".join(textwrap.wrap(line, WIDTH, subsequent_indent=" " * indent, break_long_words=False,
                                   break_on_hyphens=False))


def gpu_names_of(inventory: Inventory) -> dict[str, str]:
    """GPU UUID → nvidia-smi index, for `describe_policy` (empty without NVML)."""
    return {gpu.uuid: gpu.ref for gpu in inventory.gpus}


def shown_variable(name: str, value: str) -> str:
    """`NAME=value` as the status shows it: GPU UUIDs cut short, a huge value by excerpt."""
    value = short_value(name, value)
    return f"{name}={value}" if len(value) <= WIDTH // 2 else f"{name}={quote(value, WIDTH // 2)}"


def short_value(name: str, value: str) -> str:
    """`value` of variable `name` with its GPU UUIDs cut short (`CUDA_VISIBLE_DEVICES`)."""
    return ",".join(map(short_uuid, value.split(","))) if name == CUDA_VISIBLE_DEVICES else value


class StatusSnapshot(NamedTuple):
    """Everything the status shows, read once; the text and HTML forms both render this. (A
    NamedTuple on the panel's import path: docs/architecture.md, "Rows".)"""

    state: RuntimeState
    policy: tuple[str, ...]
    """The policy as directive-like phrases (`describe_policy`)."""
    environment: tuple[tuple[str, str], ...]
    """The variables this tool manages, as set now."""
    cuda_visible: tuple[str, ...]
    """`CUDA_VISIBLE_DEVICES` as CUDA reads it (`describe_cuda_visible`)."""
    inventory: Inventory
    grant: Grant
    """The GPUs this process was started with (`Controller.grant`): the cards outside it are marked."""
    recorded: tuple[str, ...] | None
    """What TensorFlow recorded; None while it is not imported."""
    pending: tuple[tuple[str, tuple[str, ...]], ...]
    notes: tuple[str, ...]
    frameworks: tuple[tuple[str, str], ...] = ()
    """A (label, line) per other framework imported or told something (`framework_rows`)."""
    kept: tuple[str, ...] | None = None
    """The policy kept for this kernel's next start, as phrases (`jupyter.kept`); None: nothing kept."""
    initialized_by: InitRecord | None = None
    """Where TensorFlow's runtime was initialized, where known (`tf.initcell`)."""

    @property
    def locked(self) -> bool:
        """GPU memory settings wait for a restart (TensorFlow initialized, or a route created devices)."""
        return self.state.gpu_memory_fixed


def snapshot(source: Controller) -> StatusSnapshot:
    """Read what the status shows from `source`, TensorFlow's state once and the plan once (with what an
    import of JAX or PyTorch will bring, for their rows)."""
    state = source.state()
    plan = source.plan(state, imports=True)
    environment = source.environment()
    inventory = source.inventory()
    grant = source.grant()
    recorded = source.recorded(state)
    return StatusSnapshot(
        state=state,
        policy=tuple(describe_policy(source.policy, gpu_names_of(inventory))),
        environment=tuple(environment.items()),
        cuda_visible=tuple(describe_cuda_visible(environment.get(CUDA_VISIBLE_DEVICES), inventory,
                                                 environment.get(CUDA_DEVICE_ORDER), source.environ))
        + tuple(granted_by(grant)),
        inventory=inventory,
        grant=grant,
        recorded=None if recorded is None else tuple(recorded_lines(recorded)),
        pending=tuple((title, tuple(items)) for title, items in pending_lines(source, state, plan)),
        notes=tuple(map(note_text, plan.notes)) + notebook_notes(source),
        frameworks=tuple(framework_rows(source.other_frameworks(plan), source.policy.growth is True)),
        kept=kept_phrases(gpu_names_of(inventory)),
        initialized_by=initcell.initialized_record(),
    )


def kept_phrases(gpu_names: dict[str, str]) -> tuple[str, ...] | None:
    """The policy kept for this kernel's next start (`jupyter.kept`) as phrases; None: nothing kept."""
    from ..jupyter.kept import kept_policy

    kept = kept_policy(current_shell())
    return None if kept is None else tuple(describe_policy(kept, gpu_names))


NOTEBOOK_DIFFERS = ("this notebook's saved policy differs: saved: {saved}; this kernel: {kernel} "
                    "(Save GPU Policy to Notebook Metadata saves the kernel's)")
"""The one line where the policy in the notebook's `metadata.tfgpu.policy` is not the kernel's."""


def notebook_notes(source: Controller) -> tuple[str, ...]:
    """`NOTEBOOK_DIFFERS` where this kernel's notebook (`JPY_SESSION_NAME`) saved another policy; read
    only as a status or panel is shown."""
    import os

    from ..jupyter.notebook_request import saved_difference

    try:
        cwd = os.getcwd()
    except OSError:  # the kernel's folder was removed
        cwd = None
    difference = saved_difference(source.policy, source.environ, cwd)
    if difference is None:
        return ()
    saved, kernel = (", ".join(lines) or "none (TensorFlow defaults)" for lines in difference)
    return (NOTEBOOK_DIFFERS.format(saved=saved, kernel=kernel),)


def kept_text(kept: tuple[str, ...]) -> str:
    """The status's one line on a kept policy: what the kernel's next start applies, until it changes."""
    return (f"{'; '.join(kept) or 'none (TensorFlow defaults)'}, for this kernel's next start "
            "(a policy change before it voids this)")


FRAMEWORK_LABELS = {"jax": "JAX", "torch": "PyTorch", "keras": "Keras"}


def framework_rows(views: list[FrameworkView], growth: bool) -> list[tuple[str, str]]:
    """(label, line) for each other framework: where it is in its life, and what the policy told it."""
    return [(FRAMEWORK_LABELS[view.name], _framework_line(view, growth)) for view in views]


def _framework_line(view: FrameworkView, growth: bool) -> str:
    version = f"{view.version}, " if view.version else ""
    told = ", ".join(shown_variable(name, value) for name, value in view.variables)
    if view.name == "keras":
        source = {"keras": "as imported", "default": "its default"}.get(view.backend_source or "", view.backend_source)
        return f"backend {view.backend} ({source})"
    if view.name == "jax":
        life = ("not imported" if not view.imported
                else "backends started: its XLA_* settings are fixed until restart" if view.started
                else "imported, backends not started")
        return f"{version}{life}; {_told(view, told) or 'told nothing (its default: 75% of each GPU at its first op)'}"
    build = " (a CPU-only build)" if view.cuda_build is False else ""
    life = ("not imported" if not view.imported
            else "CUDA started: its allocator settings are fixed until restart" if view.started
            else "imported, CUDA not started")
    parts = [told] if told else []
    if view.fractions:
        shares = {fraction for _, fraction in view.fractions}
        devices = ", ".join(str(device) for device, _ in view.fractions)
        fraction = (f"memory fraction {shares.pop():g} on GPU {devices}" if len(shares) == 1 else
                    "memory fractions " + ", ".join(f"GPU {device}: {share:g}" for device, share in view.fractions))
        parts.append(fraction + " (a soft cap: its caching allocator stops there; CUDA's own context is extra)")
    if growth:
        parts.append("growth: nothing to do (its caching allocator never preallocates)")
    return f"{version}{life}{build}; {_told(view, '; '.join(parts)) or 'told nothing'}"


def _told(view: FrameworkView, told: str) -> str:
    """What the framework was told, or (not imported yet) what its import will bring; '' for nothing."""
    return "" if not told else f"told: {told}" if view.imported else f"at its import: {told}"


def status_text(snap: StatusSnapshot) -> str:
    """The full `%tfgpu` status as text: TensorFlow state, desired policy, environment, what TF recorded."""
    lines = [row("TensorFlow", state_text(snap.state, snap.initialized_by))]
    lines += [row(label, line) for label, line in snap.frameworks]
    lines.append(row("Policy", list(snap.policy) or "none (TensorFlow defaults)"))
    if snap.kept is not None:
        lines.append(row("Kept", kept_text(snap.kept)))
    env = [shown_variable(name, value) for name, value in snap.environment]
    lines.append(row("Variables", env or "none set", ", "))
    lines += [fit(line) for line in snap.cuda_visible]
    lines += describe_gpus(snap.inventory, snap.grant)
    if snap.recorded is not None:
        lines.append("TensorFlow recorded:" + ("" if snap.recorded else " nothing yet (devices not listed)"))
        lines += [fit(f"  {line}") for line in snap.recorded]
    for title, items in snap.pending:
        lines.append(f"{title}:")
        lines += [fit(f"  - {item}") for item in items]
    lines += [fit(f"Note: {note}", len("Note: ")) for note in snap.notes]
    return "\n".join(lines)


def describe_status(source: Controller) -> str:
    """The full `%tfgpu` status of `source` (the controller), as text."""
    return status_text(snapshot(source))


def describe_cuda_visible(raw: str | None, inventory: Inventory, order: str | None = None,
                          environ: Mapping[str, str] | None = None) -> list[str]:
    """`CUDA_VISIBLE_DEVICES` resolved the way CUDA reads it (nothing when unset): each entry by the
    nvidia-smi index of its card, where `gpus.cudaenv.grant_of` can place it under `order`
    (`CUDA_DEVICE_ORDER`) and the process's `environ` (a Slurm job's record)."""
    if raw is None:
        return []
    parsed = parse_cuda_visible(raw, inventory.known_refs())
    stopped = quote(short_uuid(parsed.stopped_at)) if parsed.stopped_at else ""
    value = quote(short_value(CUDA_VISIBLE_DEVICES, raw), WIDTH // 2)
    if parsed.hides_all:
        where = f" (CUDA stops at {stopped})" if stopped else ""
        return [f"CUDA_VISIBLE_DEVICES={value} hides every GPU{where}"]
    stop = f"; CUDA stops at {stopped} and ignores the rest" if stopped else ""
    grant = grant_of(raw, order, inventory, environ)
    shown = ", ".join(str(card) if card is not None else short_uuid(entry)
                      for entry, card in zip(parsed.entries[:16], grant.cards))
    if len(parsed.entries) > 16:  # never a huge line, whatever the environment holds
        shown += f", … ({len(parsed.entries):,} in all)"
    order = " in CUDA's default order (fastest first), not nvidia-smi's" if None in grant.pins else ""
    return [f"CUDA_VISIBLE_DEVICES={value} → CUDA uses GPU {shown}{order}{stop}"]


def grant_source(grant: Grant) -> str:
    """What gave the grant, for a line that names it: `Slurm job 1234, gres gpu:2`, else the setting
    (`CUDA_VISIBLE_DEVICES=2`)."""
    if grant.source is None:
        return grant.setting()
    job = f"Slurm job {grant.source.job_id}" if grant.source.job_id else "a Slurm job"
    return f"{job}, gres gpu:{len(grant.source.gpus)}"


def granted_by(grant: Grant) -> list[str]:
    """`Granted by Slurm job 1234, gres gpu:2: GPU 1, 3 (nvidia-smi numbering)`, and, where CUDA's order
    among them cannot be told, what still works; nothing without a scheduler's record."""
    if grant.source is None or grant.card_set is None:
        return []
    cards = ", ".join(str(card) for card in grant.card_set)
    line = f"Granted by {grant_source(grant)}: GPU {cards} (nvidia-smi numbering)"
    if grant.placed:
        return [line]
    return [line + "; CUDA's order among them is unknown: `visible auto` picks among them by UUID, an index "
            "is refused"]


def no_gpu_reason(why: NoGpu | None) -> str:
    """The one line on why there is no GPU to list (`Controller.gpus`); '' where there are GPUs."""
    if why is None:
        return ""
    nvml = why.nvml or "NVML sees none"
    if why.tensorflow_lists_none:
        return f"No GPU: TensorFlow lists none, and {nvml}. `%tfgpu doctor` says why."
    return f"No GPU found: {nvml}. `%tfgpu doctor` says why."


def no_gpus_text(inventory: Inventory) -> str | None:
    """Why there is no GPU list (the error's first clause; the doctor has the rest); None with GPUs."""
    if not inventory.available:
        reason = (inventory.error or "").split(" (")[0]
        return f"none found: {reason} — `%tfgpu doctor` says more"
    return None if inventory.gpus else "none: NVML sees no GPU"


def outside_grant(gpu: Gpu, grant: Grant) -> str | None:
    """`not this kernel's to take: outside its grant (CUDA_VISIBLE_DEVICES=2)` for a card the grant
    does not give (only where every entry of the grant is placed); None for a card it may use."""
    if grant.gives(gpu.index):
        return None
    return f"not this kernel's to take: outside its grant ({grant_source(grant)})"


def describe_gpus(inventory: Inventory, grant: Grant = Grant(None)) -> list[str]:
    """Live memory per GPU and per process, nvidia-smi numbering, each card outside the grant marked;
    why there is no list if none."""
    why = no_gpus_text(inventory)
    if why is not None:
        return [row("GPUs", why)]
    lines = [f"GPUs (NVML, driver {inventory.driver_version}, nvidia-smi numbering):"]
    if inventory.warning:  # the last good figures, served while the driver does not answer
        lines.append(f"  Note: {inventory.warning}")
    for gpu in inventory.gpus:
        busy = "" if gpu.utilization_pct is None else f", {gpu.utilization_pct}% busy"
        lines.append(
            f"  {gpu.index}  {gpu.name}  {gib_pair(gpu.memory_used_mib, gpu.memory_total_mib)} used"
            f"{busy}  {short_uuid(gpu.uuid)}" + (f"  bus {gpu.pci_bus_id}" if gpu.pci_bus_id else "")
        )
        outside = outside_grant(gpu, grant)
        if outside:
            lines.append(f"       {outside}")
        for mig in gpu.mig_devices:
            lines.append(f"       MIG {mig.uuid}  {mib_text(mig.memory_total_mib)}")
        for proc in gpu.processes:
            host = " (a host pid)" if proc.is_self is None else ""  # NVML's pids, seen from a container
            lines.append(f"       pid {proc.pid}{host}: {mib_text(proc.used_mib)}{' (this kernel)' if proc.is_self else ''}")
    return lines
