"""The GPU policy: an immutable value, its validation and its JSON form (pure, no TensorFlow)."""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from .errors import PolicyError

ALL_GPUS = "all"
"""Key in `Policy.limits` for 'every visible GPU'."""

ALLOCATORS = {"bfc": None, "async": "cuda_malloc_async"}
"""Allocator names of the grammar and the `TF_GPU_ALLOCATOR` value each one sets (None: unset)."""

MAX_MIB = 1024 * 1024
"""Largest memory size accepted (1 TiB); larger is surely a typo."""

MAX_VIRTUAL_DEVICES = 64
"""Most logical devices one physical device may be split into."""

MAX_GPU_INDEX = 255
_UUID = re.compile(r"^(GPU|MIG)-[0-9A-Za-z][0-9A-Za-z/-]*$", re.IGNORECASE)


def is_index(text: str) -> bool:
    """True for an ASCII whole number (`str.isdigit` also accepts '²', which `int` rejects)."""
    return text.isascii() and text.isdigit()


def is_uuid(text: str) -> bool:
    """True for a GPU or MIG UUID, or a prefix of one (`GPU-8932f937`), in any case."""
    return bool(_UUID.match(text))


def check_gpu_ref(ref: str) -> None:
    """`PolicyError` unless `ref` is a canonical GPU reference: an index or a GPU/MIG UUID."""
    if is_index(ref) and int(ref) <= MAX_GPU_INDEX and ref == str(int(ref)):
        return
    if is_uuid(ref):
        return
    raise PolicyError(f"not a GPU reference: {ref!r}; expected an index (0) or a UUID (GPU-8932f937)")


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
    sources: tuple[tuple[str, str], ...] = field(default=(), compare=False)
    """Free-form notes on how a field was chosen (e.g. `visible auto`), shown by the status."""

    # ----- derived views -------------------------------------------------------------------
    @property
    def limit_map(self) -> dict[str, int]:
        return dict(self.limits)

    @property
    def split_map(self) -> dict[str, tuple[int, ...]]:
        return dict(self.splits)

    @property
    def is_empty(self) -> bool:
        return self == Policy()

    def replace(self, **changes: Any) -> Policy:
        """A new policy with `changes`, validated (raises `PolicyError`, returns nothing on error)."""
        new = dataclasses.replace(self, **changes)
        new.validate()
        return new

    # ----- validation ----------------------------------------------------------------------
    def validate(self, aliases: Mapping[str, str] | None = None) -> None:
        """Raise `PolicyError` if the policy contradicts itself or TensorFlow's rules.

        `aliases` (GPU UUID → index, from the inventory) lets a GPU named by UUID in one place and by
        index in another count as the same card."""
        same = (lambda gpu: aliases.get(gpu, gpu)) if aliases else (lambda gpu: gpu)
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
            raise PolicyError(f"split cpu: COUNT must be 1 to {MAX_VIRTUAL_DEVICES}, got {self.cpu_devices}")
        if self.allocator is not None and self.allocator not in ALLOCATORS:
            raise PolicyError(f"allocator: expected one of {', '.join(ALLOCATORS)}, got {self.allocator!r}")
        self._check_visible(same)

    def _check_visible(self, same: Callable[[str], str]) -> None:
        """No GPU twice in `visible`, and no limit or split on a GPU it hides."""
        if self.visible is None:
            return
        visible = [same(gpu) for gpu in self.visible]
        for gpu, card in zip(self.visible, visible):
            if visible.count(card) > 1:
                raise PolicyError(f"GPU {gpu} is listed twice in `visible`")
        targets = [gpu for gpu, _ in self.limits if gpu != ALL_GPUS] + [gpu for gpu, _ in self.splits]
        for gpu in targets:
            if not self.visible:
                raise PolicyError(f"GPU {gpu} has a limit or split but `visible none` hides every GPU")
            if is_index(same(gpu)) and all(is_index(v) for v in visible) and same(gpu) not in visible:
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
        if visible is not None and not _is_str_list(visible):
            raise PolicyError("policy 'visible' must be null or a list of GPU references")
        if growth is not None and not isinstance(growth, bool):
            raise PolicyError("policy 'growth' must be true, false or null")
        if cpu is not None and (isinstance(cpu, bool) or not isinstance(cpu, int)):
            raise PolicyError("policy 'cpu_devices' must be an integer or null")
        if allocator is not None and not isinstance(allocator, str):
            raise PolicyError("policy 'allocator' must be a string or null")
        policy = cls(
            visible=None if visible is None else tuple(visible),
            growth=growth,
            limits=sort_gpu_items(_int_items(_or_empty(data, "limits"), "limits")),
            splits=sort_gpu_items((gpu, tuple(sizes)) for gpu, sizes in _list_items(_or_empty(data, "splits"))),
            cpu_devices=cpu,
            allocator=allocator,
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
        if is_index(gpu):
            return (1, int(gpu), "")
        return (2, 0, gpu)

    return tuple(sorted(items, key=key))


def _check_mib(mib: Any, what: str) -> None:
    if isinstance(mib, bool) or not isinstance(mib, int):
        raise PolicyError(f"{what}: size must be a whole number of MiB, got {mib!r}")
    if not 1 <= mib <= MAX_MIB:
        raise PolicyError(f"{what}: size must be 1 MiB to {MAX_MIB // 1024} GiB, got {mib} MiB")


def _is_str_list(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(v, str) and v for v in value)


def _int_items(data: Any, name: str) -> list[tuple[str, int]]:
    if not isinstance(data, Mapping):
        raise PolicyError(f"policy '{name}' must be an object of GPU → MiB")
    items = list(data.items())
    for gpu, mib in items:
        if not isinstance(gpu, str) or not gpu:
            raise PolicyError(f"policy '{name}' keys must be GPU references")
        _check_mib(mib, f"{name} of GPU {gpu}")
    return items


def _list_items(data: Any) -> list[tuple[str, list[int]]]:
    if not isinstance(data, Mapping):
        raise PolicyError("policy 'splits' must be an object of GPU → list of MiB")
    items = list(data.items())
    for gpu, sizes in items:
        if not isinstance(gpu, str) or not gpu or not isinstance(sizes, list):
            raise PolicyError("policy 'splits' must map GPU references to lists of MiB")
    return items

