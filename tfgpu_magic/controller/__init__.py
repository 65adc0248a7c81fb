"""One controller per process: the desired policy, the environment we set, and applying at the right time.

TensorFlow's device state is process-wide, so the magic, the panel and `configure()` all share the
controller returned by `get_controller()`. `Controller` is the facade the views use; its jobs live in
modules of their own: the policy and its edits (`policyedits`), the environment it owns
(`environment`), the frameworks' moments and import hooks (`moments`), the status queries (`queries`).
"""

from __future__ import annotations

import functools
import os
from typing import TYPE_CHECKING, Callable, Iterable, MutableMapping

from ..errors import PolicyError
from ..frameworks import FrameworkMemory, FrameworkView, jax
from ..frameworks.torch import Fractions, Torch, TorchAPI
from ..gpus.cudaenv import Grant, GrantedCatalog, grant_of
from ..gpus.inventory import Inventory, InventoryCatalog
from ..envvars import ALLOCATOR_CREATION, CUDA_DEVICE_ORDER, CUDA_VISIBLE_DEVICES
from ..plan import Frameworks, Note, Plan, build_plan, cuda_env, uses_gpu_settings
from ..language.policy import Policy
from ..tf.apply import (ApplyReport, ConfigAPI, Pending, Recorded, TensorFlowConfig, VariableSet,
                        any_logical_recorded, apply_plan, env_changes, session_config)
from ..tf.routes import install_routes
from ..tf.runtime import NVML_LISTS_SELF, RuntimeState, too_late
from . import policyedits, queries
from .environment import OwnedEnvironment
from .moments import JAX, TORCH, FrameworkMoments
from .queries import GpuSettings, ListedGpu, NoGpu

if TYPE_CHECKING:  # the grammar loads at the first edit: a restarted kernel applies a stored policy without it
    from ..language.grammar import Edit

__all__ = ["Controller", "GpuSettings", "JAX", "ListedGpu", "NoGpu", "TORCH", "get_controller"]


class Controller:
    """Holds the desired policy and applies it to every framework in the process: via the environment
    before each reads it, through an import hook as TensorFlow and PyTorch finish importing, through
    `tf.config` and `torch.cuda` after; reports what is locked once a framework has read it.

    One-time work per framework happens once (`FrameworkMoments.tensorflow_imported`, `Fractions`): an
    edit applies the plan, it does not set the frameworks up again."""

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
        self._env = OwnedEnvironment(os.environ if environ is None else environ)
        self._moments = FrameworkMoments(self.api, self.torch)
        self.catalog = GrantedCatalog(catalog if catalog is not None else InventoryCatalog(), self.grant)
        """The GPUs a policy may name: the inventory's, inside this process's grant (`grant`)."""
        self.policy = Policy()
        self.last_report: ApplyReport | None = None
        self.on_import_failure: Callable[[ApplyReport], None] | None = None
        """Told what applying at `import tensorflow` left undone; a view sets it (views render, see
        `views.hookup`), so the controller imports none."""
        self._notes_shown: set[Note] = set()
        self.listeners: list[Callable[[Controller], None]] = []

    @property
    def environ(self) -> MutableMapping[str, str]:
        """The process environment this controller sets (`os.environ`; tests give their own)."""
        return self._env.environ

    @environ.setter
    def environ(self, environ: MutableMapping[str, str]) -> None:
        self._env.environ = environ

    def inventory(self) -> Inventory:
        """The GPU inventory this controller's GPU references resolve against (NVML, cached)."""
        return self.catalog.inventory

    def grant(self) -> Grant:
        """The GPUs this process was started with: `CUDA_VISIBLE_DEVICES` (and `CUDA_DEVICE_ORDER`) as
        they were before this tool set them, placed on the inventory's cards (read only where there is
        a grant), and what this process's environment says of them (a Slurm job's record). A policy
        stays inside it; `Grant.granted_cards()` is what `who` marks."""
        value = self._env.inherited(CUDA_VISIBLE_DEVICES)
        return grant_of(value, self._env.inherited(CUDA_DEVICE_ORDER), self.inventory() if value is not None else None,
                        self.environ)

    # ----- what the views read (`queries`) ----------------------------------------------------
    def subscribe(self, listener: Callable[[Controller], None]) -> None:
        """Call `listener(controller)` after every policy change (from any view, or `configure()`)."""
        self.listeners.append(listener)

    def unsubscribe(self, listener: Callable[[Controller], None]) -> None:
        """Stop calling `listener`; nothing happens if it was not subscribed."""
        if listener in self.listeners:
            self.listeners.remove(listener)

    def environment(self) -> dict[str, str]:
        """The variables this tool manages, as set in the environment now (by us or inherited)."""
        return self._env.current()

    def recorded(self, state: RuntimeState | None = None) -> list[Recorded] | None:
        """What TensorFlow has recorded, a record per device (the views word them); None while it is
        not imported."""
        return queries.recorded(self, state or self.state())

    def pending(self, state: RuntimeState | None = None, plan: Plan | None = None) -> list[Pending]:
        """Settings TensorFlow has not taken yet (`queries.pending`; the views word them); `plan`: the
        plan for `state`, where the caller built it already."""
        state = state or self.state()
        return queries.pending(self, state, plan or self.plan(state))

    def gpus(self) -> tuple[list[ListedGpu], NoGpu | None]:
        """The GPUs to list (NVML's, else TensorFlow's once imported), and why there are none
        (`views.status.no_gpu_reason` words it). Listing TF's devices never initializes its runtime."""
        return queries.gpus(self)

    def gpu_settings(self, refs: Iterable[str]) -> dict[str, GpuSettings]:
        """What the policy asks of each GPU in `refs` (nvidia-smi indices)."""
        return queries.gpu_settings(self, refs)

    def frameworks_moment(self) -> tuple[object, ...]:
        """Where JAX, PyTorch and Keras are in their lives: cheap enough for after every cell."""
        return self._moments.moment()

    def other_frameworks(self, plan: Plan | None = None) -> list[FrameworkView]:
        """JAX, PyTorch and Keras as the status shows them (`queries.other_frameworks`); `plan`: this
        process's plan with what an import will bring (`plan(imports=True)`), where the caller built it."""
        return queries.other_frameworks(self, plan)

    def framework_memory(self, state: RuntimeState | None = None,
                         plan: Plan | None = None) -> dict[str, list[FrameworkMemory]]:
        """JAX's and PyTorch's own figures per GPU once started (`queries.framework_memory`); `state` and
        `plan`: where the caller read them already (a figures-only look passes its last full look's)."""
        return queries.framework_memory(self, state, plan)

    def inherited_environment(self) -> dict[str, str]:
        """The environment with the variables this tool set put back as they were: what a fresh process
        started without the policy gets (`%tfgpu selftest` runs its rules in such processes)."""
        return self._env.inherited_environment()

    def export(self, form: str = "python", words: Callable[[Note], str] | None = None) -> str:
        """The policy as standalone code for a fresh process (`python`, `env` or `json`), its notes worded
        by `words` (a view's: `views.status.note_text`)."""
        from ..tf.export import export, note_code

        return export(self.policy, form, self.export_plan(), words or note_code)

    # ----- editing (`policyedits`) -------------------------------------------------------------
    def parse(self, line: str) -> Edit:
        """Parse a line that must be a policy edit."""
        return policyedits.parse_edit(line, self.catalog)

    def edit(self, edits: Iterable[Edit]) -> ApplyReport:
        """Apply all `edits` to the policy, all or nothing, then apply the policy. Only the result is
        validated, once (by `set_policy`), so the lines of a `%%tfgpu` cell may come in any order."""
        edits = list(edits)
        policy = policyedits.edited(self.policy, edits, self.catalog)
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
        policy = policyedits.edited(self.policy if base is None else base, [self.parse(line) for line in lines],
                                    self.catalog)
        policy.validate(policyedits.aliases(policy, self.catalog))
        return policy

    def set_policy(self, policy: Policy, fields: Iterable[str] | None = None) -> ApplyReport:
        """Replace the desired policy (validated first) and apply it as far as TensorFlow allows.
        Where TensorFlow lacks the GPUs, the report names the GPU settings this change asked for: those
        of the policy `fields` the edits set (a directive given again asks again), by default those that
        differ from the policy before."""
        policy.validate(policyedits.aliases(policy, self.catalog))
        before, self.policy = self.policy, policy
        report = self.apply()
        if report.absent:
            report.gpu_edits = policyedits.asked_of_gpus(before, policy, fields, self.catalog.uuid_to_index())
        for listener in list(self.listeners):
            listener(self)
        return report

    # ----- planning ----------------------------------------------------------------------------
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
            return state._replace(cuda_elsewhere=NVML_LISTS_SELF)
        return state

    def plan(self, state: RuntimeState | None = None, probe: bool = False, imports: bool = False) -> Plan:
        """The plan for the current policy, for TensorFlow as it is in `state` (default: now).

        With `probe` (about to apply; the `CUDA_*` variables are already set), or once CUDA started
        anyway, it asks TensorFlow whether a logical-device configuration is already recorded. With
        `imports` (a view about to show it), also what the import of JAX or PyTorch, installed and not
        imported yet, will bring (`Plan.at_import`): one plan serves the whole status."""
        state = state or self.state()
        recorded = self._may_look(state, probe) and any_logical_recorded(self.api)
        inherited = self.environ.get(CUDA_VISIBLE_DEVICES) if state.cuda_fixed \
            else self._env.inherited(CUDA_VISIBLE_DEVICES)
        plan = build_plan(self.policy, inherited, cuda_started=state.cuda_fixed,
                          aliases=policyedits.aliases(self.policy, self.catalog), logical_recorded=recorded,
                          frameworks=self.frameworks(imports=imports))
        return plan._replace(locked_env=tuple(self._locked_env(plan, state)))

    def frameworks(self, every: bool = False, imports: bool = False) -> Frameworks:
        """What the plan needs to know of the other frameworks here (`FrameworkMoments.frameworks`)."""
        policy = self.policy
        return self._moments.frameworks(bool(policy.limits or policy.splits), policy.growth is None, self.inventory,
                                        self.environ, self._env.alloc_conf(), every, imports)

    def _may_look(self, state: RuntimeState, probe: bool) -> bool:
        """Whether `plan` asks TensorFlow for a recorded logical configuration (only growth's route
        depends on it)."""
        return state.devices_listed or (probe and state.imported and self.policy.growth is True)

    def export_plan(self) -> Plan:
        """The plan for a fresh process with this machine's GPUs and the inherited grant
        (`CUDA_VISIBLE_DEVICES` and `CUDA_DEVICE_ORDER`, made explicit, since GPU indices depend on
        them): what `%tfgpu export` writes out."""
        plan = self.fresh_plan()
        inherited = [(name, value) for name in (CUDA_DEVICE_ORDER, CUDA_VISIBLE_DEVICES)
                     if (value := self._env.inherited(name)) is not None and name not in plan.env_map]
        return plan._replace(env=(*plan.env, *inherited)) if inherited else plan

    def fresh_plan(self) -> Plan:
        """The plan for the policy in a process where CUDA has not started yet, with every framework's
        settings, as `%tfgpu export` writes them."""
        return build_plan(self.policy, self._env.inherited(CUDA_VISIBLE_DEVICES),
                          aliases=policyedits.aliases(self.policy, self.catalog), frameworks=self.frameworks(every=True))

    # ----- applying ----------------------------------------------------------------------------
    def apply(self) -> ApplyReport:
        """Apply the policy now as far as TensorFlow allows; arm the import hook if TF is not loaded.

        Once TensorFlow is imported, the routes that create devices outside the eager context
        (device_lib, tf.test, TF1 sessions) are wrapped to use the policy too."""
        state = self.state()
        plan = self.plan(state)
        env_applied = self._sync_env(plan, state)
        self._moments.watch_imports(policyedits.told_frameworks(self.policy), self.apply, self._prepare_torch)
        if state.imported:
            self._moments.tensorflow_imported(self._tensorflow_ready)
            if self._may_look(state, True) != self._may_look(state, False):  # else the same plan again
                plan = self.plan(state, probe=True)
                env_applied += self._sync_env(plan, state)
            report = apply_plan(plan, self.api)
        else:
            self._moments.arm_tensorflow(self.on_tensorflow_import)
            report = ApplyReport(state=state, waiting=True, locked=env_changes(plan))
        report.applied[:0] = env_applied
        report.left = self._env.take_left()
        report.applied += self.fractions.apply()  # PyTorch's, once it is imported
        notes = [*plan.notes, *report.notes]
        report.notes = [note for note in notes if note not in self._notes_shown]
        self._notes_shown = set(notes)
        told = self.last_report.locked if self.last_report is not None else []
        report.earlier = [item for item in report.locked if item in told]
        self.last_report = report
        return report

    def on_tensorflow_import(self) -> None:
        """The import hook's callback: apply, and hand what was left undone to `on_import_failure`."""
        report = self.apply()
        if not report.ok and self.on_import_failure is not None:
            self.on_import_failure(report)

    def _tensorflow_ready(self) -> None:
        """TensorFlow imported (once): its cell hooks, and the device-creating routes that use the policy."""
        from ..tf.cellhooks import on_tensorflow_import

        on_tensorflow_import(self)
        install_routes(self.api, self._route_config)

    def _route_config(self) -> object | None:
        """The policy as a ConfigProto for a device-creating route; None without a policy."""
        plan = self.plan()
        return session_config(plan, self.api) if plan.has_tf_steps else None

    def _prepare_torch(self) -> None:
        """PyTorch's variables, set as its import begins (`sys.modules` has the half-made module already:
        it is not imported yet)."""
        state = self.state()._replace(torch_imported=False)
        self._sync_env(self.plan(state), state)

    def _locked_env(self, plan: Plan, state: RuntimeState) -> list[tuple[str, str | None, str | None, str]]:
        """The plan's variable changes that can no longer take effect, restoring included: a variable
        the policy no longer wants even in a fresh process (after `reset`, say) stays as its reader
        read it until a restart. (Once CUDA started, a plan sets no `CUDA_*` variable for a policy
        that still wants them, `plan.cuda_env`: those are not restores.)"""
        wanted = plan.env_map
        late = [(name, current, target, why) for name, current, target in self._env.diff(wanted)
                if (why := self._too_late(name, state))]
        fresh = cuda_env(self.policy, self._env.inherited(CUDA_VISIBLE_DEVICES)) \
            if any(name not in wanted for name, *_ in late) else {}
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

    def _sync_env(self, plan: Plan, state: RuntimeState) -> list[VariableSet]:
        """Set our variables as the plan says, restore those it no longer needs (`OwnedEnvironment.sync`);
        before import, the import hook learns how quiet TensorFlow's own import must be."""
        if not state.imported:
            self._moments.quiet_tensorflow(plan.loglevel)
        return self._env.sync(plan.env_map, state, self._too_late)


@functools.cache
def get_controller() -> Controller:
    """The process-wide controller shared by the magic, the panel and `configure()` (each hooks up the
    views' words: `views.hookup`)."""
    return Controller()
