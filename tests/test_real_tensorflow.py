"""The engine without IPython, against real TensorFlow (CPU build), each check in a fresh `python`.

TensorFlow is never imported by pytest itself: a process whose runtime is initialized stays locked.
Policies and exports are built here (pure code); only the subprocesses import TensorFlow.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from kernels import QUIET_ENV, quiet_env, tensorflow_stays_out_of_pytest  # noqa: F401 (autouse)

from tfgpu_magic.tf.export import export
from tfgpu_magic.language.grammar import parse_line
from tfgpu_magic.envvars import NAMES as OUR_ENV
from tfgpu_magic.language.policy import Policy

pytestmark = pytest.mark.tensorflow

TIMEOUT = 120
RESULT = "RESULT "
REPORT = f"\nimport json as _json\nprint({RESULT!r} + _json.dumps(result))\n"
"""Appended to every script: it leaves its findings in a JSON-ready `result`."""

CPUS = 'len(tf.config.list_logical_devices("CPU"))'
GPU_POLICY = ("growth on", "limit 2GB", "split 0 2x1GB", "visible 0")


def run(argv: list[str], env: dict[str, str]) -> subprocess.CompletedProcess:
    """Run `argv`, asserting a clean exit; return the finished process."""
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=TIMEOUT)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return proc


def result_of(proc: subprocess.CompletedProcess) -> dict:
    """The `result` a script reported."""
    lines = [line for line in proc.stdout.splitlines() if line.startswith(RESULT)]
    assert len(lines) == 1, proc.stdout
    return json.loads(lines[0][len(RESULT):])


def run_script(code: str, path: Path | None = None) -> tuple[dict, str]:
    """Run `code` (plus the report line) in a fresh interpreter, from `path` if given;
    its `result` and its stderr."""
    script = textwrap.dedent(code) + REPORT
    if path is None:
        argv = [sys.executable, "-c", script]
    else:
        path.write_text(script)
        argv = [sys.executable, str(path)]
    proc = run(argv, quiet_env())
    return result_of(proc), proc.stderr


def policy_of(*directives: str) -> Policy:
    """The policy the directives build, through the real grammar (pure, no TensorFlow)."""
    policy = Policy()
    for line in directives:
        policy = parse_line(line).change(policy)
    return policy


ENV_PROBE = f"{{name: __import__('os').environ.get(name) for name in {OUR_ENV!r}}}"
"""A Python expression: our variables as the process sees them (None: unset)."""


# ----- configure() before import ------------------------------------------------------------------
@pytest.mark.parametrize("import_line", ["import tensorflow as tf", "from tensorflow.python.framework import ops"])
def test_configure_before_import_applies_before_first_op(import_line):
    """`configure()` in a plain script, then TF (directly or a submodule first) and an op: 3 CPUs."""
    result, stderr = run_script(f"""
        import tfgpu_magic
        tfgpu_magic.configure("split cpu 3")
        {import_line}
        import tensorflow as tf
        tf.constant(1)
        result = {{"cpus": {CPUS}}}
    """)
    assert result == {"cpus": 3}
    assert "tfgpu_magic" not in stderr


def test_configure_does_not_import_tensorflow_until_the_script_does():
    """Importing the package and `configure()` only arm the hook; TF and keras come with the script."""
    result, _ = run_script(f"""
        import sys
        import tfgpu_magic
        from tfgpu_magic.tf import quietimport
        heavy = ("tensorflow", "keras", "ipywidgets", "pynvml", "IPython")
        report = tfgpu_magic.configure("split cpu 2")
        result = {{"before": [m for m in heavy if m in sys.modules], "waiting": report.waiting,
                  "armed": quietimport.is_armed()}}
        import tensorflow as tf
        result.update(after="tensorflow" in sys.modules, armed_after=quietimport.is_armed(), cpus={CPUS})
    """)
    assert result == {"before": [], "waiting": True, "armed": True, "after": True, "armed_after": False, "cpus": 2}


def test_asking_whether_tensorflow_exists_keeps_the_hook_armed():
    """`importlib.util.find_spec("tensorflow")` (libraries and the doctor do this) finds TF without
    importing it: the hook stays armed and the later import still gets the policy."""
    result, _ = run_script(f"""
        import importlib.util
        import tfgpu_magic
        from tfgpu_magic.tf import quietimport
        tfgpu_magic.configure("split cpu 2")
        found = importlib.util.find_spec("tensorflow") is not None
        armed = quietimport.is_armed()
        import tensorflow as tf
        result = {{"found": found, "armed": armed, "cpus": {CPUS}}}
    """)
    assert result == {"found": True, "armed": True, "cpus": 2}


# ----- configure() too late --------------------------------------------------------------------
def test_configure_after_initialization_warns_with_script_advice():
    """Too late in a script: one warning naming the locked setting, advice that fits a script (no
    kernel, no magic), no exception, TensorFlow unchanged."""
    result, _ = run_script(f"""
        import warnings
        import tensorflow as tf
        tf.constant(1)
        import tfgpu_magic
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            report = tfgpu_magic.configure("split cpu 2")
        result = {{"ok": report.ok, "warnings": [str(w.message) for w in caught], "cpus": {CPUS}}}
    """)
    assert result["ok"] is False and result["cpus"] == 1
    (message,) = result["warnings"]
    assert "logical CPU devices: TF default → 2 logical devices" in message
    assert "%tfgpu" not in message and "kernel" not in message


# ----- the import hook never breaks the import ----------------------------------------------------
@pytest.mark.parametrize(
    "error, message",
    [
        ("RuntimeError", "tfgpu_magic: could not apply the GPU policy on `import tensorflow`: injected failure"),
        ("ValueError", "TensorFlow refused part of the policy"),
    ],
)
def test_failing_policy_still_lets_tensorflow_import(error, message):
    """A policy whose application fails (injected into the `tf.config` seam) warns; TF imports and works."""
    result, stderr = run_script(f"""
        import tfgpu_magic
        from tfgpu_magic.tf import quietimport
        from tfgpu_magic.controller import get_controller

        def refuse(device, limits):
            raise {error}("injected failure")

        get_controller().api.set_logical = refuse
        tfgpu_magic.configure("split cpu 2")
        import tensorflow as tf
        result = {{"sum": int(tf.constant(1) + 1), "cpus": {CPUS}, "armed": quietimport.is_armed(),
                  "loader_restored": "exec_module" not in vars(tf.__spec__.loader)}}
    """)
    assert result == {"sum": 2, "cpus": 1, "armed": False, "loader_restored": True}
    assert message in stderr and "injected failure" in stderr


# ----- export round trips -------------------------------------------------------------------------
GPU_ENV = {"CUDA_DEVICE_ORDER": "PCI_BUS_ID", "CUDA_VISIBLE_DEVICES": "0", "TF_FORCE_GPU_ALLOW_GROWTH": "true"}
NO_ENV = {**dict.fromkeys(OUR_ENV), **{name: QUIET_ENV[name] for name in OUR_ENV if name in QUIET_ENV}}


@pytest.mark.parametrize(
    "directives, cpus, env",
    [
        (("split cpu 3",), 3, NO_ENV),
        (("split cpu 2", "growth on", "allocator async"), 2,
         {**NO_ENV, "CUDA_DEVICE_ORDER": "PCI_BUS_ID", "TF_GPU_ALLOCATOR": "cuda_malloc_async",
          "TF_FORCE_GPU_ALLOW_GROWTH": "true"}),
        (GPU_POLICY, 1, {**NO_ENV, **GPU_ENV}),
        (("growth on", "visible none"), 1, {**NO_ENV, "CUDA_DEVICE_ORDER": "PCI_BUS_ID", "CUDA_VISIBLE_DEVICES": ""}),
    ],
    ids=["cpu", "cpu+env", "gpu-policy", "growth-only"],
)
def test_exported_python_puts_the_policy_in_force(tmp_path, directives, cpus, env):
    """`export python` run as a script in a fresh process: the split and variables are in force,
    and GPU settings are a clean no-op on this GPU-less machine."""
    code = export(policy_of(*directives), "python")
    check = f"result = {{'cpus': {CPUS}, 'gpus': len(tf.config.list_physical_devices('GPU')), 'env': {ENV_PROBE}}}"
    result, stderr = run_script(code + "\n" + check, path=tmp_path / "policy.py")
    assert result == {"cpus": cpus, "gpus": 0, "env": env}
    assert "Traceback" not in stderr


ENV_CASES = [
    (GPU_POLICY + ("allocator async",), {}, {**GPU_ENV, "TF_GPU_ALLOCATOR": "cuda_malloc_async"}),
    (("visible none", "growth off", "allocator bfc"),
     {"CUDA_VISIBLE_DEVICES": "1", "TF_GPU_ALLOCATOR": "cuda_malloc_async"},
     {"CUDA_DEVICE_ORDER": "PCI_BUS_ID", "CUDA_VISIBLE_DEVICES": "", "TF_GPU_ALLOCATOR": None,
      "TF_FORCE_GPU_ALLOW_GROWTH": "false"}),
]


@pytest.mark.parametrize("directives, inherited, expected", ENV_CASES, ids=["gpu-policy", "hide-and-unset"])
def test_exported_env_sourced_in_bash(tmp_path, directives, inherited, expected):
    """`export env` sourced by bash: a Python started from it sees exactly the policy's variables
    (an empty CUDA_VISIBLE_DEVICES stays set, `bfc` unsets an inherited allocator)."""
    exported = tmp_path / "policy.env"
    exported.write_text(export(policy_of(*directives), "env"))
    probe = f"import json; print({RESULT!r} + json.dumps({ENV_PROBE}))"
    proc = run(["bash", "-c", 'source "$1" && exec "$2" -c "$3"', "bash", str(exported), sys.executable, probe],
               quiet_env(**inherited))
    assert result_of(proc) == {**NO_ENV, **expected}


@pytest.mark.parametrize("fmt", ["python", "env"])
def test_export_names_a_gpu_it_cannot_carry(fmt):
    """A limit on a GPU given by UUID (no inventory, not in `visible`) must not vanish from the
    export without a word (regression: it used to be dropped silently)."""
    policy = policy_of("limit 2GB GPU-8932f937")
    assert policy.limits == (("GPU-8932f937", 2048),)
    assert "GPU-8932f937" in export(policy, fmt)


# ----- TF1 sessions -------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "directives, cpus, growth",
    [(("split cpu 2", "growth on"), 2, True), (("growth on", "visible 0"), 1, True), (("growth off",), 1, False)],
    ids=["split+growth", "growth+visible", "growth-off"],
)
def test_session_config_carries_the_policy(directives, cpus, growth):
    """`session_config()` is a ConfigProto a TF1 `Session` accepts: its CPU devices follow the policy,
    and growth is carried (in `allow_growth`, or TF_FORCE_GPU_ALLOW_GROWTH which TF1 sessions read)."""
    result, _ = run_script(f"""
        import os
        import tfgpu_magic
        tfgpu_magic.configure(*{directives!r})
        import tensorflow as tf
        config = tfgpu_magic.session_config()
        forced = os.environ.get("TF_FORCE_GPU_ALLOW_GROWTH")
        with tf.Graph().as_default():
            with tf.device("/cpu:%d" % (config.device_count["CPU"] - 1 if "CPU" in config.device_count else 0)):
                product = tf.constant(2) * 3
            with tf.compat.v1.Session(config=config) as session:
                cpus = [d.name for d in session.list_devices() if d.device_type == "CPU"]
                value = int(session.run(product))
        result = {{"cpus": len(cpus), "value": value,
                  "growth": forced == "true" if forced else config.gpu_options.allow_growth}}
    """)
    assert result == {"cpus": cpus, "value": 6, "growth": growth}


# ----- routes that create devices outside the eager context -----------------------------------------
def test_device_routes_run_with_the_policy():
    """With `split cpu 3` in force, device_lib, tf.test and a TF1 Session given a bare ConfigProto all
    create 3 CPU devices (before: device_lib and the Session listed 1); a config's own CPU count
    wins; the wrappers are ours, TensorFlow's functions come back on uninstall, and on this GPU-less
    build nothing is recorded as creating GPU devices."""
    result, stderr = run_script("""
        import tfgpu_magic
        from tfgpu_magic.controller import get_controller
        from tfgpu_magic.tf.routes import uninstall_routes
        from tfgpu_magic.tf.runtime import WRAPPED
        tfgpu_magic.configure("split cpu 3")
        import tensorflow as tf
        from tensorflow.python.client import device_lib, session

        def cpus(devices):
            return sum(d.device_type == "CPU" for d in devices)

        result = {"device_lib": cpus(device_lib.list_local_devices()), "is_gpu_available": tf.test.is_gpu_available(),
                  "gpu_device_name": tf.test.gpu_device_name()}
        with tf.Graph().as_default():
            result["session"] = cpus(tf.compat.v1.Session(config=tf.compat.v1.ConfigProto()).list_devices())
            own = tf.compat.v1.ConfigProto(device_count={"CPU": 2})
            result["own_config"] = cpus(tf.compat.v1.Session(config=own).list_devices())
            result["default_session"] = cpus(tf.compat.v1.Session().list_devices())
        get_controller().apply()  # a second apply re-wraps, never wraps a wrapper
        wrapped = device_lib.list_local_devices
        result["wrapped_once"] = hasattr(wrapped, WRAPPED) and not hasattr(getattr(wrapped, WRAPPED), WRAPPED)
        uninstall_routes(get_controller().api)
        result["restored"] = not hasattr(device_lib.list_local_devices, WRAPPED) and \\
            not hasattr(session.BaseSession.__init__, WRAPPED)
        result["after_uninstall"] = cpus(device_lib.list_local_devices())
        result["created"] = get_controller().api.state().devices_created
        result["eager"] = """ + CPUS + """
    """)
    assert result == {"device_lib": 3, "is_gpu_available": False, "gpu_device_name": "", "session": 3,
                      "own_config": 2, "default_session": 3, "wrapped_once": True, "restored": True,
                      "after_uninstall": 1, "created": None, "eager": 3}
    ours = [line for line in stderr.splitlines() if "tfgpu_magic" in line]
    assert ours == ["tfgpu_magic: tf.compat.v1.Session(): the config's own CPU device count (2) wins over the "
                    "policy's (3) in this session"]  # the one Session whose config sets its own count
