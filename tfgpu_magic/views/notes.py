"""The words of the notes a plan, and applying it, return as records (`plan.Note`: a code and its fields):
how the policy is realised in each framework, and what part of it has no device to apply to. The status,
the messages after an edit and `%tfgpu export`'s comments all word them here.
"""

from __future__ import annotations

from ..language.directives import gpu_name
from ..plan import Note

NO_GPU = "TensorFlow sees no GPU in this process (`%tfgpu doctor` says why)"
"""The start of the lines on GPU settings with no GPU to apply to (the `no_gpu` note, an edit's message)."""

NOTES = {
    "growth_env_caps": "growth goes through {variable}=true: TF refuses set_memory_growth on a limited GPU",
    "growth_env_logical": "growth goes through {variable}=true: any logical device makes TF drop it",
    "hidden_by_tf": "CUDA has already started: TensorFlow hides GPUs through tf.config.set_visible_devices",
    "keras_backend": "Keras's backend is {backend}: TensorFlow, which Keras may import for tf.data, grows on demand "
                     "instead of taking the cards",
    "async_soft_limit": "with cuda_malloc_async a memory limit is soft (the pool's release threshold), not a cap",
    "async_growth_moot": "with cuda_malloc_async memory growth is moot: the pool allocates on demand",
    "no_tf_index": "{gpu}: no TensorFlow index is known for it here: {why}",
    "shares_unknown": "JAX and PyTorch take a limit as a share of each card's total memory, which is unknown here "
                      "(NVML): they are not limited",
    "jax_one_fraction": "JAX takes one memory fraction for every GPU: {fraction:g}, the smallest of the cards' "
                        "shares, so that no card gets more than its limit",
    "jax_split_fraction": "JAX has no virtual devices: a split reaches it as one memory fraction, its parts' sum",
    "no_gpu": f"{NO_GPU}: the policy's GPU settings have nothing to apply to here",
    "missing_gpus": "TensorFlow sees {seen} GPU(s); no {missing} to configure",
}
"""The words of each `plan.Note` (`plan.NoteCode`), its fields filled in by `note_text`."""
NO_INDEX_WHY = {False: "it is not among the GPUs CUDA will use",
                True: "a UUID needs the GPU inventory (or list it in `visible`)"}
"""Why a GPU has no TensorFlow index (`no_tf_index`), by whether it is named by UUID."""


def note_text(note: Note) -> str:
    """A note of the plan or of applying it (`plan.Note`), in words."""
    fields = note.of
    if note.code == "no_tf_index":
        fields.update(gpu=gpu_name(fields["gpu"]), why=NO_INDEX_WHY[fields["uuid"]])
    if note.code == "missing_gpus":
        fields["missing"] = ", ".join(f"GPU:{index}" for index in fields["missing"])
    return NOTES[note.code].format(**fields)
