"""One controller per process: the desired policy, the environment we set, and applying at the right time.

TensorFlow's device state is process-wide, so the magic, the panel and `configure()` all share the
controller returned by `get_controller()`.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import sys
from typing import Callable, Iterable, MutableMapping

from . import importhook
from .errors import PolicyError
from .grammar import Edit, GpuCatalog, parse_line
from .inventory import Inventory, InventoryCatalog, cached_inventory
from .plan import CUDA_ENV, OUR_ENV, Plan, build_plan, gpu_refs
from .policy import Policy, is_index
from .runtime import ApplyReport, ConfigAPI, RuntimeState, TensorFlowConfig, any_logical_recorded, apply_plan

class Controller:
    """Holds the desired policy and applies it: via the environment and an import hook before
    TensorFlow is imported, through `tf.config` after, and reports what is locked once initialized."""

    def __init__(
        self,
        api: ConfigAPI | None = None,
        environ: MutableMapping[str, str] | None = None,
        catalog: GpuCatalog | None = None,
    ) -> None:
        self.api: ConfigAPI = api or TensorFlowConfig()
        self.environ = os.environ if environ is None else environ
        self.catalog: GpuCatalog = catalog if catalog is not None else InventoryCatalog()
        self.policy = Policy()
        self.last_report: ApplyReport | None = None
        self._original_env: dict[str, str | None] = {}
        self._notes_shown: set[str] = set()
        self.listeners: list[Callable[[Controller], None]] = []

    def inventory(self) -> Inventory:
        """The GPU inventory this controller's GPU references resolve against (NVML, cached)."""
        inventory = getattr(self.catalog, "inventory", None)
        return inventory if isinstance(inventory, Inventory) else cached_inventory()

    # ----- editing -------------------------------------------------------------------------
    def parse(self, line: str) -> Edit:
        """Parse a line that must be a policy edit."""
        directive = parse_line(line, self.catalog)
        if not isinstance(directive, Edit):
            raise PolicyError(f"`{directive.name}` is not a policy change")
        return directive

    def edit(self, edits: Iterable[Edit]) -> ApplyReport:
        """Apply all `edits` to the policy, all or nothing, then apply the policy."""
        policy = self.policy
        for edit in edits:
            try:
                policy = edit.change(policy)
            except PolicyError as err:
                raise PolicyError(f"line {edit.line}: {err}" if edit.line else str(err)) from None
        return self.set_policy(policy)

    def edit_policy(self, lines: Iterable[str], base: Policy | None = None) -> Policy:
        """The policy `lines` (directive strings) make of `base` (default: the current one); applies nothing."""
        policy = self.policy if base is None else base
        for line in lines:
            policy = self.parse(line).change(policy)
        return policy

    def set_policy(self, policy: Policy) -> ApplyReport:
        """Replace the desired policy (validated first) and apply it as far as TensorFlow allows."""
        policy.validate(self._aliases(policy))
        self.policy = policy
        report = self.apply()
        for listener in list(self.listeners):
            listener(self)
        return report

    # ----- applying ------------------------------------------------------------------------
    def plan(self, state: RuntimeState | None = None, probe: bool = False) -> Plan:
        """The plan for the current policy, for TensorFlow as it is in `state` (default: now).

        With `probe` (about to apply; the `CUDA_*` variables are already set), or once CUDA started
        anyway, it asks TensorFlow whether a logical-device configuration is already recorded."""
        state = state or self.api.state()
        may_look = state.devices_listed or (probe and state.imported and self.policy.growth is True)
        recorded = may_look and any_logical_recorded(self.api)  # only growth's route depends on it
        inherited = self.environ.get("CUDA_VISIBLE_DEVICES") if state.devices_listed else self._inherited_cvd()
        return build_plan(self.policy, inherited, cuda_started=state.devices_listed, aliases=self._aliases(self.policy),
                          logical_recorded=recorded)

    def _aliases(self, policy: Policy) -> dict[str, str] | None:
        """UUID → index from the inventory, read only when `policy` names a GPU by UUID."""
        return self.catalog.uuid_to_index() if any(not is_index(ref) for ref in gpu_refs(policy)) else None

    def export_plan(self) -> Plan:
        """The plan for a fresh process with this machine's GPUs and inherited `CUDA_VISIBLE_DEVICES`
        (made explicit, since GPU indices depend on it): what `%tfgpu export` writes out."""
        inherited = self._inherited_cvd()
        plan = build_plan(self.policy, inherited, aliases=self._aliases(self.policy))
        if inherited is not None and "CUDA_VISIBLE_DEVICES" not in plan.env_map:
            plan = dataclasses.replace(plan, env=(*plan.env, ("CUDA_VISIBLE_DEVICES", inherited)))
        return plan

    def apply(self) -> ApplyReport:
        """Apply the policy now as far as TensorFlow allows; arm the import hook if TF is not loaded."""
        state = self.api.state()
        plan = self.plan(state)
        env_applied, env_locked = self._sync_env(plan, state)
        if state.imported:
            importhook.disarm()
            plan = self.plan(state, probe=True)
            more_applied, more_locked = self._sync_env(plan, state)
            env_applied += more_applied
            env_locked += [item for item in more_locked if item not in env_locked]
            report = apply_plan(plan, self.api)
        else:
            importhook.arm(self._on_import)
            report = ApplyReport(state=state, waiting=True)
        report.applied[:0] = env_applied
        report.locked[:0] = env_locked
        report.notes[:0] = [note for note in plan.notes if note not in self._notes_shown]
        self._notes_shown = set(plan.notes)
        self.last_report = report
        return report

    def _on_import(self) -> None:
        report = self.apply()
        if not report.ok:
            from .status import describe_report

            print(describe_report(report), file=sys.stderr)

    def _inherited_cvd(self) -> str | None:
        """`CUDA_VISIBLE_DEVICES` as it was before this tool set it."""
        name = "CUDA_VISIBLE_DEVICES"
        return self._original_env[name] if name in self._original_env else self.environ.get(name)

    def _sync_env(self, plan: Plan, state: RuntimeState) -> tuple[list[str], list[str]]:
        """Set our variables as the plan says, restore those it no longer needs.

        Returns (changed, locked): `CUDA_*` are left alone once CUDA started, everything once the
        runtime is initialized (TensorFlow read them already), and reported as locked if they differ.
        """
        wanted = plan.env_map
        changed, locked = [], []
        for name in OUR_ENV:
            if name in wanted:
                target = wanted[name]
            elif name in self._original_env:
                target = self._original_env[name]
            else:
                continue
            current = self.environ.get(name)
            if current == target:
                continue
            if name in CUDA_ENV and state.devices_listed:
                if name in wanted:
                    locked.append(f"{name}: {current or 'unset'} → {target or 'unset'} (read when CUDA started)")
                continue
            if state.initialized:
                locked.append(f"{name}: {current or 'unset'} → {target or 'unset'} (read at initialization)")
                continue
            self._original_env.setdefault(name, current)
            if target is None:
                self.environ.pop(name, None)
            else:
                self.environ[name] = target
            changed.append(f"{name}={target}" if target is not None else f"unset {name}")
        return changed, locked


@functools.cache
def get_controller() -> Controller:
    """The process-wide controller shared by the magic, the panel and `configure()`."""
    return Controller()


def configure(*directives: str) -> ApplyReport:
    """Script form of `%tfgpu`: `configure("growth on", "split cpu 2")` before importing TensorFlow.

    Same directives and timing rules as the magic; bad input raises `PolicyError` and changes nothing.
    """
    controller = get_controller()
    report = controller.set_policy(controller.edit_policy(directives))
    if not report.ok:
        import warnings

        from .status import SCRIPT_RESTART_HINT, describe_report

        warnings.warn(describe_report(report, SCRIPT_RESTART_HINT), stacklevel=2)
    return report
