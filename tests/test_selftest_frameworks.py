"""The selftest's JAX and PyTorch rules (`jax-settings`, `torch-settings`, docs/selftest.md).

For real, in fresh processes, with the JAX and PyTorch CPU wheels installed here: the policy's settings
reach each as it starts (JAX's backends, torch's C library); with tests/fake_nvml.py's cards at NVML's
chokepoint (in every process, through a sitecustomize) a limit reaches them as a share of the card. Each
rule fails where the setting does not get there: a plan that loses its variables, a JAX that starts its
backends as it is imported, a torch imported before the policy. Where the framework cannot be imported
(a finder that hides it, in every process) the rule is skipped, saying so, and no process is started.

Their GPU branches have not run on a GPU here: their judges are proven both ways on the figures a GPU
would give, as the TensorFlow GPU rules are (tests/test_selftest.py): PyTorch's from tests/fake_torch.py
under a real Controller (torch's rules), JAX's from a model of XLA's GPU allocator.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest
from fake_nvml import FakeNvml, four_gpus
from fake_tf import FakeTF
from fake_torch import FakeTorch
from kernels import QUIET_ENV, isolated_env, quiet_env

from tfgpu_magic import importhooks
from tfgpu_magic.controller import Controller
from tfgpu_magic.frameworks import torch as torch_room
from tfgpu_magic.gpus.inventory import Inventory, InventoryCatalog, Nvml, read_inventory
from tfgpu_magic.selftest import report
from tfgpu_magic.selftest.rules import (FAIL, FRAMEWORKS, PASS, RULES, SKIP, TORCH_ASYNC, Machine, Prepared, Probe)
from tfgpu_magic.selftest.run import selected
from tfgpu_magic.tf import quietimport

ROOT = Path(__file__).resolve().parents[1]
TESTS = Path(__file__).resolve().parent
BY_NAME = {rule.name: rule for rule in RULES}
JAX, TORCH = "jax-settings", "torch-settings"
MIB = 1024 * 1024
NO_JAX = pytest.mark.skipif(importlib.util.find_spec("jax") is None, reason="JAX is not installed in this Python")
NO_TORCH = pytest.mark.skipif(importlib.util.find_spec("torch") is None,
                              reason="PyTorch is not installed in this Python (.ci/run installs its CPU wheel where "
                                     "it lies on this machine's disk)")
CARDS = read_inventory(Nvml(module=FakeNvml(four_gpus(this_kernel=False))))
"""tests/fake_nvml.py's four cards: GPUs 1 and 2 tie on free memory, 2 is less busy; 3 is in MIG mode."""


def selftest(tmp_path: Path, sitecustomize: str = "", rules: tuple[str, ...] = (JAX, TORCH)) -> dict[str, report.Row]:
    """`python -m tfgpu_magic selftest --only RULES --json` with its own Jupyter and IPython directories,
    none of the variables the policy sets inherited, and `sitecustomize` in every process it starts."""
    env = {name: value for name, value in quiet_env().items() if name not in QUIET_ENV}
    env.update(isolated_env(tmp_path))
    if sitecustomize:
        (tmp_path / "site").mkdir()
        (tmp_path / "site" / "sitecustomize.py").write_text(sitecustomize)
        env["PYTHONPATH"] = str(tmp_path / "site")
    done = subprocess.run([sys.executable, "-m", "tfgpu_magic", "selftest", "--only", ",".join(rules), "--json"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode in (0, 1), done.stderr[-3000:]
    rows = {row.rule: row for row in report.from_json(done.stdout)}
    assert list(rows) == list(rules) and done.returncode == int(any(row.verdict == FAIL for row in rows.values()))
    return rows


FAKE_NVML = f"""\
import sys
sys.path.append({str(TESTS)!r})
from fake_nvml import FakeNvml, four_gpus
from tfgpu_magic.gpus import inventory
_nvml = inventory.Nvml(module=FakeNvml(four_gpus(this_kernel=False)))
inventory.shared_nvml = lambda: _nvml
"""
"""NVML lists the four fake cards in every process: the parent picks the card, the child's policy
turns `limit 50%` into a share of it."""


# ----- for real, here ----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def here(tmp_path_factory: pytest.TempPathFactory) -> dict[str, report.Row]:
    return selftest(tmp_path_factory.mktemp("here"))


@pytest.fixture(scope="module")
def with_cards(tmp_path_factory: pytest.TempPathFactory) -> dict[str, report.Row]:
    return selftest(tmp_path_factory.mktemp("cards"), FAKE_NVML)


@NO_JAX
def test_jax_starts_its_backends_with_the_policys_settings(here) -> None:
    """No NVML here: `growth on` only (a limit needs a card's total); jaxlib's reader of the `XLA_*`
    variables, called as the backends start, gives no preallocation; no GPU plugin and no card."""
    row = here[JAX]
    assert row.verdict == PASS and row.policy == ("growth on",), row
    f = row.figures
    assert f["started_at_import"] is False and f["error"] is None and f["given"] is None and f["gpus"] == []
    assert f["env"]["XLA_PYTHON_CLIENT_PREALLOCATE"] == "false" and f["options"]["preallocate"] is False
    assert "memory_fraction" not in f["options"] and row.seconds > 0
    assert row.measured == "jaxlib read at backend start: preallocate false, memory_fraction unset, allocator default"
    assert row.why.startswith("JAX lists no GPU here (its platforms: cpu): ") and "no limit was tried" in row.why


@NO_TORCH
def test_torch_loads_with_the_policys_allocator(here) -> None:
    """`allocator async`: both names carry the backend as torch._C loads, torch's own reader parses
    it, the import starts no CUDA, and the policy's one call waits in torch's queue."""
    row = here[TORCH]
    assert row.verdict == PASS and row.policy == ("allocator async",), row
    f = row.figures
    assert f["at_load"] == dict.fromkeys(("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF"), f"backend:{TORCH_ASYNC}")
    assert f["settings"] == f"backend:{TORCH_ASYNC}" and f["cuda_started"] is False and f["queued"] == 1
    assert f["fractions"] == {} and f["gpu"] is None
    assert "PyTorch sees no GPU here" in row.why


@NO_JAX
@NO_TORCH
def test_the_header_names_the_versions_the_rules_imported(here) -> None:
    """The report's first line names JAX and PyTorch as their children imported them."""
    from tfgpu_magic.views.selftest import header

    first = header(list(here.values()))
    assert f" · JAX {here[JAX].figures['version']}" in first and f" · PyTorch {here[TORCH].figures['version']}" in first
    assert " · JAX " not in header([row for row in here.values() if row.rule != JAX])


@NO_JAX
@NO_TORCH
def test_with_a_cards_total_the_limit_reaches_each_as_a_share(with_cards) -> None:
    """NVML's cards: the freest usable one (GPU 2) alone, `limit 50%`: JAX's reader gives memory_fraction
    0.5 at backend start; PyTorch's queued call gives device 0 (GPU 2 in CUDA's order) 0.5."""
    jax, torch = with_cards[JAX], with_cards[TORCH]
    assert (jax.verdict, jax.policy) == (PASS, ("visible 2", "growth on", "limit 50%")), jax
    assert jax.figures["options"]["memory_fraction"] == 0.5 and jax.figures["env"]["XLA_CLIENT_MEM_FRACTION"] == "0.5"
    assert "memory_fraction 0.5" in jax.measured and "no limit was tried" not in jax.why
    assert (torch.verdict, torch.policy) == (PASS, ("visible 2", "allocator async", "limit 50%")), torch
    assert torch.figures["fractions"] == {"0": 0.5} and torch.figures["queued"] == 1
    assert "1 call(s) queued for CUDA's start, giving device 0 0.5" in torch.measured


# ----- each rule can fail ----------------------------------------------------------------------------------
def after_loading(name: str, *then: str) -> str:
    """A sitecustomize in which module `name`, once loaded, runs the lines `then` (`module` is it)."""
    lines = "".join(f"            {line}\n" for line in then)
    return f"""\
import sys
from importlib.machinery import PathFinder

class AfterLoading:
    def find_spec(self, name, path=None, target=None):
        if name != {name!r}:
            return None
        spec = PathFinder.find_spec(name, path, target)
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
{lines}        spec.loader.exec_module = exec_module
        return spec

sys.meta_path.insert(0, AfterLoading())
"""


LOSE_VARIABLES = after_loading("tfgpu_magic.plan", "module._jax_env = lambda *args: None",
                               "module._torch_env = lambda *args: None")
"""The plan as loaded, but it sets none of JAX's or PyTorch's variables."""


@NO_JAX
@NO_TORCH
def test_a_plan_that_loses_the_variables_fails_both(tmp_path: Path) -> None:
    rows = selftest(tmp_path, FAKE_NVML + LOSE_VARIABLES)
    jax, torch = rows[JAX], rows[TORCH]
    assert (jax.verdict, jax.why) == (FAIL, "JAX's backends started without the policy's settings"), jax
    assert jax.measured.startswith("jaxlib read at backend start: preallocate unset (JAX's default: true), "
                                   "memory_fraction unset")
    assert (torch.verdict, torch.why) == (FAIL, "PyTorch did not get the policy's allocator or fraction"), torch
    assert torch.figures["at_load"] == {"PYTORCH_CUDA_ALLOC_CONF": None, "PYTORCH_ALLOC_CONF": None}
    assert torch.figures["settings"] == "" and torch.figures["fractions"] == {"0": 0.5}


STARTED_AT_IMPORT = after_loading("jax", "module.devices()")
"""`import jax` starts its backends before it returns (as a library that lists devices at import would)."""


@NO_JAX
def test_a_jax_whose_backends_start_at_import_fails(tmp_path: Path) -> None:
    """The policy's hook sets JAX's variables as `import jax` finishes: backends started inside the
    import read them too early, and the rule says so."""
    row = selftest(tmp_path, STARTED_AT_IMPORT, (JAX,))[JAX]
    assert (row.verdict, row.measured) == (FAIL, "backends started at import"), row
    assert row.why == "JAX's backends had started by the end of `import jax`, before the policy's variables"


@NO_TORCH
def test_a_torch_imported_before_the_policy_fails(tmp_path: Path) -> None:
    """torch loaded at startup (a sitecustomize): its C library read the environment before the policy
    existed; the child never sees it load, and torch's reader has no backend."""
    row = selftest(tmp_path, "import torch\n", (TORCH,))[TORCH]
    assert row.verdict == FAIL and row.figures["at_load"] is None, row
    assert row.measured.startswith("torch._C was not seen loading; torch's reader: ''")


# ----- skipped where the framework cannot be imported ----------------------------------------------------
HIDE_FRAMEWORKS = """\
import sys
from importlib.machinery import PathFinder

class WithoutJaxOrTorch(PathFinder):
    '''The path finder, but neither JAX nor PyTorch is installed.'''
    @classmethod
    def find_spec(cls, name, path=None, target=None):
        if name.split(".")[0] in ("jax", "jaxlib", "torch"):
            return None
        return PathFinder.find_spec(name, path, target)

sys.meta_path[:] = [WithoutJaxOrTorch if finder is PathFinder else finder for finder in sys.meta_path]
"""


def test_without_the_frameworks_each_rule_is_skipped_saying_why(tmp_path: Path) -> None:
    rows = selftest(tmp_path, HIDE_FRAMEWORKS)
    assert (rows[JAX].verdict, rows[JAX].why) == (SKIP, f"JAX is not installed for {sys.executable}")
    assert (rows[TORCH].verdict, rows[TORCH].why) == (SKIP, f"PyTorch is not installed for {sys.executable}")
    assert all(row.seconds == 0 and row.figures is None and row.policy == () for row in rows.values())


def test_they_need_neither_tensorflow_nor_the_run_without_a_policy() -> None:
    """Their own lane, which starts with the run without a policy and the NVML rules (`run._Run.all`);
    `--only` brings no baseline along, and a machine without TensorFlow or NVML still runs them."""
    assert {BY_NAME[JAX].lane, BY_NAME[TORCH].lane} == {FRAMEWORKS}
    assert [rule.name for rule in selected([JAX, TORCH])] == [JAX, TORCH]
    no_tf = Machine({}, Inventory(error="NVML unavailable"), tensorflow="TensorFlow is not installed for python")
    assert BY_NAME[JAX].prepare(no_tf).policy == ("growth on",)
    assert BY_NAME[TORCH].prepare(no_tf).args["no_limit"] == "NVML unavailable"


# ----- the GPU branches, judged on what a GPU would give ---------------------------------------------------
@pytest.fixture
def clean_process(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """PyTorch counts as installed (the fake stands for it); every hook the controller arms goes afterwards."""
    monkeypatch.setattr(torch_room, "installed", lambda: True)
    for name in ("torch", "jax"):  # one left armed by another controller would stand for this one's
        importhooks.disarm(name)
    yield
    quietimport.disarm()
    for name in ("torch", "jax"):
        importhooks.disarm(name)


def torch_on_a_gpu(sabotage: Callable[[FakeTorch], None] | None = None) -> tuple[Probe, Prepared, Machine]:
    """The torch probe's figures in a process on the four cards, with PyTorch's rules (tests/fake_torch.py):
    the rule's policy through a real Controller, `import torch` inside the policy's hook, then the
    first CUDA call, read in the probe's order."""
    machine = Machine({}, CARDS)
    prepared = BY_NAME[TORCH].prepare(machine)
    env: dict[str, str] = {}
    torch = FakeTorch(environ=env, totals_mib=[gpu.memory_total_mib for gpu in CARDS.gpus],
                      uuids=[gpu.uuid for gpu in CARDS.gpus])
    if sabotage is not None:
        sabotage(torch)
    ctl = Controller(api=FakeTF(4, imported=False, environ=env), environ=env, catalog=InventoryCatalog(CARDS),
                     torch=torch)
    ctl.edit([ctl.parse(line) for line in prepared.policy])
    hooks = [f for f in sys.meta_path if importhooks.is_hook(f) and f.target == "torch"]
    assert len(hooks) == 1
    importhooks.disarm("torch")
    with hooks[0].around():
        at_load = {name: env.get(name) for name in prepared.args["variables"]}
        torch.import_torch()
    hooks[0].callback()
    figures: dict[str, Any] = {
        "version": "2.13.0+cu128", "cuda_build": "12.8", "at_load": at_load,
        "settings": torch._read_alloc_conf(), "cuda_started": torch.is_initialized(),
        "queued": sum(getattr(call, "__self__", None) is ctl.fractions for call in torch.queued),
        "fractions": {str(device): share for device, share in ctl.fractions.wanted().items()}}
    torch.allocate(0, 1)  # torch.zeros(1, device="cuda")
    figures["gpu"] = {"devices": torch.device_count(), "backend": torch.loaded_backend,
                      "fractions": {str(d): torch.fraction(d) for d in range(torch.device_count())}}
    return Probe(figures), prepared, machine


def own_environment(torch: FakeTorch) -> None:
    """torch's C library reads an environment of its own: the policy's configuration never reaches it."""
    torch.environ = {}


def ignore_fraction(torch: FakeTorch) -> None:
    torch.set_fraction = lambda fraction, device: None


@pytest.mark.usefixtures("clean_process")
def test_the_torch_rule_on_a_gpu_passes_where_torch_obeys_and_fails_where_it_does_not() -> None:
    probe, prepared, machine = torch_on_a_gpu()
    assert probe.figures["gpu"] == {"devices": 1, "backend": TORCH_ASYNC, "fractions": {"0": 0.5}}
    outcome = BY_NAME[TORCH].judge(probe, prepared, machine)
    assert outcome.verdict == PASS and outcome.why == "", outcome
    assert outcome.measured.endswith(f"after a first CUDA call: backend {TORCH_ASYNC}, fraction device 0 0.5")
    every_card = "backend native, fraction device 0 0.5, device 1 1, device 2 1, device 3 1"  # nor CUDA_VISIBLE_DEVICES
    for sabotage, read in ((own_environment, every_card),
                           (ignore_fraction, f"backend {TORCH_ASYNC}, fraction device 0 1")):
        probe, prepared, machine = torch_on_a_gpu(sabotage)
        outcome = BY_NAME[TORCH].judge(probe, prepared, machine)
        assert outcome.verdict == FAIL and outcome.measured.endswith(read), (sabotage, outcome)


@NO_JAX
def test_the_jax_rule_on_a_gpu_passes_where_the_share_holds_and_fails_where_it_does_not(with_cards) -> None:
    """The figures of the real run with a card's total (`with_cards`), and the card a GPU would add: XLA's
    allocator limit is memory_fraction × the card's total (`CreateBFCAllocator` in XLA's
    se_gpu_pjrt_client.cc: 0.75 where no fraction is given); where JAX ignored the fraction, or gave no
    limit, the rule fails."""
    row = with_cards[JAX]
    machine = Machine({}, CARDS)
    prepared = BY_NAME[JAX].prepare(machine)
    assert isinstance(prepared, Prepared) and prepared.policy == row.policy
    total = prepared.args["total_mib"] * MIB

    def on_a_gpu(bytes_limit: int | None) -> Any:
        figures = {**row.figures, "given": row.figures["options"], "platforms": ["cpu", "cuda"],
                   "gpus": [{"device": "cuda:0", "bytes_limit": bytes_limit, "bytes_in_use": 0}]}
        return BY_NAME[JAX].judge(Probe(figures), prepared, machine)

    held = on_a_gpu(int(row.figures["options"]["memory_fraction"] * total))
    assert held.verdict == PASS and held.why == "" and held.measured.startswith("given to JAX's CUDA plugin: ")
    assert held.measured.endswith("; allocator limit on the card: 40.0 GiB")
    for ignored in (int(0.75 * total), None):
        outcome = on_a_gpu(ignored)
        assert (outcome.verdict, outcome.why) == (FAIL, "JAX's allocator may take more than the policy's share of "
                                                        "the card"), outcome


def test_a_setting_already_inherited_is_said_to_prove_only_that_it_is_kept() -> None:
    """The selftest's own environment held the backend already: the pass says what it does not show."""
    conf = f"backend:{TORCH_ASYNC}"
    machine = Machine({"PYTORCH_CUDA_ALLOC_CONF": conf}, Inventory(error="NVML unavailable"))
    prepared = BY_NAME[TORCH].prepare(machine)
    figures = {"version": "2.13.0+cpu", "cuda_build": None, "settings": conf, "cuda_started": False, "queued": 1,
               "fractions": {}, "gpu": None,
               "at_load": {"PYTORCH_CUDA_ALLOC_CONF": conf, "PYTORCH_ALLOC_CONF": conf}}
    outcome = BY_NAME[TORCH].judge(Probe(figures), prepared, machine)
    assert outcome.verdict == PASS
    assert outcome.why.endswith("PYTORCH_CUDA_ALLOC_CONF as inherited: this shows only that the policy keeps it")
    broken = {**figures, "settings": "backend:native", "at_load": {**figures["at_load"], "PYTORCH_ALLOC_CONF": None}}
    assert BY_NAME[TORCH].judge(Probe(broken), prepared, machine).verdict == FAIL
