"""How the package writes a size, in one place: in a directive (`2GB`, `512MB`, what `parse_size`
in `language.grammar` reads back) and for people (`512 MiB`, `3.5 GiB`, `20.0 / 80 GiB`, an exact
`20480` next to nvidia-smi's MiB columns). Every room that shows memory uses these."""

from __future__ import annotations

MIB = 1024 * 1024
"""Bytes in a MiB (NVML and TensorFlow count bytes, the policy MiB)."""


def mib_text(mib: float | None) -> str:
    """MiB as people read it: `512 MiB`, `3.5 GiB`; `?` when unknown."""
    if mib is None:
        return "?"
    if abs(mib) >= 1024 * 1024:
        return f"{mib / 1024 / 1024:.1f} TiB"
    return f"{mib / 1024:.1f} GiB" if abs(mib) >= 1024 else f"{mib:.0f} MiB"


def bytes_text(count: int | None) -> str:
    """Bytes as people read them: `mib_text` from 1 MiB, `KiB` below; `?` when unknown."""
    return "?" if count is None else (mib_text(count / MIB) if abs(count) >= MIB else f"{count / 1024:.0f} KiB")


def gib_pair(used_mib: int, total_mib: int) -> str:
    """Used / total as people read a card: `20.0 / 80 GiB` (MiB on cards under 1 GiB)."""
    if total_mib < 1024:
        return f"{used_mib} / {total_mib} MiB"
    total = f"{total_mib // 1024}" if total_mib % 1024 == 0 else f"{total_mib / 1024:.1f}"
    return f"{used_mib / 1024:.1f} / {total} GiB"


def mib_count(mib: int | None, grouped: bool = False) -> str:
    """An exact MiB count as nvidia-smi prints it, for a column already labelled MiB (`20480`,
    `20,480` when `grouped`); `?` when unknown."""
    if mib is None:
        return "?"
    return f"{mib:,}" if grouped else str(mib)


def directive_size(mib: int) -> str:
    """A size as a directive writes it: whole GiB as `2GB`, else `512MB`."""
    return f"{mib // 1024}GB" if mib % 1024 == 0 else f"{mib}MB"
