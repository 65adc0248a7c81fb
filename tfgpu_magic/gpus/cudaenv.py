"""`CUDA_VISIBLE_DEVICES` read the way CUDA reads it (pure)."""

from __future__ import annotations

from typing import NamedTuple

from ..language.policy import MAX_WHOLE, is_uuid, whole_number

_BLANKS = " \t"
"""What CUDA skips around an entry; a newline is not among them (`GPU-abc\n` is no UUID)."""


class CudaVisible(NamedTuple):
    """The entries CUDA will use, and the first entry it stopped at (everything after is ignored)."""

    raw: str | None
    entries: tuple[str, ...] = ()
    stopped_at: str | None = None

    @property
    def restricts(self) -> bool:
        return self.raw is not None

    @property
    def hides_all(self) -> bool:
        return self.raw is not None and not self.entries


def parse_cuda_visible(raw: str | None, known: set[str] | None = None) -> CudaVisible:
    """Parse like CUDA: indices, GPU/MIG UUIDs or prefixes; stop at the first invalid entry;
    an empty value hides every GPU. `known` (indices and UUIDs that exist), when given, also makes
    an index or UUID that does not exist invalid."""
    if raw is None:
        return CudaVisible(None)
    entries: dict[str, None] = {}  # ordered, and a linear-time check for repeats
    for token in (t.strip(_BLANKS) for t in raw.split(",")):
        if not token and not entries and raw.strip(_BLANKS) == "":
            break
        number = whole_number(token)
        entry = token if number is None else str(number)
        valid = (number is not None and number < MAX_WHOLE) or is_uuid(token)
        if valid and known is not None:
            valid = entry in known or (number is None and any(k.startswith(token) for k in known))
        if not valid or entry in entries:
            return CudaVisible(raw, tuple(entries), token or "(empty entry)")
        entries[entry] = None
    return CudaVisible(raw, tuple(entries))
