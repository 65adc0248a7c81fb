"""How the package writes a size, in one place: in a directive (`2GB`, `512MB`, `2x1GB`, what
`parse_size` in `language.grammar` reads back) and for people (`512 MiB`, `3.5 GiB`, `20.0 / 80 GiB`,
an exact `20480` next to nvidia-smi's MiB columns). Every view that shows memory uses these: the
magic's status and `%tfgpu memory`, the panel, `who`, the watch and the OOM notes (the JupyterLab
status bar and sidebar, in TypeScript, follow the same rules).

The rules: one size is whole MiB under 1 GiB (`512 MiB`, `0 MiB`: never KiB), else GiB with one
decimal (`3.5 GiB`, `80.0 GiB`), TiB likewise; a part of a whole (used of total) is `gib_pair`; a
limit or split is shown as the directive writes it."""

from __future__ import annotations

MIB = 1024 * 1024
"""Bytes in a MiB (NVML and TensorFlow count bytes, the policy MiB)."""


def mib_text(mib: float | None) -> str:
    """MiB as people read it: `512 MiB`, `3.5 GiB`, `1.0 TiB`; `?` when unknown."""
    if mib is None:
        return "?"
    if round(abs(mib) / 1024 / 1024, 1) >= 1:
        return f"{mib / 1024 / 1024:.1f} TiB"
    return f"{mib / 1024:.1f} GiB" if round(abs(mib)) >= 1024 else f"{mib:.0f} MiB"


def bytes_text(count: int | None) -> str:
    """Bytes as people read them (`mib_text`: `0 MiB` below half a MiB, never KiB); `?` when unknown."""
    return "?" if count is None else mib_text(count / MIB)


def gib_pair(used_mib: int | None, total_mib: int | None) -> str:
    """A part of a card (used, or free) of its total: `20.0 / 80 GiB`, the total whole where it is
    whole; MiB on both sides on cards under 1 GiB (`100 / 512 MiB`); `?` for what is unknown."""
    if used_mib is None or total_mib is None:
        return f"{mib_text(used_mib)} / {mib_text(total_mib)}"
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


def split_size(sizes: tuple[int, ...]) -> str:
    """A split's parts as the directive writes them: `2x1GB` (`1x4GB`) for equal parts, else `1GB,3GB`."""
    if len(set(sizes)) == 1:
        return f"{len(sizes)}x{directive_size(sizes[0])}"
    return ",".join(directive_size(mib) for mib in sizes)
