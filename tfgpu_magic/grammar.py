"""The `%tfgpu` directive language: one line of words → a policy edit or an action (pure)."""

from __future__ import annotations

import dataclasses
import re
import shlex
from dataclasses import dataclass
from typing import Callable, Protocol, Sequence

from .errors import PolicyError
from .policy import ALL_GPUS, ALLOCATORS, MAX_GPU_INDEX, MAX_MIB, MAX_VIRTUAL_DEVICES, Policy, is_index, is_uuid, sort_gpu_items

ACTIONS = ("status", "apply", "export", "restart", "doctor", "panel", "default", "autoload", "kernelspec")
CHOICES = {"export": ("python", "env", "json"), "default": ("save", "clear", "show"), "autoload": ("on", "off")}
EDITS = ("growth", "limit", "visible", "split", "allocator", "reset")

_SIZE = re.compile(r"^(\d+(?:\.\d*)?|\.\d+)\s*(mib|mb|gib|gb|g|%)?$", re.IGNORECASE)
_UNIT_MIB = {None: 1, "mib": 1, "mb": 1, "gib": 1024, "gb": 1024, "g": 1024}
_SPLIT_COUNT = re.compile(r"^(\d+)\s*[xX×]\s*(.+)$")


class GpuCatalog(Protocol):
    """What the grammar needs to know about the machine's GPUs (from the NVML inventory)."""

    def resolve(self, ref: str) -> str:
        """The canonical reference for `ref`, or `PolicyError` naming the GPUs that exist."""

    def total_mib(self, ref: str) -> int | None:
        """Total memory of the GPU `ref` in MiB, None if unknown."""

    def refs(self) -> list[str]:
        """Every GPU, nvidia-smi order."""

    def is_mig(self, ref: str) -> bool:
        """True if `ref` is a MIG instance."""

    def by_free_memory(self) -> list:
        """GPUs (with `.uuid`, `.index`, `.memory_free_mib`, `.utilization_pct`), freest first."""

    def uuid_to_index(self) -> dict[str, str]:
        """GPU UUID → nvidia-smi index, for every GPU known (empty without an inventory)."""


@dataclass(frozen=True)
class Edit:
    """A change to the policy; `change` raises `PolicyError` and then nothing changed."""

    text: str
    change: Callable[[Policy], Policy]
    line: int = 0
    """Line number in a `%%tfgpu` cell (0 for a line magic), named in errors."""


@dataclass(frozen=True)
class Action:
    """Something to do rather than a policy change: one of `ACTIONS`, with its argument if any."""

    name: str
    arg: str | None = None


Directive = Edit | Action


def split_words(line: str) -> list[str]:
    """Shell-like word split; an unbalanced quote is a `PolicyError`."""
    try:
        return shlex.split(line, comments=True)
    except ValueError as err:
        raise PolicyError(f"cannot read {line.strip()!r}: {err}") from None


def parse_line(line: str, catalog: GpuCatalog | None = None) -> Directive:
    """Parse one directive line, e.g. `"limit 4GB 0,1"`."""
    return parse_words(split_words(line), catalog)


def parse_cell(text: str, catalog: GpuCatalog | None = None) -> list[Edit]:
    """Parse a `%%tfgpu` cell: one edit per line, `#` comments; errors name the line."""
    edits: list[Edit] = []
    for number, line in enumerate(text.splitlines(), start=1):
        try:
            words = split_words(line)
            if not words:
                continue
            directive = parse_words(words, catalog)
        except PolicyError as err:
            raise PolicyError(f"line {number}: {err}") from None
        if not isinstance(directive, Edit):
            raise PolicyError(
                f"line {number}: `{directive.name}` is not allowed in a %%tfgpu cell "
                f"(only {', '.join(EDITS)}); run it as a line magic"
            )
        edits.append(dataclasses.replace(directive, line=number))
    return edits


def parse_words(words: Sequence[str], catalog: GpuCatalog | None = None) -> Directive:
    """Parse a directive already split into words. Empty means `status`."""
    if not words:
        return Action("status")
    head, args = words[0].lower(), list(words[1:])
    text = " ".join(words)
    if head in ("status", "apply", "restart", "doctor", "panel"):
        _expect(head, args, 0, 0)
        return Action(head)
    if head in CHOICES:
        choices = CHOICES[head]
        _expect(head, args, 0 if head == "export" else 1, 1, " | ".join(choices))
        choice = args[0].lower() if args else choices[0]
        if choice not in choices:
            raise PolicyError(f"{head}: unknown choice {args[0]!r}; expected one of {', '.join(choices)}")
        return Action(head, choice)
    if head == "kernelspec":
        _expect(head, args, 1, 1, "NAME [--display-name TEXT] [--remove]")
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", args[0]):
            raise PolicyError(f"kernelspec: {args[0]!r} is not a valid name; use letters, digits, '.', '_' and '-'")
        return Action(head, args[0].lower())
    parser = _EDIT_PARSERS.get(head)
    if parser is None:
        raise PolicyError(
            f"unknown directive {words[0]!r}; expected one of {', '.join(EDITS + ACTIONS)} (see %tfgpu?)"
        )
    return Edit(text, parser(args, catalog))


# ----- edits ------------------------------------------------------------------------------------
def _growth(args: list[str], catalog: GpuCatalog | None) -> Callable[[Policy], Policy]:
    _expect("growth", args, 1, 1, "all | on | off")
    word = args[0].lower()
    if word not in ("all", "on", "off"):
        raise PolicyError(f"growth: expected all, on or off, got {args[0]!r}")
    enable = word != "off"
    return lambda policy: policy.replace(growth=enable)


def _limit(args: list[str], catalog: GpuCatalog | None) -> Callable[[Policy], Policy]:
    _expect("limit", args, 1, 2, "SIZE [GPUS] | off [GPUS]")
    gpus = parse_gpus(args[1], catalog) if len(args) == 2 else None
    if args[0].lower() == "off":
        return lambda policy: _limit_off(policy, gpus)
    size = parse_size(args[0])
    if gpus is None and _is_percent(size):  # every visible card, each by its own total
        return lambda policy: policy.replace(limits=sort_gpu_items(_percent_of_unsplit(size, catalog, policy)))
    if gpus is None:
        return lambda policy: policy.replace(limits=((ALL_GPUS, int(size)),))
    entries = _per_gpu_mib(size, catalog, gpus)

    def change(policy: Policy) -> Policy:
        limits = {**policy.limit_map, **dict(entries)}
        return policy.replace(limits=sort_gpu_items(limits.items()))

    return change


def _limit_off(policy: Policy, gpus: tuple[str, ...] | None) -> Policy:
    if gpus is None:
        return policy.replace(limits=())
    limits = policy.limit_map
    for gpu in gpus:
        if gpu not in limits:
            hint = " (a limit on all GPUs stays; `limit off` removes it)" if ALL_GPUS in limits else ""
            raise PolicyError(f"limit off: GPU {gpu} has no limit of its own{hint}")
        del limits[gpu]
    return policy.replace(limits=sort_gpu_items(limits.items()))


def _visible(args: list[str], catalog: GpuCatalog | None) -> Callable[[Policy], Policy]:
    _expect("visible", args, 1, 1, "GPUS | all | none")
    word = args[0].lower()
    if word == "all":
        return lambda policy: policy.replace(visible=None, sources=())
    if word == "none":
        return lambda policy: policy.replace(visible=(), sources=())
    if word == "auto" or word.startswith("auto:"):
        gpus, why = _auto_pick(word, catalog)
        return lambda policy: policy.replace(visible=gpus, sources=(("visible", why),))
    gpus = parse_gpus(args[0], catalog)
    migs = [gpu for gpu in gpus if catalog.is_mig(gpu)] if catalog is not None else []
    if len(migs) > 1:
        raise PolicyError(
            f"visible: {len(migs)} MIG instances given, but CUDA uses only one MIG instance per process; "
            "pick one (or run one kernel per instance)"
        )
    return lambda policy: policy.replace(visible=gpus, sources=())


def _auto_pick(word: str, catalog: GpuCatalog | None) -> tuple[tuple[str, ...], str]:
    """`auto[:N]`: the N GPUs with the most free memory, pinned by UUID, and why they were picked."""
    count = parse_count(word.partition(":")[2] or "1", "visible auto:N")
    if catalog is None:
        raise PolicyError("`visible auto` needs the GPU inventory (an NVIDIA driver and nvidia-ml-py)")
    ranked = catalog.by_free_memory()
    if len(ranked) < count:
        raise PolicyError(f"visible auto:{count}: this machine has only {len(ranked)} GPU(s)")
    picked = ranked[:count]
    why = "auto picked " + ", ".join(f"GPU {g.index} ({_free_and_busy(g)})" for g in picked)
    return tuple(g.uuid for g in picked), why


def _split(args: list[str], catalog: GpuCatalog | None) -> Callable[[Policy], Policy]:
    _expect("split", args, 1, 2, "GPU COUNTxSIZE | GPU SIZE,SIZE,... | cpu COUNT | off [GPU | cpu]")
    target = args[0].lower()
    if target == "off":
        which = args[1] if len(args) == 2 else None
        return _split_off(which, catalog)
    if len(args) != 2:
        if target == "cpu":
            raise PolicyError("split cpu: missing COUNT, e.g. `split cpu 2`")
        gpu = parse_gpu(args[0], catalog)
        raise PolicyError(f"split {gpu}: missing the parts, e.g. `split {gpu} 2x2GB`")
    if target == "cpu":
        count = parse_count(args[1], "split cpu")
        return lambda policy: policy.replace(cpu_devices=count)
    gpu = parse_gpu(args[0], catalog)
    sizes = parse_parts(args[1], gpu, catalog)

    def change(policy: Policy) -> Policy:
        splits = {**policy.split_map, gpu: sizes}
        return policy.replace(splits=sort_gpu_items(splits.items()))

    return change


def _split_off(which: str | None, catalog: GpuCatalog | None) -> Callable[[Policy], Policy]:
    if which is None:
        return lambda policy: policy.replace(splits=(), cpu_devices=None)
    if which.lower() == "cpu":
        return lambda policy: policy.replace(cpu_devices=None)
    gpu = parse_gpu(which, catalog)

    def change(policy: Policy) -> Policy:
        splits = policy.split_map
        if splits.pop(gpu, None) is None:
            raise PolicyError(f"split off: GPU {gpu} is not split")
        return policy.replace(splits=sort_gpu_items(splits.items()))

    return change


def _allocator(args: list[str], catalog: GpuCatalog | None) -> Callable[[Policy], Policy]:
    _expect("allocator", args, 1, 1, " | ".join(ALLOCATORS))
    name = args[0].lower()
    if name not in ALLOCATORS:
        raise PolicyError(f"allocator: expected {' or '.join(ALLOCATORS)}, got {args[0]!r}")
    return lambda policy: policy.replace(allocator=name)


def _reset(args: list[str], catalog: GpuCatalog | None) -> Callable[[Policy], Policy]:
    _expect("reset", args, 0, 0)
    return lambda policy: Policy()


_EDIT_PARSERS = {
    "growth": _growth,
    "limit": _limit,
    "visible": _visible,
    "split": _split,
    "allocator": _allocator,
    "reset": _reset,
}


# ----- values -----------------------------------------------------------------------------------
class Percent(float):
    """A size given as a percentage of a card's total memory."""


def parse_size(text: str) -> float:
    """`4096`, `512MB`, `1.5GB`, `2GiB`, `3G` → MiB (float); `50%` → `Percent(50)`."""
    match = _SIZE.match(text.strip())
    if not match:
        if text.strip().startswith("-"):
            raise PolicyError(f"size {text!r} is negative; sizes must be positive, e.g. 4096 or 2GB")
        raise PolicyError(
            f"not a size: {text!r}; use MiB (4096), MB/MiB or GB/GiB/G (512MB, 1.5GB), or NN%, "
            f"at most {MAX_MIB // 1024} GiB"
        )
    number, unit = float(match.group(1)), (match.group(2) or "").lower() or None
    if unit == "%":
        if not 0 < number <= 100:
            raise PolicyError(f"percentage must be above 0 and at most 100, got {text!r}")
        return Percent(number)
    mib = number * _UNIT_MIB[unit]
    if mib < 1:
        raise PolicyError(f"size {text!r} is below 1 MiB; sizes must be positive")
    if mib > MAX_MIB:
        raise PolicyError(f"size {text!r} is above {MAX_MIB // 1024} GiB; no GPU has that much memory")
    return float(int(mib))


def _is_percent(size: float) -> bool:
    return isinstance(size, Percent)


def _percent_of_unsplit(size: float, catalog: GpuCatalog | None, policy: Policy) -> list[tuple[str, int]]:
    """`limit NN%` without GPUs: each visible card that has no split of its own, by its own total
    (a limit on all GPUs spares split ones the same way)."""
    cards = policy.visible if policy.visible is not None else (tuple(catalog.refs()) if catalog else None)
    if cards is not None:
        cards = tuple(gpu for gpu in cards if gpu not in policy.split_map)
    return _per_gpu_mib(size, catalog, cards)


def _per_gpu_mib(size: float, catalog: GpuCatalog | None, gpus: tuple[str, ...] | None) -> list[tuple[str, int]]:
    """Entries `(gpu, MiB)` for `gpus` (None: every GPU), resolving a percentage per card."""
    if not _is_percent(size):
        return [(gpu, int(size)) for gpu in gpus or ()]
    if catalog is None:
        raise PolicyError(f"{size:g}%: the card's total memory is unknown; give the size in MiB or GB instead")
    entries = []
    for gpu in gpus if gpus is not None else tuple(catalog.refs()):
        total = catalog.total_mib(gpu)
        if total is None:
            raise PolicyError(f"{size:g}%: the card's total memory of GPU {gpu} is unknown; give MiB or GB")
        entries.append((gpu, max(1, int(total * size / 100))))
    if not entries:
        raise PolicyError(f"{size:g}%: there is no GPU to take a percentage of")
    return entries


def _free_and_busy(gpu: object) -> str:
    free, busy = getattr(gpu, "memory_free_mib", None), getattr(gpu, "utilization_pct", None)
    parts = [f"{free} MiB free" if free is not None else "free memory unknown"]
    if busy is not None:
        parts.append(f"{busy}% busy")
    return ", ".join(parts)


def parse_parts(text: str, gpu: str, catalog: GpuCatalog | None) -> tuple[int, ...]:
    """`2x2GB` or `1GB,3GB` → sizes in MiB, one per virtual GPU."""
    match = _SPLIT_COUNT.match(text.strip())
    if match:
        count = parse_count(match.group(1), f"split {gpu}")
        pieces = [match.group(2)] * count
    else:
        pieces = text.split(",")
        if any(not piece.strip() for piece in pieces):
            raise PolicyError(f"split {gpu}: expected COUNTxSIZE (2x2GB) or SIZE,SIZE,... (1GB,3GB), got {text!r}")
    if len(pieces) > MAX_VIRTUAL_DEVICES:
        raise PolicyError(f"split {gpu}: at most {MAX_VIRTUAL_DEVICES} parts, got {len(pieces)}")
    return tuple(_per_gpu_mib(parse_size(piece), catalog, (gpu,))[0][1] for piece in pieces)


def parse_count(text: str, what: str) -> int:
    """A device count, 1 to `MAX_VIRTUAL_DEVICES`."""
    if not is_index(text):
        raise PolicyError(f"{what}: COUNT must be a whole number, got {text!r}")
    count = int(text)
    if not 1 <= count <= MAX_VIRTUAL_DEVICES:
        raise PolicyError(f"{what}: COUNT must be 1 to {MAX_VIRTUAL_DEVICES}, got {count}")
    return count


def parse_gpus(text: str, catalog: GpuCatalog | None = None) -> tuple[str, ...]:
    """`0,2`, `0-3`, `GPU-8932f937,1` → GPU references, in the order given, no repeats."""
    refs: list[str] = []
    for item in text.split(","):
        item = item.strip()
        if not item:
            raise PolicyError(f"empty entry in GPU list {text!r}; use e.g. 0,1 or 0-3")
        if re.fullmatch(r"[0-9]+-[0-9]+", item):
            first, last = (int(n) for n in item.split("-"))
            if first > last:
                raise PolicyError(f"GPU range {item!r} runs backwards; write {last}-{first}")
            if last > MAX_GPU_INDEX:
                parse_gpu(str(last), catalog)
            refs.extend(parse_gpu(str(n), catalog) for n in range(first, last + 1))
        else:
            refs.append(parse_gpu(item, catalog))
    for ref in refs:
        if refs.count(ref) > 1:
            raise PolicyError(f"GPU {ref} is listed twice in {text!r}")
    return tuple(refs)


def parse_gpu(text: str, catalog: GpuCatalog | None = None) -> str:
    """One GPU: an nvidia-smi index, a GPU/MIG UUID or a unique UUID prefix."""
    item = text.strip()
    if re.fullmatch(r"-[0-9]+", item):
        raise PolicyError(f"{item} is not a GPU; to hide every GPU use `visible none`")
    if is_index(item):
        if int(item) > MAX_GPU_INDEX:
            raise PolicyError(f"GPU index {item} is out of range (0 to {MAX_GPU_INDEX})")
        ref = str(int(item))
    elif is_uuid(item):
        ref = canonical_uuid(item)
    else:
        raise PolicyError(f"not a GPU: {text!r}; use an index (0), a range (0-3) or a UUID (GPU-8932f937)")
    return catalog.resolve(ref) if catalog is not None else ref


def canonical_uuid(text: str) -> str:
    """`gpu-8932F937` → `GPU-8932f937`: NVML writes UUIDs with an upper-case prefix, lower-case hex."""
    parts = text.split("-")
    return "-".join(part.upper() if part.upper() in ("GPU", "MIG") else part.lower() for part in parts)


def _expect(name: str, args: list[str], least: int, most: int, usage: str = "") -> None:
    if least <= len(args) <= most:
        return
    form = f"`{name} {usage}`" if usage else f"`{name}`"
    if len(args) < least:
        raise PolicyError(f"{name}: missing argument; usage: {form}")
    extra = " ".join(args[most:])
    raise PolicyError(f"{name}: unexpected {extra!r}; usage: {form}")
