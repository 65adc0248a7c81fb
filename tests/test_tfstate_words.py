"""TensorFlow's state is a record in the `tf` room and words in `views.tfstate`: every stage and every sign
of CUDA having started has its words there (one added without them fails here), the phrases are the
status's, and `tf/runtime.py` and `tf/initcell.py` word nothing for the user themselves."""

from __future__ import annotations

import ast
import itertools
import re
from pathlib import Path
from typing import get_args

import pytest

import tfgpu_magic
from tfgpu_magic.tf.initcell import InitRecord
from tfgpu_magic.tf.runtime import LOCKED_MARKER, CudaSign, RuntimeState, Stage
from tfgpu_magic.views.tfstate import CUDA_SIGNS, OUTSIDE, STAGES, init_text, state_text

ROUTE = "`device_lib.list_local_devices()` in In [3]"


def every_state() -> list[RuntimeState]:
    """Every combination of the fields `state_text` reads."""
    return [RuntimeState(imported=imported, devices_listed=listed, initialized=initialized,
                         devices_created=created, cuda_elsewhere=sign)
            for imported, listed, initialized, created, sign in itertools.product(
                (False, True), (False, True), (False, True), (None, ROUTE), (None, *get_args(CudaSign)))]


def test_every_stage_and_every_cuda_sign_has_words() -> None:
    assert set(STAGES) == set(get_args(Stage))
    assert set(CUDA_SIGNS) == set(get_args(CudaSign))
    texts = {state_text(state) for state in every_state()}
    assert all(text and "{" not in text for text in texts), texts


@pytest.mark.parametrize("state, text", [
    (RuntimeState(), "not imported"),
    (RuntimeState(imported=True), "imported, runtime not initialized: settings can still change"),
    (RuntimeState(cuda_elsewhere="libcuda"), "not imported, but CUDA already started (libcuda is loaded in this "
                                             "process): CUDA_* changes no longer take effect"),
    (RuntimeState(imported=True, cuda_elsewhere="nvml"),
     "imported, runtime not initialized: settings can still change, but CUDA already started (NVML lists this "
     "process on a GPU): CUDA_* changes no longer take effect"),
    (RuntimeState(imported=True, devices_listed=True, cuda_elsewhere="libcuda"),
     "imported, runtime not initialized: settings can still change"),
    (RuntimeState(imported=True, devices_created=ROUTE, cuda_elsewhere="libcuda"),
     f"GPU devices created by {ROUTE}: memory settings are fixed until restart"),
    (RuntimeState(imported=True, devices_listed=True, initialized=True, devices_created=ROUTE),
     "initialized: device settings are locked until restart"),
])
def test_each_stage_reads_as_the_status_says_it(state: RuntimeState, text: str) -> None:
    assert state_text(state) == text


def test_the_initializing_cell_is_worded_where_known() -> None:
    initialized = RuntimeState(imported=True, devices_listed=True, initialized=True)
    cell = InitRecord("cell", 7, "model.fit(x, ...")
    assert state_text(initialized, cell) == ("initialized by In [7]: `model.fit(x, ...`: device settings are "
                                             "locked until restart")
    assert init_text(InitRecord("outside_cell", 3)) == f"{OUTSIDE}, before In [3]"
    assert init_text(InitRecord("outside_cell")) == OUTSIDE
    assert init_text(InitRecord("before_watch", line="in In [2]")) == "before tfgpu_magic could watch (in In [2])"
    assert state_text(RuntimeState(imported=True), cell) == "imported, runtime not initialized: settings can still change"


ROOM = Path(tfgpu_magic.__file__).parent / "tf"
NOT_WORDS = {LOCKED_MARKER}
"""TensorFlow's own words, matched in its errors, never shown by this tool."""
WARNING = "could not tell which line initialized TensorFlow: {}"
"""A problem of this tool's on stderr (`errors.warn`), as every room reports one that must not stop a kernel."""


def sentences(path: Path) -> set[str]:
    """The strings `path` holds of four words or more (an f-string's fields as `{}`; not a type such as
    `int | None | LogicalSpec`), its docstrings (a string standing as a statement) left out."""
    tree = ast.parse(path.read_text())
    standing = {id(node.value) for node in ast.walk(tree) if isinstance(node, ast.Expr)}
    parts = {id(part) for node in ast.walk(tree) if isinstance(node, ast.JoinedStr) for part in node.values}
    texts = ["".join(part.value if isinstance(part, ast.Constant) else "{}" for part in node.values)
             for node in ast.walk(tree) if isinstance(node, ast.JoinedStr)]
    texts += [node.value for node in ast.walk(tree) if isinstance(node, ast.Constant) and isinstance(node.value, str)
              and id(node) not in standing | parts]
    return {text for text in texts if sum(bool(re.search("[A-Za-z]{2}", word)) for word in text.split()) >= 4}


@pytest.mark.parametrize("module", ["runtime.py", "initcell.py"])
def test_the_tf_rooms_state_modules_word_nothing_for_the_user(module: str) -> None:
    assert sentences(ROOM / module) - NOT_WORDS - {WARNING} == set()


def test_a_sentence_in_them_would_be_seen(tmp_path: Path) -> None:
    path = tmp_path / "worded.py"
    path.write_text('"""Module docstring, not words for the user."""\nA = "a name"\n"""An attribute\'s docstring."""\n'
                    'def label(state):\n    """Its docstring, not words either."""\n'
                    '    return f"initialized: {state} is locked until restart"\n')
    assert sentences(path) == {"initialized: {} is locked until restart"}
