"""The `tfgpu:` lines after a failed cell: an OOM explained (what was asked for, where, the cap in
force and its source, the peak, who else holds memory, what to do) and what was released, or the one
hint after a cuDNN / cuBLAS start-up failure. `tf.oom`'s hook finds them; it prints what `outcome_text`
makes of them, through the `settings.words` that `views.hookup` fills.
"""

from __future__ import annotations

from ..language.sizes import bytes_text, mib_text
from ..tf.oom import CONFIG_TRAIT, OomNote, Outcome, Released

DNN_STARTUP_HINT = ("tfgpu: cuDNN/cuBLAS could not start, which usually means the GPU's memory is taken (another "
                    "process, or this one's pool grabbed it all): `%tfgpu who` shows who holds it; `%tfgpu growth on` "
                    "then `%tfgpu restart` lets TensorFlow take only what it needs.")


def outcome_text(outcome: Outcome) -> str:
    """What the hook prints on stderr after IPython's traceback."""
    if outcome.dnn_startup:
        return DNN_STARTUP_HINT
    err = outcome.failure
    lines = explanation(outcome.note) if outcome.note is not None else [
        f"tfgpu: (no explanation: {type(err).__name__}: {err})"]
    if outcome.released is not None:
        lines.append(released_text(outcome.released))
    return "\n".join(lines)


def explanation(note: OomNote) -> list[str]:
    """The `tfgpu:` lines that explain one OOM, ending with what to do next."""
    request, row = note.request, note.row
    device = request.device if request else None
    lines = []
    if request is None:
        lines.append("TensorFlow ran out of memory (ResourceExhaustedError); its message names no tensor size.")
    else:
        shape = ", ".join(str(dim) for dim in request.shape)
        asked = bytes_text(request.bytes) if request.bytes is not None else f"? ({request.dtype}: size unknown)"
        lines.append(f"TensorFlow ran out of memory on {device or 'an unnamed device'}: "
                     f"it asked for {asked} (shape [{shape}], {request.dtype}).")
    if device is not None and device.startswith("CPU"):
        lines.append("That is host memory (RAM), not a GPU: GPU caps do not apply.")
    elif row is not None:
        holds = f"this process holds {mib_text(row.process_mib)} of the card's {mib_text(row.total_mib)}"
        others = row.other_processes
        who = ", ".join(f"pid {p.pid} {mib_text(p.mib)}" for p in others) if others else "none"
        lines.append(f"Cap in force: {row.cap_text}; {holds}; other processes: {who}.")
        if row.peak_bytes is not None:
            since = "the cell's peak" if note.peak_from_cell else "peak so far (`%tfgpu watch on` resets it per cell)"
            lines.append(f"Tensors now {bytes_text(row.tensors_bytes)}, {since} {bytes_text(row.peak_bytes)}.")
    steps = ["a smaller batch or tensor"]
    if note.cap_is_cause:
        steps.append("`%tfgpu limit off` (the cap is what ran out)")
    if row is not None and not row.growth:
        steps.append("`%tfgpu growth on`, so the pool grows only as needed")
    if row is not None:
        changed = note.cap_is_cause or not row.growth
        steps.append(f"`%tfgpu restart` to {'apply that and ' if changed else ''}give TensorFlow's pool back to the card")
    lines.append("Next: " + "; ".join(steps) + ".")
    return [f"tfgpu: {line}" for line in lines]


def released_text(released: Released) -> str:
    """The line after the explanation: what releasing the failed cell's frames freed."""
    freed = (f": tensors {bytes_text(released.before)} → {bytes_text(released.after)}"
             if released.before is not None else "")
    return (f"tfgpu: released what only the failed cell's frames held ({released.frames} frames cleared{freed}); "
            f"`%debug` on this error sees cleared frames (`%config TFGPUMagics.{CONFIG_TRAIT} = False` keeps them).")
