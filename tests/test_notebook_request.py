"""The GPU policy a notebook carries (`metadata.tfgpu.policy`), read at its kernel's launch.

Three levels: the reader on its own (paths as jupyter_server writes `JPY_SESSION_NAME`, the metadata's
forms, hostile files); the provisioner in this process through jupyter_client's `KernelManager` (the
fake 4-GPU inventory at `provisioner.read_inventory`); and a real jupyter_server creating sessions for
notebooks on disk, whose kernels (real ipykernel, real TensorFlow on CPU) start with the notebook's
policy in force before their first cell, or with a one-line refusal. The lines the kernel saves into a
notebook (`policy_lines`) read back to the same policy (hypothesis).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Iterator

import pytest
from faults_support import SERVER_APP, bounded, server_env
from fake_nvml import UUIDS, FakeNvml, four_gpus
from hypothesis import given, settings
from hypothesis import strategies as st
from servers import JupyterEnv, JupyterServer, running_server
from test_provisioner import _fake, _kernel_environ, _spec, env  # noqa: F401 (env: the fixture)

from tfgpu_magic.errors import PolicyError
from tfgpu_magic.gpus import reservations
from tfgpu_magic.gpus.inventory import Inventory, Nvml, read_inventory
from tfgpu_magic.jupyter import provisioner
from tfgpu_magic.jupyter.notebook_request import (
    MAX_LINE_CHARS, MAX_LINES, MAX_NOTEBOOK_BYTES, SESSION_NAME_ENV, NotebookRequest, apply_lines, notebook_path,
    read_request)
from tfgpu_magic.jupyter.startup import POLICY_ENV
from tfgpu_magic.language.directives import policy_lines
from tfgpu_magic.language.grammar import apply_edit, canonical_uuid, parse_cell
from tfgpu_magic.language.policy import AUTO_PICKED, MAX_MIB, Policy, sort_gpu_items


def _notebook(path: Path, metadata: Any) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"cells": [], "metadata": metadata, "nbformat": 4, "nbformat_minor": 5}), encoding="utf-8")
    return path


def _read(path: Path) -> NotebookRequest:
    return bounded(lambda: read_request({SESSION_NAME_ENV: str(path)}, None), 10)


# ----- the reader ---------------------------------------------------------------------------------
def test_a_policy_is_read_with_what_it_asks_for(tmp_path: Path) -> None:
    path = _notebook(tmp_path / "nb.ipynb", {"tfgpu": {"policy": ["visible auto:2", "", "# mine", "growth on"]}})
    assert _read(path) == NotebookRequest(("visible auto:2", "growth on"), 2, None, str(path), 2, False, True)
    _notebook(path, {"tfgpu": {"policy": ["visible 0,2", "limit 2GB 0"]}, "accelerator": "GPU"})
    assert _read(path) == NotebookRequest(("visible 0,2", "limit 2GB 0"), 2, None, str(path), None, False, True)
    _notebook(path, {"tfgpu": {"policy": ["visible auto:3", "visible none"]}})
    assert _read(path).gpu_count == 0 and _read(path).pick is None  # the later line wins, as in a cell
    _notebook(path, {"tfgpu": {"policy": ["growth on"]}})
    assert _read(path) == NotebookRequest(("growth on",), None, None, str(path), None, False, True)


def test_colabs_accelerator_asks_for_one_gpu_and_nothing_else_asks_anything(tmp_path: Path) -> None:
    path = _notebook(tmp_path / "colab.ipynb", {"accelerator": "GPU", "colab": {"provenance": []}})
    assert _read(path) == NotebookRequest(("visible auto:1",), 1, None, str(path), 1, True)
    for metadata in ({"accelerator": "TPU"}, {"accelerator": "gpu"}, {"kernelspec": {"name": "python3"}}, {}):
        _notebook(path, metadata)
        assert _read(path) == NotebookRequest(source=str(path))


def test_no_notebook_is_an_empty_request_without_a_refusal(tmp_path: Path) -> None:
    assert read_request({}, str(tmp_path)) == NotebookRequest()  # a console kernel: no JPY_SESSION_NAME
    (tmp_path / "script.py").write_text("{", encoding="utf-8")
    for name in (str(tmp_path / "gone.ipynb"), str(tmp_path / "script.py"), "Console 1", "a\0b.ipynb"):
        assert read_request({SESSION_NAME_ENV: name}, str(tmp_path)) == NotebookRequest()


def test_a_notebook_that_names_neither_key_is_not_parsed(tmp_path: Path) -> None:
    """No `"tfgpu"` or `"accelerator"` in the text: nothing asked, so not even broken JSON is refused."""
    path = tmp_path / "broken.ipynb"
    path.write_text('{"cells": [', encoding="utf-8")
    assert _read(path) == NotebookRequest(source=str(path))
    path.write_text('{"cells": [], "tfgpu": ', encoding="utf-8")
    assert "not valid JSON" in (_read(path).refusal or "")


def test_a_relative_session_name_is_found_from_the_kernels_folder(tmp_path: Path) -> None:
    """A session made without a name: `JPY_SESSION_NAME` is the API path from the server's root, and
    the kernel's cwd the notebook's folder, or the nearest one that exists (`cwd_for_path`)."""
    path = _notebook(tmp_path / "a" / "b" / "nb.ipynb", {"tfgpu": {"policy": ["growth on"]}})
    for cwd in (tmp_path / "a" / "b", tmp_path / "a", tmp_path):
        assert notebook_path({SESSION_NAME_ENV: "a/b/nb.ipynb"}, str(cwd)) == path
    top = _notebook(tmp_path / "top.ipynb", {})
    assert notebook_path({SESSION_NAME_ENV: "top.ipynb"}, str(tmp_path)) == top
    assert notebook_path({SESSION_NAME_ENV: "a/b/other.ipynb"}, str(tmp_path / "a" / "b")) is None


BAD_POLICIES = [
    ({"tfgpu": []}, "metadata.tfgpu must be an object, not a list"),
    ({"tfgpu": {"policy": "growth on"}}, "must be a list of strings, not a string"),
    ({"tfgpu": {"policy": {"growth": True}}}, "must be a list of strings, not an object"),
    ({"tfgpu": {"policy": ["growth on", 1]}}, "line 2 is a number, not a string"),
    ({"tfgpu": {"policy": [None]}}, "line 1 is null, not a string"),
    ({"tfgpu": {"policy": ["growth on"] * (MAX_LINES + 1)}}, f"has {MAX_LINES + 1} lines, at most {MAX_LINES}"),
    ({"tfgpu": {"policy": ["visible " + "0," * MAX_LINE_CHARS]}}, f"at most {MAX_LINE_CHARS:,}"),
    ({"tfgpu": {"policy": ["growth sideways"]}}, "line 1 ('growth sideways'): growth: expected on | off | all"),
    ({"tfgpu": {"policy": ["restart --yes"]}}, "`restart` is not a policy change"),
    ({"tfgpu": {"policy": ["kernelspec x"]}}, "`kernelspec` is not a policy change"),
    ({"tfgpu": {"policy": ["limit 50%"]}}, "give the size in MiB or GB"),
    ({"tfgpu": {"policy": ["limit 1GB 0", "split 0 2x1GB"]}}, "both a limit and a split"),
    ({"tfgpu": {"policy": ["visible 'unclosed"]}}, "No closing quotation"),
    ({"tfgpu": {"policy": ["visible auto:0"]}}, "COUNT must be 1 to 64"),
]


@pytest.mark.parametrize("metadata, expect", BAD_POLICIES)
def test_a_bad_policy_is_one_refusal_line(tmp_path: Path, metadata: Any, expect: str) -> None:
    path = _notebook(tmp_path / "bad.ipynb", metadata)
    request = _read(path)
    assert request.lines == () and request.gpu_count is None and request.source == str(path)
    assert request.refusal is not None and expect in request.refusal and "\n" not in request.refusal
    assert request.refusal.startswith(f"ignoring the GPU policy in the notebook {path}: ")


def test_a_refusal_stays_one_line_whatever_the_notebooks_name(tmp_path: Path) -> None:
    path = _notebook(tmp_path / "two\nlines.ipynb", {"tfgpu": {"policy": ["growth sideways"]}})
    refusal = _read(path).refusal or ""
    assert "\n" not in refusal and "two\\nlines.ipynb: line 1" in refusal


def _oversized(path: Path, tail: bytes) -> None:
    """A sparse notebook over the cap that ends with `tail` (its metadata, where nbformat writes it)."""
    with path.open("wb") as file:
        file.truncate(MAX_NOTEBOOK_BYTES + 1)
        file.seek(MAX_NOTEBOOK_BYTES + 1)
        file.write(tail)


def test_an_oversized_notebook_that_asks_nothing_is_no_request(tmp_path: Path) -> None:
    quiet, asking = tmp_path / "outputs.ipynb", tmp_path / "asks.ipynb"
    _oversized(quiet, b'{"metadata": {"kernelspec": {"name": "python3"}}}')
    _oversized(asking, b'{"metadata": {"accelerator": "GPU"}}')
    assert _read(quiet) == NotebookRequest(source=str(quiet))
    assert "allowed" in (_read(asking).refusal or "")


HOSTILE_FILES = {
    "huge": lambda path: _oversized(path, b'{"metadata": {"tfgpu": {"policy": ["growth on"]}}}'),  # sparse: not read
    "fifo": lambda path: os.mkfifo(path),  # reading would block forever
    "folder": lambda path: path.mkdir(),
    "device": lambda path: path.symlink_to("/dev/zero"),
    "not JSON": lambda path: path.write_text('{"metadata": {"tfgpu": ', encoding="utf-8"),
    "not UTF-8": lambda path: path.write_bytes(b'{"metadata": "\xff"}'),
    "deep": lambda path: path.write_text('{"metadata": {"tfgpu": ' + "[" * 100_000 + "]" * 100_000 + "}}",
                                         encoding="utf-8"),
    "NaN": lambda path: path.write_text('{"metadata": {"tfgpu": {"policy": NaN}}}', encoding="utf-8"),
    "a list": lambda path: path.write_text('["tfgpu"]', encoding="utf-8"),
    "metadata a string": lambda path: path.write_text('{"metadata": "tfgpu"}', encoding="utf-8"),
}
HOSTILE_WORDS = {"huge": "allowed", "fifo": "not a regular file", "folder": "not a regular file",
                 "device": "not a regular file", "not JSON": "not valid JSON", "not UTF-8": "not UTF-8",
                 "deep": "nested too deeply", "NaN": "not a JSON number", "a list": "not a JSON object",
                 "metadata a string": "metadata is not a JSON object"}


@pytest.mark.parametrize("kind", sorted(HOSTILE_FILES))
def test_a_hostile_file_is_one_refusal_line_without_blocking(tmp_path: Path, kind: str) -> None:
    path = tmp_path / "hostile.ipynb"
    HOSTILE_FILES[kind](path)
    request = _read(path)  # within 10 s, a FIFO included
    assert request.lines == () and request.refusal is not None and "\n" not in request.refusal
    assert HOSTILE_WORDS[kind] in request.refusal and len(request.refusal) < 400 + len(str(path))


def test_the_notebooks_lines_edit_a_base_policy_later_ones_winning() -> None:
    base = Policy(growth=False, cpu_devices=2, loglevel="error")
    policy, pick = apply_lines(("growth on", "split off cpu", "visible auto:2"), base, None)
    assert (policy, pick) == (Policy(growth=True, loglevel="error"), 2)
    assert apply_lines(("visible 1",), base, 2) == (base.edited(visible=("1",)), None)  # the notebook names its GPUs
    assert apply_lines(("growth on",), base, 2) == (base.edited(growth=True), 2)  # the spec's pick stays
    with pytest.raises(PolicyError, match=r"^the lines' result: GPU 0 has both a limit and a split"):
        apply_lines(("limit 1GB 0",), Policy(splits=(("0", (512,)),)))


# ----- the lines a kernel saves read back to its policy -------------------------------------------
GPU_REFS = st.one_of(st.integers(0, 7).map(str), st.sampled_from([canonical_uuid(u) for u in UUIDS]))
SIZES = st.one_of(st.integers(1, MAX_MIB), st.integers(1, 64).map(lambda gib: gib * 1024))


@st.composite
def any_policy(draw: st.DrawFn) -> Policy:
    """Any valid policy, its fields drawn directly (not only those a few directives reach)."""
    visible = draw(st.one_of(st.none(), st.lists(GPU_REFS, max_size=4, unique=True).map(tuple)))
    gpus = st.lists(GPU_REFS, max_size=3, unique=True)
    limited = draw(gpus)
    every = draw(st.one_of(st.none(), SIZES))
    split = [gpu for gpu in draw(gpus) if gpu not in limited]
    policy = Policy(
        visible=visible, growth=draw(st.sampled_from([None, True, False])),
        limits=sort_gpu_items([(gpu, draw(SIZES)) for gpu in limited] + ([("all", every)] if every else [])),
        splits=sort_gpu_items((gpu, tuple(draw(st.lists(SIZES, min_size=1, max_size=4)))) for gpu in split),
        cpu_devices=draw(st.one_of(st.none(), st.integers(1, 64))),
        allocator=draw(st.sampled_from([None, "bfc", "async"])),
        loglevel=draw(st.sampled_from([None, "debug", "info", "warning", "error"])),
    )  # fmt: skip
    try:
        policy.validate()
    except PolicyError:
        return Policy(growth=True)
    return policy


def _read_back(lines: list[str]) -> Policy:
    policy = Policy()
    for edit in parse_cell("\n".join(lines)):
        policy = apply_edit(policy, edit)
    policy.validate()
    return policy


@settings(max_examples=300, deadline=None)
@given(any_policy())
def test_saved_lines_read_back_to_the_same_policy(policy: Policy) -> None:
    lines = policy_lines(policy)
    assert _read_back(lines) == policy
    assert apply_lines(tuple(lines), Policy()) == (policy, None)  # the notebook's reader agrees


def test_an_auto_pick_is_saved_as_auto_and_a_share_as_its_mib() -> None:
    picked = Policy(visible=(UUIDS[1], UUIDS[2]), growth=True, sources=(("visible", AUTO_PICKED + "GPU 1, GPU 2"),))
    assert policy_lines(picked) == ["visible auto:2", "growth on"]
    shared = Policy(limits=(("0", 40960), ("1", 5000)), limits_written=(("0", "50%"), ("1", "50%")), limits_share="50%")
    assert policy_lines(shared) == ["limit 40GB 0", "limit 5000MB 1"]
    assert policy_lines(Policy()) == [] and policy_lines(Policy(visible=())) == ["visible none"]


def test_the_server_reply_carries_the_published_policy_as_lines() -> None:
    """`GET /api/tfgpu/kernels/<id>`'s `directives`, from the record the kernel published."""
    from tfgpu_magic.jupyter.kernelstate import policy_record
    from tfgpu_magic.serverext.gather import policy_directives

    policy = Policy(visible=("0", "2"), growth=True, limits=(("0", 1536), ("all", 2048)), cpu_devices=3)
    assert policy_directives(policy_record(policy)) == policy_lines(policy)
    picked = Policy(visible=(UUIDS[1],), sources=(("visible", AUTO_PICKED + "GPU 1"),))
    assert policy_directives(policy_record(picked)) == ["visible auto:1"]
    assert policy_directives(policy_record(Policy(splits=(("0", (0,)),)))) is None  # no valid policy


# ----- what the kernel says when its notebook saved another policy ----------------------------------
def _controller(environ: dict[str, str]) -> Any:
    from fake_tf import FakeTF

    from tfgpu_magic.controller import Controller
    from tfgpu_magic.gpus.inventory import InventoryCatalog

    inventory = read_inventory(Nvml(module=FakeNvml(four_gpus())))
    return Controller(api=FakeTF(4, imported=False), environ=environ, catalog=InventoryCatalog(inventory))


def test_the_status_and_the_panel_say_when_the_notebooks_saved_policy_differs(tmp_path: Path) -> None:
    from tfgpu_magic.views import status
    from tfgpu_magic.views.panel import Panel

    path = _notebook(tmp_path / "nb.ipynb", {"tfgpu": {"policy": ["visible auto:1", "growth on"]}})
    controller = _controller({SESSION_NAME_ENV: str(path)})
    controller.edit([controller.parse("growth on")])
    differs = ("Note: this notebook's saved policy differs: saved: visible auto:1, growth on; this kernel: growth on "
               "(Save GPU Policy to Notebook Metadata saves the kernel's)")
    assert differs in status.describe_status(controller).replace("\n      ", " ")
    panel = Panel(controller)
    try:
        assert "this notebook&#x27;s saved policy differs: saved: visible auto:1, growth on" in panel.header.value
        controller.edit([controller.parse("visible auto:1")])  # the kernel now has what the notebook saved
        assert "saved policy differs" not in panel.header.value
        assert "saved policy differs" not in status.describe_status(controller)
        _notebook(path, {"tfgpu": {"policy": []}})  # saved: TensorFlow's defaults
        assert "saved: none (TensorFlow defaults); this kernel: visible auto:1, growth on" in \
            status.describe_status(controller).replace("\n      ", " ")
    finally:
        panel.close()


def test_an_unchanged_notebook_is_read_and_parsed_once_across_statuses(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """Each status asks `saved_difference`; while the notebook's `stat` is unchanged its saved policy is neither
    read nor parsed again (parses counted at `apply_lines`, reads at `read_request`); a change is read anew."""
    from tfgpu_magic.jupyter import notebook_request

    path = _notebook(tmp_path / "nb.ipynb", {"tfgpu": {"policy": ["visible auto:1", "growth on"]}})
    env = {SESSION_NAME_ENV: str(path)}
    calls: list[str] = []
    parse, read = notebook_request.apply_lines, notebook_request.read_request
    monkeypatch.setattr(notebook_request, "apply_lines", lambda *args: calls.append("parse") or parse(*args))
    monkeypatch.setattr(notebook_request, "read_request", lambda *args: calls.append("read") or read(*args))
    differs = (("visible auto:1", "growth on"), ("growth on",))
    assert notebook_request.saved_difference(Policy(growth=True), env, None) == differs
    assert calls and calls[0] == "read"
    calls.clear()
    assert notebook_request.saved_difference(Policy(growth=True), env, None) == differs
    assert notebook_request.saved_difference(Policy(), env, None) == (differs[0], ())
    assert calls == []
    os.utime(path, ns=(1, 1))  # another stat: read and parsed again
    assert notebook_request.saved_difference(Policy(growth=True), env, None) == differs and "read" in calls


@pytest.mark.parametrize("metadata", [{}, {"accelerator": "GPU"}, {"tfgpu": {"policy": "growth on"}}])
def test_no_saved_policy_or_one_that_cannot_be_read_says_nothing_in_the_status(tmp_path: Path, metadata: Any) -> None:
    """A notebook without a tfgpu policy saves nothing to differ from; a refused one was named at launch."""
    from tfgpu_magic.views import status

    path = _notebook(tmp_path / "nb.ipynb", metadata)
    controller = _controller({SESSION_NAME_ENV: str(path)})
    controller.edit([controller.parse("growth on")])
    assert "notebook" not in status.describe_status(controller)
    assert "notebook" not in status.describe_status(_controller({}))


# ----- the provisioner, in this process --------------------------------------------------------------
def test_the_notebook_edits_the_kernelspecs_policy_and_picks_at_launch(env: JupyterEnv,  # noqa: F811
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    _fake(read_inventory(Nvml(module=FakeNvml(four_gpus(this_kernel=False)))), monkeypatch)
    _spec(env, "tf-spec", Policy(growth=False, loglevel="error"), "auto")
    path = _notebook(env.root / "work" / "nb.ipynb", {"tfgpu": {"policy": ["visible auto:2", "growth on"]}})
    environ = _kernel_environ(env, "tf-spec", **{SESSION_NAME_ENV: str(path)})
    assert sorted(environ["CUDA_VISIBLE_DEVICES"].split(",")) == [UUIDS[1], UUIDS[2]]  # the two freest, not the spec's 1
    assert json.loads(environ[POLICY_ENV]) | {"visible": None} == Policy(growth=True, loglevel="error").to_dict()
    assert provisioner.WARNING_ENV not in environ and environ[provisioner.PLACED_ENV].startswith(AUTO_PICKED)
    assert reservations.current(env.runtime_dir) == []  # the kernel's end freed its pick


def test_a_notebook_contradicting_the_kernelspec_starts_the_spec_with_a_refusal(env: JupyterEnv,  # noqa: F811
                                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    _spec(env, "tf-split", Policy(splits=(("0", (512,)),)))
    path = _notebook(env.root / "nb.ipynb", {"tfgpu": {"policy": ["growth on", "limit 1GB 0"]}})
    environ = _kernel_environ(env, "tf-split", **{SESSION_NAME_ENV: str(path)})
    assert json.loads(environ[POLICY_ENV]) == Policy(splits=(("0", (512,)),)).to_dict()
    assert environ[provisioner.WARNING_ENV].startswith(
        f"ignoring the GPU policy in the notebook {path}: on top of the kernelspec's policy, the lines' result: "
        "GPU 0 has both a limit and a split")


def test_colabs_accelerator_starts_quietly_without_nvml_and_picks_one_with_it(env: JupyterEnv,  # noqa: F811
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    _spec(env, "tf-plain", Policy())
    path = _notebook(env.root / "colab.ipynb", {"accelerator": "GPU"})
    _fake(Inventory(error="NVML unavailable: no NVIDIA driver here"), monkeypatch)
    environ = _kernel_environ(env, "tf-plain", **{SESSION_NAME_ENV: str(path)})
    assert "CUDA_VISIBLE_DEVICES" not in environ and provisioner.WARNING_ENV not in environ
    _fake(read_inventory(Nvml(module=FakeNvml(four_gpus(this_kernel=False)))), monkeypatch)
    environ = _kernel_environ(env, "tf-plain", **{SESSION_NAME_ENV: str(path)})
    assert environ["CUDA_VISIBLE_DEVICES"] in (UUIDS[1], UUIDS[2]) and provisioner.WARNING_ENV not in environ


# ----- a real jupyter_server's sessions ------------------------------------------------------------
READER = "tfgpu_magic.jupyter.notebook_request"


def _session(server: JupyterServer, path: str, kernel: str, named: bool = True) -> tuple[str, str]:
    """POST api/sessions as JupyterLab does (`named`: with the file's name) for notebook `path`
    (relative to the server's root); the session's and its kernel's ids."""
    body = {"path": path, "type": "notebook", "kernel": {"name": kernel}}
    if named:
        body["name"] = Path(path).name
    reply = server.request("POST", "api/sessions", body)
    return reply["id"], reply["kernel"]["id"]


@pytest.fixture()
def server(env: JupyterEnv) -> Iterator[JupyterServer]:  # noqa: F811
    _spec(env, "tf-spec", Policy(loglevel="error"))
    with running_server(env) as running:
        yield running


@pytest.mark.parametrize("named", [True, False], ids=["absolute path", "path from the root"])
def test_a_session_kernel_has_the_notebooks_policy_before_its_first_cell(server: JupyterServer, named: bool) -> None:
    """Real TensorFlow (CPU): the notebook's `split cpu 2` is in force when the first cell imports it."""
    _notebook(server.env.root / "work" / "nb.ipynb", {"tfgpu": {"policy": ["split cpu 2", "growth on"]}})
    session, kernel_id = _session(server, "work/nb.ipynb", "tf-spec", named)
    kernel = server.connect(kernel_id)
    try:
        first = kernel.ok("import tensorflow as tf; print(len(tf.config.list_logical_devices('CPU')))")
        assert first.stdout.strip().splitlines()[-1] == "2", first.output
        assert "ignoring" not in first.stderr
        policy = json.loads(kernel.evaluate(f"__import__('os').environ['{POLICY_ENV}']"))
        assert policy == Policy(growth=True, cpu_devices=2, loglevel="error").to_dict()
        assert not kernel.loaded_modules(READER)  # not at `%load_ext`, not per cell
        shown = kernel.ok("%tfgpu").output  # the kernel reads its notebook as its status is shown
        assert "saved: growth on, split cpu 2; this kernel: growth on, split cpu 2, loglevel error" in " ".join(
            shown.split()), shown
    finally:
        kernel.close()
        server.request("DELETE", f"api/sessions/{session}")


def test_hostile_notebooks_start_their_kernels_with_one_refusal_line(server: JupyterServer) -> None:
    root = server.env.root
    HOSTILE_FILES["huge"](root / "huge.ipynb")
    HOSTILE_FILES["fifo"](root / "fifo.ipynb")
    _notebook(root / "bad-line.ipynb", {"tfgpu": {"policy": ["growth on", "visible 0,,1"]}})
    _notebook(root / "wrong-type.ipynb", {"tfgpu": {"policy": [["growth on"]]}})
    expected = {"huge.ipynb": "allowed", "fifo.ipynb": "not a regular file",
                "bad-line.ipynb": "line 2 ('visible 0,,1'): empty entry", "wrong-type.ipynb": "line 1 is a list"}
    for name, words in expected.items():
        session, kernel_id = _session(server, name, "tf-spec")
        kernel = server.connect(kernel_id)
        try:
            first = kernel.ok("print('first cell')")
            refusals = [line for line in first.stderr.splitlines() if "ignoring the GPU policy" in line]
            assert len(refusals) == 1 and words in refusals[0], first.output
            assert refusals[0].endswith("the kernel starts without it") and first.stdout.strip() == "first cell"
            policy = json.loads(kernel.evaluate(f"__import__('os').environ['{POLICY_ENV}']"))
            assert policy == Policy(loglevel="error").to_dict()  # the kernelspec's, untouched
        finally:
            kernel.close()
            server.request("DELETE", f"api/sessions/{session}")


def test_a_server_with_gpus_gives_a_notebook_the_freest_cards_it_asks_for(env: JupyterEnv) -> None:  # noqa: F811
    """The server's provisioner on tests/fake_nvml.py's four cards (faults_support's server)."""
    _spec(env, "tf-spec", Policy())
    _notebook(env.root / "nb.ipynb", {"tfgpu": {"policy": ["visible auto:2"]}})
    server_env(env.environ)
    with running_server(env, app=SERVER_APP) as server:
        session, kernel_id = _session(server, "nb.ipynb", "tf-spec")
        kernel = server.connect(kernel_id)
        try:
            seen = kernel.evaluate("__import__('os').environ.get('CUDA_VISIBLE_DEVICES')")
            assert sorted(seen.split(",")) == sorted([UUIDS[1], UUIDS[2]])
        finally:
            kernel.close()
            server.request("DELETE", f"api/sessions/{session}")
