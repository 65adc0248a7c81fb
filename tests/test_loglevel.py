"""`loglevel`: the environment table's read times, the C++ level before import, the Python loggers
after, and the quiet import — against real TensorFlow in fresh processes and in a real kernel.

What `import tensorflow` prints depends on the CPU: with AVX-512 (oneDNN on by default) the absl
preamble and the oneDNN notice twice, plus `cpu_feature_guard.cc`'s line; without it only the
preamble and `cpu_feature_guard.cc`, and nothing at all at TF_CPP_MIN_LOG_LEVEL=3. So no test names
those lines: each TensorFlow test compares a filtered run with a baseline run (no policy) on the same
machine, shared by the module (`tf_run` is cached), and asserts only the relation between them. Both
CPUs are covered on any machine: the "no-onednn" variant sets TF_ENABLE_ONEDNN_OPTS=0, which removes
the oneDNN notice as a CPU without AVX-512 does (and with it the import-time message that would
otherwise use up absl's preamble before the first log line after the import).
"""

from __future__ import annotations

import functools
import importlib.util
import json
import os
import re
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path
from typing import Iterable, Iterator

import pytest
from fake_tf import FakeTF
from kernels import QUIET_ENV, Kernel, kernel_manager, quiet_env, tensorflow_stays_out_of_pytest  # noqa: F401
from servers import wait_until

from tfgpu_magic.controller import Controller
from tfgpu_magic.language.policy import Policy
from tfgpu_magic import envvars
from tfgpu_magic.tf import quietimport
from tfgpu_magic.envvars import TF_CPP_MIN_LOG_LEVEL
from tfgpu_magic.tf.export import export
from tfgpu_magic.plan import build_plan
from tfgpu_magic.tf.runtime import RuntimeState, too_late
from tfgpu_magic.views.status import item_text

TIMEOUT = 120

# Lines as tensorflow-cpu 2.21 wrote them to stderr here (import, then ops logging through C++).
PREAMBLE = quietimport.PREAMBLE + "\n"
INFO = ("I0000 00:00:1796114086.366015    3831 port.cc:153] oneDNN custom operations are on. You may see "
        "slightly different numerical results.\n")
INFO_CONTINUED = "To enable the following instructions: AVX2 AVX512F FMA, in other operations, rebuild TensorFlow.\n"
WARNING = "W0000 00:00:1796114331.248420    7574 logging_ops.cc:171] boom-warn\n"
ERROR = "E0000 00:00:1796114328.718096    7548 logging_ops.cc:173] boom-error\n"
FATAL = "F1201 08:00:00.000000   12 gpu_device.cc:1] Check failed: boom\n"
PY_WARNING = "WARNING:tensorflow:pywarn\n"
PY_ERROR = "ERROR:tensorflow:pyerr\n"
USER = "my own line: I0000 is not at the start\n"


def kept(level: str, *lines: str) -> str:
    return quietimport.keep_lines("".join(lines).encode(), level).decode()


# ----- the table -------------------------------------------------------------------------------------
def test_every_variable_has_a_reader_a_moment_and_a_meaning():
    assert envvars.NAMES == tuple(var.name for var in envvars.TABLE)
    assert len(set(envvars.NAMES)) == len(envvars.NAMES)
    for var in envvars.TABLE:
        assert var.read_at and set(var.read_at) <= set(envvars.MOMENTS) and var.reader and var.meaning


@pytest.mark.parametrize("state, late", [
    (RuntimeState(), set()),
    (RuntimeState(imported=True), {TF_CPP_MIN_LOG_LEVEL}),
    (RuntimeState(imported=True, devices_listed=True), {TF_CPP_MIN_LOG_LEVEL, "CUDA_DEVICE_ORDER",
                                                        "CUDA_VISIBLE_DEVICES"}),
    (RuntimeState(cuda_elsewhere="libcuda"), {"CUDA_DEVICE_ORDER", "CUDA_VISIBLE_DEVICES"}),
    (RuntimeState(imported=True, devices_listed=True, initialized=True),
     {TF_CPP_MIN_LOG_LEVEL, "CUDA_DEVICE_ORDER", "CUDA_VISIBLE_DEVICES", "TF_GPU_ALLOCATOR", "TF_FORCE_GPU_ALLOW_GROWTH"}),
    (RuntimeState(jax_started=True),
     {"TF_GPU_ALLOCATOR", "XLA_PYTHON_CLIENT_PREALLOCATE", "XLA_CLIENT_MEM_FRACTION", "XLA_PYTHON_CLIENT_MEM_FRACTION"}),
    (RuntimeState(torch_imported=True), {"PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF"}),
    (RuntimeState(torch_imported=True, torch_cuda=True),
     {"CUDA_DEVICE_ORDER", "CUDA_VISIBLE_DEVICES", "PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF"}),
], ids=["fresh", "imported", "listed", "cuda-elsewhere", "initialized", "jax-started", "torch-imported", "torch-cuda"])
def test_the_read_time_decides_what_is_locked(state, late):
    assert {name for name in envvars.NAMES if too_late(name, state)} == late
    assert too_late(TF_CPP_MIN_LOG_LEVEL, RuntimeState(imported=True)) == "import"


# ----- the plan and the exports -----------------------------------------------------------------------
@pytest.mark.parametrize("level, value", [("debug", "0"), ("info", "0"), ("warning", "1"), ("error", "2")])
def test_loglevel_sets_the_cpp_level_and_nothing_else(level, value):
    plan = build_plan(Policy(loglevel=level))
    assert plan.env == ((TF_CPP_MIN_LOG_LEVEL, value),) and plan.loglevel == level
    assert build_plan(Policy()).env == ()


def test_exports_carry_the_loglevel():
    policy = Policy(loglevel="error")
    assert "export TF_CPP_MIN_LOG_LEVEL=2" in export(policy, "env")
    python = export(policy, "python")
    assert "os.environ['TF_CPP_MIN_LOG_LEVEL'] = '2'" in python
    assert python.index("TF_CPP_MIN_LOG_LEVEL") < python.index("import tensorflow")
    assert "tf.get_logger().setLevel('ERROR')" in python and "absl.logging.set_verbosity('error')" in python
    assert json.loads(export(policy, "json"))["loglevel"] == "error"


# ----- the controller (fake TensorFlow) ---------------------------------------------------------------
@pytest.fixture
def no_quiet() -> Iterator[None]:
    yield
    quietimport.quiet(None)
    quietimport.disarm()


def test_before_import_the_environment_and_the_quiet_import_follow_the_policy(no_quiet):
    environ = {TF_CPP_MIN_LOG_LEVEL: "3"}
    controller = Controller(api=FakeTF(imported=False), environ=environ)
    report = controller.set_policy(Policy(loglevel="error"))
    assert report.ok and [item_text(item) for item in report.applied] == ["TF_CPP_MIN_LOG_LEVEL=2"]
    assert environ == {TF_CPP_MIN_LOG_LEVEL: "2"} and quietimport._quiet_level == "error"
    controller.set_policy(Policy())
    assert environ == {TF_CPP_MIN_LOG_LEVEL: "3"} and quietimport._quiet_level is None  # the user's own again


def test_after_import_the_cpp_level_is_locked_and_the_python_loggers_still_apply(no_quiet):
    fake = FakeTF(imported=True)
    controller = Controller(api=fake, environ={})
    report = controller.set_policy(Policy(loglevel="error"))
    assert [item_text(item) for item in report.locked] == ["TF_CPP_MIN_LOG_LEVEL: unset → 2 (read when TensorFlow was imported)"]
    assert "Python logger tensorflow: error and above" in map(item_text, report.applied) and fake.loglevel == "error"
    assert controller.environ == {}
    report = controller.set_policy(Policy())
    assert report.ok and fake.loglevel is None


# ----- the filter on captured lines ----------------------------------------------------------------------
def test_error_keeps_errors_and_everything_that_is_not_a_log_line():
    lines = (PREAMBLE, INFO, INFO_CONTINUED, WARNING, ERROR, FATAL, PY_WARNING, PY_ERROR, USER, "\n")
    assert kept("error", *lines) == INFO_CONTINUED + ERROR + FATAL + PY_ERROR + USER + "\n"
    assert kept("warning", *lines) == INFO_CONTINUED + WARNING + ERROR + FATAL + PY_WARNING + PY_ERROR + USER + "\n"
    assert kept("info", *lines) == "".join(lines)


def test_a_line_without_newline_and_bad_bytes_survive():
    data = b"\xff\xfe not utf-8\n" + ERROR.encode() + b"partial"
    assert quietimport.keep_lines(data, "error") == data


def test_filtered_stderr_drops_low_lines_written_to_fd_2(capfd):
    with quietimport.filtered_stderr("error"):
        os.write(2, (PREAMBLE + INFO + ERROR + USER).encode())
        print("python's own", file=sys.stderr)  # pytest's sys.stderr is no fd 2 here: never held back
    err = capfd.readouterr().err
    assert ERROR + USER in err and "python's own\n" in err and len(err) == len(ERROR + USER + "python's own\n")


def test_lines_reach_stderr_while_the_block_still_runs(capfd):
    """Streamed, not held until the block ends: an import that never returns loses nothing."""
    with quietimport.filtered_stderr("error"):
        os.write(2, (INFO + ERROR).encode())
        shown = wait_until(lambda: capfd.readouterr().err, 20, "the error line on stderr")
    assert shown == ERROR


def test_filtered_stderr_filters_the_same_when_the_block_fails(capfd):
    """Line by line however the block ends: the error line shows, the info line does not, fd 2 is back."""
    with pytest.raises(ImportError), quietimport.filtered_stderr("error"):
        os.write(2, (INFO + ERROR).encode())
        raise ImportError("broken")
    assert capfd.readouterr().err == ERROR
    os.write(2, b"fd 2 is back\n")
    assert capfd.readouterr().err == "fd 2 is back\n"


def test_an_interrupt_during_the_restore_still_restores_fd_2(capfd, monkeypatch):
    """A KeyboardInterrupt while the block's end flushes Python's stderr cannot skip putting fd 2 back."""
    calls = []

    def flush() -> None:
        calls.append(1)
        if len(calls) == 2:  # the flush as the block ends
            raise KeyboardInterrupt

    monkeypatch.setattr(quietimport, "_flush_stderr", flush)
    with pytest.raises(KeyboardInterrupt), quietimport.filtered_stderr("error"):
        os.write(2, ERROR.encode())
    assert len(calls) == 2
    os.write(2, b"fd 2 is back\n")
    assert capfd.readouterr().err.endswith("fd 2 is back\n")


def test_quiet_only_for_levels_above_info(no_quiet):
    for level, expected in [("debug", None), ("info", None), ("warning", "warning"), ("error", "error"), (None, None)]:
        quietimport.quiet(level)
        assert quietimport._quiet_level == expected


# ----- real TensorFlow in a fresh process ------------------------------------------------------------
LOUD = {name: value for name, value in quiet_env().items() if name not in QUIET_ENV}
"""A TensorFlow process's environment with TensorFlow's own log defaults (the oneDNN notice on)."""

SCRIPT = """\
import os, sys
from tfgpu_magic import configure
{configure}
print("user before", file=sys.stderr, flush=True)
os.write(2, b"fd before\\n")
{during}
import tensorflow as tf
print("IMPORTED", flush=True)
tf.constant(1) + 1
print("FIRST OP", flush=True)
print("user after", file=sys.stderr, flush=True)
os.write(2, b"fd after\\n")
{after}
"""

USER_LINES = ["user before", "fd before", "user after", "fd after"]

DURING_IMPORT = """\
class Speak:
    '''Writes to fd 2 while tensorflow/__init__ runs (when TF imports its first submodule).'''
    def find_spec(self, name, path=None, target=None):
        if name.startswith("tensorflow.") and not getattr(self, "done", False):
            self.done = True
            os.write(2, b"E0000 00:00:1.0 1 fake.cc:1] an error during import\\n")
            os.write(2, b"I0000 00:00:1.0 1 fake.cc:2] chatter during import\\n")
            os.write(2, b"not a log line during import\\n")
        return None
sys.meta_path.insert(0, Speak())
"""

C_LOGS = """\
import absl.logging
tf.print("boom-error", output_stream=absl.logging.error)
tf.print("boom-warn", output_stream=absl.logging.warning)
tf.get_logger().warning("py-warn")
tf.get_logger().error("py-error")
"""


CPUS = {"native": {}, "no-onednn": {"TF_ENABLE_ONEDNN_OPTS": "0"}}
"""This machine as it is, and as a CPU without AVX-512 (no oneDNN notice): see the module docstring."""
DURING_LINES = ["E0000 00:00:1.0 1 fake.cc:1] an error during import", "not a log line during import"]
"""What `DURING_IMPORT` writes that `loglevel error` keeps (its info line is dropped)."""


@functools.cache
def tf_run(cpu: str, level: str | None) -> tuple[str, ...]:
    """Stderr lines of a fresh process on `cpu` (a key of `CPUS`) that sets `loglevel level` (None:
    no policy, the baseline), writes during the import (`DURING_IMPORT`), imports TensorFlow, runs
    one op, then logs at every level through C++ and Python (`C_LOGS`). Cached: one run per pair."""
    code = SCRIPT.format(configure=f"configure('loglevel {level}')" if level else "", during=DURING_IMPORT,
                         after=C_LOGS)
    proc = subprocess.run([sys.executable, "-c", code], env={**LOUD, **CPUS[cpu]}, capture_output=True, text=True,
                          timeout=TIMEOUT)
    assert proc.returncode == 0 and "FIRST OP" in proc.stdout, proc.stderr[-3000:]
    return tuple(line for line in proc.stderr.splitlines() if line)


def normal(lines: Iterable[str]) -> list[str]:
    """Log lines without what differs from run to run (date, time, thread id)."""
    return [re.sub(r"^([IWEF])\d{4} [\d:.]+ +\d+ ", r"\1 ", line) for line in lines]


def at_least(level: str, lines: Iterable[str]) -> list[str]:
    """The log lines of `lines` at `level` or above."""
    floor = quietimport.SEVERITIES.index(level)
    return [line for line in lines if (found := quietimport.severity(line)) and quietimport.SEVERITIES.index(found) >= floor]


@pytest.mark.tensorflow
@pytest.mark.parametrize("cpu", sorted(CPUS))
@pytest.mark.parametrize("level", ["warning", "error"])
def test_a_quiet_level_shows_every_line_at_or_above_it_and_nothing_below(cpu: str, level: str):
    """Against the baseline on the same CPU: the same log lines at or above the level, in the same
    order, none below it (absl's preamble is one, at the import and after it), and every other
    line one the baseline has too (the user's own, continuation lines)."""
    baseline, quiet = tf_run(cpu, None), tf_run(cpu, level)
    assert normal(at_least(level, quiet)) == normal(at_least(level, baseline))
    below = [line for line in quiet if quietimport.severity(line) not in (None, *quietimport.SEVERITIES[
        quietimport.SEVERITIES.index(level):])]
    assert below == [] and quietimport.PREAMBLE not in quiet
    assert set(normal(quiet)) <= set(normal(baseline))
    assert [line for line in quiet if line in USER_LINES] == USER_LINES


@pytest.mark.tensorflow
@pytest.mark.parametrize("cpu", sorted(CPUS))
def test_loglevel_error_imports_tensorflow_without_a_line_of_its_own(cpu: str):
    """Between the user's lines before and after `import tensorflow` and the first op, only what
    the user wrote during the import that is an error or no log line; then the errors logged."""
    lines = list(tf_run(cpu, "error"))
    assert lines[:6] == USER_LINES[:2] + DURING_LINES + USER_LINES[2:]
    assert normal(lines[6:]) == ["E logging_ops.cc:173] boom-error", "ERROR:tensorflow:py-error"]


@pytest.mark.tensorflow
@pytest.mark.parametrize(("cpu", "level"), [("native", "off"), ("native", "info")])
def test_without_a_quiet_level_tensorflow_prints_what_it_prints_without_a_policy(cpu: str, level: str):
    assert normal(tf_run(cpu, level)) == normal(tf_run(cpu, None))


@pytest.mark.tensorflow
def test_exported_python_sets_both_levels(tmp_path):
    script = tmp_path / "policy.py"
    script.write_text(export(Policy(loglevel="error"), "python") + textwrap.dedent("""\
        import logging, os
        print("LEVELS", os.environ["TF_CPP_MIN_LOG_LEVEL"], logging.getLogger("tensorflow").level,
              absl.logging.get_verbosity())
        """))
    proc = subprocess.run([sys.executable, str(script)], env=LOUD, capture_output=True, text=True, timeout=TIMEOUT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "LEVELS 2 40 -2" in proc.stdout


@pytest.mark.tensorflow
def test_after_import_the_cpp_level_is_reported_locked_and_the_python_loggers_follow():
    code = textwrap.dedent("""\
        import logging, warnings
        import tensorflow as tf
        from tfgpu_magic import configure
        from tfgpu_magic.views.status import item_text
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            report = configure("loglevel error")
        print("LOCKED", [item_text(item) for item in report.locked])
        print("APPLIED", [item_text(item) for item in report.applied])
        print("LEVEL", logging.getLogger("tensorflow").level, len(caught))
        """)
    proc = subprocess.run([sys.executable, "-c", code], env=LOUD, capture_output=True, text=True, timeout=TIMEOUT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    # Where JAX is installed, TensorFlow's import imports it (tensorflow/lite/python/util.py), and JAX's
    # import sets TF_CPP_MIN_LOG_LEVEL to 1 where unset (jax/__init__.py): the status says the value it finds.
    found = "1" if importlib.util.find_spec("jax") else "unset"
    assert f"TF_CPP_MIN_LOG_LEVEL: {found} → 2 (read when TensorFlow was imported)" in proc.stdout
    assert "Python logger tensorflow: error and above" in proc.stdout and "LEVEL 40 1" in proc.stdout


# ----- a real kernel ---------------------------------------------------------------------------------------
def loud_kernel(root: Path) -> Kernel:
    """A kernel like `kernels.running_kernel()`'s, but with TensorFlow's own log defaults."""
    manager = kernel_manager(root)
    spec_file = root / "kernels" / manager.kernel_name / "kernel.json"
    spec = json.loads(spec_file.read_text())
    spec["env"] = {name: value for name, value in spec["env"].items() if name not in QUIET_ENV}
    spec_file.write_text(json.dumps(spec))
    manager.start_kernel(cwd=str(root), env=LOUD)
    client = manager.client()
    client.start_channels()
    client.wait_for_ready(timeout=60)
    return Kernel(manager, client)


@pytest.mark.tensorflow
@pytest.mark.parametrize("level", ["error", "off"])
def test_in_a_kernel_the_import_cell_is_quiet_with_loglevel_error(level):
    with tempfile.TemporaryDirectory(prefix="tfgpu-loglevel-") as tmp:
        kernel = loud_kernel(Path(tmp))
        try:
            kernel.ok("%load_ext tfgpu_magic")
            kernel.ok(f"%tfgpu loglevel {level}")
            cell = kernel.ok("import tensorflow as tf\ntf.constant(1) + 1\nprint('done')")
            later = kernel.ok("import sys, os\nprint('mine', file=sys.stderr, flush=True)\n"
                              "os.write(2, b'fd mine\\n')\nimport time; time.sleep(0.5)")
        finally:
            kernel.client.stop_channels()
            kernel.manager.shutdown_kernel(now=True)
    assert "done" in cell.stdout
    if level == "error":
        assert cell.stderr == ""
    else:  # what the same import and op print in a script on this CPU, no more, no less
        assert normal(line for line in cell.stderr.splitlines() if line) == normal(tensorflows_own(tf_run("native", None)))
    assert "mine" in later.stderr and "fd mine" in later.stderr


def tensorflows_own(lines: tuple[str, ...]) -> list[str]:
    """What TensorFlow itself printed at `import tensorflow` and the first op, in a `tf_run`."""
    between = lines[lines.index("fd before") + 1 : lines.index("user after")]
    ours = ("during import",)
    return [line for line in between if not line.endswith(ours)]
