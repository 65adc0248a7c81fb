"""The `%tfgpu` directive language: one line of words → a policy edit or an action (pure)."""

from __future__ import annotations

import re
import shlex
from typing import Any, Callable, Mapping, NamedTuple, Protocol, Sequence

from ..errors import PolicyError
from . import directives
from .directives import lookup
from .policy import (
    ALL_GPUS,
    MAX_GPU_INDEX,
    MAX_MIB,
    MAX_VIRTUAL_DEVICES,
    Policy,
    auto_pick_note,
    check_gpu_count,
    is_uuid,
    quote,
    quote_number,
    sort_gpu_items,
    whole_number,
)

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
_PLAIN_LINE = re.compile(r"[ !$-&(-\[\]-~\t\r\n]*")
"""Printable ASCII and shell spaces, without quotes, backslashes or `#`: such a line splits the same
with `str.split` as with shlex (the common case, about ten times cheaper)."""


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

    def scope(self) -> str:
        """Which GPUs there are to choose from, for a message: `this machine has only 4 GPU(s)`, or
        the grant a process was started with (`this kernel was granted 1 GPU (CUDA_VISIBLE_DEVICES=2)`)."""


class Edit(NamedTuple):
    """A change to the policy in the policy's own terms: the fields it sets, each with its value as
    `Policy` holds it (`limit 2GB` → `(("limits", (("all", 2048),)),)`), and where it was written.

    GPU references are already resolved and `visible auto` already picked at parse time. Per-GPU
    fields given for some GPUs (`limit 1GB 0`, `split off 1`) are merged into the policy's entries
    when applied, None removing one; only what depends on the policy it is applied to waits for
    `apply_edit`: `limit NN%` on every visible card holds a `Percent` under `all`."""

    name: str
    changes: tuple[tuple[str, Any], ...] = ()
    line: int = 0
    """Line number in a `%%tfgpu` cell (0 for a line magic), named in errors."""

    def change(self, policy: Policy, catalog: GpuCatalog | None = None) -> Policy:
        """The edited policy, validated on its own (a script's or a test's single step)."""
        new = apply_edit(policy, self, catalog)
        new.validate()
        return new


class Action(NamedTuple):
    """Something to do rather than a policy change: one of `directives.ACTIONS`, with its argument."""

    name: str
    arg: str | None = None


Parsed = Edit | Action


def split_words(line: str) -> list[str]:
    """Shell-like word split; an unbalanced quote is a `PolicyError`. A word that starts with `#`
    starts a comment; a `#` inside a word (`0#1`) is part of it (shlex would cut the line there)."""
    if len(line) > MAX_LINE:
        raise PolicyError(f"line too long ({len(line):,} characters, at most {MAX_LINE:,}): {quote(line)}")
    if _PLAIN_LINE.fullmatch(line):
        return line.split()
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
    import difflib  # only on a typo: not on every grammar import

    close = difflib.get_close_matches(word.lower(), choices, n=1, cutoff=0.6)
    return f"; did you mean `{close[0]}`?" if close else ""


def not_one_of(what: str, given: str, choices: Sequence[str]) -> PolicyError:
    """The error for a word outside a closed set: the near miss if there is one."""
    return PolicyError(f"{what}: expected {' | '.join(choices)}, got {quote(given)}{suggest(given, choices)}")


def parse_line(line: str, catalog: GpuCatalog | None = None) -> Parsed:
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
            spec = lookup(words[0])
            if spec is not None and not spec.in_cell:  # before its arguments: `restart --yes` is no edit either
                raise PolicyError(
                    f"`{spec.name}` is not allowed in a %%tfgpu cell "
                    f"(only {', '.join(directives.CELL_NAMES)}); run it as a line magic"
                )
            parsed = parse_words(words, catalog)
        except PolicyError as err:
            raise PolicyError(f"line {number}: {err}") from None
        edits.append(parsed._replace(line=number))
    return edits


def parse_words(words: Sequence[str], catalog: GpuCatalog | None = None) -> Parsed:
    """Parse a directive already split into words. Empty means `status`."""
    if not words:
        return Action("status")
    spec = lookup(words[0])
    if spec is None:
        hint = suggest(words[0], directives.NAMES)
        raise PolicyError(
            f"unknown directive {quote(words[0])}"
            + (hint or f"; expected one of {', '.join(directives.NAMES)} (see %tfgpu?)")
        )
    args = list(words[1:])
    if spec.kind == "action":
        return _action(spec, args)
    if spec.parse is None:  # a field edit: one word of a closed set sets one field
        _expect_spec(spec, args)
        return Edit(spec.name, ((spec.field or "", spec.value(_choice(spec, args[0]))),))
    return Edit(spec.name, spec.parse(args, catalog))


def default_edit(name: str) -> Edit:
    """The edit that gives a field directive's part of the policy back to TensorFlow's default (the
    panel's "TF default"); `PolicyError` for a directive that sets no single field."""
    spec = directives.spec(name)
    if spec.kind != "edit" or spec.field is None:
        raise PolicyError(f"`{name}` sets no single policy field")
    return Edit(spec.name, ((spec.field, None),))


def apply_edit(policy: Policy, edit: Edit, catalog: GpuCatalog | None = None) -> Policy:
    """The policy `edit` makes of `policy`, not validated: the steps of a `%%tfgpu` cell may
    contradict each other on the way, only the cell's result is validated. Each field the edit names
    takes its value; per-GPU entries merge (see `Edit`), and a note on how a field was chosen
    (`sources`) replaces that field's note."""
    changes = dict(edit.changes)
    if "limits" in changes:
        changes.update(_limits(policy, changes["limits"], changes.pop("limits_written", ()), catalog))
    if changes.get("splits"):
        changes["splits"] = _merged(policy.splits, changes["splits"], "split off: GPU {gpu} is not split")
    if changes.get("sources"):
        named = dict(changes["sources"])
        changes["sources"] = (*(note for note in policy.sources if note[0] not in named),
                              *((field, why) for field, why in named.items() if why is not None))
    edited = policy.edited(**changes)
    if ("visible" in changes or "splits" in changes) and "limits" not in changes:
        edited = edited.edited(**_reshared(edited, catalog))
    return edited


def _limits(policy: Policy, given: Changes, written: Changes, catalog: GpuCatalog | None) -> dict[str, Any]:
    """`limits`, `limits_written` and `limits_share` after a `limit` edit: one for every GPU (`all`, a
    share of each visible card's own total) or none replaces them all; per-GPU ones merge, and a card
    keeps how its limit was written only until another limit or `limit off` changes it. A share on every
    GPU stays in `limits_share`: which cards it sizes follows `visible` (`_reshared`)."""
    every = dict(given).get(ALL_GPUS)
    if isinstance(every, Percent):
        share = dict(written)[ALL_GPUS]
        given = tuple(_percent_of_unsplit(every, catalog, policy))
        return {**_with_limits(dict(given), dict.fromkeys(dict(given), share)), "limits_share": share}
    if every is not None or not given:
        return {**_with_limits(dict(given), dict(written)), "limits_share": None}
    hint = " (a limit on all GPUs stays; `limit off` removes it)" if ALL_GPUS in policy.limit_map else ""
    limits = _merged(policy.limits, given, f"limit off: GPU {{gpu}} has no limit of its own{hint}")
    kept = {gpu: text for gpu, text in policy.limits_written if gpu not in dict(given)}
    removed = None in dict(given).values()  # `limit off 2`: the share no longer covers every visible GPU
    return {**_with_limits(dict(limits), {**kept, **dict(written)}),
            "limits_share": None if removed else policy.limits_share}


def _reshared(policy: Policy, catalog: GpuCatalog | None) -> dict[str, Any]:
    """After `visible` or a split changed: a share given for every GPU (`limit 50%`) sizes exactly the
    visible cards without a split of their own, whichever directive came first (a `%%tfgpu` cell's
    lines come in any order). Limits given per GPU stay as they are."""
    share = policy.limits_share
    if share is None:
        return {}
    written = dict(policy.limits_written)
    own = {gpu: mib for gpu, mib in policy.limits if written.get(gpu) != share}
    shared = {gpu: mib for gpu, mib in _percent_of_unsplit(Percent(share.rstrip("%")), catalog, policy, empty_ok=True)
              if gpu not in own}
    return _with_limits({**shared, **own}, {**written, **dict.fromkeys(shared, share)})


def _with_limits(limits: Mapping[str, int], written: Mapping[str, str]) -> dict[str, Any]:
    """These limits, and how those given as a share of the card were written, as policy fields."""
    return {"limits": sort_gpu_items(limits.items()),
            "limits_written": sort_gpu_items((gpu, text) for gpu, text in written.items() if gpu in limits)}


def _merged(entries: Changes, given: Changes, missing: str) -> tuple:
    """Per-GPU `entries` with `given` merged in, None removing a GPU's entry (`missing`, formatted
    with the GPU, is the error when it has none)."""
    merged = dict(entries)
    for gpu, value in given:
        if value is not None:
            merged[gpu] = value
        elif merged.pop(gpu, None) is None:
            raise PolicyError(missing.format(gpu=gpu))
    return sort_gpu_items(merged.items())


def _expect_spec(spec: directives.Directive, args: list[str]) -> None:
    _expect(spec.name, args, *spec.arity, spec.synopsis)


def _choice(spec: directives.Directive, word: str) -> str:
    """`word` as one of the directive's closed choices (any case), else the near-miss error."""
    choice = word.lower()
    if choice not in spec.choices:
        raise not_one_of(spec.name, word, spec.choices)
    return choice


# ----- actions ----------------------------------------------------------------------------------
def _action(spec: directives.Directive, args: list[str]) -> Action:
    _expect_spec(spec, args)
    if spec.parse is not None:
        return Action(spec.name, spec.parse(args))
    if spec.choices:
        return Action(spec.name, _choice(spec, args[0]) if args else spec.choices[0])
    return Action(spec.name)


# ----- edits: a parser each (words → the policy fields it sets) ------------------------------------
Changes = tuple[tuple[str, Any], ...]
Parser = Callable[[list[str], GpuCatalog | None], Changes]


def parses(name: str) -> Callable[[Parser], Parser]:
    """Put the decorated parser on edit `name`'s registry entry (an edit that is not a field edit;
    tests/test_registry.py checks that every such edit has one)."""

    def register(parser: Parser) -> Parser:
        directives.spec(name).parse = parser
        return parser

    return register


@parses("limit")
def _parse_limit(args: list[str], catalog: GpuCatalog | None) -> Changes:
    _check_spaced_unit("limit", args)
    _expect_spec(directives.spec("limit"), args)
    gpus = parse_gpus(args[1], catalog) if len(args) == 2 else None
    if args[0].lower() == "off":
        return (("limits", tuple((gpu, None) for gpu in gpus or ())),)
    size = parse_size(args[0])
    written = (("limits_written", tuple((gpu, f"{size:g}%") for gpu in gpus or (ALL_GPUS,))),) \
        if _is_percent(size) else ()
    if gpus is None:  # a share: every visible card, each by its own total, when applied
        return (("limits", ((ALL_GPUS, size if _is_percent(size) else int(size)),)), *written)
    return (("limits", tuple(_per_gpu_mib(size, catalog, gpus))), *written)


@parses("visible")
def _parse_visible(args: list[str], catalog: GpuCatalog | None) -> Changes:
    _expect_spec(directives.spec("visible"), args)
    word = args[0].lower()
    if word == "all":
        return _visible(None)
    if word == "none":
        return _visible(())
    if word == "auto" or word.startswith("auto:"):
        return _visible(*_auto_pick(word, catalog))
    gpus = parse_gpus(args[0], catalog)
    migs = [gpu for gpu in gpus if catalog.is_mig(gpu)] if catalog is not None else []
    if len(migs) > 1:
        raise PolicyError(
            f"visible: {len(migs)} MIG instances given, but CUDA uses only one MIG instance per process; "
            "pick one (or run one kernel per instance)"
        )
    return _visible(gpus)


def _visible(gpus: tuple[str, ...] | None, why: str | None = None) -> Changes:
    """`visible`, and its note in `Policy.sources` (None: no note any more)."""
    return (("visible", gpus), ("sources", (("visible", why),)))


def _auto_pick(word: str, catalog: GpuCatalog | None) -> tuple[tuple[str, ...], str]:
    """`auto[:N]`: the N GPUs with the most free memory (of those the catalog offers: a grant's), pinned
    by UUID, and why they were picked."""
    count = parse_count(word.partition(":")[2] or "1", "visible auto:N")
    if catalog is None:
        raise PolicyError("`visible auto` needs the GPU inventory (an NVIDIA driver and nvidia-ml-py)")
    ranked = catalog.by_free_memory()
    if len(ranked) < count:
        raise PolicyError(f"visible auto:{count}: {catalog.scope()}")
    picked = ranked[:count]
    return tuple(g.uuid for g in picked), auto_pick_note(picked)


@parses("split")
def _parse_split(args: list[str], catalog: GpuCatalog | None) -> Changes:
    _check_spaced_unit("split", args)
    _expect_spec(directives.spec("split"), args)
    target = args[0].lower()
    if target == "off":
        if len(args) == 1:
            return (("splits", ()), ("cpu_devices", None))
        which = args[1]
        return (("cpu_devices", None),) if which.lower() == "cpu" else (("splits", ((parse_gpu(which, catalog), None),)),)
    if len(args) != 2:
        if target == "cpu":
            raise PolicyError("split cpu: missing COUNT, e.g. `split cpu 2`")
        gpu = parse_gpu(args[0], catalog)
        raise PolicyError(f"split {gpu}: missing the parts, e.g. `split {gpu} 2x2GB`")
    if target == "cpu":
        return (("cpu_devices", parse_count(args[1], "split cpu")),)
    gpu = parse_gpu(args[0], catalog)
    return (("splits", ((gpu, parse_parts(args[1], gpu, catalog)),)),)


_EVERY_DEFAULT: Changes = tuple(vars(Policy()).items())
"""Every policy field at TensorFlow's default (and no notes): what `reset` sets."""


@parses("reset")
def _parse_reset(args: list[str], catalog: GpuCatalog | None) -> Changes:
    _expect_spec(directives.spec("reset"), args)
    return _EVERY_DEFAULT


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


def _percent_of_unsplit(size: float, catalog: GpuCatalog | None, policy: Policy,
                        empty_ok: bool = False) -> list[tuple[str, int]]:
    """`limit NN%` without GPUs: each visible card that has no split of its own, by its own total
    (a limit on all GPUs spares split ones the same way)."""
    cards = policy.visible if policy.visible is not None else (tuple(catalog.refs()) if catalog else None)
    if cards is not None:
        cards = tuple(gpu for gpu in cards if gpu not in policy.split_map)
    return [] if empty_ok and cards == () else _per_gpu_mib(size, catalog, cards)


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
