"""What `%tfgpu` says once TensorFlow's runtime is initialized, and the messages around it.

The session after initialization runs once, in a fresh process (real IPython shell, real TensorFlow CPU
build, its own IPYTHONDIR): the policy of docs/applying.md's example (`limit 2GB`, `split cpu 2`), then
a cell that starts with `%tfgpu` and initializes TensorFlow, then directives one cell each. Each test
reads the exact text of one step. The rest (one message per cell, HTML, `%tfgpu?`, a four-GPU status) runs
on the test shell with the fakes (tests/fake_tf.py, tests/fake_nvml.py); TensorFlow never enters pytest.
"""

from __future__ import annotations

import importlib.util

import json
import re
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Callable, Iterator

import pytest
from fake_nvml import UUIDS, FakeNvml, four_gpus
from fake_tf import FakeTF
from kernels import isolated_env, quiet_env, tensorflow_stays_out_of_pytest  # noqa: F401 (autouse)

from tfgpu_magic.controller import Controller
from tfgpu_magic.gpus.inventory import Inventory, InventoryCatalog, Nvml, read_inventory
from tfgpu_magic.tf import quietimport
from tfgpu_magic.views.notes import NO_GPU
from tfgpu_magic.views.magics import TFGPUMagics
from tfgpu_magic.views.results import RestartOffer, StatusResult
from tfgpu_magic.views.status import RECORDED, TERMINAL_RESTART_HINT, WIDTH, snapshot

TIMEOUT = 180

SESSION = r'''
import contextlib, io, json
from IPython.testing.globalipapp import start_ipython
from IPython.utils.capture import capture_output

ip = start_ipython()
out = {}


def cell(name, source):
    """Run `source` as one cell; keep what it printed, and the number it ran as."""
    out[name + "_count"] = ip.execution_count
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed), contextlib.redirect_stderr(printed):
        ip.run_cell(source, store_history=True)
    out[name] = printed.getvalue()


cell("load", "%load_ext tfgpu_magic")
cell("limit2", "%tfgpu limit 2GB")
cell("split2", "%tfgpu split cpu 2")
cell("init", "%tfgpu\nimport tensorflow as tf\n\nx = tf.constant(1)\ny = x + 1")
out["tf_gpus"] = len(ip.user_ns["tf"].config.list_physical_devices("GPU"))
cell("limit3", "%tfgpu limit 3GB")
cell("export", "%tfgpu export json")
cell("apply", "%tfgpu apply")
cell("growth", "%tfgpu growth on")
cell("split3", "%tfgpu split cpu 3")
cell("visible", "%tfgpu visible 0")
cell("again", "%tfgpu growth on")
with capture_output() as shown:  # a publisher that keeps every format, as a notebook's does
    ip.run_cell("%tfgpu", store_history=True)
out["status"], out["status_html"] = shown.outputs[0].data["text/plain"], shown.outputs[0].data["text/html"]
cell("reset", "%tfgpu reset")
cell("after_reset", "%tfgpu")
print("RESULT " + json.dumps(out))
'''


@pytest.fixture(scope="module")
def after_init(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """Every step's output of `SESSION`; skipped where TensorFlow sees a GPU (the steps assume none)."""
    env = {**quiet_env(), **isolated_env(tmp_path_factory.mktemp("after-init"))}
    proc = subprocess.run([sys.executable, "-c", SESSION], env=env, capture_output=True, text=True, timeout=TIMEOUT)
    assert proc.returncode == 0, proc.stderr[-4000:]
    (line,) = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    out = json.loads(line.removeprefix("RESULT "))
    if out["tf_gpus"]:
        pytest.skip("TensorFlow sees a GPU here; these steps are about a process where it sees none")
    return out


def locked_header(out: dict) -> str:
    """The first line of a message about settings that wait for a restart, in this session."""
    return (f"TensorFlow's runtime is already initialized in this process (by In [{out['init_count']}]: "
            "`x = tf.constant(1)`), so these settings cannot change now:")


RECORDED_RESTART = f"The policy is recorded. {TERMINAL_RESTART_HINT}"
"""How a terminal IPython message ends that named settings waiting for a restart."""


WITH_JAX = "{sep}{action}XLA_PYTHON_CLIENT_PREALLOCATE{value}" if importlib.util.find_spec("jax") else ""
"""Where JAX is installed, `import tensorflow` imports it (tensorflow/lite/python/util.py), and `growth`
tells JAX too: its variable comes after TensorFlow's in the same line."""


# ----- a setting TensorFlow has nothing to apply to is never "in force" --------------------------
@pytest.mark.tensorflow
def test_a_new_limit_without_a_gpu_says_what_it_means_not_already_in_force(after_init: dict) -> None:
    """Was: "Already in force." while `export json` showed 3072 MiB."""
    assert after_init["limit3"] == (
        f"{NO_GPU}: `limit 3GB on every visible GPU` has nothing to apply to here.\n")
    assert json.loads(after_init["export"])["limits"] == {"all": 3072}
    assert after_init["apply"] == f"{NO_GPU}: the policy's GPU settings have nothing to apply to here\n"  # was: in force


# ----- each directive shows what it changed, one line for the rest ---------------------------------
@pytest.mark.tensorflow
def test_each_directive_after_initialization_names_only_its_own_change(after_init: dict) -> None:
    """Was: by the fourth directive 4 bullets (every pending change again) and 3 `Note:` lines. And
    `growth on` got a restart's advice for TF_FORCE_GPU_ALLOW_GROWTH, which no GPU
    allocator of this process will read, beside "nothing to apply to here"; given again, it was
    "in force"."""
    assert after_init["growth"].splitlines() == [
        "Applied: TF_FORCE_GPU_ALLOW_GROWTH=true" + WITH_JAX.format(sep="; ", action="", value="=false"),
        f"{NO_GPU}: `growth on` has nothing to apply to here.",
        "Note: growth goes through TF_FORCE_GPU_ALLOW_GROWTH=true: TF refuses set_memory_growth on a limited GPU",
    ]
    assert after_init["split3"].splitlines() == [
        locked_header(after_init), "  - logical CPU devices: 2 logical devices → 3 logical devices", RECORDED_RESTART,
    ]
    assert after_init["visible"].splitlines() == [
        "1 earlier change still waits for a restart (`%tfgpu` lists them).",
        f"{NO_GPU}: `visible 0` has nothing to apply to here.",
        "Note: CUDA has already started: TensorFlow hides GPUs through tf.config.set_visible_devices",
    ]
    assert after_init["again"].splitlines() == ["1 earlier change still waits for a restart (`%tfgpu` lists them).",
                                                f"{NO_GPU}: `growth on` has nothing to apply to here."]
    pending = after_init["status"].split("Pending, needs a restart:\n", 1)[1].split("\nNote: ")[0].splitlines()
    assert pending == ["  - logical CPU devices: 2 logical devices → 3 logical devices"]


# ----- reset after initialization says which variable stays --------------------------------------
@pytest.mark.tensorflow
def test_reset_after_initialization_says_the_variable_cuda_read_stays(after_init: dict) -> None:
    """Was: "No variable needed restoring." while CUDA_DEVICE_ORDER=PCI_BUS_ID stayed set and listed."""
    kept = "CUDA_DEVICE_ORDER: PCI_BUS_ID → unset (read when CUDA started)"
    assert after_init["reset"].splitlines() == [
        "Policy cleared.",
        "Restored what this tool had set: unset TF_FORCE_GPU_ALLOW_GROWTH" + WITH_JAX.format(sep=", ", action="unset ", value=""),
        locked_header(after_init), f"  - {kept}",
        "  - logical CPU devices: 2 logical devices → TF default", TERMINAL_RESTART_HINT,
    ]
    status = after_init["after_reset"]
    assert "CUDA_DEVICE_ORDER=PCI_BUS_ID" in status and f"  - {kept}" in status.split("Pending, needs a restart:")[1]


# ----- the initializing line, named; code in HTML ----------------------------------------
@pytest.mark.tensorflow
def test_the_line_that_initialized_is_named_not_the_cells_first(after_init: dict) -> None:
    """The cell starts with `%tfgpu`, imports TensorFlow on its second line, and its fourth,
    `x = tf.constant(1)`, initializes the runtime. Was: "initialized by In [4]: `%tfgpu`"."""
    named = f"initialized by In [{after_init['init_count']}]: `x = tf.constant(1)`"
    assert after_init["status"].startswith(f"TensorFlow: {named}: device settings are locked")
    assert named in after_init["status_html"].replace("<code>", "`").replace("</code>", "`")


@pytest.mark.tensorflow
def test_status_html_shows_code_as_code_not_backticks(after_init: dict) -> None:
    html = after_init["status_html"]
    assert f"In [{after_init['init_count']}]: <code>x = tf.constant(1)</code>" in html
    assert "`" not in html


def test_html_of_every_result_has_no_backticks() -> None:
    """The status without NVML ("`%tfgpu doctor` says more"), a restart offer, a pending change."""
    fake = FakeTF(2)
    ctl = Controller(api=fake, environ={}, catalog=InventoryCatalog(Inventory(error="NVML unavailable: no driver")))
    ctl.edit([ctl.parse("split cpu 2")])
    fake.initialize()
    ctl.edit([ctl.parse("split cpu 3")])
    html = StatusResult(snapshot(ctl)).html()
    assert "<code>%tfgpu doctor</code> says more" in html and "`" not in html
    offer = RestartOffer("Click the button, or run `%tfgpu restart --yes`.", lambda: "")
    assert offer.html() == "<pre>Click the button, or run <code>%tfgpu restart --yes</code>.</pre>"
    quietimport.disarm()


# ----- one "Recorded" per cell ---------------------------------------------------------------------
@pytest.fixture
def private_magic(shell, capsys) -> Iterator[Callable[[str], str]]:
    """`%tfgpu` on the test shell over a controller of its own (an environment dict, no NVML); runs a
    whole cell and returns what it printed."""
    previous = shell.magics_manager.registry["TFGPUMagics"]
    controller = Controller(environ={}, catalog=InventoryCatalog(Inventory(error="no NVML in these tests")))
    shell.register_magics(TFGPUMagics(shell, controller=controller))

    def run(cell: str) -> str:
        capsys.readouterr()
        shell.run_cell(cell, store_history=False)
        return capsys.readouterr().out

    yield run
    quietimport.disarm()
    shell.register_magics(previous)


def test_a_cell_of_three_directives_says_recorded_once(private_magic) -> None:
    """Was: "Recorded; the rest applies when TensorFlow is imported." three times."""
    out = private_magic("%tfgpu growth on\n%tfgpu limit 2GB\n%tfgpu split cpu 2")
    assert out.splitlines() == [
        "Applied: CUDA_DEVICE_ORDER=PCI_BUS_ID", RECORDED, "Applied: TF_FORCE_GPU_ALLOW_GROWTH=true",
        "Note: growth goes through TF_FORCE_GPU_ALLOW_GROWTH=true: TF refuses set_memory_growth on a limited GPU",
    ]
    assert private_magic("%tfgpu limit 4GB") == f"{RECORDED}\n"  # the next cell says it again
    assert private_magic("%tfgpu loglevel error\n%tfgpu split cpu 3") == (
        f"Applied: TF_CPP_MIN_LOG_LEVEL=2\n{RECORDED}\n")


# ----- `%tfgpu?` stands on its own ---------------------------------------------------------------
def test_help_points_nowhere_and_says_more_on_the_directives_that_need_it(shell, capsys) -> None:
    """Was: "(below)" six times, with nothing below."""
    shell.run_line_magic("pinfo", "%tfgpu")
    out = capsys.readouterr().out
    assert "below" not in out and "README" not in out
    more = out.split("More on some directives::", 1)[1].split("Options::", 1)[0]
    named = {line.split()[0] for line in more.splitlines() if line.startswith("  ") and not line.startswith("    ")}
    assert named == {"restart", "panel", "doctor", "selftest", "memory", "who", "watch", "kernelspec"}


# ----- four GPUs by UUID within one screen width --------------------------------------------------
def four_gpu_status(*lines: str) -> tuple[str, str]:
    """The status text and HTML after `lines`, on the fake four-GPU machine, TensorFlow not imported."""
    inventory = read_inventory(Nvml(module=FakeNvml(four_gpus(this_kernel=False))))
    ctl = Controller(api=FakeTF(4, imported=False), environ={}, catalog=InventoryCatalog(inventory))
    for line in lines:
        ctl.edit([ctl.parse(line)])
    quietimport.disarm()
    result = StatusResult(snapshot(ctl))
    return result.text(), result.html()


def test_four_gpu_status_names_gpus_by_index_and_the_limit_as_written() -> None:
    """Was: full UUIDs everywhere, "GPU GPU-…", "40960 MiB on GPU GPU-b1c2…" per UUID, an 81-character
    `CUDA_VISIBLE_DEVICES` value and lines up to 316 characters."""
    text, html = four_gpu_status("visible auto:2", "limit 50%")
    lines = text.splitlines()
    policy = lines.index("Policy:     visible 2 (GPU-b2d4f6a8…), 1 (GPU-b1c2d3e4…)")
    assert lines[policy + 1] == "            limit 50% (40.0 GiB) on GPU 1, 2"
    assert "Variables:  CUDA_DEVICE_ORDER=PCI_BUS_ID, CUDA_VISIBLE_DEVICES=GPU-b2d4f6a8…,GPU-b1c2d3e4…" in lines
    assert "CUDA_VISIBLE_DEVICES='GPU-b2d4f6a8…,GPU-b1c2d3e4…' → CUDA uses GPU 2, 1" in lines
    assert [line.split()[-3] for line in lines if re.match(r"  \d  ", line)] == [uuid[:12] + "…" for uuid in UUIDS]
    assert "GPU GPU-" not in text and not any(uuid in text for uuid in UUIDS)
    assert "GPU GPU-" not in html and "limit 50% (40.0 GiB) on GPU 1, 2" in html
    assert f"<code title='{UUIDS[1]}'>{UUIDS[1][:12]}…</code>" in html  # the whole UUID as a tooltip


@pytest.mark.parametrize("lines", [
    ("visible auto:2", "limit 50%"), ("visible auto:4", "limit 25%", "growth on"),
    ("visible auto:3", "limit 30%", "allocator async", "growth on"), ("split 0 2x10GB", "limit 20GB 1-3"),
])
def test_four_gpu_status_fits_one_screen_width(lines: tuple[str, ...]) -> None:
    text, _ = four_gpu_status(*lines)
    assert max(len(line) for line in text.splitlines()) <= WIDTH, text


# ----- session_config() without TensorFlow --------------------------------------------------------
BLOCKERS = {
    "sys.modules entry": "sys.modules['tensorflow'] = None",
    "meta_path finder": textwrap.dedent("""\
        class NoTensorFlow:
            def find_spec(self, name, path=None, target=None):
                if name == 'tensorflow' or name.startswith('tensorflow.'):
                    raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        sys.meta_path.insert(0, NoTensorFlow())"""),
}


@pytest.mark.parametrize("blocker", BLOCKERS)
def test_session_config_without_tensorflow_is_one_line_saying_how_to_install(blocker: str, tmp_path: Path) -> None:
    """Was: a raw `ModuleNotFoundError: No module named 'tensorflow'`."""
    code = "import sys\n" + BLOCKERS[blocker] + textwrap.dedent("""
        import tfgpu_magic
        try:
            tfgpu_magic.session_config()
        except tfgpu_magic.PolicyError as err:
            print("ERROR", repr(str(err)))
        """)
    proc = subprocess.run([sys.executable, "-c", code], env={**quiet_env(), **isolated_env(tmp_path)},
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (line,) = proc.stdout.splitlines()
    message = eval(line.removeprefix("ERROR "))  # noqa: S307 (our own repr)
    assert message == (f"TensorFlow is not installed in this Python ({sys.executable}): pip install tensorflow "
                       "(on a GPU machine: pip install 'tensorflow[and-cuda]')")
