"""`python -m tfgpu_magic selftest`: the CPU rules proven here with real TensorFlow in fresh processes,
the GPU rules skipped with their reason; a TensorFlow that ignores `set_logical_device_configuration`
(a sitecustomize on PYTHONPATH, in every process) fails the split; NVML without TensorFlow still runs
the NVML-only rules; and each GPU rule's judge, both ways, on figures the fakes produce.

Bounded: an `import tensorflow` that hangs costs one timeout and skips the rest; the overall deadline;
rows printed as decided; the selftest signalled (SIGINT, SIGTERM, SIGHUP, SIGKILL), abandoned at
interpreter exit, or interrupted in a real kernel leaves no process (a SIGINT ignored from the start
stays ignored); what a user's startup code prints neither crashes a run nor passes for a figure; a
broken TensorFlow is never said to accept a policy.

The GPU figures come from a fake process: the rule's own policy goes through a real `Controller` over
tests/fake_tf.py (TensorFlow's rules decide what is in force at initialization), a card model here
decides what the cards then show (below), tests/fake_nvml.py serves it through the inventory's
chokepoint, and the package's own `selftest.measure.cards` and `tf.memory.memory` read it, as the
real probes do in their child processes.
"""

from __future__ import annotations

import contextlib
import copy
import importlib.util
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest
from fake_memory import FakeMemory
from fake_nvml import UUIDS, FakeNvml, four_gpus
from fake_tf import FakeTF, GpuInForce, InForce
from hypothesis import given, settings
from hypothesis import strategies as st
from kernels import QUIET_ENV, isolated_env, quiet_env, running_kernel
from kernels import tensorflow_stays_out_of_pytest  # noqa: F401 (autouse)
from strategies import FUZZ_EXAMPLES

from tfgpu_magic.controller import Controller
from tfgpu_magic.gpus.inventory import Inventory, InventoryCatalog, Nvml, read_inventory
from tfgpu_magic.selftest import probes, report
from tfgpu_magic.selftest.measure import cards
from tfgpu_magic.selftest.children import TIMED_OUT, Children
from tfgpu_magic.selftest.frames import Reader, encode, new_nonce
from tfgpu_magic.selftest.run import run_outside, verdict_row
from tfgpu_magic.selftest.rules import (FAIL, GPU, NVML, PASS, RULES, SKIP, TENSORFLOW, Machine, Prepared, Probe,
                                        Rule, judge_quiet_import)
from tfgpu_magic.tf import quietimport
from tfgpu_magic.tf.memory import memory
from tfgpu_magic.tf.runtime import ASYNC_ALLOCATOR
from tfgpu_magic.views import selftest as selftest_view

ROOT = Path(__file__).resolve().parents[1]
TESTS = Path(__file__).resolve().parent
TIMEOUT = 600
MIB = 1024 * 1024
BY_NAME = {rule.name: rule for rule in RULES}
CPU_RULES = ("baseline", "split-cpu", "visible-none", "same-cell", "device-routes", "locked")
NVML_RULES = ("nvml-inventory", "visible-auto", "limit-percent", "who")
GPU_RULES = tuple(rule.name for rule in RULES if rule.lane == GPU)


def selftest_env(tmp: Path, pythonpath: Path | None = None) -> dict[str, str]:
    """The environment of a selftest: TensorFlow's own log defaults, Jupyter and IPython directories
    under `tmp`, and `pythonpath` (a sitecustomize, a fake TensorFlow) when given."""
    env = {name: value for name, value in quiet_env().items() if name not in QUIET_ENV}
    env.update(isolated_env(tmp))
    if pythonpath is not None:
        env["PYTHONPATH"] = str(pythonpath)
    return env


def selftest(tmp: Path, *args: str, pythonpath: Path | None = None) -> subprocess.CompletedProcess[str]:
    """`python -m tfgpu_magic selftest ARGS` in `selftest_env`."""
    return subprocess.run([sys.executable, "-m", "tfgpu_magic", "selftest", *args], cwd=ROOT,
                          env=selftest_env(tmp, pythonpath), capture_output=True, text=True, timeout=TIMEOUT)


def rows_of(done: subprocess.CompletedProcess[str]) -> dict[str, report.Row]:
    return {row.rule: row for row in report.from_json(done.stdout)}


# ----- the whole selftest, for real, on this machine ------------------------------------------------------
@pytest.fixture(scope="module")
def here(tmp_path_factory: pytest.TempPathFactory) -> tuple[subprocess.CompletedProcess[str], dict[str, report.Row]]:
    done = selftest(tmp_path_factory.mktemp("selftest"), "--json")
    return done, rows_of(done)


@pytest.mark.tensorflow
def test_every_cpu_rule_is_proven_here_in_fresh_processes(here) -> None:
    done, rows = here
    assert done.returncode == 0, done.stderr[-3000:] + done.stdout[-3000:]
    assert list(rows) == [rule.name for rule in RULES]
    for name in CPU_RULES:
        assert rows[name].verdict == PASS, rows[name]
    assert rows["split-cpu"].measured == "3" and rows["same-cell"].measured == "2"
    assert rows["device-routes"].figures == {"device_lib": 3, "session_with_config": 3, "session": 3}
    assert rows["locked"].figures["initialized"] is True and rows["locked"].figures["cpus"] == 1
    assert all(rows[name].seconds > 0 and rows[name].figures for name in CPU_RULES)


@pytest.mark.tensorflow
def test_loglevel_error_is_counted_against_the_run_without_a_policy(here) -> None:
    """What TensorFlow prints at import differs between CPUs: the rule counts against the baseline
    run of the same selftest, and skips only where that run printed no log line below error."""
    _, rows = here
    row = rows["loglevel-error"]
    assert row.verdict == PASS or (row.verdict == SKIP and "nothing to hide" in row.why), row
    if row.verdict == PASS:
        assert row.measured.startswith("0 left") and "without a policy" in row.expected


@pytest.mark.tensorflow
def test_gpu_rules_are_skipped_here_with_their_reason(here) -> None:
    _, rows = here
    inventory = read_inventory()
    for name in GPU_RULES:
        assert rows[name].verdict == SKIP and rows[name].seconds == 0
        assert rows[name].why.startswith("TensorFlow lists no GPU here without a policy"), rows[name]
    for name in NVML_RULES:
        if inventory.available:
            assert rows[name].verdict == PASS, rows[name]
        else:
            assert (rows[name].verdict, rows[name].why) == (SKIP, inventory.error)
    assert rows["doctor"].verdict == PASS


@pytest.mark.tensorflow
def test_the_json_is_a_list_of_rules_and_the_text_says_the_same(here) -> None:
    done, rows = here
    data = json.loads(done.stdout)
    assert [set(item) for item in data] == [set(report.Row._fields)] * len(RULES)
    assert all(item["verdict"] in (PASS, FAIL, SKIP) for item in data)
    text = selftest_view.text(list(rows.values()))
    assert text.splitlines()[0].startswith(f"tfgpu_magic selftest · Python {sys.version.split()[0]}")
    assert f"[pass] split-cpu: `split cpu 3` gives 3 logical CPUs  ({rows['split-cpu'].seconds:.1f} s)" in text
    counts = {verdict: sum(row.verdict == verdict for row in rows.values()) for verdict in (PASS, FAIL, SKIP)}
    assert text.splitlines()[-1] == f"{len(RULES)} rules: {counts[PASS]} pass, 0 fail, {counts[SKIP]} skip"


SABOTAGE = """\
import sys
from importlib.machinery import PathFinder

class IgnoreLogicalDevices:
    '''Makes TensorFlow's Context.set_logical_device_configuration a no-op once its module loads.'''
    def find_spec(self, name, path=None, target=None):
        if name != "tensorflow.python.eager.context":
            return None
        spec = PathFinder.find_spec(name, path, target)
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            module.Context.set_logical_device_configuration = lambda self, device, logical_devices: None
        spec.loader.exec_module = exec_module
        return spec

sys.meta_path.insert(0, IgnoreLogicalDevices())
"""


@pytest.mark.tensorflow
def test_a_tensorflow_that_ignores_the_split_fails_the_selftest(tmp_path: Path) -> None:
    (tmp_path / "sitecustomize.py").write_text(SABOTAGE)
    done = selftest(tmp_path, "--only", "split-cpu", "--json", pythonpath=tmp_path)
    rows = rows_of(done)
    assert done.returncode == 1, done.stderr[-3000:]
    assert list(rows) == ["baseline", "split-cpu"] and rows["baseline"].verdict == PASS
    assert (rows["split-cpu"].verdict, rows["split-cpu"].measured) == (FAIL, "1")


WITHOUT_TENSORFLOW = f"""\
import sys
from importlib.machinery import PathFinder

class WithoutTensorFlow(PathFinder):
    '''The path finder, but no TensorFlow is installed.'''
    @classmethod
    def find_spec(cls, name, path=None, target=None):
        if name.split(".")[0] in ("tensorflow", "keras"):
            return None
        return PathFinder.find_spec(name, path, target)

sys.meta_path[:] = [WithoutTensorFlow if finder is PathFinder else finder for finder in sys.meta_path]
sys.path.insert(0, {str(TESTS)!r})
from fake_nvml import FakeNvml, four_gpus
from tfgpu_magic.gpus import inventory
_nvml = inventory.Nvml(module=FakeNvml(four_gpus(this_kernel=False)))
inventory.shared_nvml = lambda: _nvml
"""


def test_with_nvml_and_without_tensorflow_the_nvml_rules_still_run(tmp_path: Path) -> None:
    """A GPU machine without TensorFlow (fake NVML at the chokepoint, no TensorFlow, in every process),
    through `run_outside`: the whole selftest in a child process, as `%tfgpu selftest` runs it."""
    (tmp_path / "sitecustomize.py").write_text(WITHOUT_TENSORFLOW)
    rows = {row.rule: row for row in run_outside(selftest_env(tmp_path, tmp_path))}
    for name in (*NVML_RULES, "doctor"):
        assert rows[name].verdict == PASS, rows[name]
    assert rows["visible-auto"].figures["visible"] == [UUIDS[2]]  # GPUs 1 and 2 tie on free memory; 2 is less busy
    assert rows["limit-percent"].figures["limits"] == {"0": 40960, "1": 40960, "2": 40960, "3": 20480}
    assert {(p["gpu"], p["pid"]) for p in rows["who"].figures["nvml"]} == {(0, 4243), (0, 4242)}
    for name in (*CPU_RULES, *GPU_RULES, "loglevel-error"):
        assert rows[name].verdict == SKIP and rows[name].why == f"TensorFlow is not installed for {sys.executable}"


def test_plain_text_by_default_and_one_line_for_a_wrong_rule(tmp_path: Path) -> None:
    done = selftest(tmp_path, "--only", "doctor")
    lines = done.stdout.splitlines()
    assert done.returncode == 0 and lines[1].startswith("[pass] doctor: `%tfgpu doctor` runs every check  (")
    assert lines[-1].startswith("1 rule: 1 pass, 0 fail, 0 skip; ") and "processes at a time" in lines[-1]
    wrong = selftest(tmp_path, "--only", "split-cpu,nonsense")
    assert wrong.returncode == 2 and "Traceback" not in wrong.stderr and wrong.stdout == ""
    assert "error: argument --only: unknown rule 'nonsense'; the rules: baseline, split-cpu," in wrong.stderr


# ----- the loglevel judge on lines as TensorFlow writes them -------------------------------------------
PREAMBLE = quietimport.PREAMBLE
INFO = "I0000 00:00:1796114086.366015    3831 port.cc:153] oneDNN custom operations are on."
ERROR = "E0000 00:00:1796114328.718096    7548 cuda_fft.cc:467] Unable to register cuFFT factory"
WARNING_TF = "WARNING:tensorflow:From x.py:1: the name is deprecated"
PYTHON_WARNING = "/site-packages/google/protobuf/runtime_version.py:98: UserWarning: Protobuf gencode version"


@pytest.mark.parametrize("baseline, run, verdict", [
    ((PREAMBLE, INFO, ERROR, PYTHON_WARNING), (ERROR, PYTHON_WARNING), PASS),
    ((PREAMBLE, INFO, ERROR), (ERROR, INFO), FAIL),
    ((PREAMBLE, INFO), (WARNING_TF,), FAIL),
    ((ERROR, PYTHON_WARNING), (ERROR, PYTHON_WARNING), SKIP),
], ids=["quiet", "info-left", "python-warning-left", "nothing-to-hide"])
def test_loglevel_error_keeps_errors_and_non_log_lines_and_nothing_below_error(baseline, run, verdict) -> None:
    machine = Machine({}, Inventory(error="none"), baseline=Probe({"gpus": 0}, baseline))
    outcome = judge_quiet_import(Probe({}, run), Prepared(("loglevel error",)), machine)
    assert outcome.verdict == verdict


# ----- GPU rules on the fakes ----------------------------------------------------------------------------
CONTEXT_MIB = 400
"""The card model: what a CUDA context with TensorFlow's handles holds on a card."""
TAKEN = 0.95
"""The card model: the share of free memory TensorFlow's BFC allocator takes without growth or cap."""
ASYNC_LOG = ("I0000 00:00:1770777499.320499  482597 gpu_process_state.cc:208] Using CUDA malloc Async "
             "allocator for GPU: 0")
"""The line TensorFlow logs when it builds the cuda_malloc_async allocator (as a user's log shows it)."""


def pool_mib(gpu: GpuInForce, free: float, tensors_mib: float) -> float:
    """The card model: what TensorFlow's pool takes on a card once initialized, with `tensors_mib` of tensors."""
    if gpu.allocator == ASYNC_ALLOCATOR or gpu.growth:
        return tensors_mib
    return sum(gpu.limits) if gpu.limits else free * TAKEN


def fits(gpu: GpuInForce, logical: int, mib: float, free: float) -> bool:
    """The card model: a tensor fits on logical GPU `logical` of the card under its cap (else the free memory)."""
    return mib <= (gpu.limits[logical] if gpu.limits else free)


class FakeProcess:
    """A probe's process on the fakes: the rule's policy through a real Controller over FakeTF (4 cards
    as in `four_gpus`), TensorFlow imported and initialized, and the cards as the model says."""

    def __init__(self, prepared: Prepared, sabotage: Callable[[FakeTF, dict], None] | None = None,
                 tensors_mib: float = 1, listed: bool = True) -> None:
        self.cards_before = four_gpus(this_kernel=False)
        self.before = read_inventory(Nvml(module=FakeNvml(copy.deepcopy(self.cards_before))))
        self.env: dict[str, str] = {}
        self.fake = FakeTF(4, imported=False, environ=self.env)
        if sabotage is not None:
            sabotage(self.fake, self.env)
        self.ctl = Controller(api=self.fake, environ=self.env, catalog=InventoryCatalog(self.before))
        self.ctl.edit([self.ctl.parse(line) for line in prepared.policy])  # configure(*POLICY)
        self.fake.imported = True  # import tensorflow: the hook applies the rest
        quietimport.disarm()
        self.ctl.apply()
        self.in_force: InForce = self.fake.initialize()  # the first op
        after = copy.deepcopy(self.cards_before)
        for gpu in self.in_force.gpus:
            card = after[gpu.cuda_id]
            held = CONTEXT_MIB + pool_mib(gpu, card.total_mib - card.used_mib, tensors_mib)
            card.processes.append((os.getpid() if listed else 99999, held))
            card.used_mib += held
        self.after = read_inventory(Nvml(module=FakeNvml(after)))

    def gpu(self, tf_index: int = 0) -> tuple[GpuInForce, float]:
        gpu = self.in_force.gpus[tf_index]
        card = self.cards_before[gpu.cuda_id]
        return gpu, card.total_mib - card.used_mib


def figures_of(rule: str, process: FakeProcess, prepared: Prepared) -> tuple[dict[str, Any], tuple[str, ...]]:
    """What the rule's probe script reports (and writes on stderr) in `process`."""
    found = cards(process.after)
    if rule == "visible-gpus":
        return {"tf_gpus": len(process.fake.devices("GPU")), "cards": found}, ()
    if rule in ("growth-on", "growth-off"):
        return {"before": cards(process.before), "after": found}, ()
    gpu, free = process.gpu()
    mib = prepared.args.get("mib", 0)
    if rule == "limit":
        return {"oom": not fits(gpu, 0, mib * 1.5, free), "cards": found}, ()
    if rule == "split-gpu":
        logical = sum(len(g.limits or (None,)) for g in process.in_force.gpus)
        second = fits(gpu, 1, mib / 2, free) if logical > 1 else None
        return {"logical_gpus": logical, "oom": not fits(gpu, 0, mib * 1.5, free), "second_fits": second}, ()
    if rule == "allocator-async":
        logged = (ASYNC_LOG,) if gpu.allocator == ASYNC_ALLOCATOR else ()
        return {"allocator": process.env.get("TF_GPU_ALLOCATOR")}, logged
    assert rule == "memory-info"
    stats = FakeMemory(process.fake)
    stats.allocate("GPU:0", mib * MIB)
    rows = memory(process.ctl, stats, process.after)
    return {"tensors_bytes": rows[0]["tensors_bytes"], "cards": found}, ()


def gpu_machine(environ: dict[str, str] | None = None) -> Machine:
    """`four_gpus` through NVML, and a TensorFlow that lists them without a policy."""
    baseline = {"gpus": len(FakeTF(4).devices("GPU")), "cuda_build": True, "cpus": 1}
    return Machine(environ or {}, read_inventory(Nvml(module=FakeNvml(four_gpus(this_kernel=False)))),
                   baseline=Probe(baseline))


def judged(name: str, machine: Machine | None = None, **process: Any) -> tuple[str, Prepared, FakeProcess]:
    rule: Rule = BY_NAME[name]
    machine = machine or gpu_machine()
    prepared = rule.prepare(machine)
    assert isinstance(prepared, Prepared), prepared
    process.setdefault("tensors_mib", prepared.args.get("mib", 1) if name == "memory-info" else 1)
    fake = FakeProcess(prepared, **process)
    figures, stderr = figures_of(name, fake, prepared)
    return rule.judge(Probe(figures, stderr), prepared, machine).verdict, prepared, fake


@pytest.fixture(autouse=True)
def no_hook() -> Iterator[None]:
    yield
    quietimport.disarm()
    quietimport.quiet(None)


def ignore_split(fake: FakeTF, env: dict) -> None:
    """TensorFlow accepts logical devices without recording them."""
    fake.set_user_logical = lambda device, configs: None


def ignore_growth(fake: FakeTF, env: dict) -> None:
    fake.set_growth = lambda device, enable: None


def own_environment(**variables: str) -> Callable[[FakeTF, dict], None]:
    """TensorFlow reads an environment of its own: the policy's variables never reach it."""
    def sabotage(fake: FakeTF, env: dict) -> None:
        fake.environ = dict(variables)
    return sabotage


@pytest.mark.parametrize("name, sabotage", [
    ("visible-gpus", own_environment()),
    ("growth-on", ignore_growth),
    ("growth-off", own_environment(TF_FORCE_GPU_ALLOW_GROWTH="true")),
    ("limit", ignore_split),
    ("split-gpu", ignore_split),
    ("allocator-async", own_environment()),
])
def test_each_gpu_rule_passes_where_tensorflow_obeys_and_fails_where_it_does_not(name: str, sabotage) -> None:
    assert judged(name)[0] == PASS
    assert judged(name, sabotage=sabotage)[0] == FAIL


def test_the_gpu_rules_use_the_freest_cards_outside_mig_mode() -> None:
    """four_gpus: GPUs 1 and 2 tie on free memory, 2 is less busy; GPU 3 is in MIG mode."""
    _, prepared, fake = judged("visible-gpus")
    assert prepared.policy == ("visible 1,2",) and [g.cuda_id for g in fake.in_force.gpus] == [1, 2]
    _, prepared, fake = judged("limit")
    assert prepared.policy == ("visible 2", "limit 1024MB") and fake.in_force.gpus[0].limits == (1024,)
    assert judged("split-gpu")[1].policy == ("visible 2", "split 2 2x512MB")


def test_an_inherited_cuda_visible_devices_keeps_the_probes_on_its_cards() -> None:
    """An admin's pin (`CUDA_VISIBLE_DEVICES=0`) is respected: the probes use GPU 0 only."""
    verdict, prepared, _ = judged("growth-on", gpu_machine({"CUDA_VISIBLE_DEVICES": "0"}))
    assert verdict == PASS and prepared.policy == ("visible 0", "growth on")


def test_memory_info_agrees_with_nvml_or_says_why_not() -> None:
    assert judged("memory-info")[0] == PASS

    class NoStatistics(FakeMemory):
        def info(self, device: str) -> None:
            return None

    _, prepared, fake = judged("memory-info")
    rows = memory(fake.ctl, NoStatistics(fake.fake), fake.after)
    figures = {"tensors_bytes": rows[0]["tensors_bytes"], "cards": cards(fake.after)}
    assert BY_NAME["memory-info"].judge(Probe(figures), prepared, gpu_machine()).verdict == FAIL


@pytest.mark.parametrize("name", ["visible-gpus", "growth-on", "limit", "memory-info"])
def test_where_nvml_does_not_list_the_process_the_rule_says_so(name: str) -> None:
    """In a container NVML may report host process ids: the memory cannot be attributed."""
    rule = BY_NAME[name]
    machine = gpu_machine()
    prepared = rule.prepare(machine)
    figures, stderr = figures_of(name, FakeProcess(prepared, listed=False), prepared)
    outcome = rule.judge(Probe(figures, stderr), prepared, machine)
    assert outcome.verdict == SKIP and outcome.why.startswith("NVML does not list this process")


def test_without_gpus_or_tensorflow_each_rule_says_why_it_cannot_run() -> None:
    no_nvml = Inventory(error="NVML unavailable: no NVIDIA driver here")
    cpu_only = Machine({}, no_nvml, baseline=Probe({"gpus": 0, "cuda_build": False}))
    assert BY_NAME["growth-on"].prepare(cpu_only) == ("TensorFlow lists no GPU here without a policy (this "
                                                      "TensorFlow is a CPU-only build); NVML unavailable: no NVIDIA "
                                                      "driver here")
    assert BY_NAME["who"].prepare(cpu_only) == "NVML unavailable: no NVIDIA driver here"
    no_tf = Machine({}, gpu_machine().inventory, tensorflow="TensorFlow is not installed for python")
    assert {rule.prepare(no_tf) for rule in RULES if rule.lane in (TENSORFLOW, GPU)} == {
        "TensorFlow is not installed for python"}
    assert all(isinstance(rule.prepare(no_tf), Prepared) for rule in RULES if rule.lane == NVML)
    gpus_without_nvml = Machine({}, no_nvml, baseline=gpu_machine().baseline)
    assert BY_NAME["limit"].prepare(gpus_without_nvml).startswith("needs NVML to see this process on the cards")
    assert BY_NAME["split-gpu"].prepare(gpus_without_nvml).policy == ("visible 0", "split 0 2x512MB")


def test_the_probe_scripts_compile_and_only_they_import_tensorflow() -> None:
    """The child scripts are text (tests/test_architecture.py reads only real imports): each compiles,
    and importing the selftest leaves TensorFlow out of this process."""
    for rule in RULES:
        compile(probes.script(rule.probe), rule.name, "exec")
    code = textwrap.dedent("""\
        import sys
        import tfgpu_magic.__main__, tfgpu_magic.selftest.run
        print(sorted(m for m in ("tensorflow", "ipywidgets", "IPython") if m in sys.modules))
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert done.stdout.strip() == "[]", done.stderr


# ----- `%tfgpu selftest` ---------------------------------------------------------------------------------
def test_the_magic_runs_it_outside_the_kernel_with_the_environment_before_the_policy(
        shell, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """`%tfgpu selftest` on a real shell: a child process runs it (fake NVML and no TensorFlow there, for
    speed), with `CUDA_VISIBLE_DEVICES` as it was before `%tfgpu visible none` set it (the doctor's check
    of it is ok, not "hides every GPU"); the plain form ends with the counts."""
    (tmp_path / "sitecustomize.py").write_text(WITHOUT_TENSORFLOW)
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    shell.run_line_magic("tfgpu", "visible none")
    try:
        assert os.environ["CUDA_VISIBLE_DEVICES"] == ""
        capsys.readouterr()
        shell.run_line_magic("tfgpu", "selftest --json")
        rows = {row.rule: row for row in report.from_json(capsys.readouterr().out)}
        shell.run_line_magic("tfgpu", "selftest")
        table = capsys.readouterr().out
    finally:
        shell.run_line_magic("tfgpu", "reset")
    checks = {check["check"]: check["verdict"] for check in rows["doctor"].figures["checks"]}
    assert checks["CUDA_VISIBLE_DEVICES"] == "ok"
    assert rows["nvml-inventory"].verdict == PASS and rows["split-cpu"].verdict == SKIP
    frameworks = [name for name in ("jax", "torch") if importlib.util.find_spec(name) is not None]
    assert all(rows[f"{name}-settings"].verdict == PASS for name in frameworks), rows  # their CPU builds
    passed = 5 + len(frameworks)
    assert table.splitlines()[-1].startswith(f"{len(RULES)} rules: {passed} pass, 0 fail, {len(RULES) - passed} skip; ")


# ----- bounded: a hanging TensorFlow, hostile startup code, interrupts, the deadline ---------------------
HANGING_TENSORFLOW = "import time\nwhile True:  # `import tensorflow` never returns\n    time.sleep(3600)\n"

BROKEN_TENSORFLOW = '''\
"""A broken TensorFlow: it imports, runs a "first op" and lists one CPU; every other tf.config call raises."""
__version__ = "0.0.0+broken"

class _Device:
    def __init__(self, name, device_type):
        self.name, self.device_type = name, device_type

class _Config:
    def list_physical_devices(self, device_type=None):
        return [_Device("/physical_device:CPU:0", "CPU")] if device_type in (None, "CPU") else []

    def list_logical_devices(self, device_type=None):
        return [_Device("/device:CPU:0", "CPU")] if device_type in (None, "CPU") else []

    def __getattr__(self, name):
        def broken(*args, **kwargs):
            raise RuntimeError(f"this TensorFlow is broken: tf.config.{name}")
        return broken

class test:
    is_built_with_cuda = staticmethod(lambda: False)

class errors:
    class OpError(Exception):
        pass

config = _Config()

def constant(value):
    return value
'''

HOSTILE_PRINTS = '''\
import atexit, sys
FIGURES = "TFGPU_SELFTEST_FIGURES "  # the marker the probes once printed their figures after
print(FIGURES + "{not json")
print("0123456789abcdef0123456789abcdef" + ' {"cpus": 3}')  # looks like a framed line, with some other nonce
print("x" * 3_000_000)
sys.stdout.write("no newline at the end of this, then a frame-like line: ")
sys.stdout.flush()
sys.stdout.buffer.write(bytes(range(256)) + b"\\n")
atexit.register(print, FIGURES + '{"cpus": 3, "device_lib": 3, "session_with_config": 3, "session": 3, '
                '"checks": [], "gpus": 0, "logical_gpus": 0, "error": null}')
atexit.register(print, FIGURES + "[[[[" * 50_000)
atexit.register(print, FIGURES + "{}")
'''
"""A user's sitecustomize that prints the probes' old marker with garbage, with an empty object, and
(at exit, after the probe's own report) with figures a rule would pass on; in every process."""

PROBE_SIGN = "_end_when_orphaned"
"""In every probe's command line (`probes.PRELUDE`)."""
RUNNER_SIGN = "tfgpu_magic.__main__"
"""In the command line of `%tfgpu selftest`'s child (`run.LAUNCH`)."""


def fake_tensorflow(root: Path, text: str) -> Path:
    """A folder for PYTHONPATH holding a `tensorflow` package made of `text`."""
    (root / "tensorflow").mkdir(parents=True)
    (root / "tensorflow" / "__init__.py").write_text(text)
    return root


def tagged_processes(pythonpath: Path) -> dict[int, str]:
    """Live processes whose environment has this PYTHONPATH (a test's own), wherever they are in the
    process tree (orphans included), with their command lines; zombies are not live."""
    tag = f"PYTHONPATH={pythonpath}".encode()
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = (entry / "environ").read_bytes().split(b"\0")
            command = (entry / "cmdline").read_bytes().decode(errors="replace")
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if tag in environ and state != "Z":
            found[int(entry.name)] = command
    return found


def selftest_processes(pythonpath: Path) -> list[int]:
    """The live probes and `%tfgpu selftest` children among `tagged_processes`."""
    return [pid for pid, command in tagged_processes(pythonpath).items()
            if PROBE_SIGN in command or RUNNER_SIGN in command]


def wait_for(condition: Callable[[], Any], timeout: float = 60) -> Any:
    end = time.monotonic() + timeout
    while not (value := condition()):
        assert time.monotonic() < end, "timed out waiting"
        time.sleep(0.1)
    return value


@pytest.fixture
def hang(tmp_path: Path) -> Iterator[Path]:
    """A folder for PYTHONPATH whose `import tensorflow` never returns; whatever of the selftest with it
    is still alive after the test is killed by pid."""
    path = fake_tensorflow(tmp_path / "hang", HANGING_TENSORFLOW)
    yield path
    for pid in tagged_processes(path):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def test_a_hanging_tensorflow_import_costs_one_probe_timeout_and_skips_the_rest(tmp_path: Path, hang: Path) -> None:
    """Before: every TensorFlow probe waited its full timeout after the baseline's had passed (4 timeouts
    on 2 workers; 1201 s with the 300 s default). Now the baseline's one timeout, the rest skipped."""
    timeout = 6
    start = time.monotonic()
    done = selftest(tmp_path, "--json", "--timeout", str(timeout), "--workers", "2", pythonpath=hang)
    seconds = time.monotonic() - start
    rows = rows_of(done)
    assert done.returncode == 1, done.stderr[-2000:]
    assert (rows["baseline"].verdict, rows["baseline"].why) == (FAIL, f"the probe wrote no result: it did not "
                                                                      f"finish within {timeout} s")
    for name in (*CPU_RULES[1:], "loglevel-error", *GPU_RULES):
        assert rows[name].verdict == SKIP and rows[name].seconds == 0, rows[name]
        assert rows[name].why == f"the run without a policy failed: it did not finish within {timeout} s"
    assert rows["doctor"].verdict == PASS
    assert seconds < 2 * timeout, seconds  # one timeout and the start; before, four of them
    assert selftest_processes(hang) == []


def test_the_overall_deadline_skips_what_did_not_finish(tmp_path: Path, hang: Path) -> None:
    start = time.monotonic()
    done = selftest(tmp_path, "--json", "--only", "split-cpu,doctor", "--deadline", "4", pythonpath=hang)
    seconds = time.monotonic() - start
    rows = rows_of(done)
    assert (rows["baseline"].verdict, rows["baseline"].why) == (SKIP, "the overall deadline of 4 s passed while it ran")
    assert rows["baseline"].seconds >= 3
    assert (rows["split-cpu"].verdict, rows["split-cpu"].why) == (SKIP, "the overall deadline of 4 s passed before "
                                                                        "it ran")
    assert rows["doctor"].verdict == PASS and done.returncode == 0
    assert seconds < 4 + 6, seconds
    assert selftest_processes(hang) == []


def test_text_rows_are_printed_as_each_rule_is_decided(tmp_path: Path, hang: Path) -> None:
    """`python -m tfgpu_magic selftest`: the doctor's row is on stdout while the hanging baseline still runs."""
    env = selftest_env(tmp_path, hang)
    process = subprocess.Popen([sys.executable, "-m", "tfgpu_magic", "selftest", "--only", "split-cpu,doctor",
                                "--timeout", "8"], cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True)
    try:
        assert process.stdout.readline().startswith("tfgpu_magic selftest · Python ")
        assert process.stdout.readline().startswith("[pass] doctor: ")
        assert process.poll() is None and selftest_processes(hang)  # the baseline is still waiting on its import
        rest = process.stdout.read()
    finally:
        process.kill()
        process.wait()
    assert "[fail] baseline: " in rest and "[skip] split-cpu: " in rest
    assert rest.splitlines()[-1].startswith("3 rules: 1 pass, 1 fail, 1 skip; ")


@contextlib.contextmanager
def sigint(ignored: bool) -> Iterator[None]:
    """SIGINT ignored here, or raising KeyboardInterrupt, whatever pytest itself began with; and children
    started inside begin with it ignored (a script's background job, `cmd &`) or at its default (a
    terminal's foreground job): only SIG_IGN passes through exec, a Python handler becomes the default
    there. Pytest run as such a background job would otherwise hand its ignored SIGINT on. Pytest's own
    handler afterwards."""
    saved = signal.signal(signal.SIGINT, signal.SIG_IGN if ignored else signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler if saved is None else saved)


@pytest.mark.parametrize("signum, status", [(signal.SIGINT, 130), (signal.SIGTERM, 128 + signal.SIGTERM),
                                            (signal.SIGHUP, 128 + signal.SIGHUP), (signal.SIGKILL, -signal.SIGKILL)],
                         ids=["SIGINT", "SIGTERM", "SIGHUP", "SIGKILL"])
def test_a_stopped_selftest_leaves_no_process(tmp_path: Path, hang: Path, signum: int, status: int) -> None:
    """The selftest's process is signalled while its probes run (a TensorFlow import that hangs). Before:
    after SIGINT it went on waiting on them (still running 30 s later). Now it stops them and exits; even
    killed outright (SIGKILL), each probe reads EOF on its stdin and ends its own process group."""
    env = selftest_env(tmp_path, hang)
    with sigint(ignored=False):  # Ctrl-C reaches a foreground job only
        process = subprocess.Popen([sys.executable, "-m", "tfgpu_magic", "selftest", "--only", "split-cpu"],
                                   cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: selftest_processes(hang))
        os.kill(process.pid, signum)
        assert process.wait(timeout=30) == status
        stderr = process.stderr.read()
    finally:
        process.kill()
        process.wait()
    if signum == signal.SIGINT:
        assert stderr.strip() == "tfgpu_magic selftest: interrupted; the processes it started are stopped"
    if signum != signal.SIGKILL:
        assert selftest_processes(hang) == []  # at once: stopped before the selftest exited
    assert wait_for(lambda: not selftest_processes(hang), timeout=5)


def test_a_selftest_started_with_sigint_ignored_leaves_it_ignored_and_sigterm_stops_it(tmp_path: Path,
                                                                                       hang: Path) -> None:
    """Started as a script's background job (SIGINT ignored, so that the terminal's Ctrl-C meant for the
    foreground job spares it), the selftest keeps SIGINT ignored, as Python and `nohup` do; SIGTERM still
    stops it and its probes. (Pytest run as such a job failed the SIGINT case above before that test
    started its selftest with SIGINT at its default.)"""
    with sigint(ignored=True):
        process = subprocess.Popen([sys.executable, "-m", "tfgpu_magic", "selftest", "--only", "split-cpu"],
                                   cwd=ROOT, env=selftest_env(tmp_path, hang), stdout=subprocess.DEVNULL,
                                   stderr=subprocess.DEVNULL)
    try:
        wait_for(lambda: selftest_processes(hang))
        os.kill(process.pid, signal.SIGINT)
        with pytest.raises(subprocess.TimeoutExpired):
            process.wait(timeout=1)
        assert selftest_processes(hang)
        os.kill(process.pid, signal.SIGTERM)
        assert process.wait(timeout=30) == 128 + signal.SIGTERM
    finally:
        process.kill()
        process.wait()
    assert selftest_processes(hang) == []


ABANDONED = """\
import atexit, glob, threading, time

def children():
    return [int(pid) for name in glob.glob("/proc/self/task/*/children") for pid in open(name).read().split()]

def alive(pid):
    try:
        return open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False

probes = []
atexit.register(lambda: print("left at exit:", sum(map(alive, probes)), flush=True))
from tfgpu_magic.selftest.run import selftest  # registers its exit handler after (so it runs before) the one above
threading.Thread(target=selftest, kwargs={"only": ["split-cpu"]}, daemon=True).start()
while not probes:
    time.sleep(0.1)
    probes[:] = children()
time.sleep(0.5)
print("probes running:", sum(map(alive, probes)), flush=True)
"""


def test_at_interpreter_exit_the_probes_are_stopped(tmp_path: Path, hang: Path) -> None:
    """A selftest left running in a thread when the interpreter exits: its probes are stopped by the
    exit handler, while this process still lives (not by the EOF backstop after it)."""
    env = selftest_env(tmp_path, hang)
    done = subprocess.run([sys.executable, "-c", ABANDONED], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=60)
    assert done.stdout.splitlines() == ["probes running: 1", "left at exit: 0"], done.stderr[-2000:]
    assert selftest_processes(hang) == []


def test_a_probe_that_ignores_sigterm_and_leaves_a_child_is_killed_with_its_group() -> None:
    """`Children.run`: on timeout SIGTERM to the group, SIGKILL after the grace; a process the probe
    started goes with it, and one left behind by a probe that exited is killed too."""
    stubborn = ("import json, signal, subprocess, sys, time\n"
                "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
                "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'],"
                " stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)\n"
                "print('\\n' + sys.argv[1] + ' ' + json.dumps({'pid': child.pid}), flush=True)\n")
    for end, timeout, cut in (("time.sleep(600)", 2.0, TIMED_OUT), ("", 30.0, None)):
        children = Children(grace=1.0)
        nonce = new_nonce()
        start = time.monotonic()
        done = children.run([sys.executable, "-c", stubborn + end, nonce], os.environ, timeout, Reader(nonce))
        seconds = time.monotonic() - start
        grandchild = done.reader.frames[0]["pid"]
        assert done.cut == cut and seconds < timeout + 1.0 + 1.5, (done, seconds)
        assert done.returncode == (-signal.SIGKILL if cut else 0)
        assert wait_for(lambda: not alive(grandchild), timeout=5)
        children.close()


def test_an_interrupt_while_a_child_starts_stops_that_child(monkeypatch: pytest.MonkeyPatch) -> None:
    """`Children.run` in the main thread (a kernel's `%tfgpu selftest`) gets SIGINT while Popen waits for
    the exec; here just as Popen returns. Before: the KeyboardInterrupt came out of Popen, the child was
    never recorded, and it ran on (the selftest's runner until the kernel exits). Now the interrupt waits
    until the child is in hand, then stops it and is raised."""
    started: list[subprocess.Popen[bytes]] = []
    real = subprocess.Popen

    def interrupted(*args: Any, **kwargs: Any) -> subprocess.Popen[bytes]:
        started.append(real(*args, **kwargs))
        signal.raise_signal(signal.SIGINT)  # its handler runs before this returns
        return started[-1]

    monkeypatch.setattr(subprocess, "Popen", interrupted)
    children = Children(grace=1.0)
    try:
        with sigint(ignored=False), pytest.raises(KeyboardInterrupt):
            children.run([sys.executable, "-c", "import time; time.sleep(60)"], os.environ, 30.0,
                         Reader(new_nonce()))
        assert len(started) == 1 and not alive(started[0].pid)
    finally:
        children.close()
        for process in started:
            process.kill()
            process.wait()


def alive(pid: int) -> bool:
    """Whether process `pid` exists and is not a zombie."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_the_kernel_interrupt_stops_every_process_and_rows_arrive_as_decided(tmp_path: Path, hang: Path,
                                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """`%tfgpu selftest` in a real kernel with a TensorFlow import that hangs. Before: the interrupt left
    probes orphaned to pid 1, still running; and with the default timeouts the cell held the kernel
    1201 s. Now: the rows come as they are decided (the doctor's long before the cell ends), the cell
    ends after the baseline's one timeout, and after an interrupt no process of the selftest is left."""
    monkeypatch.setenv("PYTHONPATH", str(hang))
    with running_kernel() as kernel:
        kernel.ok("%load_ext tfgpu_magic\nimport tfgpu_magic.selftest.run as run\nrun.PROBE_TIMEOUT = 8")
        start = time.monotonic()
        outputs = timed_outputs(kernel, "%tfgpu selftest")
        seconds = time.monotonic() - start
        lines = [(at, line) for at, kind, text in outputs if kind == "stdout" for line in text.splitlines()]
        doctor = next(at for at, line in lines if line.startswith("[pass] doctor"))
        baseline = next(at for at, line in lines if line.startswith("[fail] baseline"))
        assert doctor < baseline - 3 and baseline < seconds
        assert any(kind == "html" and "tfgpu-selftest" in text for _, kind, text in outputs)
        assert 8 <= seconds < 16, seconds
        assert selftest_processes(hang) == []

        kernel.ok("run.PROBE_TIMEOUT = 120")
        # Without stop_on_error: ipykernel aborts ("aborted", no output) requests that reach it before it
        # has finished aborting the queue after an error reply, and the next cell here may be that quick.
        kernel.client.execute("%tfgpu selftest", stop_on_error=False)
        wait_for(lambda: [pid for pid in selftest_processes(hang)
                          if PROBE_SIGN in Path(f"/proc/{pid}/cmdline").read_text(errors="replace")])
        interrupted = time.monotonic()
        kernel.manager.interrupt_kernel()
        reply = kernel.client.get_shell_msg(timeout=60)
        assert (reply["content"]["status"], reply["content"].get("ename")) == ("error", "KeyboardInterrupt")
        assert time.monotonic() - interrupted < 10
        assert selftest_processes(hang) == []
        kernel.ok("1")


def timed_outputs(kernel, code: str, timeout: float = 90) -> list[tuple[float, str, str]]:
    """Execute `code`; (seconds since, kind, text) of each output as it arrives: kind is the stream name,
    or "html" for a display's HTML."""
    start = time.monotonic()
    outputs: list[tuple[float, str, str]] = []

    def collect(msg: dict) -> None:
        kind, content = msg["msg_type"], msg["content"]
        if kind == "stream":
            outputs.append((time.monotonic() - start, content["name"], content["text"]))
        elif kind in ("display_data", "execute_result") and "text/html" in content["data"]:
            outputs.append((time.monotonic() - start, "html", content["data"]["text/html"]))

    reply = kernel.client.execute_interactive(code, timeout=timeout, output_hook=collect, allow_stdin=False)
    assert reply["content"]["status"] == "ok", outputs
    return outputs


def test_what_a_users_startup_code_prints_neither_crashes_the_run_nor_passes_for_a_figure(tmp_path: Path) -> None:
    """A sitecustomize prints the probes' old marker with garbage, a framed-looking line, 3 MB without a
    break, raw bytes, and at exit (after the probe's own report) figures on which `split-cpu` would pass,
    in every process, and TensorFlow ignores the split. Before: `KeyError`/`JSONDecodeError` ended the
    run, or the last line at exit was taken as the figures. Now the split fails as measured (1 CPU)."""
    (tmp_path / "sitecustomize.py").write_text(HOSTILE_PRINTS + SABOTAGE)
    rows = {row.rule: row for row in run_outside(selftest_env(tmp_path, tmp_path), only=["split-cpu"])}
    assert list(rows) == ["baseline", "split-cpu"] and rows["baseline"].verdict == PASS
    assert (rows["split-cpu"].verdict, rows["split-cpu"].measured) == (FAIL, "1")
    assert rows["split-cpu"].figures["cpus"] == 1


def test_startup_prints_leave_the_nvml_rules_and_the_doctor_as_they_are(tmp_path: Path) -> None:
    """The same prints with fake NVML and no TensorFlow: the doctor's row (before: `KeyError: 'checks'`)."""
    (tmp_path / "sitecustomize.py").write_text(WITHOUT_TENSORFLOW + HOSTILE_PRINTS)
    rows = {row.rule: row for row in run_outside(selftest_env(tmp_path, tmp_path))}
    for name in (*NVML_RULES, "doctor"):
        assert rows[name].verdict == PASS, rows[name]
    assert rows["doctor"].figures["checks"]


def test_a_broken_tensorflow_is_never_said_to_accept_the_policy(tmp_path: Path) -> None:
    """A TensorFlow whose tf.config calls raise (but which lists one CPU). Before: `split-cpu` and
    `same-cell` said "TensorFlow accepted the policy". Now each row says only what it measured, and
    what tfgpu_magic said."""
    broken = fake_tensorflow(tmp_path / "broken", BROKEN_TENSORFLOW)
    done = selftest(tmp_path, "--json", "--only", "split-cpu,same-cell,visible-none,device-routes,locked",
                    pythonpath=broken)
    rows = rows_of(done)
    assert rows["baseline"].verdict == PASS and "0.0.0+broken" in rows["baseline"].measured
    for name, count in (("split-cpu", 3), ("same-cell", 2)):
        assert rows[name].verdict == FAIL and rows[name].measured == "1"
        assert rows[name].why.startswith(f"TensorFlow lists 1 logical CPU(s) after the policy, not {count} (the "
                                         "process said: "), rows[name]
        assert "could not apply the GPU policy on `import tensorflow`: this TensorFlow is broken: tf.config." in rows[name].why
    for name in ("device-routes", "locked"):
        assert rows[name].verdict == FAIL and rows[name].why.startswith("the probe wrote no result: exit status 1: ")
    assert not [row for row in rows.values() if "accept" in row.why], rows


def test_a_cell_that_raised_counts_no_cpu() -> None:
    outcome = BY_NAME["same-cell"].judge(Probe({"cpus": None, "error": "RuntimeError: broken"}), Prepared(),
                                         gpu_machine())
    assert outcome == (FAIL, "the cell raised an error, so no logical CPU was counted", "2 logical CPUs",
                       "error in the cell: RuntimeError: broken")


def test_figures_a_judge_cannot_read_fail_that_rule_only() -> None:
    row = verdict_row(BY_NAME["split-cpu"], Prepared(("split cpu 3",)), Probe({"gpus": 0}, (), 1.0), gpu_machine())
    assert (row.verdict, row.why) == (FAIL, "the probe's figures are not what this rule reads (KeyError: 'cpus')")


@settings(max_examples=FUZZ_EXAMPLES, deadline=None)
@given(noise=st.lists(st.binary(max_size=300) | st.sampled_from([b"\n", b"NONCE", b"NONCE ", b"NONCE {", b"{}\n",
                                                                 b'NONCE {"a": 1}\n', b"NONCE [1]\n"]), max_size=30),
       cuts=st.lists(st.integers(1, 64), max_size=40))
def test_the_frame_reader_takes_only_its_own_whole_lines(noise: list[bytes], cuts: list[int]) -> None:
    """Any noise before, between and after two frames, fed in chunks of any size: exactly the two
    frames come out, in order, and nothing raises."""
    nonce = new_nonce()
    data = b"".join(noise) + encode(nonce, {"first": [1, "é"]}) + b"".join(noise) + encode(nonce, {"second": None})
    data += b"".join(noise) + nonce.encode() + b' {"unfinished": true}'  # no newline: the stream ended mid-line
    reader = Reader(nonce, limit=10_000)
    chunks, at = [], 0
    for cut in cuts + [len(data)]:
        chunks.append(data[at:at + cut])
        at += cut
    for chunk in chunks:
        reader.feed(chunk)
    assert reader.frames == [{"first": [1, "é"]}, {"second": None}]


def test_framed_lines_that_are_not_objects_or_too_long_are_refused_with_why() -> None:
    nonce = new_nonce()
    reader = Reader(nonce, limit=200_000)
    for payload in (b"[1]", b"{not json", b"[" * 100_000, b'{"a": "' + b"x" * 300_000 + b'"}', b"\xff\xfe{}"):
        reader.feed(b"\n" + nonce.encode() + b" " + payload + b"\n")
    assert reader.frames == [] and reader.rejected == [
        "a framed line holding a JSON list, not an object", "a framed line that is not JSON (JSONDecodeError)",
        "a framed line that is not JSON (RecursionError)", "a framed line longer than 200000 bytes",
        "a framed line that is not JSON (UnicodeDecodeError)"]
