"""The GPU policy: an immutable value, its validation and its JSON form (pure, no TensorFlow)."""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Container, Iterable, Mapping

from ..errors import PolicyError
from .words import ALL_GPUS, ALLOCATORS, LOGLEVELS

AUTO_PICKED = "auto picked "
"""How `visible auto` notes its pick in `Policy.sources` (a kernelspec turns it back into `auto:N`)."""


def auto_pick_note(picked: Iterable[Any], shared: Container[str] = ()) -> str:
    """The note on a `visible auto` pick (the magic's and the provisioner's): `auto picked GPU 2 (79.0
    GiB free, 10% busy), ...`, from cards with `index`, `uuid`, `memory_free_mib` and `utilization_pct`
    (`gpus.inventory.Gpu`); a card whose UUID is in `shared` was just given to another kernel too."""
    from .sizes import mib_text

    def card(gpu: Any) -> str:
        parts = [f"{mib_text(gpu.memory_free_mib)} free" if gpu.memory_free_mib is not None else "free memory unknown"]
        if gpu.utilization_pct is not None:
            parts.append(f"{gpu.utilization_pct}% busy")
        if gpu.uuid in shared:
            parts.append("also just given to another kernel")
        return f"GPU {gpu.index} ({', '.join(parts)})"

    return AUTO_PICKED + ", ".join(card(gpu) for gpu in picked)

MAX_MIB = 1024 * 1024
"""Largest memory size accepted (1 TiB); larger is surely a typo."""

MAX_VIRTUAL_DEVICES = 64
"""Most logical devices one physical device may be split into."""

MAX_GPU_INDEX = 255

MAX_GPU_ENTRIES = MAX_GPU_INDEX + 1
"""Most entries in one GPU list: more than any machine has cards, small enough that
`CUDA_VISIBLE_DEVICES` stays far below the kernel's limit on one environment string."""

MAX_UUID_CHARS = 80
"""Longest GPU/MIG UUID accepted: `MIG-GPU-<36>/<gi>/<ci>` is about 55 characters."""

_UUID = re.compile(r"(GPU|MIG)-(GPU-)?[0-9a-f][0-9a-f-]*(/[0-9]+){0,2}", re.IGNORECASE | re.ASCII)
"""NVML's forms: `GPU-<hex uuid>`, `MIG-<hex uuid>`, the older `MIG-GPU-<hex uuid>/<gi>/<ci>`, and their
prefixes. Hex only: a typo such as `GPU-xyz` would otherwise reach `CUDA_VISIBLE_DEVICES` and hide
every GPU."""
_MAX_DIGITS = 18
"""Longest whole number (after leading zeros) ever turned into an `int`: far below Python's
4,300-digit limit, far above any count, index or MiB this tool accepts."""
MAX_WHOLE = 10**_MAX_DIGITS
"""What `whole_number` gives for a longer number: larger than every limit, cheap to print."""


def is_index(text: str) -> bool:
    """True for an ASCII whole number (`str.isdigit` also accepts '²', which `int` rejects)."""
    return text.isascii() and text.isdigit()


def whole_number(text: str) -> int | None:
    """`text` as an int if it is an ASCII whole number, None otherwise. A number too long to be
    meaningful gives `MAX_WHOLE` (out of every range) rather than Python's digit-limit ValueError."""
    if not is_index(text):
        return None
    digits = text.lstrip("0") or "0"
    return MAX_WHOLE if len(digits) > _MAX_DIGITS else int(digits)


def is_uuid(text: str) -> bool:
    """True for a GPU or MIG UUID, or a prefix of one (`GPU-8932f937`), in any case; ASCII only and
    the whole text (no trailing newline)."""
    return len(text) <= MAX_UUID_CHARS and _UUID.fullmatch(text) is not None


SHORT_UUID = len("GPU-8932f937")
"""A UUID shown in a status is cut to its first 8 hex digits, a prefix CUDA and `%tfgpu` accept."""


def short_uuid(ref: str) -> str:
    """`GPU-b1c2d3e4…` for a long GPU/MIG UUID (the status keeps within a screen's width); other
    references as they are."""
    return f"{ref[:SHORT_UUID]}…" if is_uuid(ref) and len(ref) > SHORT_UUID + 1 else ref


def quote(value: object, limit: int = 40) -> str:
    """`repr(value)` for an error message, shortened so a huge input is never echoed back whole
    (and a huge int never reaches `repr`, which raises Python's digit-limit ValueError)."""
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value) if -MAX_WHOLE < value < MAX_WHOLE else f"a number of about {len_digits(value):,} digits"
    if isinstance(value, str) and len(value) > limit:
        return f"{value[: limit - 12]!r}…{value[-8:]!r} ({len(value):,} characters)"
    text = repr(value)
    return text if len(text) <= limit else f"{text[: limit - 8]}… ({len(text):,} characters)"


def len_digits(value: int) -> int:
    """About how many decimal digits `value` has, without `str()` (which refuses over 4,300)."""
    return max(1, round(abs(value).bit_length() * 0.30103))


def quote_number(number: int, text: str) -> str:
    """`number` parsed from `text` (`whole_number`) for a message: the text itself, shortened, when
    the number was too long to parse."""
    return quote(number) if number < MAX_WHOLE else quote(text)


def check_gpu_ref(ref: str) -> None:
    """`PolicyError` unless `ref` is a canonical GPU reference: an index or a GPU/MIG UUID."""
    number = whole_number(ref)
    if number is not None and number <= MAX_GPU_INDEX and ref == str(number):
        return
    if is_uuid(ref):
        return
    raise PolicyError(f"not a GPU reference: {quote(ref)}; expected an index (0) or a UUID (GPU-8932f937)")


def check_gpu_count(count: int, what: str) -> None:
    """`PolicyError` if a GPU list is longer than any machine's (keeps every later step small)."""
    if count > MAX_GPU_ENTRIES:
        raise PolicyError(f"{what}: {count:,} GPUs listed; at most {MAX_GPU_ENTRIES}")


@dataclass(frozen=True)
class Policy:
    """What the user wants TensorFlow's devices to look like.

    `None` (or empty) in a field means "leave TensorFlow's default alone".
    GPU references are strings: an nvidia-smi index ("0") or a GPU/MIG UUID (or unique prefix).
    """

    visible: tuple[str, ...] | None = None
    growth: bool | None = None
    limits: tuple[tuple[str, int], ...] = ()
    splits: tuple[tuple[str, tuple[int, ...]], ...] = ()
    cpu_devices: int | None = None
    allocator: str | None = None
    loglevel: str | None = None
    sources: tuple[tuple[str, str], ...] = field(default=(), compare=False)
    """Free-form notes on how a field was chosen (e.g. `visible auto`), shown by the status."""
    limits_written: tuple[tuple[str, str], ...] = field(default=(), compare=False)
    """(GPU, `50%`) for each limit given as a share of its card, so the status shows it as written;
    the MiB in `limits` are what applies."""
    limits_share: str | None = field(default=None, compare=False)
    """`50%` where `limit 50%` was given for every GPU: the share then sizes whichever cards are visible
    (the grammar sizes them again when `visible` or a split changes), in whatever order they came."""

    # ----- derived views -------------------------------------------------------------------
    @property
    def limit_map(self) -> dict[str, int]:
        return dict(self.limits)

    @property
    def split_map(self) -> dict[str, tuple[int, ...]]:
        return dict(self.splits)

    @property
    def picked_automatically(self) -> bool:
        """`visible` was chosen by `visible auto` (the freest GPUs), not named by the user."""
        return bool(self.visible) and dict(self.sources).get("visible", "").startswith(AUTO_PICKED)

    @property
    def is_empty(self) -> bool:
        return self == Policy()

    def replace(self, **changes: Any) -> Policy:
        """A new policy with `changes`, validated (raises `PolicyError`, returns nothing on error)."""
        new = self.edited(**changes)
        new.validate()
        return new

    def edited(self, **changes: Any) -> Policy:
        """A new policy with `changes`, not validated: the steps of a `%%tfgpu` cell may contradict
        each other on the way, only the cell's result is validated."""
        return dataclasses.replace(self, **changes)

    # ----- validation ----------------------------------------------------------------------
    def validate(self, aliases: Mapping[str, str] | None = None) -> None:
        """Raise `PolicyError` if the policy contradicts itself or TensorFlow's rules.

        `aliases` (GPU UUID → index, from the inventory) lets a GPU named by UUID in one place and by
        index in another count as the same card."""
        same = (lambda gpu: aliases.get(gpu, gpu)) if aliases else (lambda gpu: gpu)
        for name, entries in (("visible", self.visible or ()), ("limits", self.limits), ("splits", self.splits)):
            check_gpu_count(len(entries), name)
        limited = {same(gpu) for gpu, _ in self.limits}
        for ref in [*(self.visible or ()), *(g for g, _ in self.limits if g != ALL_GPUS), *(g for g, _ in self.splits)]:
            check_gpu_ref(ref)
        for gpu, mib in self.limits:
            _check_mib(mib, f"limit on GPU {gpu}")
        for gpu, sizes in self.splits:
            if not 1 <= len(sizes) <= MAX_VIRTUAL_DEVICES:
                raise PolicyError(f"split of GPU {gpu}: 1 to {MAX_VIRTUAL_DEVICES} parts, got {len(sizes)}")
            for mib in sizes:
                _check_mib(mib, f"split of GPU {gpu}")
            if same(gpu) in limited:
                raise PolicyError(
                    f"GPU {gpu} has both a limit and a split; a split already sizes each part "
                    f"(remove one: `limit off {gpu}` or `split off {gpu}`)"
                )
        if self.cpu_devices is not None and not 1 <= self.cpu_devices <= MAX_VIRTUAL_DEVICES:
            raise PolicyError(
                f"split cpu: COUNT must be 1 to {MAX_VIRTUAL_DEVICES}, got {quote(self.cpu_devices)}"
            )
        if self.allocator is not None and self.allocator not in ALLOCATORS:
            raise PolicyError(f"allocator: expected one of {', '.join(ALLOCATORS)}, got {quote(self.allocator)}")
        if self.loglevel is not None and self.loglevel not in LOGLEVELS:
            raise PolicyError(f"loglevel: expected one of {', '.join(LOGLEVELS)}, got {quote(self.loglevel)}")
        self._check_visible(same)

    def _check_visible(self, same: Callable[[str], str]) -> None:
        """No GPU twice in `visible`, and no limit or split on a GPU it hides."""
        if self.visible is None:
            return
        visible: set[str] = set()
        for gpu in self.visible:
            if same(gpu) in visible:
                raise PolicyError(f"GPU {gpu} is listed twice in `visible`")
            visible.add(same(gpu))
        by_index = all(is_index(v) for v in visible)
        targets = [gpu for gpu, _ in self.limits if gpu != ALL_GPUS] + [gpu for gpu, _ in self.splits]
        for gpu in targets:
            if not self.visible:
                raise PolicyError(f"GPU {gpu} has a limit or split but `visible none` hides every GPU")
            if by_index and is_index(same(gpu)) and same(gpu) not in visible:
                raise PolicyError(
                    f"GPU {gpu} has a limit or split but is not visible (visible: {','.join(self.visible)})"
                )

    # ----- JSON ----------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict; `Policy.from_dict(p.to_dict()) == p`."""
        return {
            "visible": None if self.visible is None else list(self.visible),
            "growth": self.growth,
            "limits": dict(self.limits),
            "splits": {gpu: list(sizes) for gpu, sizes in self.splits},
            "cpu_devices": self.cpu_devices,
            "allocator": self.allocator,
            "loglevel": self.loglevel,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Policy:
        """Build and validate a policy from `to_dict()` output; `PolicyError` on anything else."""
        if not isinstance(data, Mapping):
            raise PolicyError(f"a policy must be a JSON object, got {type(data).__name__}")
        unknown = set(data) - {f.name for f in dataclasses.fields(cls) if f.compare}
        if unknown:
            raise PolicyError(f"unknown policy keys: {', '.join(sorted(map(str, unknown)))}")
        visible = data.get("visible")
        growth = data.get("growth")
        cpu = data.get("cpu_devices")
        allocator = data.get("allocator")
        loglevel = data.get("loglevel")
        if visible is not None and not _is_str_list(visible):
            raise PolicyError("policy 'visible' must be null or a list of GPU references")
        if isinstance(visible, list):
            check_gpu_count(len(visible), "policy 'visible'")
        if growth is not None and not isinstance(growth, bool):
            raise PolicyError("policy 'growth' must be true, false or null")
        if cpu is not None and (isinstance(cpu, bool) or not isinstance(cpu, int)):
            raise PolicyError("policy 'cpu_devices' must be an integer or null")
        if allocator is not None and not isinstance(allocator, str):
            raise PolicyError("policy 'allocator' must be a string or null")
        if loglevel is not None and not isinstance(loglevel, str):
            raise PolicyError("policy 'loglevel' must be a string or null")
        policy = cls(
            visible=None if visible is None else tuple(visible),
            growth=growth,
            limits=sort_gpu_items(_int_items(_or_empty(data, "limits"), "limits")),
            splits=sort_gpu_items((gpu, tuple(sizes)) for gpu, sizes in _list_items(_or_empty(data, "splits"))),
            cpu_devices=cpu,
            allocator=allocator,
            loglevel=loglevel,
        )
        policy.validate()
        return policy


def _or_empty(data: Mapping[str, Any], key: str) -> Any:
    """`data[key]`, with a missing key or null meaning an empty mapping."""
    value = data.get(key)
    return {} if value is None else value


def sort_gpu_items(items: Any) -> tuple:
    """Canonical order for per-GPU entries: `all` first, then indices numerically, then UUIDs."""

    def key(item: tuple[str, Any]) -> tuple[int, int, str]:
        gpu = item[0]
        if gpu == ALL_GPUS:
            return (0, 0, "")
        number = whole_number(gpu)
        if number is not None:
            return (1, number, "")
        return (2, 0, gpu)

    return tuple(sorted(items, key=key))


def _check_mib(mib: Any, what: str) -> None:
    if isinstance(mib, bool) or not isinstance(mib, int):
        raise PolicyError(f"{what}: size must be a whole number of MiB, got {quote(mib)}")
    if not 1 <= mib <= MAX_MIB:
        raise PolicyError(f"{what}: size must be 1 MiB to {MAX_MIB // 1024} GiB, got {quote(mib)} MiB")


def _is_str_list(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(v, str) and v for v in value)


def _int_items(data: Any, name: str) -> list[tuple[str, int]]:
    if not isinstance(data, Mapping):
        raise PolicyError(f"policy '{name}' must be an object of GPU → MiB")
    check_gpu_count(len(data), f"policy '{name}'")
    items = list(data.items())
    for gpu, mib in items:
        if not isinstance(gpu, str) or not gpu:
            raise PolicyError(f"policy '{name}' keys must be GPU references")
        if gpu != ALL_GPUS:
            check_gpu_ref(gpu)
        _check_mib(mib, f"{name} of GPU {gpu}")
    return items


def _list_items(data: Any) -> list[tuple[str, list[int]]]:
    if not isinstance(data, Mapping):
        raise PolicyError("policy 'splits' must be an object of GPU → list of MiB")
    check_gpu_count(len(data), "policy 'splits'")
    items = list(data.items())
    for gpu, sizes in items:
        if not isinstance(gpu, str) or not gpu or not isinstance(sizes, list):
            raise PolicyError("policy 'splits' must map GPU references to lists of MiB")
    return items

