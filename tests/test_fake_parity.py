"""FakeTF against real TensorFlow (CPU build) wherever both can run: same outcome for every call.

Each scenario is a list of calls on the seam. Real TensorFlow runs it in ONE fresh subprocess
(this pytest process never imports TensorFlow: that would lock its state for the whole session),
through the real `TensorFlowConfig`; the fake runs it here. Every step must give the same outcome
(value, or exception type and message) on both, and the outcome the scenario expects.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from fake_tf import FakeTF, PhysicalDevice
from tfgpu_magic.plan import build_plan
from tfgpu_magic.language.policy import Policy
from tfgpu_magic.tf.apply import ApplyReport, apply_plan, session_config
from tfgpu_magic.tf.apply import TensorFlowConfig
from tfgpu_magic.tf.routes import install_routes
from tfgpu_magic.tf.runtime import LogicalSpec
from tfgpu_magic.views import status

pytestmark = pytest.mark.tensorflow

TESTS_DIR = Path(__file__).resolve().parent
TF_TIMEOUT = 120


# ----- one interpreter for both sides ---------------------------------------------------------------
class RealTF(TensorFlowConfig):
    """The real seam plus TensorFlow's life, for the subprocess."""

    def list_devices(self) -> list[Any]:
        return self.tf.config.list_physical_devices()

    def initialize(self) -> None:
        self.tf.config.list_logical_devices()  # initializes the runtime

    def cpus_in_force(self) -> int:
        return len(self.tf.config.list_logical_devices("CPU"))

    @property
    def device_lib(self) -> Any:
        from tensorflow.python.client import device_lib

        return device_lib

    def session_devices(self, config: Any) -> list[Any]:
        with self.tf.Graph().as_default():
            return self.tf.compat.v1.Session(config=config).list_devices()

    def set_user_logical(self, device: Any, configs: Any) -> None:
        make = self.tf.config.LogicalDeviceConfiguration
        self.tf.config.set_logical_device_configuration(device, type(configs)(make(*spec) for spec in configs))


class ParityFake(FakeTF):
    def cpus_in_force(self) -> int:
        return self.in_force().cpus

    def session_devices(self, config: Any) -> list[Any]:
        return self.Session(config=config).list_devices()


def device(name: str) -> PhysicalDevice:
    """`"CPU:0"` → a PhysicalDevice (a namedtuple: equal to TensorFlow's own)."""
    return PhysicalDevice(f"/physical_device:{name}", name.split(":")[0])


def _names(api: Any, devices: list[Any]) -> list[str]:
    return [api.name(d) for d in devices]


def _report(report: ApplyReport) -> dict[str, Any]:
    """The report with its changes as the messages word them (`views.status`)."""
    data: dict[str, Any] = {name: getattr(report, name) for name in ApplyReport.__slots__}
    data["state"] = list(report.state)  # a NamedTuple: its values in field order
    for name in ("applied", "locked", "failed", "earlier"):
        data[name] = [status.item_text(item) for item in getattr(report, name)]
    for name in ("notes", "absent"):
        data[name] = [status.note_text(note) for note in getattr(report, name)]
    return data


def _initialize(api: Any) -> None:
    api.initialize()


def _cpus(devices: list[Any]) -> int:
    return sum(d.device_type == "CPU" for d in devices)


def _policy_config(api: Any, policy: dict | None) -> Any:
    return None if policy is None else session_config(build_plan(Policy.from_dict(policy)), api)


def _own_config(api: Any, cpus: int | None) -> Any:
    config = api.new_session_config()
    if cpus is not None:
        config.device_count["CPU"] = cpus
    return config


def _install(api: Any, policy: dict) -> None:
    install_routes(api, lambda: _policy_config(api, policy))


OPS = {
    # the first three fields: devices_created and cuda_elsewhere are GPU-build facts (a CPU build never
    # creates GPU devices nor loads libcuda), covered by tests/test_gpu_paths.py
    "state": lambda api: list(api.state())[:3],
    "list": lambda api, kind: _names(api, api.devices(kind)),
    "init": lambda api: _initialize(api),
    "cpus": lambda api: api.cpus_in_force(),
    "get_growth": lambda api, name: api.get_growth(device(name)),
    "set_growth": lambda api, name, enable: api.set_growth(device(name), enable),
    "get_logical": lambda api, name: api.get_logical(device(name)),
    "set_logical": lambda api, name, limits: api.set_logical(device(name), limits),
    "get_visible": lambda api, kind: _names(api, api.get_visible(kind)),
    "set_visible": lambda api, names, kind: api.set_visible([device(n) for n in names], kind),
    "apply": lambda api, policy: _report(apply_plan(build_plan(Policy.from_dict(policy)), api)),
    "device_lib": lambda api, policy: _cpus(api.device_lib.list_local_devices(_policy_config(api, policy))),
    "routes": lambda api, policy: (_install(api, policy), _cpus(api.device_lib.list_local_devices()))[1],
    "session": lambda api, cpus: _cpus(api.session_devices(_own_config(api, cpus))),
    "set_user_logical": lambda api, name, count, kind: api.set_user_logical(
        device(name), {"list": list, "tuple": tuple}[kind](LogicalSpec() for _ in range(count))),
    "cpu_priority": lambda api, name: api.set_user_logical(device(name), [LogicalSpec(None, 1)]),
}


def run_steps(api: Any, calls: list[list[Any]]) -> list[list[Any]]:
    """Outcome of each call: `["ok", value]` or `[exception type, message]`, JSON-shaped."""
    outcomes = []
    for op, *args in calls:
        try:
            value = OPS[op](api, *args)
        except (ValueError, RuntimeError, KeyError) as err:
            outcomes.append([type(err).__name__, str(err)])
        else:
            outcomes.append(["ok", json.loads(json.dumps(value))])
    return outcomes


SUBPROCESS = """
import json, sys
import tensorflow
sys.path.insert(0, sys.argv[1])
from test_fake_parity import RealTF, run_steps
print("OUTCOMES " + json.dumps(run_steps(RealTF(), json.loads(sys.argv[2]))))
"""


def run_real(calls: list[list[Any]]) -> list[list[Any]]:
    """Outcomes of `calls` on real TensorFlow, in one fresh interpreter."""
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "CUDA_VISIBLE_DEVICES": ""}
    done = subprocess.run(
        [sys.executable, "-c", SUBPROCESS, str(TESTS_DIR), json.dumps(calls)],
        capture_output=True, text=True, env=env, cwd=TESTS_DIR.parent, timeout=TF_TIMEOUT,
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("OUTCOMES ")]
    assert done.returncode == 0 and lines, f"TensorFlow subprocess failed:\n{done.stderr[-3000:]}"
    return json.loads(lines[-1].removeprefix("OUTCOMES "))


# ----- scenarios ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Step:
    why: str
    call: tuple
    want: tuple
    """("ok", value) exact; (ExceptionType, message substring); ("report", {field: [substrings]})."""


def ok(value: Any = None) -> tuple:
    return ("ok", value)


def report(**fields: list[str]) -> tuple:
    return ("report", fields)


THREE = [None, None, None]
VIRTUAL_LOCKED = "Virtual devices cannot be modified after being initialized"
VISIBLE_LOCKED = "Visible devices cannot be modified after being initialized"

RULES = [
    Step("imported, nothing listed", ("state",), ok([True, False, False])),
    Step("listing starts CUDA", ("list", "CPU"), ok(["CPU:0"])),
    Step("devices listed", ("state",), ok([True, True, False])),
    Step("no GPU on this build", ("list", "GPU"), ok([])),
    Step("CPU visible", ("get_visible", "CPU"), ok(["CPU:0"])),
    Step("no logical config yet", ("get_logical", "CPU:0"), ok(None)),
    Step("growth of a CPU is no key", ("get_growth", "CPU:0"), ("KeyError", "CPU:0")),
    Step("growth on CPU", ("set_growth", "CPU:0", True), ("ValueError", "memory growth on non-GPU")),
    Step("growth on unknown GPU", ("set_growth", "GPU:0", True), ("ValueError", "Unrecognized device")),
    Step("logical of unknown GPU", ("get_logical", "GPU:0"), ("ValueError", "Unrecognized device")),
    Step("split unknown GPU", ("set_logical", "GPU:0", [1024]), ("ValueError", "Unrecognized device")),
    Step("memory_limit on CPU", ("set_logical", "CPU:0", [1024, None]), ("ValueError", "memory limit on CPU")),
    Step("still no logical config", ("get_logical", "CPU:0"), ok(None)),
    Step("show unknown GPU", ("set_visible", ["GPU:0"], "GPU"), ("ValueError", "Unrecognized device")),
    Step("CPU as a GPU", ("set_visible", ["CPU:0"], "GPU"), ("ValueError", "Unrecognized device")),
    Step("split CPU in 3", ("set_logical", "CPU:0", THREE), ok()),
    Step("3 recorded", ("get_logical", "CPU:0"), ok(THREE)),
    Step("growth with virtual config", ("set_growth", "CPU:0", False), ("ValueError", "virtual devices configured")),
    Step("same split again", ("set_logical", "CPU:0", THREE), ok()),
    Step("change before init", ("set_logical", "CPU:0", [None, None]), ok()),
    Step("change back", ("set_logical", "CPU:0", THREE), ok()),
    Step("same visible CPU", ("set_visible", ["CPU:0"], "CPU"), ok()),
    Step("empty GPU list, no GPU", ("set_visible", [], "GPU"), ok()),
    Step("first op", ("init",), ok()),
    Step("initialized", ("state",), ok([True, True, True])),
    Step("3 logical CPUs in force", ("cpus",), ok(3)),
    Step("identical split after init", ("set_logical", "CPU:0", THREE), ok()),
    Step("other split after init", ("set_logical", "CPU:0", [None, None]), ("RuntimeError", VIRTUAL_LOCKED)),
    Step("limit checked before lock", ("set_logical", "CPU:0", [512]), ("ValueError", "memory limit on CPU")),
    Step("config unchanged", ("get_logical", "CPU:0"), ok(THREE)),
    Step("identical visible after init", ("set_visible", ["CPU:0"], "CPU"), ok()),
    Step("hide CPU after init", ("set_visible", [], "CPU"), ("RuntimeError", VISIBLE_LOCKED)),
    Step("CPU still visible", ("get_visible", "CPU"), ok(["CPU:0"])),
    Step("growth on CPU after init", ("set_growth", "CPU:0", True), ("ValueError", "virtual devices configured")),
    Step("still 3 in force", ("cpus",), ok(3)),
]

CPU3 = {"cpu_devices": 3}
APPLY = [
    Step("TF imported only", ("state",), ok([True, False, False])),
    Step("growth, no GPU", ("apply", {"growth": True}), report(applied=[], locked=[], notes=["sees no GPU"])),
    Step("CPU split", ("apply", CPU3), report(applied=["TF default → 3 logical devices"], locked=[], failed=[])),
    Step("again: nothing to do", ("apply", CPU3), report(applied=[], locked=[], failed=[])),
    Step("change before init", ("apply", {"cpu_devices": 2}), report(applied=["3 logical devices → 2"], locked=[])),
    Step("back to 3", ("apply", CPU3), report(applied=["→ 3 logical devices"], locked=[])),
    Step("first op", ("init",), ok()),
    Step("3 CPUs in force", ("cpus",), ok(3)),
    Step("identical after init", ("apply", CPU3), report(applied=[], locked=[], failed=[])),
    Step("different after init", ("apply", {"cpu_devices": 2}),
         report(applied=[], locked=["3 logical devices → 2"], failed=[])),
    Step("split off after init", ("apply", {"cpu_devices": 1}), report(applied=[], locked=["→ 1 logical devices"])),
    Step("nothing changed", ("get_logical", "CPU:0"), ok(THREE)),
    Step("still 3 in force", ("cpus",), ok(3)),
]

# Routes that create devices outside the eager context (client/device_lib.py `list_local_devices`,
# client/session.py `BaseSession.__init__`) and TF's `==` on recorded logical configurations
# (context.py `set_logical_device_configuration`): what a CPU build can show of them.
ROUTES = [
    Step("split cpu 3 recorded", ("set_logical", "CPU:0", THREE), ok()),
    Step("device_lib's default config ignores it", ("device_lib", None), ok(1)),
    Step("device_lib given the policy's config", ("device_lib", CPU3), ok(3)),
    Step("wrapped: device_lib's default is the policy", ("routes", CPU3), ok(3)),
    Step("wrapped: a bare ConfigProto gets the policy's", ("session", None), ok(3)),
    Step("wrapped: a config's own CPU count wins", ("session", 2), ok(2)),
    Step("no route initialized the runtime", ("state",), ok([True, True, False])),
    Step("the user's own configs, as a tuple", ("set_user_logical", "CPU:0", 3, "tuple"), ok()),
    Step("read back as entries", ("get_logical", "CPU:0"), ok(THREE)),
    Step("priority on a CPU", ("cpu_priority", "CPU:0"), ("ValueError", "experimental_priority on CPU")),
    Step("first op", ("init",), ok()),
    Step("same values as a list: TF compares with ==", ("set_logical", "CPU:0", THREE), ("RuntimeError", VIRTUAL_LOCKED)),
    Step("apply sees them identical, calls nothing", ("apply", CPU3), report(applied=[], locked=[], failed=[])),
    Step("3 CPUs in force", ("cpus",), ok(3)),
]
# Read, not run (a CPU build has no GPU): a priority or ordinal on a GPU's logical devices, the
# allocators fixed by the first GPU device creation, cuda_malloc_async, "mapped to multiple CUDA
# devices" and VerifyVirtualDeviceSettings; tests/test_gpu_paths.py drives them through the fake.

SCENARIOS = {"rules": RULES, "apply_plan": APPLY, "routes": ROUTES}


@pytest.fixture(scope="module")
def outcomes() -> dict[str, tuple[list, list]]:
    """(real, fake) outcomes of every scenario; each scenario runs in its own fresh TF process."""
    calls = {name: [list(step.call) for step in steps] for name, steps in SCENARIOS.items()}
    return {name: (run_real(calls[name]), run_steps(ParityFake(0), calls[name])) for name in SCENARIOS}


def matches(outcome: list, want: tuple) -> bool:
    kind, expected = want
    if kind == "report":
        return outcome[0] == "ok" and all(
            len(outcome[1][field]) == len(subs) and all(s in line for s, line in zip(subs, outcome[1][field]))
            for field, subs in expected.items()
        )
    if kind == "ok":
        return outcome == ["ok", expected]
    return outcome[0] == kind and expected in outcome[1]


CASES = [
    pytest.param(name, index, id=f"{name}-{index:02d}-{step.why.replace(' ', '_')}")
    for name, steps in SCENARIOS.items()
    for index, step in enumerate(steps)
]


@pytest.mark.parametrize(("scenario", "index"), CASES)
def test_fake_matches_tensorflow(outcomes: dict, scenario: str, index: int) -> None:
    """The fake gives TensorFlow's exact outcome, and both give the one the scenario expects."""
    real, fake = (side[index] for side in outcomes[scenario])
    step = SCENARIOS[scenario][index]
    assert matches(real, step.want), f"TensorFlow itself: {real}, scenario expects {step.want}"
    assert fake == real

