"""TensorFlow's state is a record in the `tf` room and words in `views.tfstate`: every stage and every sign
of CUDA having started has its words there (one added without them fails here), the phrases are the
status's, the route that created GPU devices and where it ran are records (`CreatedBy`, `Place`) worded
there too, the published state maps `RuntimeState.stage` onto the schema's enum, and `tf/runtime.py`,
`tf/initcell.py` and `tf/routes.py` word nothing for the user themselves (but the routes' stderr lines)."""

from __future__ import annotations

import ast
import json
import itertools
import re
from pathlib import Path
from types import SimpleNamespace
from typing import get_args

import pytest

import tfgpu_magic
from tfgpu_magic.jupyter.staterecords import tensorflow_state
from tfgpu_magic.jupyter.kernelstate import SCHEMA
from tfgpu_magic.tf import initcell
from tfgpu_magic.tf.initcell import InitRecord
from tfgpu_magic.tf.runtime import LOCKED_MARKER, CreatedBy, CudaSign, Place, RuntimeState, Stage
from tfgpu_magic.views.tfstate import CUDA_SIGNS, OUTSIDE, STAGES, init_text, place_text, route_text, state_text

ROUTE = CreatedBy("device_lib.list_local_devices()", Place(ipython=True, cell=3))


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
     "GPU devices created by `device_lib.list_local_devices()` in In [3]: memory settings are fixed until restart"),
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
    assert init_text(InitRecord("before_watch", 2)) == "before tfgpu_magic could watch (in In [2])"
    assert init_text(InitRecord("before_watch")) == "before tfgpu_magic could watch (in IPython)"
    assert state_text(RuntimeState(imported=True), cell) == "imported, runtime not initialized: settings can still change"


def test_initialized_before_the_watch_names_the_cell_running_then() -> None:
    """The record keeps the cell's number (`where(shell)`), not its words; the view words it as before."""
    shell = SimpleNamespace(events=None, history_manager=SimpleNamespace(input_hist_parsed=["", "import tf", "x"]))
    initcell.forget()
    try:
        assert initcell.watch_initialization(shell, lambda: True) is None
        assert initcell.initialized_record() == InitRecord("before_watch", 2)
        assert init_text(initcell.initialized_record()) == "before tfgpu_magic could watch (in In [2])"
    finally:
        initcell.forget()


@pytest.mark.parametrize("place, text", [
    (Place(ipython=True, cell=3), "in In [3]"), (Place(ipython=True), "in IPython"), (Place(ipython=False), "outside IPython"),
])
def test_where_a_route_ran_reads_as_before(place: Place, text: str) -> None:
    assert place_text(place) == text
    assert route_text(CreatedBy("tf.compat.v1.Session()", place)) == f"`tf.compat.v1.Session()` {text}"


def test_the_published_state_is_the_stage_in_the_schemas_enum() -> None:
    """The published enum has no `devices_created`: TensorFlow is imported then, its runtime not initialized."""
    enum = json.loads(SCHEMA.read_text(encoding="utf-8"))["$defs"]["tensorflowState"]["enum"]
    published = {state: tensorflow_state(state) for state in every_state()}
    assert set(published.values()) == set(enum)
    assert all(value == ("initialized" if state.initialized else "imported" if state.imported else "not_imported")
               for state, value in published.items() if state.imported or not state.devices_created)
    assert tensorflow_state(RuntimeState(imported=True, devices_created=ROUTE)) == "imported"


ROOM = Path(tfgpu_magic.__file__).parent / "tf"
NOT_WORDS = {LOCKED_MARKER}
"""TensorFlow's own words, matched in its errors, never shown by this tool."""
WARNING = "could not tell which line initialized TensorFlow: {}"
"""A problem of this tool's on stderr (`errors.warn`), as every room reports one that must not stop a kernel."""
ROUTE_LINES = {
    "the config's own gpu_options ({}) win over the policy's for the GPU devices it creates; they stay fixed until restart",
    "the config's own CPU device count ({}) wins over the policy's ({}) in this session",
    "tfgpu_magic: {}: the policy was not passed on: {}",
    "tfgpu_magic: {} could not create devices with {}: {}",
}
"""The stderr lines a wrapped route prints inside TensorFlow's own call, where no view runs (still words
in the `tf` room: a record and a hook from the views would move them; any other sentence fails)."""
PLACE = re.compile(r"\b(in|outside) (In \[|IPython\b)")
"""Where a call ran, as `views.tfstate.place_text` words it: too short for a sentence, still words."""


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
    return {text for text in texts
            if sum(bool(re.search("[A-Za-z]{2}", word)) for word in text.split()) >= 4 or PLACE.search(text)}


@pytest.mark.parametrize("module", ["runtime.py", "initcell.py", "routes.py"])
def test_the_tf_rooms_state_modules_word_nothing_for_the_user(module: str) -> None:
    assert sentences(ROOM / module) - NOT_WORDS - {WARNING} - ROUTE_LINES == set()


def test_a_sentence_in_them_would_be_seen(tmp_path: Path) -> None:
    path = tmp_path / "worded.py"
    path.write_text('"""Module docstring, not words for the user."""\nA = "a name"\n"""An attribute\'s docstring."""\n'
                    'def label(state):\n    """Its docstring, not words either."""\n'
                    '    return f"initialized: {state} is locked until restart"\n'
                    'def where(count):\n    return f"in In [{count}]" if count else "outside IPython"\n'
                    'ROUTE = f"`{label}` in IPython"\n')
    assert sentences(path) == {"initialized: {} is locked until restart", "in In [{}]", "outside IPython",
                               "`{}` in IPython"}
