"""One policy for JAX and Keras 3 too, in real ipykernel kernels with real JAX (CPU build),
real TensorFlow (CPU build) and real Keras 3; TensorFlow, JAX and Keras never enter pytest.

Each directive (growth, limit, allocator, visible) meets JAX at each moment: before `import jax`, after
it, and after JAX's backends started. What proves a setting reached JAX is JAX's own reader, run as a
backend starts: jaxlib's `xla_client.generate_pjrt_gpu_plugin_options()`, which JAX's CUDA plugin calls
when `jax._src.xla_bridge.backends()` discovers its plugins, just before the backends are created
(`initialize` in https://github.com/jax-ml/jax/blob/main/jax_plugins/cuda/__init__.py). A CPU build has no CUDA plugin, so a hook registered with
`xla_bridge.register_backend_initialization_hook` (run by `_init_backend` for every backend it starts)
calls the same function at the same moment and keeps what it returned. `TF_GPU_ALLOCATOR` and
`CUDA_VISIBLE_DEVICES` are read by XLA's and CUDA's C++ code, not by that function: the hook keeps them as
the environment holds them then (`TF_GPU_ALLOCATOR=cuda_malloc_async` for JAX:
https://docs.jax.dev/en/latest/gpu_memory_allocation.html).

A size limit reaches JAX as a share of the card's total (NVML): the kernels that need totals run on
tests/fake_nvml.py's cards, installed at the inventory's chokepoint as tests/fake_gpu_kernel.py does;
one kernel runs without NVML, where JAX gets no fraction and the status says so. Four kernels, one per
order of events that needs a fresh process; each runs its steps once and the tests read them.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Iterator

import pytest
from fake_nvml import four_gpus
from kernels import CellResult, Kernel, running_kernel, tensorflow_stays_out_of_pytest  # noqa: F401 (autouse)

from tfgpu_magic.envvars import (CUDA_VISIBLE_DEVICES, NAMES, TF_FORCE_GPU_ALLOW_GROWTH, TF_GPU_ALLOCATOR,
                                 XLA_CLIENT_MEM_FRACTION, XLA_PYTHON_CLIENT_MEM_FRACTION,
                                 XLA_PYTHON_CLIENT_PREALLOCATE)
from tfgpu_magic.views.status import LABEL_WIDTH

pytestmark = [pytest.mark.kernel, pytest.mark.tensorflow]

TESTS = Path(__file__).resolve().parent

FAKE_CARDS = f"""
import sys
sys.path.insert(0, {str(TESTS)!r})
from fake_nvml import FakeNvml, four_gpus
from tfgpu_magic.gpus import inventory
_nvml = inventory.Nvml(module=FakeNvml(four_gpus(this_kernel=False)))
inventory.shared_nvml = lambda: _nvml
"""
"""Run before `%load_ext`: the kernel's NVML is four fake cards (none used by this kernel)."""

PROBE = """
def _read_at_backend_start(backend):
    import os
    from jaxlib import xla_client
    try:
        options = dict(xla_client.generate_pjrt_gpu_plugin_options())
    except ValueError as err:  # jaxlib refuses both memory-fraction variables at once
        options = {"error": str(err)}
    _at_start.update(platform=backend.platform, options=options,
                     env={name: os.environ.get(name) for name in ("CUDA_VISIBLE_DEVICES", "TF_GPU_ALLOCATOR")})
_at_start = {}
from jax._src import xla_bridge as _bridge
_bridge.register_backend_initialization_hook(_read_at_backend_start)
"""
"""Run after `import jax`, before its first op: `_at_start` gets what JAX's GPU plugin would be given."""

FIRST_OP = "jax.numpy.zeros(1).block_until_ready()"
ENV = f"{{name: __import__('os').environ.get(name) for name in {list(NAMES)!r}}}"
STARTED = "__import__('jax._src.xla_bridge', fromlist=['_']).backends_are_initialized()"
TF_INITIALIZED = ("getattr(__import__('tensorflow.python.eager.context', fromlist=['_']).context_safe(), "
                  "'_context_handle', None) is not None")
"""TensorFlow's runtime initialized: the test its own setters make (tensorflow/python/eager/context.py)."""
LIBCUDA = "'/libcuda.so' in open('/proc/self/maps').read()"
POLICY = "__import__('tfgpu_magic').current_policy().to_dict()"
HOOKS_ARMED = ("[name for name in ('tensorflow', 'jax') "
               "if __import__('tfgpu_magic.importhooks', fromlist=['_']).is_armed(name)]")

CARD_MIB = four_gpus(this_kernel=False)[1].total_mib
SHARE_2GB = "0.025"
"""2 GiB of an 80 GiB card."""
SHARE_3GB = "0.037"
"""3 GiB of an 80 GiB card is 0.0375: rounded down, never above the limit."""
JAX_READ = "read when JAX's backends started"
JAX_LOCKED = "JAX cannot change these settings in this process any more:"
NO_TOTALS = "JAX and PyTorch take a limit as a share of each card's total memory, which is unknown here"
NO_VIRTUAL = "JAX has no virtual devices: a split reaches it as one memory fraction, its parts' sum"
KERAS_GROWS = "Keras's backend is jax: TensorFlow, which Keras may import for tf.data, grows on demand"


def status_row(status: str, label: str) -> str:
    """The status row `label`, its continuation lines joined; '' where the status has none."""
    lines = status.splitlines()
    for at, line in enumerate(lines):
        if line.startswith(f"{label}:"):
            parts = [line[LABEL_WIDTH:].strip()]
            for more in lines[at + 1:]:
                if not more.startswith(" " * LABEL_WIDTH) or not more.strip():
                    break
                parts.append(more.strip())
            return " ".join(parts)
    return ""


def pending_items(status: str) -> list[str]:
    """The status's "Pending, needs a restart" items (continuation lines joined)."""
    _, found, rest = status.partition("Pending, needs a restart:\n")
    items: list[str] = []
    for line in rest.splitlines() if found else []:
        if line.startswith("  - "):
            items.append(line[4:])
        elif line.startswith("    ") and items:
            items[-1] += " " + line.strip()
        else:
            break
    return items


def joined(text: str) -> str:
    """`text` with its wrapped lines joined (the status wraps at its width)."""
    return " ".join(text.split())


@contextlib.contextmanager
def kernel_with(tmp_path: Path, **env: str) -> Iterator[Kernel]:
    """A kernel whose Keras keeps its files under `tmp_path` (Keras writes `keras.json` at import), with
    `env` set and no `KERAS_BACKEND` of the tester's own."""
    with pytest.MonkeyPatch.context() as patch:
        patch.delenv("KERAS_BACKEND", raising=False)
        for name, value in {"KERAS_HOME": str(tmp_path), **env}.items():
            patch.setenv(name, value)
        with running_kernel() as kernel:
            yield kernel


def steps_of(kernel: Kernel, cells: dict[str, str]) -> dict[str, CellResult]:
    """Run `cells` in order, each asserted to raise nothing."""
    return {name: kernel.ok(code) for name, code in cells.items()}


# ----- before `import jax`: the policy waits for JAX's import, which brings it ------------------------------
@pytest.fixture(scope="module")
def before_import(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """Fake cards; directives in turn before JAX is imported (each followed by the status and the
    environment); then ONE cell imports JAX and runs its first op; then directives after the start."""
    out: dict = {}
    with kernel_with(tmp_path_factory.mktemp("keras")) as kernel:
        kernel.ok(FAKE_CARDS)
        kernel.ok("%load_ext tfgpu_magic")
        for step in ("growth on", "growth off", "limit 50%", "limit 2GB", "allocator async", "visible 1"):
            out[step] = {"said": kernel.ok(f"%tfgpu {step}").stdout, "status": kernel.ok("%tfgpu").output,
                         "env": kernel.evaluate(ENV)}
        out["modules_before"] = kernel.loaded_modules("jax", "jaxlib")
        out["first_op"] = kernel.ok(f"%tfgpu growth on\nimport jax\n{PROBE}\n{FIRST_OP}")
        out["at_start"] = kernel.evaluate("_at_start")
        out["started_status"] = kernel.ok("%tfgpu").output
        late = ("growth off", "limit 3GB", "allocator bfc")
        out["after"] = steps_of(kernel, {step: f"%tfgpu {step}" for step in late})
        out["after_status"] = kernel.ok("%tfgpu").output
        out["restart_offer"] = kernel.ok("%tfgpu restart").output
        out["env_after"] = kernel.evaluate(ENV)
        out["split"] = kernel.ok("%tfgpu split 1 3x1GB").stdout
        out["split_status"] = kernel.ok("%tfgpu").output
    return out


def test_before_import_the_status_says_what_jax_will_be_told_without_importing_it(before_import):
    """Before `import jax` nothing of JAX's is set (the plan sets it as JAX's import finishes), and the
    status row says what its import will bring; asking never imports JAX."""
    assert CARD_MIB == 81920  # the shares below are of this card
    expected = {"growth on": "XLA_PYTHON_CLIENT_PREALLOCATE=false",
                "limit 50%": f"{XLA_CLIENT_MEM_FRACTION}=0.5",
                "limit 2GB": f"{XLA_CLIENT_MEM_FRACTION}={SHARE_2GB}",
                "allocator async": "TF_GPU_ALLOCATOR=cuda_malloc_async"}
    for step, told in expected.items():
        row = status_row(before_import[step]["status"], "JAX")
        assert row.startswith("not imported; at its import: ") and told in row, (step, row)
        assert all(before_import[step]["env"][name] is None for name in NAMES if name.startswith("XLA_")), step
    assert status_row(before_import["growth off"]["status"], "JAX") == ""  # JAX's default: nothing to tell it
    assert before_import["visible 1"]["env"][CUDA_VISIBLE_DEVICES] == "1"
    assert before_import["allocator async"]["env"][TF_GPU_ALLOCATOR] == "cuda_malloc_async"
    assert before_import["modules_before"] == set()


def test_settings_made_before_import_reach_jax_at_its_backend_start(before_import):
    """`%tfgpu growth on`, `import jax` and the first op in one cell: the settings were in place when
    JAX's backend started, as JAX's own reader of them reports (what a GPU plugin is created with)."""
    at_start = before_import["at_start"]
    assert at_start["platform"] == "cpu"
    options = at_start["options"]
    assert "error" not in options, options
    assert options["preallocate"] is False  # growth on
    assert options["memory_fraction"] == float(SHARE_2GB)  # limit 2GB on an 80 GiB card
    assert options["allocator"] == "default"  # JAX's own allocator switch is left alone
    assert at_start["env"] == {CUDA_VISIBLE_DEVICES: "1", TF_GPU_ALLOCATOR: "cuda_malloc_async"}
    assert "tfgpu_magic" not in before_import["first_op"].output


def test_status_after_the_start_says_what_jax_was_told(before_import):
    row = status_row(before_import["started_status"], "JAX")
    assert "backends started: its XLA_* settings are fixed until restart" in row
    assert f"told: TF_GPU_ALLOCATOR=cuda_malloc_async, XLA_PYTHON_CLIENT_PREALLOCATE=false, " \
           f"{XLA_CLIENT_MEM_FRACTION}={SHARE_2GB}" in row


def test_directives_after_the_start_say_what_jax_can_no_longer_change(before_import):
    """Each change JAX read at its start is named as locked, for that reason, with the restart offer;
    the variables stay as JAX read them."""
    after = before_import["after"]
    changes = {"growth off": "XLA_PYTHON_CLIENT_PREALLOCATE: false → unset",
               "limit 3GB": f"{XLA_CLIENT_MEM_FRACTION}: {SHARE_2GB} → {SHARE_3GB}",
               "allocator bfc": "TF_GPU_ALLOCATOR: cuda_malloc_async → unset"}
    for step, change in changes.items():
        said = after[step].stdout
        assert JAX_LOCKED in said and f"  - {change} ({JAX_READ})" in said.splitlines(), said
        assert "Run `%tfgpu restart`" in said
        assert "Traceback" not in after[step].output
    env = before_import["env_after"]
    assert (env[XLA_PYTHON_CLIENT_PREALLOCATE], env[XLA_CLIENT_MEM_FRACTION], env[TF_GPU_ALLOCATOR]) == \
           ("false", SHARE_2GB, "cuda_malloc_async")
    assert env[XLA_PYTHON_CLIENT_MEM_FRACTION] is None  # one name only: jaxlib 0.10 raises on both


def test_status_and_restart_offer_list_what_waits_for_a_restart(before_import):
    """The edits said "`%tfgpu` lists them": the status lists each, and `%tfgpu restart` names them as
    the changes a restart applies."""
    wanted = {f"XLA_PYTHON_CLIENT_PREALLOCATE: false → unset ({JAX_READ})",
              f"{XLA_CLIENT_MEM_FRACTION}: {SHARE_2GB} → {SHARE_3GB} ({JAX_READ})",
              f"TF_GPU_ALLOCATOR: cuda_malloc_async → unset ({JAX_READ})"}
    assert set(pending_items(before_import["after_status"])) == wanted
    offer = before_import["restart_offer"]
    assert "Changes it applies:" in offer and all(f"  - {item}" in offer.splitlines() for item in wanted), offer


def test_a_split_reaches_jax_as_its_sum_and_the_status_says_so(before_import):
    """JAX has no virtual devices: `split 1 3x1GB` is a 3 GiB share for it (the same as `limit 3GB`, so
    the change waiting for a restart stays that one), and the edit and the status say so."""
    assert NO_VIRTUAL in joined(before_import["split"])
    status = before_import["split_status"]
    assert NO_VIRTUAL in joined(status)
    assert f"{XLA_CLIENT_MEM_FRACTION}: {SHARE_2GB} → {SHARE_3GB} ({JAX_READ})" in pending_items(status)


# ----- after `import jax`, before its first op; no NVML (this machine as it is) -------------------------------
@pytest.fixture(scope="module")
def after_import(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """No NVML: `import jax` and `%tfgpu growth on` in one cell, directives one cell each, the last one
    (`allocator async`) in the cell of the first op; then `visible` after the start."""
    out: dict = {}
    with kernel_with(tmp_path_factory.mktemp("keras")) as kernel:
        kernel.ok("%load_ext tfgpu_magic")
        out["growth on"] = {"said": kernel.ok(f"import jax\n{PROBE}\n%tfgpu growth on").stdout,
                            "env": kernel.evaluate(ENV)}
        out["status"] = kernel.ok("%tfgpu").output
        for step in ("growth off", "limit 2GB", "visible 0"):
            out[step] = {"said": kernel.ok(f"%tfgpu {step}").stdout, "env": kernel.evaluate(ENV)}
        out["limit_status"] = kernel.ok("%tfgpu").output
        out["policy"] = kernel.evaluate(POLICY)
        out["percent"] = kernel.run("%tfgpu limit 50%")
        out["policy_after_percent"] = kernel.evaluate(POLICY)
        out["env_before_op"] = kernel.evaluate(ENV)
        out["started_before_op"] = kernel.evaluate(STARTED)
        out["first_op"] = kernel.ok(f"%tfgpu allocator async\n{FIRST_OP}")
        out["at_start"] = kernel.evaluate("_at_start")
        out["libcuda"] = kernel.evaluate(LIBCUDA)
        out["visible_after"] = kernel.ok("%tfgpu visible 1").stdout
        out["env_after"] = kernel.evaluate(ENV)
    return out


def test_after_import_each_directive_sets_what_jax_reads_at_once(after_import):
    """JAX imported, backends not started: each directive is applied to the environment right away."""
    assert "Applied: " in after_import["growth on"]["said"] and "XLA_PYTHON_CLIENT_PREALLOCATE=false" in \
        after_import["growth on"]["said"]
    assert after_import["growth on"]["env"][XLA_PYTHON_CLIENT_PREALLOCATE] == "false"
    assert after_import["growth off"]["env"][XLA_PYTHON_CLIENT_PREALLOCATE] is None  # JAX's default again
    assert "unset XLA_PYTHON_CLIENT_PREALLOCATE" in after_import["growth off"]["said"]
    assert after_import["env_before_op"][TF_GPU_ALLOCATOR] is None  # asked for only in the cell of the first op
    assert after_import["visible 0"]["env"][CUDA_VISIBLE_DEVICES] == "0"
    row = status_row(after_import["status"], "JAX")
    assert row.endswith("imported, backends not started; told: XLA_PYTHON_CLIENT_PREALLOCATE=false"), row


def test_without_card_totals_a_size_limit_gives_jax_no_fraction_and_says_so(after_import):
    """No NVML here: a size cannot become a share of the card, so no fraction variable is set (neither
    name), the status says JAX is not limited, and `limit NN%` is a one-line refusal that changes nothing."""
    env = after_import["limit 2GB"]["env"]
    assert env[XLA_CLIENT_MEM_FRACTION] is None and env[XLA_PYTHON_CLIENT_MEM_FRACTION] is None
    assert NO_TOTALS in joined(after_import["limit_status"])
    percent = after_import["percent"]
    assert percent.status == "error" and percent.output.strip().startswith("UsageError: ")
    assert "unknown" in percent.output and "Traceback" not in percent.output
    assert after_import["policy_after_percent"] == after_import["policy"]


def test_settings_made_after_import_reach_jax_at_its_backend_start(after_import):
    """`%tfgpu` after `import jax`, even in the cell of the first op: JAX's reader sees `growth off` as
    its default (no preallocate option), no fraction, and the allocator and visible GPUs asked for."""
    assert after_import["started_before_op"] is False
    options = after_import["at_start"]["options"]
    assert "error" not in options and "preallocate" not in options and "memory_fraction" not in options, options
    assert after_import["at_start"]["env"] == {CUDA_VISIBLE_DEVICES: "0", TF_GPU_ALLOCATOR: "cuda_malloc_async"}


def test_visible_after_a_cpu_backend_started_still_goes_to_cuda(after_import):
    """JAX's CPU backend never starts CUDA (libcuda is not loaded), so `CUDA_VISIBLE_DEVICES` is still
    unread and is set, not reported as locked."""
    assert after_import["libcuda"] is False
    said = after_import["visible_after"]
    assert "CUDA_VISIBLE_DEVICES=1" in said and "cannot change" not in said
    assert after_import["env_after"][CUDA_VISIBLE_DEVICES] == "1"


# ----- `import tensorflow` first: TensorFlow 2.21 imports JAX ----------------------------------------------
@pytest.fixture(scope="module")
def tensorflow_first(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """`import tensorflow` (which imports JAX), then the policy, then JAX's first op."""
    out: dict = {}
    with kernel_with(tmp_path_factory.mktemp("keras")) as kernel:
        kernel.ok("%load_ext tfgpu_magic")
        kernel.ok("import tensorflow as tf")
        out["modules"] = kernel.loaded_modules("jax", "keras")
        out["status"] = kernel.ok("%tfgpu").output
        out["edits"] = steps_of(kernel, {"growth": "%tfgpu growth on", "allocator": "%tfgpu allocator async"})
        out["env"] = kernel.evaluate(ENV)
        kernel.ok(f"import jax\n{PROBE}\n{FIRST_OP}")
        out["at_start"] = kernel.evaluate("_at_start")
        out["tf_initialized"] = kernel.evaluate(TF_INITIALIZED)
        out["late"] = kernel.ok("%tfgpu growth off").stdout
    return out


def test_tensorflow_imports_jax_and_the_policy_still_reaches_it(tensorflow_first):
    """TensorFlow's import brought JAX (backends not started): the policy set after it reaches JAX's
    backend start, and JAX's first op leaves TensorFlow's runtime uninitialized."""
    assert "jax" in tensorflow_first["modules"]
    assert status_row(tensorflow_first["status"], "JAX").endswith(
        "imported, backends not started; told nothing (its default: 75% of each GPU at its first op)")
    assert "XLA_PYTHON_CLIENT_PREALLOCATE=false" in tensorflow_first["edits"]["growth"].stdout
    assert tensorflow_first["env"][XLA_PYTHON_CLIENT_PREALLOCATE] == "false"
    options = tensorflow_first["at_start"]["options"]
    assert options["preallocate"] is False and "memory_fraction" not in options, options
    assert tensorflow_first["at_start"]["env"][TF_GPU_ALLOCATOR] == "cuda_malloc_async"
    assert tensorflow_first["tf_initialized"] is False


def test_with_tensorflow_imported_a_late_change_names_jax_as_the_reader(tensorflow_first):
    late = tensorflow_first["late"]
    assert JAX_LOCKED in late
    assert f"  - XLA_PYTHON_CLIENT_PREALLOCATE: false → unset ({JAX_READ})" in late.splitlines()
    assert "Run `%tfgpu restart`" in late


# ----- Keras 3 on JAX: TensorFlow comes along, and never takes the card ----------------------------------------
@pytest.fixture(scope="module")
def keras_on_jax(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """`KERAS_BACKEND=jax`, fake cards: a limit (no growth directive), then `import tensorflow` (which
    imports JAX and Keras: JAX's import finishes inside TensorFlow's), `import keras`, a Keras op."""
    out: dict = {}
    with kernel_with(tmp_path_factory.mktemp("keras"), KERAS_BACKEND="jax") as kernel:
        kernel.ok(FAKE_CARDS)
        kernel.ok("%load_ext tfgpu_magic")
        out["status"] = kernel.ok("%tfgpu").output
        out["limit"] = kernel.ok("%tfgpu limit 2GB").stdout
        out["limit_status"] = kernel.ok("%tfgpu").output
        out["env_before_tf"] = kernel.evaluate(ENV)
        out["modules_before_tf"] = kernel.loaded_modules("tensorflow", "keras", "jax")
        out["import_tf"] = kernel.ok("import tensorflow as tf")
        out["modules_after_tf"] = kernel.loaded_modules("keras", "jax")
        out["hooks_after_tf"] = kernel.evaluate(HOOKS_ARMED)
        out["env_after_tf"] = kernel.evaluate(ENV)
        out["backend"] = kernel.evaluate("__import__('keras').backend.backend()")
        kernel.ok(PROBE)
        kernel.ok("import keras\nkeras.ops.ones(1)")
        out["at_start"] = kernel.evaluate("_at_start")
        out["imported_status"] = kernel.ok("%tfgpu").output
        out["tf_initialized"] = kernel.evaluate(TF_INITIALIZED)
    return out


def test_status_names_keras_backend_before_and_after_its_import(keras_on_jax):
    assert status_row(keras_on_jax["status"], "Keras") == "backend jax (KERAS_BACKEND)"
    assert status_row(keras_on_jax["imported_status"], "Keras") == "backend jax (as imported)"
    assert keras_on_jax["backend"] == "jax"


def test_keras_on_jax_keeps_tensorflow_off_the_card(keras_on_jax):
    """With Keras on JAX and no growth directive, the policy sets TF_FORCE_GPU_ALLOW_GROWTH=true before
    TensorFlow is imported (Keras is not imported yet, so this is ours, not Keras's own), and it stays
    through TensorFlow's import; the status says why. (TensorFlow's reader of it, the GPU BFC allocator's
    GetAllowGrowthValue, exists only on a GPU build: on this CPU the variable is what can be shown.)"""
    assert keras_on_jax["modules_before_tf"] == set()
    assert keras_on_jax["env_before_tf"][TF_FORCE_GPU_ALLOW_GROWTH] == "true"
    assert "TF_FORCE_GPU_ALLOW_GROWTH=true" in keras_on_jax["limit"]
    assert KERAS_GROWS in joined(keras_on_jax["limit_status"])
    assert "TF_FORCE_GPU_ALLOW_GROWTH=true" in status_row(keras_on_jax["imported_status"], "Variables")
    assert keras_on_jax["env_after_tf"][TF_FORCE_GPU_ALLOW_GROWTH] == "true"
    assert keras_on_jax["tf_initialized"] is False


def test_jax_imported_inside_tensorflow_import_gets_the_policy(keras_on_jax):
    """TensorFlow's import imports JAX: JAX's import hook applies the policy there, without a warning,
    and the share reaches JAX's backend start through Keras's first op."""
    assert {"keras", "jax"} <= keras_on_jax["modules_after_tf"]
    assert "tfgpu_magic" not in keras_on_jax["import_tf"].output
    assert keras_on_jax["hooks_after_tf"] == []  # both imports done: no hook left behind
    assert f"at its import: {XLA_CLIENT_MEM_FRACTION}={SHARE_2GB}" in status_row(keras_on_jax["limit_status"], "JAX")
    assert keras_on_jax["env_after_tf"][XLA_CLIENT_MEM_FRACTION] == SHARE_2GB
    options = keras_on_jax["at_start"]["options"]
    assert "error" not in options and options["memory_fraction"] == float(SHARE_2GB), options


def test_a_variable_jaxs_backends_read_waits_for_a_restart_though_tensorflow_found_no_gpu(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """TensorFlow initialized without a GPU never creates a GPU allocator, so `TF_GPU_ALLOCATOR` is not
    locked by TensorFlow; but JAX's backends, started, read it too: `allocator async` then waits for a
    restart, read when JAX's backends started (a controller on FakeTF, JAX's state as started)."""
    from fake_tf import FakeTF

    from tfgpu_magic.controller import Controller
    from tfgpu_magic.frameworks import jax
    from tfgpu_magic.gpus.inventory import Inventory, InventoryCatalog

    environ: dict[str, str] = {}
    fake = FakeTF(0, imported=True, environ=environ)
    controller = Controller(api=fake, environ=environ, catalog=InventoryCatalog(Inventory(error="no NVML here")))
    fake.initialize()
    monkeypatch.setattr(jax, "state", lambda: jax.JaxState(imported=True, started=True, version="0.10.2"))
    report = controller.edit([controller.parse("allocator async")])
    assert [(change.device, change.why) for change in report.locked] == [(TF_GPU_ALLOCATOR, "jax_backends")]
    assert TF_GPU_ALLOCATOR not in environ and report.applied == []
    monkeypatch.setattr(jax, "state", lambda: jax.JaxState(imported=True, started=False, version="0.10.2"))
    report = controller.edit([controller.parse("allocator async")])
    assert report.locked == [] and environ[TF_GPU_ALLOCATOR] == "cuda_malloc_async"  # TensorFlow alone: set
