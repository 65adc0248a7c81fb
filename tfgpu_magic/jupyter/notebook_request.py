"""The GPU policy a notebook carries in its own metadata, read when its kernel is launched.

A notebook asks for its GPUs in `metadata.tfgpu.policy`: a list of directive lines in the `%%tfgpu`
cell language (`["visible auto:1", "growth on"]`), so the request travels with the file (the ask of
jupyter_client#1055, a notebook field that provisioners read). Colab and Kaggle keep
`metadata.accelerator`; `"GPU"` (as Colab writes it) with no tfgpu policy asks for `visible auto:1`.

jupyter_server names the notebook in the kernel's environment as `JPY_SESSION_NAME`
(`SessionManager.get_kernel_env` in jupyter_server/services/sessions/sessionmanager.py): an absolute
path (the kernel's folder joined with the session's name, as JupyterLab and Notebook 7 start
sessions), or, for a session created without a name, the API path relative to the server's root; the
kernel's `cwd` is then the notebook's folder (`cwd_for_path`), so the root is `cwd` less that folder.

The notebook is hostile input: a regular file only, read without blocking and up to a cap
(`safefile`), JSON nesting bounded, a list of strings only, few and short lines, each one an edit the
grammar accepts. Any problem is one line in `NotebookRequest.refusal`, never an exception: the kernel
starts without the notebook's policy and shows that line. No notebook (a console kernel, a session
whose file does not exist) is an empty request with no refusal.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path, PurePosixPath
from typing import Any, Mapping, NamedTuple

from ..errors import PolicyError
from ..language.policy import Policy, quote

SESSION_NAME_ENV = "JPY_SESSION_NAME"
"""Where jupyter_server puts the path of the notebook a kernel was started for."""
METADATA_KEY = "tfgpu"
"""`metadata.tfgpu.policy`: the notebook's directive lines."""
POLICY_KEY = "policy"
ACCELERATOR_KEY = "accelerator"
"""Colab's (and Kaggle's) `metadata.accelerator`."""
ACCELERATOR_GPU = "GPU"
ACCELERATOR_LINES = ("visible auto:1",)
"""What `metadata.accelerator: "GPU"` asks for where the notebook has no tfgpu policy."""
NOTEBOOK_SUFFIX = ".ipynb"
MAX_NOTEBOOK_BYTES = 32 << 20
"""Largest notebook read for its policy (32 MiB: outputs make notebooks big; parsing this takes well
under a second, off the server's event loop)."""
END_BYTES = 64 << 10
"""How much of each end of an oversized notebook is looked at for its metadata's keys."""
MAX_LINES = 64
"""Most directive lines in a notebook's policy (a whole policy takes a handful)."""
MAX_LINE_CHARS = 4096
"""Longest directive line in a notebook (about 100 GPU UUIDs)."""


class NotebookRequest(NamedTuple):
    """What a notebook asks of its kernel's GPUs.

    `lines`: its directive lines (blank and comment lines left out), already checked by the grammar;
    `gpu_count`: how many GPUs they ask for (N of `visible auto:N`, the length of a `visible` list,
    0 for `visible none`; None where they leave `visible` alone); `refusal`: one line saying why the
    notebook's policy was not taken (then `lines` is empty); `source`: the notebook file read (None:
    no notebook); `pick`: N of a `visible auto:N` in force after the lines, to be picked at launch;
    `from_accelerator`: the lines stand for Colab's `accelerator: "GPU"`, not a tfgpu policy; `saved`:
    the notebook has a tfgpu policy of its own, even an empty one (False with a refusal)."""

    lines: tuple[str, ...] = ()
    gpu_count: int | None = None
    refusal: str | None = None
    source: str | None = None
    pick: int | None = None
    from_accelerator: bool = False
    saved: bool = False
    """The notebook has `metadata.tfgpu` (an empty policy included)."""


def read_request(env: Mapping[str, str], cwd: str | None) -> NotebookRequest:
    """The request of the notebook named by `env[JPY_SESSION_NAME]` (the launch environment a
    provisioner's `pre_launch` gets), `cwd` the kernel's folder from the launch kwargs. Never raises
    for anything in the file: problems are `refusal`."""
    path = notebook_path(env, cwd)
    if path is None:
        return NotebookRequest()
    source = str(path)
    try:
        metadata = _read_metadata(path)
        if metadata is None:
            return NotebookRequest()
        return _request(metadata, source)
    except PolicyError as err:
        return NotebookRequest(refusal=refusal_line(source, str(err)), source=source)
    except (OSError, ValueError, RecursionError, MemoryError) as err:
        return NotebookRequest(refusal=refusal_line(source, f"{type(err).__name__}: {err}"), source=source)


def refusal_line(source: str, why: str) -> str:
    """One line: the notebook, why its policy was not taken, and what the kernel does instead."""
    why = " ".join(why.split()).removesuffix("; ignoring it")  # safefile's own ending
    source = source.encode("unicode_escape").decode("ascii") if not source.isprintable() else source
    return f"ignoring the GPU policy in the notebook {source}: {why[:240]}; the kernel starts without it"


def notebook_path(env: Mapping[str, str], cwd: str | None) -> Path | None:
    """The notebook file `JPY_SESSION_NAME` names (see the module docstring), None where there is
    none to read: not set (a console kernel), not an `.ipynb`, or nothing there."""
    name = env.get(SESSION_NAME_ENV)
    if not name or "\0" in name or not name.endswith(NOTEBOOK_SUFFIX):
        return None
    if os.path.isabs(name):
        return Path(name) if os.path.lexists(name) else None
    folder = Path(cwd) if cwd else Path.cwd()
    parents = PurePosixPath(name).parent.parts
    for keep in range(len(parents), -1, -1):  # cwd is the root joined with the first `keep` of them
        tail = parents[:keep]
        if keep and folder.parts[-keep:] != tail:
            continue
        root = folder.parents[keep - 1] if keep else folder
        candidate = root.joinpath(*PurePosixPath(name).parts)
        if os.path.lexists(candidate):
            return candidate
    return None


def _read_metadata(path: Path) -> dict[str, Any] | None:
    """The notebook's `metadata` object; None when the file has gone (`PolicyError` otherwise)."""
    from .. import safefile

    if _oversized_without_ask(path):
        return {}
    text = safefile.read_text(path, MAX_NOTEBOOK_BYTES)
    if text is None:
        return None
    if f'"{METADATA_KEY}"' not in text and f'"{ACCELERATOR_KEY}"' not in text:
        return {}  # asks nothing: a big notebook is not parsed (a thread's parse still holds the server's GIL)
    notebook = safefile.loads(text, str(path))
    if not isinstance(notebook, dict):
        raise PolicyError("the notebook is not a JSON object")
    metadata = notebook.get("metadata", {})
    if not isinstance(metadata, dict):
        raise PolicyError("its metadata is not a JSON object")
    return metadata


def _oversized_without_ask(path: Path) -> bool:
    """Whether `path` is a regular file over the cap whose ends name neither key: a notebook's
    top-level `metadata` comes after its cells where nbformat writes it (sorted keys) and first where a
    writer keeps insertion order, so a big notebook of outputs that asks nothing starts its kernel
    quietly; one that may ask is refused by the capped read (it cannot be checked whole)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError:
        return False  # the capped read says why
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_size <= MAX_NOTEBOOK_BYTES:
            return False
        ends = os.pread(fd, END_BYTES, 0) + os.pread(fd, END_BYTES, info.st_size - END_BYTES)
    except OSError:
        return False
    finally:
        os.close(fd)
    return f'"{METADATA_KEY}"'.encode() not in ends and f'"{ACCELERATOR_KEY}"'.encode() not in ends


def _request(metadata: Mapping[str, Any], source: str) -> NotebookRequest:
    ours = metadata.get(METADATA_KEY)
    if ours is None:
        if metadata.get(ACCELERATOR_KEY) != ACCELERATOR_GPU:
            return NotebookRequest(source=source)
        return NotebookRequest(ACCELERATOR_LINES, 1, None, source, 1, True)
    if not isinstance(ours, dict):
        raise PolicyError(f"metadata.{METADATA_KEY} must be an object, not {_json_type(ours)}")
    raw = ours.get(POLICY_KEY, [])
    if not isinstance(raw, list):
        raise PolicyError(f"metadata.{METADATA_KEY}.{POLICY_KEY} must be a list of strings, not {_json_type(raw)}")
    if len(raw) > MAX_LINES:
        raise PolicyError(f"metadata.{METADATA_KEY}.{POLICY_KEY} has {len(raw):,} lines, at most {MAX_LINES}")
    for number, line in enumerate(raw, start=1):
        if not isinstance(line, str):
            raise PolicyError(f"line {number} is {_json_type(line)}, not a string")
        if len(line) > MAX_LINE_CHARS:
            raise PolicyError(f"line {number} has {len(line):,} characters, at most {MAX_LINE_CHARS:,}")
    policy, pick = apply_lines(tuple(raw), Policy())
    lines = tuple(line for line in raw if not _blank(line))
    count = pick if pick is not None else (len(policy.visible) if policy.visible is not None else None)
    return NotebookRequest(lines, count, None, source, pick, saved=True)


def _blank(line: str) -> bool:
    from ..language.grammar import split_words

    return not split_words(line)


def _json_type(value: Any) -> str:
    names = {dict: "an object", list: "a list", str: "a string", bool: "a boolean", type(None): "null"}
    return names.get(type(value), "a number")


def apply_lines(lines: tuple[str, ...], base: Policy, pick: int | None = None) -> tuple[Policy, int | None]:
    """`base` edited by the notebook's `lines` (later ones win, as in a `%%tfgpu` cell), validated,
    and N of the `visible auto:N` in force after them (`pick`: the one in force before, a
    kernelspec's). `visible auto` is not picked here: the launch picks through its reservation; the
    policy's `visible` is then left to that pick. Sizes are MiB or GB (a share of a card needs the
    card, unknown here); `PolicyError` names the line at fault."""
    from ..language.grammar import Edit, parse_count, parse_words, split_words
    from ..language import directives
    from ..language.grammar import apply_edit

    policy = base
    for number, line in enumerate(lines, start=1):
        try:
            words = split_words(line)
            if not words:
                continue
            spec = directives.lookup(words[0])
            if spec is not None and (spec.kind != "edit" or not spec.in_cell):
                raise PolicyError(f"`{spec.name}` is not a policy change")
            if spec is not None and spec.name == "visible" and len(words) == 2 and _is_auto(words[1]):
                pick = parse_count(words[1].partition(":")[2] or "1", "visible auto:N")
                policy = policy.edited(visible=None, sources=tuple(s for s in policy.sources if s[0] != "visible"))
                continue
            edit = parse_words(words)
            assert isinstance(edit, Edit)  # an edit directive parses to an Edit
            policy = apply_edit(policy, edit)
            if spec is not None and spec.name in ("visible", "reset"):
                pick = None
        except PolicyError as err:
            raise PolicyError(f"line {number} ({quote(line.strip())}): {err}") from None
    try:
        policy.validate()
    except PolicyError as err:
        raise PolicyError(f"the lines' result: {err}") from None
    return policy, pick


def _is_auto(word: str) -> bool:
    word = word.lower()
    return word == "auto" or word.startswith("auto:")


_last: tuple[tuple[Any, ...], tuple[str, ...] | None] | None = None
"""The last notebook read by `saved_difference`, by its path and `stat`, with its saved policy's lines
(`saved_lines`): a status shown again reads and parses an unchanged notebook once."""


def saved_difference(policy: Policy, env: Mapping[str, str], cwd: str | None) -> tuple[tuple[str, ...], tuple[str, ...]] | None:
    """(the notebook's saved lines, `policy`'s lines), both as `policy_lines` writes them, where the
    policy the kernel's notebook saved (`metadata.tfgpu.policy`) is not `policy`; None where they agree,
    or the notebook saved none or none that can be read (its launch said why). Read only when a status or
    panel is shown, never per cell."""
    from ..language.directives import policy_lines

    global _last
    path = notebook_path(env, cwd)
    if path is None:
        return None
    try:
        info = os.stat(path)
        key: tuple[Any, ...] = (str(path), info.st_ino, info.st_mtime_ns, info.st_size)
    except OSError:
        return None
    if _last is not None and _last[0] == key:
        saved_lines = _last[1]
    else:
        saved_lines = saved_policy_lines(read_request(env, cwd))
        _last = (key, saved_lines)
    if saved_lines is None:
        return None
    kernel_lines = tuple(policy_lines(policy))
    return None if saved_lines == kernel_lines else (saved_lines, kernel_lines)


def saved_policy_lines(request: NotebookRequest) -> tuple[str, ...] | None:
    """The policy `request`'s notebook saved, as `policy_lines` writes it (a `visible auto:N` first); None
    where it saved none or one that cannot be read."""
    from ..language.directives import policy_lines

    if not request.saved or request.refusal is not None:
        return None
    saved, pick = apply_lines(request.lines, Policy())
    return tuple(([f"visible auto:{pick}"] if pick else []) + policy_lines(saved))
