"""TensorFlow's build as the doctor reads it: `python/platform/build_info.py` parsed, never executed
(its CUDA, cuDNN and the GPU architectures it has kernels for), and the installed distribution's version."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from .records import Machine


def read_build_info(tf_dir: Path) -> dict[str, object]:
    """TensorFlow's build facts from `python/platform/build_info.py`, parsed, never executed."""
    source = (tf_dir / "python" / "platform" / "build_info.py").read_text(encoding="utf-8")
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "build_info" for t in node.targets):
            value = node.value
            if isinstance(value, ast.Call) and value.args:
                value = value.args[0]
            return dict(ast.literal_eval(value))
    return {}


def build_info(m: Machine) -> dict[str, object] | None:
    """The build facts, None where TensorFlow is missing or its build info unreadable (the
    TensorFlow check says so)."""
    if m.tf_dir is None:
        return None
    try:
        return read_build_info(m.tf_dir)
    except (OSError, SyntaxError, ValueError):
        return None


def tf_version(m: Machine) -> tuple[int, int] | None:
    """(major, minor) of the installed TensorFlow distribution ("tensorflow 2.21.0" → (2, 21))."""
    found = re.search(r" (\d+)\.(\d+)", m.tf_distribution or "")
    return (int(found[1]), int(found[2])) if found else None


def parse_architectures(entries: object) -> list[tuple[str, int, int, str]]:
    """build_info's `cuda_compute_capabilities` ('sm_80', 'compute_90', 'sm_90a') as
    (kind, major, minor, suffix); kind 'sm' is a binary, 'compute' PTX."""
    parsed = []
    for entry in entries if isinstance(entries, (list, tuple)) else ():
        found = re.fullmatch(r"(sm|compute)_(\d+)(\d)([a-z]?)", str(entry).strip())
        if found:
            parsed.append((found[1], int(found[2]), int(found[3]), found[4]))
    return parsed


def covers(architectures: list[tuple[str, int, int, str]], capability: tuple[int, int]) -> str | None:
    """How TensorFlow runs on a card of `capability`: 'sm_XY' (a binary of its major version at or
    below its minor; an 'a' binary only on its exact card), 'compute_XY' (PTX at or below it, compiled
    by the driver at start), or None (no kernel at all)."""
    major, minor = capability
    binaries = [(a, b, s) for kind, a, b, s in architectures if kind == "sm"
                and a == major and (b == minor if s else b <= minor)]
    if binaries:
        a, b, s = max(binaries)
        return f"sm_{a}{b}{s}"
    ptx = [(a, b) for kind, a, b, _ in architectures if kind == "compute" and (a, b) <= capability]
    if ptx:
        a, b = max(ptx)
        return f"compute_{a}{b}"
    return None
