"""`%tfgpu` and `%%tfgpu` on a real IPython shell. TensorFlow is never imported in this process."""

from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
import sys
import time
from typing import Callable, Iterator

import pytest
from hypothesis import HealthCheck, assume, given, settings
from IPython.core.error import UsageError
from IPython.core.profiledir import ProfileDir
from traitlets.config import Config

import tfgpu_magic
import tfgpu_magic.controller
from cases import HASH_IN_WORD, HOSTILE, HUGE, HUGE_NUMBERS, NON_ASCII, params
from strategies import FUZZ_EXAMPLES, directive_lines
from tfgpu_magic import importhooks
from tfgpu_magic.tf import quietimport
from tfgpu_magic.tf.apply import ApplyReport, Change
from tfgpu_magic.controller import Controller
from tfgpu_magic.errors import PolicyError
from tfgpu_magic.language.directives import ACTIONS, REGISTRY
from tfgpu_magic.language.grammar import split_words
from tfgpu_magic.views.magics import split_options
from tfgpu_magic.gpus.inventory import Inventory, InventoryCatalog
from tfgpu_magic.views.magics import TFGPUMagics, watch_tensorflow_import
from tfgpu_magic.envvars import NAMES as OUR_ENV
from tfgpu_magic.language.policy import Policy

NO_NVML = "no NVML in these tests"


def new_controller(environ: dict | None = None) -> Controller:
    """A controller over `environ` (not os.environ) and a GPU inventory that is unavailable, as on a
    machine without an NVIDIA driver, so results do not depend on the machine's GPUs."""
    catalog = InventoryCatalog(Inventory(error=NO_NVML))
    return Controller(environ={} if environ is None else environ, catalog=catalog)


@pytest.fixture
def make_magic(shell, tmp_path, monkeypatch) -> Iterator[Callable[..., Controller]]:
    """Register fresh magics over a private controller (and profile dir); put the old ones back after."""
    previous = shell.magics_manager.registry["TFGPUMagics"]
    outside = {name: os.environ.get(name) for name in OUR_ENV}
    monkeypatch.setattr(shell, "profile_dir", ProfileDir.create_profile_dir(str(tmp_path / "profile")))

    def make(environ: dict | None = None) -> Controller:
        controller = new_controller(environ)
        shell.register_magics(TFGPUMagics(shell, controller=controller))
        return controller

    yield make
    quietimport.disarm()
    shell.register_magics(previous)
    assert {name: os.environ.get(name) for name in OUR_ENV} == outside, "the test touched os.environ"
    assert "tensorflow" not in sys.modules


@pytest.fixture
def controller(make_magic) -> Controller:
    return make_magic()


@pytest.fixture
def tfgpu(shell, capsys) -> Callable[[str], str]:
    """Run `%tfgpu LINE`, return what it printed."""

    def run(line: str) -> str:
        capsys.readouterr()
        shell.run_line_magic("tfgpu", line)
        return capsys.readouterr().out

    return run


def test_load_ext_registers_line_and_cell_magic(shell) -> None:
    assert shell.find_line_magic("tfgpu") is not None
    assert shell.find_cell_magic("tfgpu") is not None


def test_edit_updates_policy_environment_and_arms_hook(controller: Controller, tfgpu) -> None:
    out = tfgpu("growth on")
    assert controller.policy == Policy(growth=True)
    assert controller.environ == {"CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
    assert "applies when TensorFlow is imported" in out
    assert quietimport.is_armed()


def test_the_hook_armed_at_load_hands_on_what_applying_left_undone(shell, controller: Controller) -> None:
    """Loaded without a policy, the extension arms the import hook itself (`watch_tensorflow_import`);
    its callback hands an apply that left something undone to `on_import_failure` (the views' warning),
    as the controller's own callback does."""
    quietimport.disarm()
    magics = shell.magics_manager.registry["TFGPUMagics"]
    watch_tensorflow_import(magics)
    hook = next(finder for finder in sys.meta_path if importhooks.is_hook(finder) and finder.target == "tensorflow")
    undone = ApplyReport(controller.state(), locked=[Change("growth", "GPU:0", False, True)])
    handed: list[ApplyReport] = []
    controller.on_import_failure = handed.append
    controller.apply = lambda: undone  # type: ignore[method-assign]
    hook.callback()
    assert not undone.ok and handed == [undone]


def test_status_shows_policy_and_tensorflow_state(controller: Controller, tfgpu) -> None:
    empty = tfgpu("")
    assert "TensorFlow: not imported" in empty
    assert "growth" not in empty
    tfgpu("growth on")
    tfgpu("limit 2GB 0")
    out = tfgpu("")
    assert "not imported" in out
    assert "growth on" in out and "limit 2GB on GPU 0" in out
    assert "TF_FORCE_GPU_ALLOW_GROWTH=true" in out
    assert tfgpu("status") == out


def test_export_prints_code_without_changing_anything(controller: Controller, tfgpu) -> None:
    tfgpu("visible 1")
    tfgpu("growth on")
    before = (controller.policy, dict(controller.environ))
    python = tfgpu("export")
    compile(python, "<export>", "exec")
    assert "os.environ['CUDA_VISIBLE_DEVICES'] = '1'" in python and "set_memory_growth" in python
    assert "export CUDA_VISIBLE_DEVICES=1" in tfgpu("export env").splitlines()
    assert Policy.from_dict(json.loads(tfgpu("export json"))) == controller.policy
    assert (controller.policy, dict(controller.environ)) == before


def test_cell_applies_every_line(shell, controller: Controller, capsys) -> None:
    shell.run_cell_magic("tfgpu", "", "# shared box\n\ngrowth on\nlimit 1GB 0  # small card\nsplit cpu 2\n")
    assert controller.policy == Policy(growth=True, limits=(("0", 1024),), cpu_devices=2)
    assert controller.environ["TF_FORCE_GPU_ALLOW_GROWTH"] == "true"
    assert "applies when TensorFlow is imported" in capsys.readouterr().out


@pytest.mark.parametrize(
    "line, cell, expect",
    [
        ("", "growth on\nlimit 0\nsplit cpu 2\n", "line 2: size '0'"),
        ("", "growth on\n\nfoo\n", "line 3: unknown directive 'foo'"),
        ("", "growth on\nexport\n", "line 2: `export` is not allowed"),
        # was: "unexpected '--yes'"
        ("", "growth on\nrestart --yes\n", "line 2: `restart` is not allowed in a %%tfgpu cell"),
        ("", "who --shutdown abc --yes\n", "line 1: `who` is not allowed in a %%tfgpu cell"),
        ("growth on", "split cpu 2\n", "not on the first line"),
        ("", "growth on\nlimit 1GB 0\nsplit 0 2x1GB\n", "the cell's result: GPU 0 has both a limit and a split"),
    ],
)
def test_bad_cell_changes_nothing(shell, controller: Controller, tfgpu, capsys, line, cell, expect) -> None:
    tfgpu("growth off")
    before = (controller.policy, dict(controller.environ))
    with pytest.raises(UsageError) as info:
        shell.run_cell_magic("tfgpu", line, cell)
    assert expect in str(info.value)
    assert (controller.policy, dict(controller.environ)) == before
    assert capsys.readouterr().out == ""


@pytest.mark.parametrize("case", params("magic"))
def test_bad_line_is_usage_error_and_changes_nothing(controller: Controller, tfgpu, capsys, case) -> None:
    for line in case.setup:
        tfgpu(line)
    before = (controller.policy, dict(controller.environ))
    with pytest.raises(UsageError) as info:
        tfgpu(case.line)
    assert case.expect in str(info.value)
    assert "\n" not in str(info.value)
    assert (controller.policy, dict(controller.environ)) == before
    assert capsys.readouterr().out == ""


def test_percent_error_says_why_there_is_no_inventory(controller: Controller, tfgpu) -> None:
    with pytest.raises(UsageError) as info:
        tfgpu("limit 50%")
    assert NO_NVML in str(info.value)


@pytest.mark.parametrize("line", ["--foo", "growth on --foo", "-x"])
def test_unknown_option_is_usage_error(controller: Controller, tfgpu, line: str) -> None:
    with pytest.raises(UsageError) as info:
        tfgpu(line)
    assert line.split()[-1] in str(info.value)
    assert controller.policy == Policy() and controller.environ == {}


@pytest.mark.parametrize(
    "line, option",
    [("restart --yes --yes", "--yes"), ("doctor --json --json", "--json"), ("doctor --json=1 --json", "--json"),
     ("kernelspec tf0 --display-name a --display-name=b", "--display-name"),
     ("who --shutdown k1 --shutdown k2 --yes", "--shutdown")],
)
def test_an_option_given_twice_is_one_line_error(controller: Controller, tfgpu, capsys, line: str,
                                                 option: str) -> None:
    """Was accepted: `restart --yes --yes` restarted, `doctor --json --json` printed JSON."""
    with pytest.raises(UsageError) as info:
        tfgpu(line)
    assert str(info.value) == (f"{option} takes no value" if "=1" in line else f"{option} is given twice; give it once")
    assert controller.policy == Policy() and controller.environ == {} and capsys.readouterr().out == ""


@pytest.mark.parametrize("name", ["\x1b[31mred\x1b[0m", "two\nlines", "bell\x07", "csi\x9b31m", "evil\u202egnp.exe",
                                  "isolate\u2066x\u2069", "line\u2028break"])
def test_a_display_name_with_control_characters_is_refused(controller: Controller, tfgpu, monkeypatch,
                                                           tmp_path, name: str) -> None:
    """Was accepted: an ANSI escape in the launcher's name. Nothing is installed."""
    monkeypatch.setenv("JUPYTER_DATA_DIR", str(tmp_path / "data"))
    with pytest.raises(UsageError) as info:
        tfgpu(f"kernelspec tf0 --display-name '{name}'")
    message = str(info.value)
    assert message.startswith("--display-name: control characters such as ") and "are not allowed: " in message
    assert "\n" not in message and not any(char in message for char in name if not char.isprintable())
    assert not (tmp_path / "data").exists()


def test_a_display_name_in_any_script_is_accepted() -> None:
    words, options = split_options("kernelspec tf0 --display-name 'TensorFlow · GPU 0 — ünï 日本 ✓'")
    assert words == ["kernelspec", "tf0"] and options == {"--display-name": "TensorFlow · GPU 0 — ünï 日本 ✓"}


GRAMMAR = [*(usage for directive in REGISTRY for usage in directive.usage), "(all is the same as on)",
           "default: every visible GPU", "SIZE: MiB (4096)", "begins a comment", "not expanded", "any order",
           "--display-name TEXT", "with restart: restart now"]


def test_help_shows_the_grammar(shell, capsys) -> None:
    shell.run_line_magic("pinfo", "%tfgpu")
    out = capsys.readouterr().out
    assert [form for form in GRAMMAR if form not in out] == []
    assert [form for form in GRAMMAR if form not in TFGPUMagics.tfgpu.getdoc()] == []


@pytest.fixture
def load_with_config(shell, make_magic, monkeypatch, capsys):  # noqa: ANN201
    """Load the extension into a shell whose config sets `TFGPUMagics.default_policy`."""

    def load(default_policy: list[str]) -> tuple[Controller, str, str]:
        """The controller it loaded with, and what loading printed on stdout and on stderr."""
        controller = new_controller()
        monkeypatch.setattr(tfgpu_magic.controller, "get_controller", lambda: controller)  # the shared one
        monkeypatch.setitem(shell.config, "TFGPUMagics", Config(default_policy=default_policy))
        capsys.readouterr()
        tfgpu_magic.load_ipython_extension(shell)
        printed = capsys.readouterr()
        return controller, printed.out, printed.err

    return load


def test_configured_default_policy_applies_at_load(load_with_config, tfgpu) -> None:
    controller, out, err = load_with_config(["growth on", "split cpu 2"])
    assert controller.policy == Policy(growth=True, cpu_devices=2)
    assert controller.environ["TF_FORCE_GPU_ALLOW_GROWTH"] == "true"
    assert out == "" and err == ""
    assert Policy.from_dict(json.loads(tfgpu("export json"))) == controller.policy  # %tfgpu now uses it


@pytest.mark.parametrize("default", [["growth maybe"], ["growth on", "limit 0"], ["status"]])
def test_invalid_default_policy_is_one_line_and_ignored(load_with_config, tfgpu, default) -> None:
    controller, out, err = load_with_config(default)
    assert out == ""
    assert err.startswith("tfgpu_magic: ignoring the configured default_policy: ") and len(err.splitlines()) == 1
    assert controller.policy == Policy() and controller.environ == {}
    assert "not imported" in tfgpu("")  # the magic still works


def test_reset_restores_variables_the_tool_changed(make_magic, tfgpu) -> None:
    """Indices count within the inherited grant (here by UUID prefixes: no inventory needed)."""
    outside = {"TF_GPU_ALLOCATOR": "foo", "CUDA_VISIBLE_DEVICES": "GPU-3a,GPU-1b", "HOME": "/home/me"}
    controller = make_magic(dict(outside))
    tfgpu("allocator async")
    tfgpu("visible 1,0")
    tfgpu("growth on")
    assert controller.environ == {**outside, "TF_GPU_ALLOCATOR": "cuda_malloc_async",
                                  "CUDA_VISIBLE_DEVICES": "GPU-1b,GPU-3a", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
    tfgpu("reset")
    assert controller.policy == Policy()
    assert controller.environ == outside


def test_allocator_bfc_unsets_then_reset_restores(make_magic, tfgpu) -> None:
    controller = make_magic({"TF_GPU_ALLOCATOR": "foo"})
    tfgpu("allocator bfc")
    assert "TF_GPU_ALLOCATOR" not in controller.environ
    tfgpu("reset")
    assert controller.environ == {"TF_GPU_ALLOCATOR": "foo"}


LOAD_PROBE = """
import json, sys
from IPython.core.interactiveshell import InteractiveShell
def heavy():
    return [name for name in ("tensorflow", "keras", "ipywidgets", "pynvml") if name in sys.modules]
shell = InteractiveShell.instance()
seen = {}
shell.run_line_magic("load_ext", "tfgpu_magic")
seen["load"] = heavy()
seen["ours"] = sorted(name for name in sys.modules if name.startswith("tfgpu_magic"))
shell.run_line_magic("tfgpu", "growth on")
shell.run_line_magic("tfgpu", "export")
seen["edit"] = heavy()
shell.run_line_magic("tfgpu", "")
seen["status"] = [name for name in heavy() if name != "pynvml"]  # the status lists GPUs through NVML
print(json.dumps(seen))
"""


def test_load_ext_imports_nothing_heavy(tmp_path) -> None:
    """In a fresh process: loading and editing import no TensorFlow, ipywidgets or NVML; the status no
    TensorFlow or ipywidgets."""
    env = {k: v for k, v in os.environ.items() if k not in OUR_ENV}
    env["IPYTHONDIR"] = str(tmp_path)
    done = subprocess.run([sys.executable, "-c", LOAD_PROBE], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout.splitlines()[-1])
    assert seen.pop("ours") == LOAD_PATH
    assert seen == {"load": [], "edit": [], "status": []}


LOAD_PATH = sorted(["tfgpu_magic", "tfgpu_magic._version", "tfgpu_magic.errors", "tfgpu_magic.views",
                    "tfgpu_magic.views.magics",
                    "tfgpu_magic.jupyter", "tfgpu_magic.jupyter.startup", "tfgpu_magic.jupyter.persist",
                    "tfgpu_magic.tf", "tfgpu_magic.tf.quietimport", "tfgpu_magic.importhooks"])
"""Every module of ours `%load_ext` imports where no policy exists (each costs about 0.1 ms; the
CONTRIBUTING.md's Speed section says why each is there): a new one on this path shows up here."""


# ----- fuzz: a line through the magic is a policy or a UsageError, and an error changes nothing -----
SIDE_EFFECTS = set(ACTIONS) - {"status", "apply", "export"}
"""Actions that touch files, kernels or widgets (every action but these three, so a new one is left
out until it is known to be harmless); the fuzz leaves them to their own tests."""


@settings(max_examples=FUZZ_EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(line=directive_lines())
def test_fuzzed_line_is_a_policy_or_a_usage_error(make_magic, shell, line: str) -> None:
    """Random and mutated lines: either the magic accepts them (a valid policy) or it raises a
    UsageError, and then the policy and the environment are exactly as before."""
    try:
        words = split_words(line)
    except PolicyError:
        words = []
    assume(not words or words[0].lower() not in SIDE_EFFECTS)
    environ = {"TF_GPU_ALLOCATOR": "user-value"}
    controller = make_magic(environ)
    controller.edit([controller.parse("growth on"), controller.parse("split cpu 2")])
    before_policy, before_env = controller.policy, dict(environ)
    with contextlib.redirect_stdout(io.StringIO()):
        try:
            shell.run_line_magic("tfgpu", line)
        except UsageError as err:
            assert "\n" not in str(err)
            assert controller.policy == before_policy and environ == before_env
            return
    controller.policy.validate()


@pytest.mark.parametrize(
    "line, says",
    [
        ("kernelspec k --display-name --remove", "--display-name needs a value"),
        ("kernelspec k --display-name T --remove", "makes no sense with --remove"),
    ],
)
def test_kernelspec_option_mistakes(controller: Controller, tfgpu, line: str, says: str) -> None:
    """An option where a value belongs, or two options that contradict, is a one-line UsageError."""
    with pytest.raises(UsageError, match=says):
        tfgpu(line)


# ----- hostile lines -------------------------------------------------------------------------------
@pytest.mark.parametrize("line", HOSTILE, ids=lambda line: line if len(line) <= 40 else f"{line[:30]}…({len(line)})")
def test_hostile_line_is_one_short_usage_error(shell, make_magic, tfgpu, capsys, line: str) -> None:
    """Each hostile line of the adversarial replay: one UsageError, one short line, at once, and the
    policy, the controller's environment and os.environ as before."""
    controller = make_magic({"TF_GPU_ALLOCATOR": "user-value"})
    tfgpu("growth on")
    shell.user_ns.update(gpu="0", size="1GB")
    before = (controller.policy, dict(controller.environ), dict(os.environ))
    started = time.perf_counter()
    with pytest.raises(UsageError) as info:
        tfgpu(line)
    assert time.perf_counter() - started < 2
    message = str(info.value)
    assert "\n" not in message and len(message) < 300 and "Exceeds the limit" not in message
    assert (controller.policy, dict(controller.environ), dict(os.environ)) == before
    assert capsys.readouterr().out == ""


@pytest.mark.parametrize("line", HUGE_NUMBERS[:5] + NON_ASCII[:3] + HASH_IN_WORD[:1])
def test_hostile_line_in_a_cell_names_the_line(shell, controller: Controller, line: str) -> None:
    with pytest.raises(UsageError) as info:
        shell.run_cell_magic("tfgpu", "", f"growth on\n{line}\n")
    assert str(info.value).startswith("line 2: ") and len(str(info.value)) < 300
    assert controller.policy == Policy() and controller.environ == {}


@pytest.mark.parametrize("directives", [(f"visible {HUGE}",), ("growth on", f"split cpu {HUGE}"), ("limit ４GB",)])
def test_configure_raises_policy_error_for_hostile_lines(monkeypatch, directives: tuple) -> None:
    controller = new_controller()
    monkeypatch.setattr(tfgpu_magic.controller, "get_controller", lambda: controller)
    with pytest.raises(PolicyError) as info:
        tfgpu_magic.configure(*directives)
    assert "Exceeds the limit" not in str(info.value) and len(str(info.value)) < 300
    assert controller.policy == Policy() and controller.environ == {}


@pytest.mark.parametrize("given", [["growth", "on"], None, 5, b"growth on"])
def test_configure_names_its_argument_type(monkeypatch, given: object) -> None:
    """A list, None, a number or bytes is a clear TypeError about configure()'s arguments, not a
    shlex or len() error from deep inside; nothing changes."""
    controller = new_controller()
    monkeypatch.setattr(tfgpu_magic.controller, "get_controller", lambda: controller)
    with pytest.raises(TypeError, match=r"^configure\(\) takes directive strings"):
        tfgpu_magic.configure(given)  # type: ignore[arg-type]
    with pytest.raises(PolicyError, match="empty directive"):
        tfgpu_magic.configure("growth on", "  ")
    assert controller.policy == Policy() and controller.environ == {}


def test_lines_are_not_variable_expanded(shell, controller: Controller, tfgpu) -> None:
    """`$name` / `{expr}` stay as typed (`no_var_expand`): no directive uses them, and IPython's
    expansion of a long line took minutes before the magic ran."""
    shell.user_ns["gpu"] = "0"
    with pytest.raises(UsageError, match=r"not a GPU: '\$gpu'"):
        tfgpu("visible $gpu")
    with pytest.raises(UsageError, match=r"not a GPU: '\{gpu\}'"):
        tfgpu("visible {gpu}")
    assert controller.policy == Policy()


# ----- messages -------------------------------------------------------------------------------------
def test_reset_says_what_it_cleared_and_restored(make_magic, tfgpu) -> None:
    controller = make_magic({"CUDA_VISIBLE_DEVICES": "3,1", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"})
    tfgpu("visible 1")  # the grant's second GPU: nvidia-smi's 1, CUDA counting in PCI order
    assert controller.environ["CUDA_VISIBLE_DEVICES"] == "1"
    out = tfgpu("reset")
    assert "Policy cleared" in out and "CUDA_VISIBLE_DEVICES=3,1" in out and "CUDA_DEVICE_ORDER" not in out
    assert "Recorded" not in out and "applies when TensorFlow is imported" not in out
    assert "No variable needed restoring." in tfgpu("reset")


def test_apply_before_import_says_there_is_nothing_to_apply_yet(controller: Controller, tfgpu) -> None:
    tfgpu("split cpu 2")
    out = tfgpu("apply")
    assert out.strip() == (
        "Nothing to apply yet: TensorFlow is not imported; the policy applies at `import tensorflow`."
    )


@pytest.fixture
def locked(make_magic, shell) -> Controller:
    """Magics over a fake TensorFlow whose runtime is initialized (every device setting locked)."""
    from fake_tf import FakeTF

    environ: dict[str, str] = {}
    fake = FakeTF(1, imported=True, environ=environ)
    controller = Controller(api=fake, environ=environ, catalog=InventoryCatalog(Inventory(error=NO_NVML)))
    shell.register_magics(TFGPUMagics(shell, controller=controller))
    fake.initialize()
    return controller


def test_locked_hint_in_terminal_ipython_skips_restart(locked: Controller, shell, tfgpu) -> None:
    """Terminal IPython (no kernel) cannot run `%tfgpu restart`: the hint says how to get there instead."""
    assert getattr(shell, "kernel", None) is None
    out = tfgpu("split cpu 2")
    assert "cannot change" in out and "%tfgpu restart" not in out
    assert "Restart IPython" in out and "%tfgpu default save" in out
    assert "Nothing else was applied." not in out  # nothing was applied or tried


def test_locked_hint_in_a_kernel_offers_restart(locked: Controller, shell, tfgpu, monkeypatch) -> None:
    monkeypatch.setattr(shell, "kernel", object(), raising=False)
    assert "Run `%tfgpu restart`" in tfgpu("split cpu 2")


def test_bare_status_without_gpus_reads_at_a_glance(controller: Controller, tfgpu) -> None:
    assert tfgpu("").splitlines() == [
        "TensorFlow: not imported",
        "Policy:     none (TensorFlow defaults)",
        "Variables:  none set",
        f"GPUs:       none found: {NO_NVML} — `%tfgpu doctor` says more",
    ]


def test_limit_on_every_gpu_and_one_gpu_is_one_phrase(controller: Controller, tfgpu) -> None:
    tfgpu("limit 4GB")
    tfgpu("limit 1GB 0")
    assert "Policy:     limit 1GB on GPU 0, 4GB on every other visible GPU" in tfgpu("")


def test_unknown_option_gets_a_suggestion(controller: Controller, tfgpu) -> None:
    with pytest.raises(UsageError, match="unknown option '--yse'; did you mean `--yes`"):
        tfgpu("restart --yse")


# ----- a cell is validated as a whole ---------------------------------------------------------------
@pytest.mark.parametrize(
    "cell",
    ["limit 1GB 1\nvisible 0,1\n", "visible 0,1\nlimit 1GB 1\n", "split 0 2x1GB\nlimit off 0\n",
     "visible none\nvisible 0\nlimit 1GB 0\n"],
)
def test_cell_lines_may_come_in_any_order(shell, controller: Controller, tfgpu, cell: str) -> None:
    """Only the cell's result is validated: from `visible 0`, `limit 1GB 1` then `visible 0,1` passes."""
    tfgpu("visible 0")
    if "limit off 0" in cell:
        tfgpu("limit 1GB 0")
    shell.run_cell_magic("tfgpu", "", cell)
    controller.policy.validate()
    assert controller.policy.limits or controller.policy.splits


def test_invalid_cell_result_says_it_concerns_the_result(shell, controller: Controller, tfgpu) -> None:
    tfgpu("visible 0")
    with pytest.raises(UsageError, match=r"^the cell's result: GPU 1 has a limit or split but is not visible"):
        shell.run_cell_magic("tfgpu", "", "visible 0,1\nlimit 1GB 1\nvisible 0\n")
    assert controller.policy == Policy(visible=("0",))


def test_configure_validates_only_the_result(monkeypatch) -> None:
    controller = new_controller()
    monkeypatch.setattr(tfgpu_magic.controller, "get_controller", lambda: controller)
    tfgpu_magic.configure("visible 0")
    tfgpu_magic.configure("limit 1GB 1", "visible 0,1")
    assert controller.policy == Policy(visible=("0", "1"), limits=(("1", 1024),))
    quietimport.disarm()


def test_loglevel_through_the_magic(shell, controller: Controller, tfgpu) -> None:
    """`loglevel` in a cell and as a line, in the status and the JSON export; a typo changes nothing."""
    shell.run_cell_magic("tfgpu", "", "loglevel warning\ngrowth on\n")
    assert controller.policy == Policy(growth=True, loglevel="warning")
    tfgpu("loglevel error")
    assert "growth on; loglevel error" in tfgpu("")
    with pytest.raises(UsageError, match="did you mean `error`"):
        tfgpu("loglevel eror")
    assert controller.policy.loglevel == "error"
    assert json.loads(tfgpu("export json"))["loglevel"] == "error"
    tfgpu("loglevel off")
    assert controller.policy == Policy(growth=True)
