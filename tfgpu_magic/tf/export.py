"""`%tfgpu export`: the policy as standalone Python, shell `export` lines, or JSON (pure)."""

from __future__ import annotations

import json
import shlex
from typing import Callable

from ..errors import PolicyError
from ..envvars import TF_FORCE_GPU_ALLOW_GROWTH
from ..plan import Note, Plan, build_plan
from ..language.policy import Policy

HEADER = "# GPU policy exported by tfgpu_magic; run it before anything else touches TensorFlow."


def note_code(note: Note) -> str:
    """A note as its code and fields, where no view words it (`views.status.note_text` does)."""
    return note.code + "".join(f" {name}={value}" for name, value in note.fields)


def export(policy: Policy, fmt: str = "python", plan: Plan | None = None,
           words: Callable[[Note], str] = note_code) -> str:
    """The policy in `fmt` (python, env or json), ready to paste. `plan` (default: the policy's
    plan for a fresh process) is what python and env follow; see `Controller.export_plan`. `words`
    words its notes (comments)."""
    if fmt == "json":
        return json.dumps(policy.to_dict(), indent=2)
    plan = plan or build_plan(policy)
    if fmt == "python":
        return to_python(plan, words)
    if fmt == "env":
        return to_env(plan, words)
    raise PolicyError(f"export: unknown format {fmt!r}; expected python, env or json")


def to_python(plan: Plan, words: Callable[[Note], str] = note_code) -> str:
    """A script that realises `plan` in a fresh process (a no-op on parts the machine lacks)."""
    lines = [HEADER, *_note_comments(plan, words)]
    if plan.env:
        lines += ["import os", ""]
    for name, value in plan.env:
        lines.append(f"os.environ[{name!r}] = {value!r}" if value is not None else f"os.environ.pop({name!r}, None)")
    lines += ["", "import tensorflow as tf", ""]
    if plan.loglevel is not None:
        lines += [
            "# The lines TensorFlow prints before its C++ level applies (the oneDNN notice) stay; only",
            f"# tfgpu_magic.configure('loglevel {plan.loglevel}') before the import hides them too.",
            f"tf.get_logger().setLevel({plan.loglevel.upper()!r})",
            "import absl.logging",
            f"absl.logging.set_verbosity({plan.loglevel!r})",
        ]
    sized = plan.sized
    if sized or plan.growth is not None:
        lines.append('gpus = tf.config.list_physical_devices("GPU")')
    if sized:
        table = {index: list(sizes) for index, sizes in plan.tf_limits}
        every = plan.tf_default_limits
        lines += [
            f"memory_limits = {table!r}  # TensorFlow GPU index -> MiB of each logical GPU",
            f"default_limits = {list(every) if every else None!r}  # for every other GPU",
            "for index, gpu in enumerate(gpus):",
            "    limits = memory_limits.get(index, default_limits)",
            "    if limits:",
            "        tf.config.set_logical_device_configuration(",
            "            gpu, [tf.config.LogicalDeviceConfiguration(memory_limit=mib) for mib in limits]",
            "        )",
        ]
    if plan.growth is not None:
        lines += [
            "for gpu in gpus:",
            "    if tf.config.get_logical_device_configuration(gpu) is None:",
            f"        tf.config.experimental.set_memory_growth(gpu, {plan.growth!r})",
        ]
    if plan.cpu_devices is not None:
        lines += [
            'cpus = tf.config.list_physical_devices("CPU")',
            "tf.config.set_logical_device_configuration(",
            f"    cpus[0], [tf.config.LogicalDeviceConfiguration()] * {plan.cpu_devices}",
            ")",
        ]
    if plan.torch_fractions:
        lines += [
            "",
            "# PyTorch, where installed: each device's memory fraction (a soft cap in its caching allocator)",
            "try:",
            "    import torch",
            "except ImportError:",
            "    torch = None",
            "if torch is not None and torch.cuda.is_available():",
            f"    for device, fraction in {dict(plan.torch_fractions)!r}.items():",
            "        if device < torch.cuda.device_count():",
            "            torch.cuda.set_per_process_memory_fraction(fraction, device)",
        ]
    return "\n".join(lines).rstrip() + "\n"


def to_env(plan: Plan, words: Callable[[Note], str] = note_code) -> str:
    """Shell lines for what environment variables can express; the rest as comments."""
    env = plan.env_map
    if plan.growth is not None:
        env[TF_FORCE_GPU_ALLOW_GROWTH] = "true" if plan.growth else "false"
    lines = [HEADER.replace("run it", "source it"), *_note_comments(plan, words)]
    for name, value in env.items():
        lines.append(f"export {name}={shlex.quote(value)}" if value is not None else f"unset {name}")
    if plan.sized or plan.cpu_devices is not None or plan.torch_fractions:
        lines.append(
            "# memory limits and logical devices (and PyTorch's memory fractions) have no environment variable: "
            "use `%tfgpu export python`"
        )
    return "\n".join(lines) + "\n"


def _note_comments(plan: Plan, words: Callable[[Note], str]) -> list[str]:
    """The plan's notes as comments, so an export never drops a setting without a word."""
    return [f"# Note: {words(note)}" for note in plan.notes]
