"""One controller per process: the desired policy, the environment we set, and applying at the right time.

TensorFlow's device state is process-wide, so the magic, the panel and `configure()` all share the
controller returned by `get_controller()`.
"""

from __future__ import annotations

import contextlib
import functools
import os
from typing import TYPE_CHECKING, Callable, Iterable, Iterator, MutableMapping, NamedTuple

from . import importhooks
from .tf import importhook
from .errors import PolicyError
from .frameworks import FrameworkView, jax, keras
from .frameworks.torch import Fractions, Torch, TorchAPI
from .frameworks import torch as torch_room
from .gpus.cudaenv import Grant, GrantedCatalog, grant_of
from .gpus.inventory import Inventory, InventoryCatalog
from .envvars import (ALLOCATOR_CREATION, CUDA_DEVICE_ORDER, CUDA_VISIBLE_DEVICES, NAMES, PYTORCH_ALLOC_CONF,
                      PYTORCH_CUDA_ALLOC_CONF)
from .plan import ALL_FRAMEWORKS, Frameworks, Plan, build_plan, gpu_refs, uses_gpu_settings
from .language.policy import ALL_GPUS, Policy, is_index
from .tf.apply import (ApplyReport, Pending, Recorded, any_logical_recorded, apply_plan, env_changes,
                       pending_changes, recorded_settings, session_config)
from .tf.apply import ConfigAPI, TensorFlowConfig
from .tf.routes import install_routes
from .tf.runtime import RuntimeState, too_late

if TYPE_CHECKING:  # the grammar loads at the first edit: a restarted kernel applies a stored policy without it
    from .language.grammar import Edit


class ListedGpu(NamedTuple):
    """A GPU as the views list it: NVML's card (`gpus.inventory.Gpu`, cut to what a list shows) when
    NVML works, else only TensorFlow's physical device, which has no figures; hence a record of its own."""

    ref: str
    name: str
    used_mib: int | None = None
    total_mib: int | None = None


class GpuSettings(NamedTuple):
    """What the policy asks of one GPU (nvidia-smi index), precedence already worked out."""

    visible: bool
    limit_mib: int | None
    """Its own limit, else the every-GPU limit unless it has a split (a split sizes each part)."""
    split: tuple[int, ...] | None


JAX, TORCH = "jax", "torch"
"""The top-level packages whose import the controller watches (`importhooks`)."""


class Controller:
    """Holds the desired policy and applies it to every framework in the process: via the environment
    before each reads it, through an import hook as TensorFlow and PyTorch finish importing, through
    `tf.config` and `torch.cuda` after; reports what is locked once a framework has read it.

    One-time work per framework happens once (`_tensorflow_imported`, `Fractions`): an edit applies the
    plan, it does not set the frameworks up again."""

    def __init__(
        self,
        api: ConfigAPI | None = None,
        environ: MutableMapping[str, str] | None = None,
        catalog: InventoryCatalog | None = None,
        torch: TorchAPI | None = None,
    ) -> None:
        self.api: ConfigAPI = api or TensorFlowConfig()
        self.torch: TorchAPI = torch or Torch()
        self.fractions = Fractions(lambda: dict(self.plan().torch_fractions), self.torch)
        """PyTorch's per-device memory fractions, given as its CUDA starts (or at once, once started)."""
        self._tf_ready = False
        self._torch_importing = False
        self.environ = os.environ if environ is None else environ
        self.catalog = GrantedCatalog(catalog if catalog is not None else InventoryCatalog(), self.grant)
        """The GPUs a policy may name: the inventory's, inside this process's grant (`grant`)."""
        self.policy = Policy()
        self.last_report: ApplyReport | None = None
        self.on_import_failure: Callable[[ApplyReport], None] | None = None
        """Told what applying at `import tensorflow` left undone; a view sets it (views render, see
        `views.hookup`), so the controller imports none."""
        self._original_env: dict[str, str | None] = {}
        self._notes_shown: set[str] = set()
        self.listeners: list[Callable[[Controller], None]] = []

    def inventory(self) -> Inventory:
        """The GPU inventory this controller's GPU references resolve against (NVML, cached)."""
        return self.catalog.inventory

    def grant(self) -> Grant:
        """The GPUs this process was started with: `CUDA_VISIBLE_DEVICES` (and `CUDA_DEVICE_ORDER`) as
        they were before this tool set them, placed on the inventory's cards (read only where there is
        a grant). A policy stays inside it; `Grant.granted_cards()` is what `who` marks."""
        value = self._inherited(CUDA_VISIBLE_DEVICES)
        return grant_of(value, self._inherited(CUDA_DEVICE_ORDER), self.inventory() if value is not None else None)

    # ----- what the views read --------------------------------------------------------------
    def subscribe(self, listener: Callable[[Controller], None]) -> None:
        """Call `listener(controller)` after every policy change (from any view, or `configure()`)."""
        self.listeners.append(listener)

    def unsubscribe(self, listener: Callable[[Controller], None]) -> None:
        """Stop calling `listener`; nothing happens if it was not subscribed."""
        if listener in self.listeners:
            self.listeners.remove(listener)

    def environment(self) -> dict[str, str]:
        """The variables this tool manages, as set in the environment now (by us or inherited)."""
        return {name: value for name in NAMES if (value := self.environ.get(name)) is not None}

    def recorded(self, state: RuntimeState | None = None) -> list[Recorded] | None:
        """What TensorFlow has recorded, a record per device (the views word them); None while it is
        not imported."""
        state = state or self.state()
        return recorded_settings(self.api) if state.imported else None

    def pending(self, state: RuntimeState | None = None) -> list[Pending]:
        """Settings TensorFlow has not taken yet: those only a restart can make first, then those
        `%tfgpu apply` still can (the views word them). Before CUDA started only the variables a reader
        read already (JAX's at its backend start): there is no `tf.config` to compare yet."""
        state = state or self.state()
        if not (state.devices_listed or state.devices_created):
            return [Pending(change, change.why, True) for change in env_changes(self.plan(state))]
        steps, _ = pending_changes(self.plan(state), self.api)
        found = [Pending(step.change, step.change.why or ("initialized" if state.initialized else "no_call"), True)
                 if state.initialized or step.needs_restart else Pending(step.change, None, False) for step in steps]
        return sorted(found, key=lambda item: not item.needs_restart)

    def gpus(self) -> tuple[list[ListedGpu], str]:
        """The GPUs to list (NVML's, else TensorFlow's once imported), and a one-line reason when there
        are none. Listing TF's devices never initializes its runtime."""
        inventory = self.inventory()
        if inventory.available and inventory.gpus:
            return [ListedGpu(gpu.ref, gpu.name or "GPU", gpu.memory_used_mib, gpu.memory_total_mib)
                    for gpu in inventory.gpus], ""
        if self.state().imported:
            gpus = self.api.devices("GPU")
            if gpus:
                return [ListedGpu(str(i), self.api.name(gpu)) for i, gpu in enumerate(gpus)], ""
            return [], f"No GPU: TensorFlow lists none, and {inventory.error or 'NVML sees none'}. `%tfgpu doctor` says why."
        return [], f"No GPU found: {inventory.error or 'NVML sees none'}. `%tfgpu doctor` says why."

    def gpu_settings(self, refs: Iterable[str]) -> dict[str, GpuSettings]:
        """What the policy asks of each GPU in `refs` (nvidia-smi indices); entries the policy gives by
        UUID are matched through the inventory."""
        policy, aliases = self.policy, self.catalog.uuid_to_index()
        visible = None if policy.visible is None else {aliases.get(gpu, gpu) for gpu in policy.visible}
        limits = {aliases.get(gpu, gpu): mib for gpu, mib in policy.limits}
        splits = {aliases.get(gpu, gpu): sizes for gpu, sizes in policy.splits}
        return {ref: GpuSettings(visible is None or ref in visible,
                                 limits.get(ref, None if ref in splits else limits.get(ALL_GPUS)), splits.get(ref))
                for ref in refs}

    def frameworks_moment(self) -> tuple[object, ...]:
        """Where JAX, PyTorch and Keras are in their lives (imported; backends or CUDA started), which
        they tell nobody: a few attribute reads, cheap enough for after every cell."""
        return jax.state(), self.torch.state(), keras.imported()

    def other_frameworks(self) -> list[FrameworkView]:
        """JAX and PyTorch where imported (what they were told), or installed and told something by the
        policy (what their import will bring); Keras where imported or set to another backend than
        TensorFlow."""
        from .envvars import BY_NAME

        every = {"tensorflow", "jax", "torch"}  # CUDA's own variables: not told to one framework in particular
        fresh = self._fresh_plan()
        planned = {name: value for name, value in fresh.env if value is not None}

        def told(name: str, imported: bool) -> tuple[tuple[str, str], ...]:
            source = self.environment() if imported else planned
            return tuple((var, value) for var, value in source.items()
                         if name in BY_NAME[var].frameworks and set(BY_NAME[var].frameworks) != every)

        views = []
        jax_state = jax.state()
        jax_told = told(JAX, jax_state.imported)
        if jax_state.imported or (jax_told and jax.installed()):
            views.append(FrameworkView(JAX, jax_state.version, jax_state.imported, jax_state.started, jax_told))
        torch_state = self.torch.state()
        torch_told = told(TORCH, torch_state.imported)
        fractions = self.plan().torch_fractions if torch_state.imported else fresh.torch_fractions
        if torch_state.imported or ((torch_told or fractions) and torch_room.installed()):
            views.append(FrameworkView(TORCH, torch_state.version, torch_state.imported, torch_state.cuda_started,
                                       torch_told, fractions, torch_state.cuda_build is not None
                                       if torch_state.imported else None))
        keras_state = keras.state(self.environ)
        if keras_state.imported or keras_state.backend != keras.DEFAULT_BACKEND:
            views.append(FrameworkView("keras", None, keras_state.imported, False, backend=keras_state.backend,
                                       backend_source=keras_state.source))
        return views

    def framework_memory(self) -> dict[str, list[tuple[str, str | None, int, int | None, int | None]]]:
        """JAX's and PyTorch's own figures per GPU once started: (device, card, in use, peak, reserved),
        the card (UUID) placed by CUDA's order of this process's GPUs; {} for a framework not started."""
        found: dict[str, list[tuple[str, str | None, int, int | None, int | None]]] = {}
        figures = {JAX: [(index, f"gpu:{index}", d.in_use, d.peak, d.limit) for index, d in enumerate(jax.memory())],
                   TORCH: [(device, f"cuda:{device}", allocated, None, reserved)
                           for device, allocated, reserved in self.fractions.memory()]}
        if not any(figures.values()):
            return found
        from .tf.memory import cuda_order

        inventory = self.inventory()
        state = self.state()
        order = cuda_order(self, inventory, state, self.plan(state))
        uuids = {gpu.ref: gpu.uuid for gpu in inventory.gpus}
        for name, rows in figures.items():
            found[name] = [(device, uuids.get(order[index]) if index < len(order) else None, current, peak, reserved)
                           for index, device, current, peak, reserved in rows]
        return found

    def inherited_environment(self) -> dict[str, str]:
        """The environment with the variables this tool set put back as they were: what a fresh process
        started without the policy gets (`%tfgpu selftest` runs its rules in such processes)."""
        environ = dict(self.environ)
        for name, value in self._original_env.items():
            if value is None:
                environ.pop(name, None)
            else:
                environ[name] = value
        return environ

    def export(self, form: str = "python") -> str:
        """The policy as standalone code for a fresh process (`python`, `env` or `json`)."""
        from .tf.export import export

        return export(self.policy, form, self.export_plan())

    # ----- editing -------------------------------------------------------------------------
    def parse(self, line: str) -> Edit:
        """Parse a line that must be a policy edit."""
        from .language.grammar import Edit, parse_line

        directive = parse_line(line, self.catalog)
        if not isinstance(directive, Edit):
            raise PolicyError(f"`{directive.name}` is not a policy change")
        return directive

    def edit(self, edits: Iterable[Edit]) -> ApplyReport:
        """Apply all `edits` to the policy, all or nothing, then apply the policy. Only the result is
        validated, once (by `set_policy`), so the lines of a `%%tfgpu` cell may come in any order."""
        edits = list(edits)
        policy = self._edited(self.policy, edits)
        try:
            return self.set_policy(policy, {field for edit in edits for field, _ in edit.changes})
        except PolicyError as err:
            if self.policy is policy:  # raised after the policy was taken: not about these edits
                raise
            in_cell = any(edit.line for edit in edits)
            raise PolicyError(f"the cell's result: {err}" if in_cell else str(err)) from None

    def edit_policy(self, lines: Iterable[str], base: Policy | None = None) -> Policy:
        """The policy `lines` (directive strings) make of `base` (default: the current one), validated
        as a whole like a `%%tfgpu` cell; applies nothing."""
        policy = self._edited(self.policy if base is None else base, [self.parse(line) for line in lines])
        policy.validate(self._aliases(policy))
        return policy

    def _edited(self, policy: Policy, edits: list[Edit]) -> Policy:
        """`policy` with every edit applied in turn, not validated; an error names its cell line."""
        from .language.grammar import apply_edit

        for edit in edits:
            try:
                policy = apply_edit(policy, edit, self.catalog)
            except PolicyError as err:
                raise PolicyError(f"line {edit.line}: {err}" if edit.line else str(err)) from None
        return policy

    def set_policy(self, policy: Policy, fields: Iterable[str] | None = None) -> ApplyReport:
        """Replace the desired policy (validated first) and apply it as far as TensorFlow allows.
        Where TensorFlow lacks the GPUs, the report names the GPU settings this change asked for: those
        of the policy `fields` the edits set (a directive given again asks again), by default those that
        differ from the policy before."""
        policy.validate(self._aliases(policy))
        before, self.policy = self.policy, policy
        report = self.apply()
        if report.absent:
            from .language.directives import gpu_asks

            if fields is None:
                fields = [name for name, value in vars(policy).items() if getattr(before, name) != value]
            asked = Policy().edited(**{name: getattr(policy, name) for name in {*fields, "limits_written"}})
            report.gpu_edits = gpu_asks(asked, self.catalog.uuid_to_index())
        for listener in list(self.listeners):
            listener(self)
        return report

    # ----- applying ------------------------------------------------------------------------
    def state(self) -> RuntimeState:
        """TensorFlow's state, plus NVML's word when the policy wants `CUDA_*` variables set: this
        process among a GPU's compute processes means CUDA started here (another library did it).

        Only once TensorFlow is imported (its import costs far more than an NVML read); before, the
        libcuda check in `runtime_state` covers it, and `%load_ext` never loads NVML."""
        torch_state = self.torch.state()
        state = self.api.state()._replace(jax_started=jax.state().started, torch_cuda=torch_state.cuda_started,
                                          torch_imported=torch_state.imported)
        if state.cuda_fixed or not state.imported or not uses_gpu_settings(self.policy):
            return state
        inventory = self.inventory()
        if any(proc.is_self for gpu in inventory.gpus for proc in gpu.processes):
            return state._replace(cuda_elsewhere="NVML lists this process on a GPU")
        return state

    def plan(self, state: RuntimeState | None = None, probe: bool = False) -> Plan:
        """The plan for the current policy, for TensorFlow as it is in `state` (default: now).

        With `probe` (about to apply; the `CUDA_*` variables are already set), or once CUDA started
        anyway, it asks TensorFlow whether a logical-device configuration is already recorded."""
        state = state or self.state()
        recorded = self._may_look(state, probe) and any_logical_recorded(self.api)
        inherited = self.environ.get(CUDA_VISIBLE_DEVICES) if state.cuda_fixed else self._inherited(CUDA_VISIBLE_DEVICES)
        plan = build_plan(self.policy, inherited, cuda_started=state.cuda_fixed, aliases=self._aliases(self.policy),
                          logical_recorded=recorded, frameworks=self.frameworks())
        return plan._replace(locked_env=tuple(self._locked_env(plan, state)))

    def frameworks(self, every: bool = False) -> Frameworks:
        """What the plan needs to know of the other frameworks here: those imported (one imported later
        gets the policy as its import finishes: `_watch_imports`), or every one (`every`: for a fresh
        process elsewhere, or to show what an import will bring). The cards' totals and JAX's fraction
        variable are read only where a limit needs them, Keras's backend only where the policy leaves growth
        to it."""
        torch_state, jax_state = self.torch.state(), jax.state()
        here = ALL_FRAMEWORKS if every else Frameworks(
            jax=jax_state.imported, torch=torch_state.imported or self._torch_importing,
            tensorflow=self.api.state().imported, cuda_users=torch_state.cuda_started or jax_state.started)
        limited = bool(self.policy.limits or self.policy.splits)
        inventory = self.inventory() if limited and (here.jax or here.torch) else None
        totals = {gpu.ref: gpu.memory_total_mib for gpu in inventory.gpus if gpu.memory_total_mib} \
            if inventory is not None and inventory.available else {}
        fraction_variable = jax.fraction_variable(self.environ) if limited and here.jax else here.fraction_variable
        return here._replace(fraction_variable=fraction_variable,
                             alloc_conf=self._alloc_conf(),
                             totals=totals,
                             keras_backend=keras.state(self.environ).backend if self.policy.growth is None else None)

    def _may_look(self, state: RuntimeState, probe: bool) -> bool:
        """Whether `plan` asks TensorFlow for a recorded logical configuration (only growth's route
        depends on it)."""
        return state.devices_listed or (probe and state.imported and self.policy.growth is True)

    def _aliases(self, policy: Policy) -> dict[str, str] | None:
        """UUID → index from the inventory, read only when `policy` names a GPU by UUID."""
        return self.catalog.uuid_to_index() if any(not is_index(ref) for ref in gpu_refs(policy)) else None

    def export_plan(self) -> Plan:
        """The plan for a fresh process with this machine's GPUs and the inherited grant
        (`CUDA_VISIBLE_DEVICES` and `CUDA_DEVICE_ORDER`, made explicit, since GPU indices depend on
        them): what `%tfgpu export` writes out."""
        plan = self._fresh_plan()
        inherited = [(name, value) for name in (CUDA_DEVICE_ORDER, CUDA_VISIBLE_DEVICES)
                     if (value := self._inherited(name)) is not None and name not in plan.env_map]
        return plan._replace(env=(*plan.env, *inherited)) if inherited else plan

    def _fresh_plan(self, every: bool = True) -> Plan:
        """The plan for the policy in a process where CUDA has not started yet (`every`: with every
        framework's settings, as `%tfgpu export` writes them)."""
        return build_plan(self.policy, self._inherited(CUDA_VISIBLE_DEVICES), aliases=self._aliases(self.policy),
                          frameworks=self.frameworks(every))

    def apply(self) -> ApplyReport:
        """Apply the policy now as far as TensorFlow allows; arm the import hook if TF is not loaded.

        Once TensorFlow is imported, the routes that create devices outside the eager context
        (device_lib, tf.test, TF1 sessions) are wrapped to use the policy too."""
        state = self.state()
        plan = self.plan(state)
        env_applied = self._sync_env(plan, state)
        self._watch_imports()
        if state.imported:
            self._tensorflow_imported()
            if self._may_look(state, True) != self._may_look(state, False):  # else the same plan again
                plan = self.plan(state, probe=True)
                env_applied += self._sync_env(plan, state)
            report = apply_plan(plan, self.api)
        else:
            if not importhook.is_armed():
                importhook.arm(self.on_tensorflow_import)
            report = ApplyReport(state=state, waiting=True, locked=env_changes(plan))
        report.applied[:0] = env_applied
        report.applied += self.fractions.apply()  # PyTorch's, once it is imported
        notes = [*plan.notes, *report.notes]
        report.notes = [note for note in notes if note not in self._notes_shown]
        self._notes_shown = set(notes)
        told = self.last_report.locked if self.last_report is not None else []
        report.earlier = [item for item in report.locked if item in told]
        self.last_report = report
        return report

    def _route_config(self) -> object | None:
        """The policy as a ConfigProto for a device-creating route; None without a policy."""
        plan = self.plan()
        return session_config(plan, self.api) if plan.has_tf_steps else None

    def _tensorflow_imported(self) -> None:
        """Once TensorFlow is imported, whoever imported it first (this extension's hook, or the user
        before loading it): its cell hooks and the device-creating routes that use the policy."""
        if self._tf_ready:
            return
        self._tf_ready = True
        importhook.disarm()
        from .tf.cellhooks import on_tensorflow_import

        on_tensorflow_import(self)
        install_routes(self.api, self._route_config)

    def _watch_imports(self) -> None:
        """Where the policy tells JAX or PyTorch something and one is installed but not imported, a hook
        applies the policy as its import finishes (before its backends or CUDA can start)."""
        policy = self.policy
        told = {JAX: policy.growth is not None or bool(policy.limits or policy.splits) or policy.allocator is not None,
                TORCH: bool(policy.limits or policy.splits) or policy.allocator is not None}
        installed = {JAX: lambda: not jax.state().imported and jax.installed(),
                     TORCH: lambda: not self.torch.state().imported and torch_room.installed()}
        around = {JAX: contextlib.nullcontext, TORCH: self._torch_import}
        for name, wanted in told.items():
            if wanted and not importhooks.is_armed(name) and installed[name]():
                importhooks.arm(name, self._on_framework_import, around[name])

    @contextlib.contextmanager
    def _torch_import(self) -> Iterator[None]:
        """`import torch` with PyTorch's variables set first: its CUDA library picks the allocator backend
        as it loads (`envvars.PYTORCH_CUDA_ALLOC_CONF`)."""
        self._torch_importing = True
        try:  # `sys.modules` has the half-made module already: it is not imported yet
            state = self.state()._replace(torch_imported=False)
            self._sync_env(self.plan(state), state)
            yield
        finally:
            self._torch_importing = False

    def _alloc_conf(self) -> str | None:
        """PyTorch's allocator configuration as inherited, as torch reads it: `PYTORCH_CUDA_ALLOC_CONF`
        first (even empty), else `PYTORCH_ALLOC_CONF` (torch 2.13's CUDAAllocatorConfig::instance)."""
        old = self._inherited(PYTORCH_CUDA_ALLOC_CONF)
        return old if old is not None else self._inherited(PYTORCH_ALLOC_CONF)

    def _on_framework_import(self) -> None:
        """JAX or PyTorch finished importing: its variables and PyTorch's fractions (the report is the
        status's to show, as nothing it says is new to this import)."""
        self.apply()

    def on_tensorflow_import(self) -> None:
        """The import hook's callback: apply, and hand what was left undone to `on_import_failure`."""
        report = self.apply()
        if not report.ok and self.on_import_failure is not None:
            self.on_import_failure(report)

    def _inherited(self, name: str) -> str | None:
        """Variable `name` as it was before this tool set it."""
        return self._original_env[name] if name in self._original_env else self.environ.get(name)

    def _env_diff(self, plan: Plan) -> list[tuple[str, str | None, str | None]]:
        """(name, current, target) of our variables that differ from what the plan wants (restoring
        the user's own value for those it no longer needs)."""
        wanted = plan.env_map
        diff = []
        for name in NAMES:
            if name in wanted:
                target = wanted[name]
            elif name in self._original_env:
                target = self._original_env[name]
            else:
                continue
            current = self.environ.get(name)
            if current != target:
                diff.append((name, current, target))
        return diff

    def _locked_env(self, plan: Plan, state: RuntimeState) -> list[tuple[str, str | None, str | None, str]]:
        """The plan's variable changes that can no longer take effect, restoring included: a variable
        the policy no longer wants even in a fresh process (after `reset`, say) stays as its reader
        read it until a restart. (Once CUDA started, a plan sets no `CUDA_*` variable for a policy
        that still wants them: those are not restores.)"""
        wanted = plan.env_map
        late = [(name, current, target, why) for name, current, target in self._env_diff(plan)
                if (why := self._too_late(name, state))]
        fresh = self._fresh_plan(every=False).env_map if any(name not in wanted for name, *_ in late) else {}
        return [change for change in late if change[0] in wanted or change[0] not in fresh]

    def _too_late(self, name: str, state: RuntimeState) -> str | None:
        """Why a change of variable `name` no longer takes effect (`runtime.too_late`), None while it
        does. TensorFlow's allocator creation never comes where TensorFlow listed its devices and found no
        GPU: a variable read then is set like any other (what this process starts inherits it) and never
        waits for a restart, which would not help it, unless another reader (JAX's backends) read it."""
        why = too_late(name, state)
        if why == ALLOCATOR_CREATION.code and state.devices_listed and not self.api.devices("GPU"):
            return too_late(name, state, ignoring=(ALLOCATOR_CREATION.code,))
        return why

    def _sync_env(self, plan: Plan, state: RuntimeState) -> list[str]:
        """Set our variables as the plan says, restore those it no longer needs; returns what changed.

        Variables TensorFlow or CUDA already read are left alone (`Plan.locked_env` reports them).
        Before import, the import hook learns how quiet TensorFlow's own import must be."""
        if not state.imported:
            importhook.quiet(plan.loglevel)
        changed = []
        for name, current, target in self._env_diff(plan):
            if self._too_late(name, state):
                continue
            self._original_env.setdefault(name, current)
            if target is None:
                self.environ.pop(name, None)
            else:
                self.environ[name] = target
            changed.append(f"{name}={target}" if target is not None else f"unset {name}")
        return changed


@functools.cache
def get_controller() -> Controller:
    """The process-wide controller shared by the magic, the panel and `configure()` (each hooks up the
    views' words: `views.hookup`)."""
    return Controller()
