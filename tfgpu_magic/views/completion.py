"""Tab completion for `%tfgpu` lines and `%%tfgpu` cells: directive names, then the arguments that
are a closed set (`on | off`, `bfc | async`, GPU indices of this machine, ...).

`%load_ext` registers the matcher (`magics.register_completer`, API v2, IPython >= 8.6); this module
is imported at the first Tab. What each position offers comes from the registry of directives
(`language.directives`).
"""

from __future__ import annotations

from typing import Any, Callable, Sequence


def complete(context: Any, controller: Callable[[], Any]) -> dict[str, Any]:
    """Matcher API v2: completions for the word at the cursor when it is in a `%tfgpu` directive."""
    from IPython.core.completer import SimpleCompletion

    words = directive_words(context.full_text, context.cursor_line, context.text_until_cursor)
    if words is None:
        return {"completions": [], "suppress": False}
    done, cell = words
    prefix = "" if context.text_until_cursor[-1:].isspace() else (done.pop() if done else "")
    found = [word for word in candidates(done, cell, controller) if word.lower().startswith(prefix.lower())]
    return {
        "completions": [SimpleCompletion(word, type="tfgpu") for word in found],
        "suppress": bool(found),
        "matched_fragment": prefix,
    }


def directive_words(full_text: str, cursor_line: int, before_cursor: str) -> tuple[list[str], bool] | None:
    """The words of the directive up to the cursor and whether it is a cell line, or None when the
    cursor is not in a `%tfgpu` line or in the body of a `%%tfgpu` cell."""
    stripped = before_cursor.lstrip()
    for magic in ("%tfgpu ", "tfgpu "):  # `tfgpu ...` works too where automagic is on
        if stripped.startswith(magic):
            return stripped[len(magic):].split(), False
    first = full_text.lstrip().split("\n", 1)[0].strip()
    if cursor_line > 0 and first == "%%tfgpu" and not stripped.startswith("#"):
        return stripped.split(), True
    return None


def candidates(done: list[str], cell: bool, controller: Callable[[], Any]) -> Sequence[str]:
    """What may come after the words `done`, from the registry's slots and options; empty where the
    next word is free (a size, a name)."""
    from ..language import directives

    if not done:
        return directives.CELL_NAMES if cell else directives.NAMES
    spec = directives.lookup(done[0])
    if spec is None:
        return ()
    position = len(done) - 1
    if spec.options and not cell and position >= spec.arity[0]:
        return tuple(option.name for option in spec.options)
    slot = spec.slots[position] if position < len(spec.slots) else None
    if slot is None or (slot.after is not None and done[-1].lower() != slot.after):
        return ()
    return (*slot.words, *gpu_indices(controller)) if slot.gpus else slot.words


def gpu_indices(controller: Callable[[], Any]) -> list[str]:
    """This machine's GPU indices where the inventory is available. The inventory checks for a driver
    before it imports NVML, so on a machine without one this imports nothing."""
    try:
        inventory = controller().inventory()
    except Exception:  # completion must never raise into the user's Tab  # noqa: BLE001
        return []
    return [gpu.ref for gpu in inventory.gpus] if inventory.available else []
