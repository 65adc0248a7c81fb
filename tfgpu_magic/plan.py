"""Turn a policy into each framework's own form, derived once (pure): environment variables (CUDA's,
TensorFlow's, JAX's `XLA_*`, PyTorch's allocator configuration), TensorFlow's `tf.config` arguments
(`tf_limits`: TensorFlow's index → MiB of each logical device), JAX's memory fraction and PyTorch's
per-device fractions.

The runtime (applying in this process) and the exporter (code for a script) both follow the plan,
so they cannot disagree. A size limit reaches JAX and PyTorch as a share of each card's total memory
(`Frameworks.totals`, from NVML): JAX takes one fraction for every GPU, the smallest of the cards'
shares (so that no card gets more than its limit); PyTorch one per device.
"""

from __future__ import annotations

from typing import Any, Literal, Mapping, NamedTuple, Sequence

from .gpus.cudaenv import PCI_BUS_ID, parse_cuda_visible
from .language.policy import ALL_GPUS, ALLOCATORS, Policy, is_index
from .envvars import (CPP_LOG_LEVEL, CUDA_DEVICE_ORDER, CUDA_VISIBLE_DEVICES, PYTORCH_ALLOC_CONF,
                      PYTORCH_CUDA_ALLOC_CONF, TF_CPP_MIN_LOG_LEVEL, TF_FORCE_GPU_ALLOW_GROWTH, TF_GPU_ALLOCATOR,
                      XLA_CLIENT_MEM_FRACTION, XLA_PYTHON_CLIENT_PREALLOCATE, alloc_conf_entries)


NoteCode = Literal["growth_env_caps", "growth_env_logical", "hidden_by_tf", "keras_backend", "async_soft_limit",
                   "async_growth_moot", "no_tf_index", "shares_unknown", "jax_one_fraction", "jax_split_fraction",
                   "no_gpu", "missing_gpus"]
"""What a note says (`views.status.NOTES` words each): growth goes through `TF_FORCE_GPU_ALLOW_GROWTH`
because TF refuses set_memory_growth on a limited GPU (`growth_env_caps`) or drops it once any logical
device exists (`growth_env_logical`: context.py `_compute_device_options`; `GetAllowGrowthValue` in
gpu_bfc_allocator.cc reads the variable); CUDA started, so TensorFlow hides GPUs through
`set_visible_devices`; Keras's other backend makes TensorFlow grow; under cuda_malloc_async a limit is
soft and growth moot; a GPU without a TensorFlow index; cards' totals unknown (no shares for JAX and
PyTorch); JAX's one fraction, and a split reaching it as one; no GPU for the policy's GPU settings
(`tf.apply`), or fewer GPUs than it names."""


class Note(NamedTuple):
    """Something the user should know about how the policy is realised: a code and its fields (the views
    word it; a record, so a note said once is known again by equality)."""

    code: NoteCode
    fields: tuple[tuple[str, Any], ...] = ()

    @property
    def of(self) -> dict[str, Any]:
        """The note's fields by name."""
        return dict(self.fields)


def note(code: NoteCode, **fields: Any) -> Note:
    """`Note(code, fields)` with its fields named."""
    return Note(code, tuple(fields.items()))


class Frameworks(NamedTuple):
    """What the plan needs to know of the process beyond the policy (the controller reads it)."""

    jax: bool = False
    """JAX can be imported here: its `XLA_*` variables are set."""
    torch: bool = False
    """PyTorch can be imported here: its allocator configuration is set and its fractions planned."""
    fraction_variable: str = XLA_CLIENT_MEM_FRACTION
    """The memory-fraction variable the installed jaxlib reads (`frameworks.jax.fraction_variable`)."""
    alloc_conf: str | None = None
    """`PYTORCH_CUDA_ALLOC_CONF` as inherited: the plan adds its backend to the user's other keys."""
    totals: Mapping[str, int] = {}
    """Total MiB of each card by nvidia-smi index (NVML); empty without NVML."""
    keras_backend: str | None = None
    """Keras's backend (`frameworks.keras`): JAX's or PyTorch's means TensorFlow is only Keras's helper."""
    tensorflow: bool = True
    """TensorFlow is (or will be) imported: it can hide GPUs itself once CUDA started."""
    cuda_users: bool = False
    """JAX's backends or PyTorch's CUDA started: they read `CUDA_VISIBLE_DEVICES`, and only a new process
    changes what they see."""
    jax_at_import: bool = False
    """JAX is installed and not imported: the plan works out what its import will bring (`Plan.at_import`)."""
    torch_at_import: bool = False
    """PyTorch is installed and not imported: the plan works out what its import will bring (`Plan.at_import`)."""


ALL_FRAMEWORKS = Frameworks(jax=True, torch=True)
"""For a fresh process elsewhere (`%tfgpu export`): every framework's settings."""


class AtImport(NamedTuple):
    """What an import of JAX or PyTorch, installed and not imported yet, will bring in this process
    (`Frameworks.jax_at_import`, `torch_at_import`): planned with the plan, set only at that import."""

    env: tuple[tuple[str, str | None], ...] = ()
    """Their own variables (JAX's `XLA_*`, PyTorch's allocator configuration)."""
    torch_fractions: tuple[tuple[int, float], ...] = ()
    """PyTorch's per-device memory fractions (`Plan.torch_fractions`)."""


class Plan(NamedTuple):
    """Each framework's form of a policy, derived once: TensorFlow's memory limits by its own GPU index
    (`tf_limits`), JAX's fraction, PyTorch's fractions by its device index, and the variables."""

    env: tuple[tuple[str, str | None], ...] = ()
    """Variables to set (None: make sure it is unset), before their readers read them."""
    growth: bool | None = None
    """`set_memory_growth(gpu, growth)` on every GPU without a logical configuration."""
    tf_limits: tuple[tuple[int, tuple[int, ...]], ...] = ()
    """TensorFlow's `memory_limit`s (MiB, one per logical device) of each GPU index with a limit or split
    of its own (CUDA's order, renumbered from 0)."""
    tf_default_limits: tuple[int, ...] | None = None
    """The `memory_limit` of every other GPU (the policy's limit on `all`); None: left alone."""
    tf_indices: tuple[tuple[str, int], ...] = ()
    """TensorFlow's index of each GPU the policy's limits and splits name."""
    cpu_devices: int | None = None
    """Logical CPU devices on the first physical CPU."""
    visible_gpus: tuple[int, ...] | None = None
    """TF GPU indices for `set_visible_devices`, used only when CUDA started before the policy."""
    unresolved: tuple[str, ...] = ()
    """GPU references that cannot be mapped to a TensorFlow index here."""
    notes: tuple[Note, ...] = ()
    """Things the user should know about how the policy is realised."""
    locked_env: tuple[tuple[str, str | None, str | None, str], ...] = ()
    """(name, current, wanted, why) of variables the plan wants changed that were read already."""
    loglevel: str | None = None
    """Lowest severity TensorFlow's logs still show (None: TensorFlow's default): the C++ side
    through `env`, the Python loggers once TensorFlow is imported."""
    jax_fraction: float | None = None
    """The share of each GPU JAX may take (its memory-fraction variable holds it too)."""
    torch_fractions: tuple[tuple[int, float], ...] = ()
    """PyTorch's device index (CUDA's order) → its per-process memory fraction."""
    at_import: AtImport = AtImport()
    """What the import of a framework installed and not imported yet will bring (the status shows it)."""

    @property
    def env_map(self) -> dict[str, str | None]:
        return dict(self.env)

    @property
    def sized(self) -> bool:
        """TensorFlow gets logical devices with memory limits on some GPU."""
        return bool(self.tf_limits) or self.tf_default_limits is not None

    def memory_limits(self, index: int) -> tuple[int, ...] | None:
        """TensorFlow's `memory_limit`s for the logical devices of its GPU `index`; None to leave it alone."""
        return dict(self.tf_limits).get(index, self.tf_default_limits)

    @property
    def has_tf_steps(self) -> bool:
        """Whether anything goes through `tf.config` (else only the environment matters)."""
        return self.sized or self.cpu_devices is not None or self.growth is not None or self.visible_gpus is not None


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
    frameworks: Frameworks = Frameworks(),
) -> Plan:
    """The plan for `policy`.

    `inherited_visible` is `CUDA_VISIBLE_DEVICES` as CUDA will see it apart from this policy (or, once
    CUDA has started, as it saw it); `aliases` maps GPU UUIDs to indices; `logical_recorded` says
    TensorFlow already holds a logical-device configuration (so growth must go through the
    environment); `frameworks` what else the process has (JAX, PyTorch, Keras's backend, the cards'
    totals). Once CUDA has started, `CUDA_*` variables are too late: GPUs are hidden through
    `tf.config.set_visible_devices` instead.
    """
    env: dict[str, str | None] = {}
    notes: list[Note] = []
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
                if frameworks.tensorflow:
                    notes.append(note("hidden_by_tf"))
                if frameworks.cuda_users:  # they read it as their CUDA started: reported as waiting for a restart
                    env[CUDA_VISIBLE_DEVICES] = ",".join(policy.visible)
    else:
        order = visible_order(policy, inherited_visible)
        env.update(cuda_env(policy, inherited_visible))
    if policy.allocator is not None:
        env[TF_GPU_ALLOCATOR] = ALLOCATORS[policy.allocator]  # JAX's XLA reads it too

    placed: dict[str, int] = {}
    for ref, _ in policy.limits + policy.splits:
        index = None if ref == ALL_GPUS else tf_index(ref, order, aliases)
        if index is not None:
            placed[ref] = index
        elif ref != ALL_GPUS:
            unresolved.append(ref)
    tf_limits = {placed[gpu]: (mib,) for gpu, mib in policy.limits if gpu in placed}
    tf_limits.update((placed[gpu], sizes) for gpu, sizes in policy.splits if gpu in placed)
    every = policy.limit_map.get(ALL_GPUS)

    growth = policy.growth
    has_virtual = bool(tf_limits) or every is not None or policy.cpu_devices is not None or logical_recorded
    pool = policy.allocator == "async"
    if policy.growth is True and has_virtual:
        env[TF_FORCE_GPU_ALLOW_GROWTH] = "true"
        growth = None
        if not pool:
            notes.append(note("growth_env_caps" if tf_limits or every is not None else "growth_env_logical",
                              variable=TF_FORCE_GPU_ALLOW_GROWTH))
    elif policy.growth is not None:
        env[TF_FORCE_GPU_ALLOW_GROWTH] = None
    elif frameworks.keras_backend in KERAS_OTHER_BACKENDS:
        env[TF_FORCE_GPU_ALLOW_GROWTH] = "true"  # what Keras sets itself at `import keras` (keras/src/backend/config.py)
        notes.append(note("keras_backend", backend=frameworks.keras_backend))
    if pool:
        # GPUProcessState::GetGPUAllocator (gpu_process_state.cc): cuda_malloc_async replaces the BFC
        # allocator; the limit becomes the pool's release threshold, shared by logical GPUs of one card.
        if policy.limits or policy.splits:
            notes.append(note("async_soft_limit"))
        if policy.growth is not None:
            notes.append(note("async_growth_moot"))
    loglevel = policy.loglevel
    if loglevel is not None:
        env[TF_CPP_MIN_LOG_LEVEL] = CPP_LOG_LEVEL[loglevel]
    for ref in unresolved:
        notes.append(note("no_tf_index", gpu=ref, uuid=not is_index(aliases.get(ref, ref) if aliases else ref)))
    planned = frameworks.jax or frameworks.torch or frameworks.jax_at_import or frameworks.torch_at_import
    shares = card_shares(policy, order, aliases or {}, frameworks.totals) if planned else {}
    if (frameworks.jax or frameworks.torch) and (policy.limits or policy.splits) and not shares:
        notes.append(note("shares_unknown"))
    jax_fraction = _jax_env(policy, shares, frameworks, env, notes) if frameworks.jax else None
    if frameworks.torch:
        _torch_env(policy, frameworks, env)
    return Plan(
        env=tuple(env.items()),
        growth=growth,
        tf_limits=tuple(sorted(tf_limits.items())),
        tf_default_limits=None if every is None else (every,),
        tf_indices=tuple(placed.items()),
        cpu_devices=policy.cpu_devices,
        visible_gpus=visible_gpus,
        unresolved=tuple(unresolved),
        notes=tuple(notes),
        loglevel=loglevel,
        jax_fraction=jax_fraction,
        torch_fractions=tuple(sorted(shares.items())) if frameworks.torch else (),
        at_import=_at_import(policy, shares, frameworks),
    )


def cuda_env(policy: Policy, inherited_visible: str | None) -> dict[str, str | None]:
    """The `CUDA_*` variables `policy` sets where CUDA has not started yet (`inherited_visible`: as in
    `build_plan`): once CUDA started a plan sets none, though a fresh process would get these."""
    env: dict[str, str | None] = {}
    if uses_gpu_settings(policy) and not keeps_granted_order(policy, inherited_visible):
        env[CUDA_DEVICE_ORDER] = PCI_BUS_ID
    if policy.visible is not None:
        env[CUDA_VISIBLE_DEVICES] = ",".join(policy.visible)
    return env


def _at_import(policy: Policy, shares: dict[int, float], frameworks: Frameworks) -> AtImport:
    """What the import of JAX or PyTorch (`Frameworks.jax_at_import`, `torch_at_import`) will bring, from
    the same shares as the rest of the plan; its notes are the plan's once the framework is imported."""
    env: dict[str, str | None] = {}
    if frameworks.jax_at_import:
        _jax_env(policy, shares, frameworks, env, [])
    if frameworks.torch_at_import:
        _torch_env(policy, frameworks, env)
    return AtImport(tuple(env.items()), tuple(sorted(shares.items())) if frameworks.torch_at_import else ())


KERAS_OTHER_BACKENDS = ("jax", "torch")
"""Keras backends for which TensorFlow is only a helper (tf.data), never the one training."""
FRACTION_DIGITS = 3
"""Fractions are rounded down to 0.1 % (80 MiB of an 80 GiB card), never above the limit; a share
below that keeps `FRACTION_DIGITS` significant digits instead (`_fraction`)."""
BACKEND_KEY = "backend"
"""The key of PyTorch's allocator configuration that picks the allocator (`envvars.alloc_conf_entries`)."""
ASYNC_BACKEND = f"{BACKEND_KEY}:cudaMallocAsync"
"""PyTorch's allocator configuration for CUDA's stream-ordered pool (what `allocator async` asks)."""


def _fraction(share: float) -> float:
    """`share` rounded down to `FRACTION_DIGITS` decimals (a limit is never exceeded by rounding), and
    never down to 0 for a positive share: 0 means no memory at all to both readers, which take any
    fraction above it (PyTorch's `set_per_process_memory_fraction` checks only 0 <= f <= 1 and caps its
    allocator at total × f, torch/cuda/memory.py; jaxlib reads the variable with Python's `float()`,
    `xla_client.generate_pjrt_gpu_plugin_options`, exponents included). So a tiny limit (`limit 50MB`
    of an 80 GiB card: 0.0006) keeps `FRACTION_DIGITS` significant digits, rounded down as well
    (`f"{share:g}"` writes it exactly: `0.00061`, `1.22e-05`)."""
    scale = 10**FRACTION_DIGITS
    fraction = max(0.0, min(1.0, int(share * scale + 1e-9) / scale))
    if fraction == 0.0 and share > 0:
        import math

        scale = 10 ** (FRACTION_DIGITS - 1 - math.floor(math.log10(share)))
        fraction = math.floor(share * scale + 1e-9) / scale
    return fraction


def card_shares(policy: Policy, order: Sequence[str] | None, aliases: Mapping[str, str],
                totals: Mapping[str, int]) -> dict[int, float]:
    """CUDA index → the share of its card the policy's limit allows (a split counts as its parts'
    sum: JAX and PyTorch have no virtual devices); a card without a limit is left out. `limit NN%` on
    every card is that share itself; a size needs the card's total (`totals`), and a card whose
    total is unknown is left out."""
    refs = list(order) if order is not None else sorted(totals, key=int)
    limits, splits = policy.limit_map, policy.split_map
    every = limits.get(ALL_GPUS)
    shares: dict[int, float] = {}
    for index, ref in enumerate(refs):
        card = aliases.get(ref, ref)
        own = next((mib for gpu, mib in limits.items() if aliases.get(gpu, gpu) == card and gpu != ALL_GPUS), None)
        split = next((sum(sizes) for gpu, sizes in splits.items() if aliases.get(gpu, gpu) == card), None)
        limit = own if own is not None else split if split is not None else every
        if limit is None:
            continue
        if own is None and split is None and policy.limits_share is not None:
            shares[index] = _fraction(float(policy.limits_share.rstrip("%")) / 100)
        elif card in totals and totals[card] > 0:
            shares[index] = _fraction(limit / totals[card])
    return shares


def _jax_env(policy: Policy, shares: dict[int, float], frameworks: Frameworks, env: dict[str, str | None],
             notes: list[Note]) -> float | None:
    """JAX's variables (growth: no preallocation; a limit: one fraction for every GPU); its fraction."""
    if policy.growth is not None:
        env[XLA_PYTHON_CLIENT_PREALLOCATE] = "false" if policy.growth else None
    fraction = min(shares.values()) if shares else None
    if fraction is not None:
        env[frameworks.fraction_variable] = f"{fraction:g}"
    if fraction is not None and len(set(shares.values())) > 1:
        notes.append(note("jax_one_fraction", fraction=fraction))
    if fraction is not None and policy.splits:
        notes.append(note("jax_split_fraction"))
    return fraction


def _torch_env(policy: Policy, frameworks: Frameworks, env: dict[str, str | None]) -> None:
    """PyTorch's allocator configuration: its backend for `allocator async`, the user's other keys kept;
    both names (pytorch#183387: 2.9.1 honoured some keys only under the old one)."""
    if policy.allocator is None:
        return
    keys = [entry for key, entry in alloc_conf_entries(frameworks.alloc_conf or "") if key != BACKEND_KEY]
    value = ",".join(keys + ([ASYNC_BACKEND] if policy.allocator == "async" else [])) or None
    env[PYTORCH_CUDA_ALLOC_CONF] = value
    env[PYTORCH_ALLOC_CONF] = value
