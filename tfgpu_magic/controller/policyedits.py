"""The policy and its edits: a directive line parsed to an `Edit`, edits applied in turn (all or nothing,
validated once, as a whole), and what an edit asked of GPUs that are not there. Pure: nothing here
applies the policy (the controller does, once an edited policy is taken).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Iterable, Mapping

from ..errors import PolicyError
from ..language.policy import Policy, is_index
from ..plan import gpu_refs

if TYPE_CHECKING:  # the grammar loads at the first edit: a restarted kernel applies a stored policy without it
    from ..gpus.cudaenv import GrantedCatalog
    from ..language.grammar import Edit


def parse_edit(line: str, catalog: GrantedCatalog) -> Edit:
    """Parse a line that must be a policy edit."""
    from ..language.grammar import Edit, parse_line

    directive = parse_line(line, catalog)
    if not isinstance(directive, Edit):
        raise PolicyError(f"`{directive.name}` is not a policy change")
    return directive


def edited(policy: Policy, edits: Iterable[Edit], catalog: GrantedCatalog) -> Policy:
    """`policy` with every edit applied in turn, not validated; an error names its cell line."""
    from ..language.grammar import apply_edit

    for edit in edits:
        try:
            policy = apply_edit(policy, edit, catalog)
        except PolicyError as err:
            raise PolicyError(f"line {edit.line}: {err}" if edit.line else str(err)) from None
    return policy


def aliases(policy: Policy, catalog: GrantedCatalog) -> dict[str, str] | None:
    """UUID → index from the inventory, read only when `policy` names a GPU by UUID."""
    return catalog.uuid_to_index() if any(not is_index(ref) for ref in gpu_refs(policy)) else None


def told_frameworks(policy: Policy) -> dict[str, bool]:
    """Whether the policy tells JAX and PyTorch anything, by top-level package (else their imports need
    no hook)."""
    sized = bool(policy.limits or policy.splits)
    return {"jax": policy.growth is not None or sized or policy.allocator is not None,
            "torch": sized or policy.allocator is not None}


def asked_of_gpus(before: Policy, policy: Policy, fields: Iterable[str] | None,
                  uuid_to_index: Mapping[str, str]) -> list[str]:
    """The GPU settings a change from `before` to `policy` asked for (status phrases): those of the policy
    `fields` the edits set (a directive given again asks again), by default those that differ."""
    from ..language.directives import gpu_asks

    if fields is None:
        fields = [name for name, value in vars(policy).items() if getattr(before, name) != value]
    asked = Policy().edited(**{name: getattr(policy, name) for name in {*fields, "limits_written"}})
    return gpu_asks(asked, dict(uuid_to_index))
