"""Turn a policy into concrete steps: environment variables and `tf.config` calls (pure).

The runtime (applying in this process) and the exporter (code for a script) both follow the plan,
so they cannot disagree.
"""

from __future__ import annotations

from typing import Mapping, NamedTuple, Sequence

from ..gpus.cudaenv import PCI_BUS_ID, parse_cuda_visible
from ..language.directives import gpu_name
from ..language.policy import ALL_GPUS, ALLOCATORS, Policy, is_index
from .envvars import (CPP_LOG_LEVEL, CUDA_DEVICE_ORDER, CUDA_VISIBLE_DEVICES, TF_CPP_MIN_LOG_LEVEL,
                      TF_FORCE_GPU_ALLOW_GROWTH, TF_GPU_ALLOCATOR)


GROWTH_WITH_CAPS = f"growth goes through {TF_FORCE_GPU_ALLOW_GROWTH}=true: TF refuses set_memory_growth on a limited GPU"
GROWTH_WITH_CPU_SPLIT = f"growth goes through {TF_FORCE_GPU_ALLOW_GROWTH}=true: any logical device makes TF drop it"
"""Why growth is set through the environment (context.py `_compute_device_options` drops allow_growth
once any virtual device exists; `GetAllowGrowthValue` in gpu_bfc_allocator.cc reads the variable)."""


class Plan(NamedTuple):
    """The steps that realise a policy: the policy's memory limits and splits as it holds them, with
    where TensorFlow will number each GPU they name (`tf_indices`); `tf.apply` derives TensorFlow's
    arguments from them at the call."""

    env: tuple[tuple[str, str | None], ...] = ()
    """Variables to set (None: make sure it is unset), before TensorFlow reads them."""
    growth: bool | None = None
    """`set_memory_growth(gpu, growth)` on every GPU without a logical configuration."""
    limits: tuple[tuple[str, int], ...] = ()
    """The policy's memory limits as it holds them (`Policy.limits`, `all` included), less those on
    GPUs TensorFlow's index is unknown for (`unresolved`); `tf.apply` turns them into TF's arguments."""
    splits: tuple[tuple[str, tuple[int, ...]], ...] = ()
    """The policy's splits as it holds them (`Policy.splits`), on the GPUs `tf_indices` places."""
    tf_indices: tuple[tuple[str, int], ...] = ()
    """TensorFlow's index of each GPU named in `limits` and `splits` (CUDA's order, renumbered from 0)."""
    cpu_devices: int | None = None
    """Logical CPU devices on the first physical CPU."""
    visible_gpus: tuple[int, ...] | None = None
    """TF GPU indices for `set_visible_devices`, used only when CUDA started before the policy."""
    unresolved: tuple[str, ...] = ()
    """GPU references that cannot be mapped to a TensorFlow index here."""
    notes: tuple[str, ...] = ()
    """Things the user should know about how the policy is realised."""
    locked_env: tuple[tuple[str, str | None, str | None, str], ...] = ()
    """(name, current, wanted, why) of variables the plan wants changed that were read already."""
    loglevel: str | None = None
    """Lowest severity TensorFlow's logs still show (None: TensorFlow's default): the C++ side
    through `env`, the Python loggers once TensorFlow is imported."""

    @property
    def env_map(self) -> dict[str, str | None]:
        return dict(self.env)

    @property
    def has_tf_steps(self) -> bool:
        """Whether anything goes through `tf.config` (else only the environment matters)."""
        return bool(self.limits or self.splits) or self.cpu_devices is not None or self.growth is not None \
            or self.visible_gpus is not None


def gpu_refs(policy: Policy) -> list[str]:
    """Every GPU the policy names (not `all`)."""
    named = list(policy.visible or ()) + [gpu for gpu, _ in policy.limits + policy.splits]
    return [gpu for gpu in named if gpu != ALL_GPUS]


def uses_gpu_settings(policy: Policy) -> bool:
    return bool(
        policy.visible is not None or policy.growth is not None or policy.limits or policy.splits or policy.allocator
    )


def visible_order(policy: Policy, inherited: str | None) -> list[str] | None:
    """The `CUDA_VISIBLE_DEVICES` entries CUDA will enumerate, None for 'every GPU, PCI order'."""
    if policy.visible is not None:
        return list(policy.visible)
    if inherited is None:
        return None
    return list(parse_cuda_visible(inherited).entries)


def keeps_granted_order(policy: Policy, inherited: str | None) -> bool:
    """Whether `CUDA_DEVICE_ORDER` must stay as inherited: the process was granted GPUs by index
    (`CUDA_VISIBLE_DEVICES=2`) and the policy keeps that grant (no `visible`). CUDA reads the indices
    in the inherited order; setting PCI_BUS_ID could make one of them another card (`gpus.cudaenv.Grant`)."""
    return policy.visible is None and any(is_index(entry) for entry in visible_order(policy, inherited) or ())


def tf_index(ref: str, order: Sequence[str] | None, aliases: Mapping[str, str] | None = None) -> int | None:
    """TensorFlow's index for GPU `ref` (nvidia-smi index or UUID), None if it cannot be known.

    `aliases` maps GPU UUIDs to nvidia-smi indices (from the inventory)."""
    aliases = aliases or {}
    ref = aliases.get(ref, ref)
    if order is None:
        return int(ref) if is_index(ref) else None
    canonical = [aliases.get(entry, entry) for entry in order]
    return canonical.index(ref) if ref in canonical else None


def build_plan(
    policy: Policy,
    inherited_visible: str | None = None,
    cuda_started: bool = False,
    aliases: Mapping[str, str] | None = None,
    logical_recorded: bool = False,
) -> Plan:
    """The plan for `policy`.

    `inherited_visible` is `CUDA_VISIBLE_DEVICES` as CUDA will see it apart from this policy (or, once
    CUDA has started, as it saw it); `aliases` maps GPU UUIDs to indices; `logical_recorded` says
    TensorFlow already holds a logical-device configuration (so growth must go through the
    environment). Once CUDA has started, `CUDA_*` variables are too late: GPUs are
    hidden through `tf.config.set_visible_devices` instead.
    """
    env: dict[str, str | None] = {}
    notes: list[str] = []
    unresolved: list[str] = []
    visible_gpus: tuple[int, ...] | None = None
    if cuda_started:
        order = visible_order(Policy(), inherited_visible)
        if policy.visible is not None:
            indices = [tf_index(ref, order, aliases) for ref in policy.visible]
            unresolved += [ref for ref, index in zip(policy.visible, indices) if index is None]
            resolved = tuple(index for index in indices if index is not None)
            if order is None or sorted(resolved) != list(range(len(order))):
                visible_gpus = resolved
                notes.append("CUDA has already started: GPUs are hidden through tf.config.set_visible_devices")
    else:
        order = visible_order(policy, inherited_visible)
        if uses_gpu_settings(policy) and not keeps_granted_order(policy, inherited_visible):
            env[CUDA_DEVICE_ORDER] = PCI_BUS_ID
        if policy.visible is not None:
            env[CUDA_VISIBLE_DEVICES] = ",".join(policy.visible)
    if policy.allocator is not None:
        env[TF_GPU_ALLOCATOR] = ALLOCATORS[policy.allocator]

    placed: dict[str, int] = {}
    for ref, _ in policy.limits + policy.splits:
        index = None if ref == ALL_GPUS else tf_index(ref, order, aliases)
        if index is not None:
            placed[ref] = index
        elif ref != ALL_GPUS:
            unresolved.append(ref)
    limits = tuple(entry for entry in policy.limits if entry[0] == ALL_GPUS or entry[0] in placed)
    splits = tuple(entry for entry in policy.splits if entry[0] in placed)

    growth = policy.growth
    has_virtual = bool(limits or splits) or policy.cpu_devices is not None or logical_recorded
    pool = policy.allocator == "async"
    if policy.growth is True and has_virtual:
        env[TF_FORCE_GPU_ALLOW_GROWTH] = "true"
        growth = None
        if not pool:
            notes.append(GROWTH_WITH_CAPS if limits or splits else GROWTH_WITH_CPU_SPLIT)
    elif policy.growth is not None:
        env[TF_FORCE_GPU_ALLOW_GROWTH] = None
    if pool:
        # GPUProcessState::GetGPUAllocator (gpu_process_state.cc): cuda_malloc_async replaces the BFC
        # allocator; the limit becomes the pool's release threshold, shared by logical GPUs of one card.
        if policy.limits or policy.splits:
            notes.append("with cuda_malloc_async a memory limit is soft (the pool's release threshold), not a cap")
        if policy.growth is not None:
            notes.append("with cuda_malloc_async memory growth is moot: the pool allocates on demand")
    loglevel = policy.loglevel
    if loglevel is not None:
        env[TF_CPP_MIN_LOG_LEVEL] = CPP_LOG_LEVEL[loglevel]
    for ref in unresolved:
        why = ("it is not among the GPUs CUDA will use" if is_index(aliases.get(ref, ref) if aliases else ref)
               else "a UUID needs the GPU inventory (or list it in `visible`)")
        notes.append(f"{gpu_name(ref)}: no TensorFlow index is known for it here: {why}")
    return Plan(
        env=tuple(env.items()),
        growth=growth,
        limits=limits,
        splits=splits,
        tf_indices=tuple(placed.items()),
        cpu_devices=policy.cpu_devices,
        visible_gpus=visible_gpus,
        unresolved=tuple(unresolved),
        notes=tuple(notes),
        loglevel=loglevel,
    )
