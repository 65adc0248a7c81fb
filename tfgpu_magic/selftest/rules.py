"""The selftest's rules, in the order the report lists them: for each, the policy it applies, the child
script that measures it (`probes`), when it cannot run here and why, and its judge (`judges`: pure, it
reads only the figures a child reported). What a rule is made of is in `records`.
"""

from __future__ import annotations

from typing import Callable, Mapping

from ..errors import PolicyError
from ..gpus.cudaenv import parse_cuda_visible
from ..gpus.inventory import Gpu, Inventory, freest_first
from ..envvars import CUDA_VISIBLE_DEVICES, told_to
from . import probes
from .judges import (CPU_SPLIT, judge_allocator, judge_baseline, judge_cpu_split, judge_device_routes, judge_doctor,
                     judge_growth, judge_inventory, judge_jax, judge_limit, judge_limit_percent, judge_locked,
                     judge_memory_info, judge_quiet_import, judge_split_gpu, judge_torch, judge_visible_auto,
                     judge_visible_gpus, judge_visible_none, judge_who)
from .judges import TORCH_ASYNC  # noqa: F401 (callers and tests import it, and the records, from here)
from .records import FAIL, FRAMEWORKS, GPU, NVML, PASS, SKIP, TENSORFLOW, Machine, Prepared, Probe, Rule  # noqa: F401

CELL_SPLIT = 2
HALF_SHARE = 0.5
HALF = f"limit {HALF_SHARE:.0%}"
"""The limit JAX's and PyTorch's rules set where NVML knows the card: it reaches them as `HALF_SHARE`."""
NO_USABLE_GPU = "no GPU outside MIG mode among those CUDA_VISIBLE_DEVICES allows"


# ----- what each rule needs -------------------------------------------------------------------------------
def needs_tensorflow(*policy: str) -> Callable[[Machine], Prepared | str]:
    def prepare(machine: Machine) -> Prepared | str:
        return machine.tensorflow or baseline_failed(machine) or Prepared(policy)

    return prepare


def baseline_failed(machine: Machine) -> str | None:
    """Why the run without a policy gave no result (it hangs, or fails to import): every other
    TensorFlow rule is skipped with this instead of waiting on the same TensorFlow; None until it ran."""
    baseline = machine.baseline
    if baseline is None or baseline.figures is not None:
        return None
    return f"the run without a policy failed: {baseline.error}"


def needs_gpus_in_nvml(*policy: str) -> Callable[[Machine], Prepared | str]:
    def prepare(machine: Machine) -> Prepared | str:
        if not machine.inventory.available:
            return machine.inventory.error or "NVML unavailable"
        return Prepared(policy) if machine.inventory.gpus else "NVML lists no GPU on this machine"

    return prepare


def always(machine: Machine) -> Prepared:
    return Prepared()


def with_half_a_card(framework: str, missing: Callable[[Machine], str | None],
                     *policy: str) -> Callable[[Machine], Prepared | str]:
    """A JAX or PyTorch rule: skipped where this Python cannot import the framework (`missing` says why);
    else `policy`, and where NVML lists a usable card, that card alone with `limit 50%` (a limit reaches
    them as a share of the card's total, which only NVML gives: without it the policy takes no limit).
    The child notes the variables the policy tells `framework` (`envvars.told_to`)."""

    def prepare(machine: Machine) -> Prepared | str:
        why = missing(machine)
        if why:
            return why
        told = list(told_to(framework))
        gpus = usable_gpus(machine.inventory, machine.environ) if machine.inventory.available else []
        card = next((gpu for gpu in gpus if gpu.memory_total_mib), None)
        if card is None:
            no_limit = machine.inventory.error or f"NVML lists {NO_USABLE_GPU}"
            return Prepared(policy, {"variables": told, "fraction": None, "no_limit": no_limit})
        return Prepared((f"visible {card.ref}", *policy, HALF),
                        {"variables": told, "fraction": HALF_SHARE, "total_mib": card.memory_total_mib})

    return prepare


def usable_gpus(inventory: Inventory, environ: Mapping[str, str]) -> list[Gpu]:
    """GPUs a probe may use, freest first: not in MIG mode (CUDA sees only its instances there), and
    among those an inherited `CUDA_VISIBLE_DEVICES` allows (an admin's or a provisioner's pin)."""
    gpus = [gpu for gpu in inventory.gpus if not gpu.mig_devices]
    raw = environ.get(CUDA_VISIBLE_DEVICES)
    if raw is not None:
        allowed = set()
        for entry in parse_cuda_visible(raw, inventory.known_refs()).entries:
            try:
                device = inventory.find(entry)
            except PolicyError:  # a UUID prefix of several cards: CUDA would not take it either
                continue
            if isinstance(device, Gpu):
                allowed.add(device.index)
        gpus = [gpu for gpu in gpus if gpu.index in allowed]
    return sorted(gpus, key=freest_first)


def no_gpu_here(machine: Machine, nvml: bool) -> str | None:
    """Why the GPU rules cannot run: no TensorFlow, no GPU it lists, or (`nvml`) no NVML to measure with."""
    if machine.tensorflow:
        return machine.tensorflow
    baseline = machine.baseline
    if baseline is None:
        return "the run without a policy did not run"
    if baseline.figures is None:
        return baseline_failed(machine)
    if not baseline.figures["gpus"]:
        hints = [] if baseline.figures["cuda_build"] else ["this TensorFlow is a CPU-only build"]
        if machine.environ.get(CUDA_VISIBLE_DEVICES) is not None:
            hints.append(f"CUDA_VISIBLE_DEVICES={machine.environ[CUDA_VISIBLE_DEVICES]!r} is inherited")
        nvml_says = machine.inventory.error or f"NVML lists {len(machine.inventory.gpus)} GPU(s)"
        hinted = f" ({'; '.join(hints)})" if hints else ""
        return f"TensorFlow lists no GPU here without a policy{hinted}; {nvml_says}"
    if nvml and not machine.inventory.available:
        return f"needs NVML to see this process on the cards: {machine.inventory.error}"
    if nvml and not usable_gpus(machine.inventory, machine.environ):
        return NO_USABLE_GPU
    return None


def on_one_card(nvml: bool, make: Callable[[str, int | None], Prepared]) -> Callable[[Machine], Prepared | str]:
    """A GPU rule on one card: the freest usable one (GPU 0 where NVML is missing), given to `make`
    as its nvidia-smi index and total MiB (None: unknown); the card's UUID goes in the args."""

    def prepare(machine: Machine) -> Prepared | str:
        why = no_gpu_here(machine, nvml)
        if why:
            return why
        gpus = usable_gpus(machine.inventory, machine.environ) if machine.inventory.available else []
        card = gpus[0] if gpus else None
        prepared = make(card.ref if card else "0", card.memory_total_mib if card else None)
        return prepared._replace(args={**prepared.args, "uuid": card.uuid if card else None})

    return prepare


def share(total: int | None, part: float, most: int) -> int:
    """`part` of a card's `total` MiB, at most `most` (`most` where the total is unknown)."""
    return most if total is None else max(1, min(most, int(total * part)))


# ----- the rules, in the order the report lists them --------------------------------------------------------
BASELINE = Rule("baseline", "TensorFlow without a policy (what the other rules count against)", TENSORFLOW,
                probes.BASELINE, needs_tensorflow(), judge_baseline)

RULES: tuple[Rule, ...] = (
    BASELINE,
    Rule("split-cpu", f"`split cpu {CPU_SPLIT}` gives {CPU_SPLIT} logical CPUs", TENSORFLOW, probes.CONFIGURED,
         needs_tensorflow(f"split cpu {CPU_SPLIT}"), judge_cpu_split(CPU_SPLIT)),
    Rule("visible-none", "`visible none` leaves no GPU", TENSORFLOW, probes.CONFIGURED,
         needs_tensorflow("visible none"), judge_visible_none),
    Rule("same-cell", "the policy lands before the first op when import and op share a cell", TENSORFLOW,
         probes.SAME_CELL, needs_tensorflow(f"split cpu {CELL_SPLIT}"), judge_cpu_split(CELL_SPLIT)),
    Rule("device-routes", "device_lib.list_local_devices() and TF1 Sessions honour the policy", TENSORFLOW,
         probes.DEVICE_ROUTES, needs_tensorflow(f"split cpu {CPU_SPLIT}"), judge_device_routes),
    Rule("locked", "an initialized runtime is detected and locked settings are named", TENSORFLOW, probes.LOCKED,
         needs_tensorflow(f"split cpu {CELL_SPLIT}"), judge_locked),
    Rule("loglevel-error", "`loglevel error` leaves no TensorFlow line below error on stderr", TENSORFLOW,
         probes.CONFIGURED, needs_tensorflow("loglevel error"), judge_quiet_import),
    Rule("nvml-inventory", "NVML lists every GPU with its UUID and memory", NVML, probes.INVENTORY,
         needs_gpus_in_nvml(), judge_inventory),
    Rule("visible-auto", "`visible auto` pins the GPU with the most free memory by UUID", NVML, probes.VISIBLE_AUTO,
         needs_gpus_in_nvml("visible auto"), judge_visible_auto),
    Rule("limit-percent", "`limit 50%` is half of each card's memory", NVML, probes.LIMIT_PERCENT,
         needs_gpus_in_nvml("limit 50%"), judge_limit_percent),
    Rule("who", "`who` shows each process on a GPU with the memory NVML gives", NVML, probes.WHO,
         needs_gpus_in_nvml(), judge_who),
    Rule("doctor", "`%tfgpu doctor` runs every check", NVML, probes.DOCTOR, always, judge_doctor),
    Rule("jax-settings", "JAX's backends start with the policy's settings (on a GPU: its allocator stays within "
         "the share)", FRAMEWORKS, probes.JAX, with_half_a_card("jax", lambda machine: machine.jax, "growth on"),
         judge_jax),
    Rule("torch-settings", "PyTorch loads with the policy's allocator, its limit a per-device fraction (on a GPU: "
         "the fraction holds)", FRAMEWORKS, probes.TORCH,
         with_half_a_card("torch", lambda machine: machine.torch, "allocator async"), judge_torch),
    Rule("visible-gpus", "`visible` shows TensorFlow exactly the chosen cards (UUIDs from NVML)", GPU,
         probes.VISIBLE_GPUS, lambda machine: _two_cards(machine), judge_visible_gpus),
    Rule("growth-on", "with `growth on` the process holds far less than the card after a small op", GPU,
         probes.GROWTH, on_one_card(True, lambda gpu, total: Prepared((f"visible {gpu}", "growth on"))),
         judge_growth(True)),
    Rule("growth-off", "without growth TensorFlow takes nearly all free memory", GPU, probes.GROWTH,
         on_one_card(True, lambda gpu, total: Prepared((f"visible {gpu}", "growth off"))), judge_growth(False)),
    Rule("limit", "`limit X`: past X an allocation fails, and NVML shows the process within X plus overhead", GPU,
         probes.LIMIT, on_one_card(True, lambda gpu, total: _sized(gpu, total, 0.25, 1024, "limit {mib}MB")),
         judge_limit),
    Rule("split-gpu", "`split GPU 2xX` gives two logical GPUs of X", GPU, probes.SPLIT_GPU,
         on_one_card(False, lambda gpu, total: _sized(gpu, total, 0.125, 512, f"split {gpu} 2x{{mib}}MB")),
         judge_split_gpu),
    Rule("allocator-async", "`allocator async` is what TensorFlow builds", GPU, probes.ALLOCATOR,
         on_one_card(False, lambda gpu, total: Prepared((f"visible {gpu}", "allocator async", "loglevel info"))),
         judge_allocator),
    Rule("memory-info", "TensorFlow's get_memory_info agrees with NVML", GPU, probes.MEMORY_INFO,
         on_one_card(True, lambda gpu, total: Prepared((f"visible {gpu}", "growth on"),
                                                       {"mib": share(total, 0.125, 256)})),
         judge_memory_info),
)

NAMES = tuple(rule.name for rule in RULES)


def _sized(gpu: str, total: int | None, part: float, most: int, directive: str) -> Prepared:
    mib = share(total, part, most)
    return Prepared((f"visible {gpu}", directive.format(mib=mib)), {"mib": mib})


def _two_cards(machine: Machine) -> Prepared | str:
    """`visible` with the two freest usable cards (one where there is one), in index order."""
    why = no_gpu_here(machine, True)
    if why:
        return why
    cards = sorted(usable_gpus(machine.inventory, machine.environ)[:2], key=lambda gpu: gpu.index)
    return Prepared((f"visible {','.join(gpu.ref for gpu in cards)}",), {"uuids": [gpu.uuid for gpu in cards]})
