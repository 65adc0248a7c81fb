"""The `%tfgpu` directive language: one line of words → a policy edit or an action (pure)."""

from __future__ import annotations

import dataclasses
import difflib
import re
import shlex
from dataclasses import dataclass
from typing import Callable, Protocol, Sequence

from ..errors import PolicyError
from .policy import (
    ALL_GPUS,
    ALLOCATORS,
    MAX_GPU_INDEX,
    MAX_MIB,
    MAX_VIRTUAL_DEVICES,
    Policy,
    check_gpu_count,
    is_uuid,
    quote,
    quote_number,
    sort_gpu_items,
    whole_number,
)

ACTIONS = ("status", "apply", "export", "restart", "doctor", "panel", "default", "autoload", "kernelspec")
CHOICES = {"export": ("python", "env", "json"), "default": ("save", "clear", "show"), "autoload": ("on", "off")}
EDITS = ("growth", "limit", "visible", "split", "allocator", "reset")
GROWTH_CHOICES = ("on", "off", "all")
"""`all` is the same as `on`: growth always concerns every visible GPU (TensorFlow requires it)."""

MAX_LINE = 32 * 1024
"""Longest directive line read: 256 MIG UUIDs fit; a longer line is a mistake, refused before any work."""

MAX_CELL = 8 * MAX_LINE
"""Longest `%%tfgpu` cell read (thousands of directives), so that no cell keeps the kernel busy."""

_UNITS = "mib|mb|gib|gb|g|%"
_SIZE = re.compile(rf"([0-9]+(?:\.[0-9]*)?|\.[0-9]+)\s*({_UNITS})?", re.IGNORECASE | re.ASCII)
_UNIT = re.compile(_UNITS, re.IGNORECASE | re.ASCII)
_UNIT_MIB = {None: 1, "mib": 1, "mb": 1, "gib": 1024, "gb": 1024, "g": 1024}
_SPLIT_COUNT = re.compile(r"([0-9]*)\s*[xX×]\s*(.*)", re.ASCII)
_RANGE = re.compile(r"([0-9]+)-([0-9]+)", re.ASCII)
_SHELL_SPACE = " \t\r\n"


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
    build: Callable[[Policy], Policy]
    """The edited policy, not yet validated (a cell validates only its result)."""
    line: int = 0
    """Line number in a `%%tfgpu` cell (0 for a line magic), named in errors."""

    def change(self, policy: Policy) -> Policy:
        """The edited policy, validated on its own."""
        new = self.build(policy)
        new.validate()
        return new


@dataclass(frozen=True)
class Action:
    """Something to do rather than a policy change: one of `ACTIONS`, with its argument if any."""

    name: str
    arg: str | None = None


Directive = Edit | Action


def split_words(line: str) -> list[str]:
    """Shell-like word split; an unbalanced quote is a `PolicyError`. A word that starts with `#`
    starts a comment; a `#` inside a word (`0#1`) is part of it (shlex would cut the line there)."""
    if len(line) > MAX_LINE:
        raise PolicyError(f"line too long ({len(line):,} characters, at most {MAX_LINE:,}): {quote(line)}")
    try:
        return shlex.split(_without_comment(line), comments=False)
    except ValueError as err:
        raise PolicyError(f"cannot read {quote(line.strip())}: {err}") from None


def _without_comment(line: str) -> str:
    """`line` up to its first unquoted `#` that begins a word (POSIX shell quoting rules)."""
    quoting, escaped, word_start = "", False, True
    for at, char in enumerate(line):
        if escaped:
            escaped, word_start = False, False
        elif quoting == "'":
            quoting = "" if char == "'" else quoting
        elif quoting == '"':
            escaped = char == "\\"
            quoting = "" if char == '"' else quoting
        elif char == "\\":
            escaped, word_start = True, False
        elif char in "'\"":
            quoting, word_start = char, False
        elif char == "#" and word_start:
            return line[:at]
        else:
            word_start = char in _SHELL_SPACE
    return line


def suggest(word: str, choices: Sequence[str]) -> str:
    """`; did you mean `growth`?` for a near miss of one of `choices`, else ''."""
    close = difflib.get_close_matches(word.lower(), choices, n=1, cutoff=0.6)
    return f"; did you mean `{close[0]}`?" if close else ""


def not_one_of(what: str, given: str, choices: Sequence[str]) -> PolicyError:
    """The error for a word outside a closed set: the near miss if there is one."""
    return PolicyError(f"{what}: expected {' | '.join(choices)}, got {quote(given)}{suggest(given, choices)}")


def parse_line(line: str, catalog: GpuCatalog | None = None) -> Directive:
    """Parse one directive line, e.g. `"limit 4GB 0,1"`."""
    return parse_words(split_words(line), catalog)


def parse_cell(text: str, catalog: GpuCatalog | None = None) -> list[Edit]:
    """Parse a `%%tfgpu` cell: one edit per line, `#` comments; errors name the line."""
    if len(text) > MAX_CELL:
        raise PolicyError(f"%%tfgpu cell too long ({len(text):,} characters, at most {MAX_CELL:,})")
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
            raise not_one_of(head, args[0], choices)
        return Action(head, choice)
    if head == "kernelspec":
        _expect(head, args, 1, 1, "NAME [--display-name TEXT] [--remove]")
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", args[0], re.ASCII):
            raise PolicyError(
                f"kernelspec: {quote(args[0])} is not a valid name; use letters, digits, '.', '_' and '-'"
            )
        return Action(head, args[0].lower())
    parser = _EDIT_PARSERS.get(head)
    if parser is None:
        hint = suggest(head, EDITS + ACTIONS)
        raise PolicyError(
            f"unknown directive {quote(words[0])}"
            + (hint or f"; expected one of {', '.join(EDITS + ACTIONS)} (see %tfgpu?)")
        )
    return Edit(text, parser(args, catalog))


# ----- edits ------------------------------------------------------------------------------------
def _growth(args: list[str], catalog: GpuCatalog | None) -> Callable[[Policy], Policy]:
    _expect("growth", args, 1, 1, " | ".join(GROWTH_CHOICES))
    word = args[0].lower()
    if word not in GROWTH_CHOICES:
        raise not_one_of("growth", args[0], GROWTH_CHOICES)
    enable = word != "off"
    return lambda policy: policy.edited(growth=enable)


def _limit(args: list[str], catalog: GpuCatalog | None) -> Callable[[Policy], Policy]:
    _check_spaced_unit("limit", args)
    _expect("limit", args, 1, 2, "SIZE [GPUS] | off [GPUS]")
    gpus = parse_gpus(args[1], catalog) if len(args) == 2 else None
    if args[0].lower() == "off":
        return lambda policy: _limit_off(policy, gpus)
    size = parse_size(args[0])
    if gpus is None and _is_percent(size):  # every visible card, each by its own total
        return lambda policy: policy.edited(limits=sort_gpu_items(_percent_of_unsplit(size, catalog, policy)))
    if gpus is None:
        return lambda policy: policy.edited(limits=((ALL_GPUS, int(size)),))
    entries = _per_gpu_mib(size, catalog, gpus)

    def change(policy: Policy) -> Policy:
        limits = {**policy.limit_map, **dict(entries)}
        return policy.edited(limits=sort_gpu_items(limits.items()))

    return change


def _limit_off(policy: Policy, gpus: tuple[str, ...] | None) -> Policy:
    if gpus is None:
        return policy.edited(limits=())
    limits = policy.limit_map
    for gpu in gpus:
        if gpu not in limits:
            hint = " (a limit on all GPUs stays; `limit off` removes it)" if ALL_GPUS in limits else ""
            raise PolicyError(f"limit off: GPU {gpu} has no limit of its own{hint}")
        del limits[gpu]
    return policy.edited(limits=sort_gpu_items(limits.items()))


def _visible(args: list[str], catalog: GpuCatalog | None) -> Callable[[Policy], Policy]:
    _expect("visible", args, 1, 1, "GPUS | all | none")
    word = args[0].lower()
    if word == "all":
        return lambda policy: policy.edited(visible=None, sources=())
    if word == "none":
        return lambda policy: policy.edited(visible=(), sources=())
    if word == "auto" or word.startswith("auto:"):
        gpus, why = _auto_pick(word, catalog)
        return lambda policy: policy.edited(visible=gpus, sources=(("visible", why),))
    gpus = parse_gpus(args[0], catalog)
    migs = [gpu for gpu in gpus if catalog.is_mig(gpu)] if catalog is not None else []
    if len(migs) > 1:
        raise PolicyError(
            f"visible: {len(migs)} MIG instances given, but CUDA uses only one MIG instance per process; "
            "pick one (or run one kernel per instance)"
        )
    return lambda policy: policy.edited(visible=gpus, sources=())


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
    _check_spaced_unit("split", args)
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
        return lambda policy: policy.edited(cpu_devices=count)
    gpu = parse_gpu(args[0], catalog)
    sizes = parse_parts(args[1], gpu, catalog)

    def change(policy: Policy) -> Policy:
        splits = {**policy.split_map, gpu: sizes}
        return policy.edited(splits=sort_gpu_items(splits.items()))

    return change


def _split_off(which: str | None, catalog: GpuCatalog | None) -> Callable[[Policy], Policy]:
    if which is None:
        return lambda policy: policy.edited(splits=(), cpu_devices=None)
    if which.lower() == "cpu":
        return lambda policy: policy.edited(cpu_devices=None)
    gpu = parse_gpu(which, catalog)

    def change(policy: Policy) -> Policy:
        splits = policy.split_map
        if splits.pop(gpu, None) is None:
            raise PolicyError(f"split off: GPU {gpu} is not split")
        return policy.edited(splits=sort_gpu_items(splits.items()))

    return change


def _allocator(args: list[str], catalog: GpuCatalog | None) -> Callable[[Policy], Policy]:
    _expect("allocator", args, 1, 1, " | ".join(ALLOCATORS))
    name = args[0].lower()
    if name not in ALLOCATORS:
        raise not_one_of("allocator", args[0], tuple(ALLOCATORS))
    return lambda policy: policy.edited(allocator=name)


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
    match = _SIZE.fullmatch(text.strip())
    if not match:
        if text.strip().startswith("-"):
            raise PolicyError(f"size {quote(text)} is negative; sizes must be positive, e.g. 4096 or 2GB")
        raise PolicyError(
            f"not a size: {quote(text)}; use MiB (4096), MB/MiB or GB/GiB/G (512MB, 1.5GB), or NN%, "
            f"at most {MAX_MIB // 1024} GiB"
        )
    number, unit = float(match.group(1)), (match.group(2) or "").lower() or None
    if unit == "%":
        if not 0 < number <= 100:
            raise PolicyError(f"percentage must be above 0 and at most 100, got {quote(text)}")
        return Percent(number)
    mib = number * _UNIT_MIB[unit]
    if mib < 1:
        raise PolicyError(f"size {quote(text)} is below 1 MiB; sizes must be positive")
    if mib > MAX_MIB:
        raise PolicyError(f"size {quote(text)} is above {MAX_MIB // 1024} GiB; no GPU has that much memory")
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
    match = _SPLIT_COUNT.fullmatch(text.strip())
    if match and not (match.group(1) and match.group(2)):
        missing = "the size of each part" if match.group(1) else "the number of parts"
        raise PolicyError(f"split {gpu}: {quote(text)} is missing {missing}, e.g. `split {gpu} 2x2GB`")
    if match:
        count = parse_count(match.group(1), f"split {gpu}")
        pieces = [match.group(2)] * count
    else:
        pieces = text.split(",")
        if any(not piece.strip() for piece in pieces):
            raise PolicyError(
                f"split {gpu}: expected COUNTxSIZE (2x2GB) or SIZE,SIZE,... (1GB,3GB), got {quote(text)}"
            )
    if len(pieces) > MAX_VIRTUAL_DEVICES:
        raise PolicyError(f"split {gpu}: at most {MAX_VIRTUAL_DEVICES} parts, got {len(pieces)}")
    return tuple(_per_gpu_mib(parse_size(piece), catalog, (gpu,))[0][1] for piece in pieces)


def parse_count(text: str, what: str) -> int:
    """A device count, 1 to `MAX_VIRTUAL_DEVICES`."""
    count = whole_number(text)
    if count is None:
        raise PolicyError(f"{what}: COUNT must be a whole number, got {quote(text)}")
    if not 1 <= count <= MAX_VIRTUAL_DEVICES:
        raise PolicyError(f"{what}: COUNT must be 1 to {MAX_VIRTUAL_DEVICES}, got {quote_number(count, text)}")
    return count


def parse_gpus(text: str, catalog: GpuCatalog | None = None) -> tuple[str, ...]:
    """`0,2`, `0-3`, `GPU-8932f937,1` → GPU references, in the order given, no repeats."""
    items = text.split(",")
    check_gpu_count(len(items), "GPU list")
    refs: list[str] = []
    for item in items:
        item = item.strip()
        if not item:
            raise PolicyError(f"empty entry in GPU list {quote(text)}; use e.g. 0,1 or 0-3")
        span = _RANGE.fullmatch(item)
        if span:
            first, last = (_index(number) for number in span.groups())
            if first > last:
                raise PolicyError(f"GPU range {quote(item)} runs backwards; write {last}-{first}")
            refs.extend(parse_gpu(str(n), catalog) for n in range(first, last + 1))
        else:
            refs.append(parse_gpu(item, catalog))
        check_gpu_count(len(refs), "GPU list")
    seen: set[str] = set()
    for ref in refs:
        if ref in seen:
            raise PolicyError(f"GPU {ref} is listed twice in {quote(text)}")
        seen.add(ref)
    return tuple(refs)


def parse_gpu(text: str, catalog: GpuCatalog | None = None) -> str:
    """One GPU: an nvidia-smi index, a GPU/MIG UUID or a unique UUID prefix."""
    item = text.strip()
    if re.fullmatch(r"-[0-9]+", item, re.ASCII):
        raise PolicyError(f"{quote(item)} is not a GPU; to hide every GPU use `visible none`")
    if whole_number(item) is not None:
        ref = str(_index(item))
    elif is_uuid(item):
        ref = canonical_uuid(item)
    else:
        raise PolicyError(f"not a GPU: {quote(text)}; use an index (0), a range (0-3) or a UUID (GPU-8932f937)")
    return catalog.resolve(ref) if catalog is not None else ref


def _index(text: str) -> int:
    """An nvidia-smi index from ASCII digits, or `PolicyError` if no machine has that many GPUs."""
    number = whole_number(text)
    if number is None or number > MAX_GPU_INDEX:
        shown = quote(text) if number is None else quote_number(number, text)
        raise PolicyError(f"GPU index {shown} is out of range (0 to {MAX_GPU_INDEX})")
    return number


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
    raise PolicyError(f"{name}: unexpected {quote(extra)}; usage: {form}")


def _check_spaced_unit(name: str, args: list[str]) -> None:
    """`limit 4 GB`: the unit came apart from its number; say how to write it."""
    for before, word in zip(args, args[1:]):
        if _UNIT.fullmatch(word) and len(before) <= 24 and before[-1:].isascii() and before[-1:].isdigit():
            raise PolicyError(f"{name}: write `{before}{word}` (no space between a number and its unit)")
