"""The policy value, its JSON form, the plan it turns into and its export (pure, no TensorFlow)."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import subprocess
import sys
from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fake_tf import FakeTF, GpuInForce, InForce

from tfgpu_magic.errors import PolicyError
from tfgpu_magic.tf.export import export
from tfgpu_magic.language.directives import REGISTRY
from tfgpu_magic.language.grammar import parse_line
from tfgpu_magic.plan import build_plan
from tfgpu_magic.tf.runtime import LogicalSpec
from tfgpu_magic.language.policy import Policy, sort_gpu_items
from tfgpu_magic.views.status import note_text

GROWTH_ENV = "TF_FORCE_GPU_ALLOW_GROWTH"


def policy_of(*lines: str) -> Policy:
    policy = Policy()
    for line in lines:
        policy = parse_line(line).change(policy)
    return policy


# ----- the value --------------------------------------------------------------------------------
def test_policy_is_frozen() -> None:
    policy = Policy(growth=True)
    with pytest.raises(dataclasses.FrozenInstanceError):
        policy.growth = False  # type: ignore[misc]
    assert policy.growth is True


def test_replace_validates_and_leaves_the_original() -> None:
    policy = Policy(limits=(("0", 1024),))
    with pytest.raises(PolicyError, match="both a limit and a split"):
        policy.replace(splits=(("0", (512, 512)),))
    assert policy == Policy(limits=(("0", 1024),))


def test_sources_do_not_count_for_equality() -> None:
    assert Policy(growth=True, sources=(("visible", "auto"),)) == Policy(growth=True)
    assert Policy(sources=(("visible", "auto"),)).is_empty


def test_gpu_items_sort_all_first_then_numeric_then_uuids() -> None:
    items = [("GPU-b", 1), ("10", 1), ("2", 1), ("all", 1), ("GPU-a", 1)]
    assert [gpu for gpu, _ in sort_gpu_items(items)] == ["all", "2", "10", "GPU-a", "GPU-b"]


@pytest.mark.parametrize(
    "fields, expect",
    [
        ({"limits": (("0", 1024),), "splits": (("0", (512,)),)}, "both a limit and a split"),
        ({"splits": (("0", ()),)}, "1 to 64 parts, got 0"),
        ({"splits": (("0", (1,) * 65),)}, "1 to 64 parts, got 65"),
        ({"splits": (("0", (0,)),)}, "1 MiB to 1024 GiB"),
        ({"limits": (("0", 1024 * 1024 + 1),)}, "1 MiB to 1024 GiB"),
        ({"limits": (("0", 1.5),)}, "whole number of MiB"),
        ({"cpu_devices": 0}, "1 to 64, got 0"),
        ({"cpu_devices": 65}, "1 to 64, got 65"),
        ({"allocator": "cuda_malloc_async"}, "'cuda_malloc_async'"),
        ({"visible": (), "limits": (("0", 5),)}, "`visible none` hides every GPU"),
        ({"visible": ("0",), "splits": (("1", (5,)),)}, "not visible (visible: 0)"),
    ],
)
def test_validation_rules(fields: dict, expect: str) -> None:
    with pytest.raises(PolicyError) as info:
        Policy(**fields).validate()
    assert expect in str(info.value) and "\n" not in str(info.value)


@pytest.mark.parametrize(
    "policy",
    [
        Policy(visible=(), limits=(("all", 1024),)),  # a cap on all GPUs does not need one visible
        Policy(visible=("GPU-8932f937",), limits=(("0", 1024),)),  # UUIDs: cannot tell here
        Policy(limits=(("all", 1024),), splits=(("0", (512, 512)),)),  # the split overrides GPU 0
        Policy(visible=("2", "3"), limits=(("3", 1),), splits=(("2", (1024 * 1024,)),)),
    ],
)
def test_valid_edge_policies(policy: Policy) -> None:
    policy.validate()


# ----- JSON -------------------------------------------------------------------------------------
DIRECTIVES = [
    *(example for directive in REGISTRY if directive.kind == "edit" for example in directive.examples),
    "limit 512MB 0", "limit 2GB 1,3", "limit off", "limit off 0", "visible 0-3", "visible 3,1",
    "visible GPU-8932f937,2", "split 2 256MB,768MB", "split off 0", "loglevel debug",
]
"""Every edit's examples from the registry, and a few more forms."""


@st.composite
def policies(draw: st.DrawFn) -> Policy:
    """Policies reachable by directives (the ones that fail on the way are skipped)."""
    policy = Policy()
    for line in draw(st.lists(st.sampled_from(DIRECTIVES), max_size=8)):
        try:
            policy = parse_line(line).change(policy)
        except PolicyError:
            pass
    return policy


@settings(max_examples=150, deadline=None)
@given(policies())
def test_json_round_trip(policy: Policy) -> None:
    data = json.loads(json.dumps(policy.to_dict()))
    assert Policy.from_dict(data) == policy
    assert json.loads(export(policy, "json")) == data


@pytest.mark.parametrize(
    "data, expect",
    [
        ([], "must be a JSON object, got list"),
        ("growth on", "must be a JSON object, got str"),
        ({"growth": True, "colour": "red"}, "unknown policy keys: colour"),
        ({"sources": []}, "unknown policy keys: sources"),
        ({"visible": "0,1"}, "'visible' must be null or a list"),
        ({"visible": [0, 1]}, "'visible' must be null or a list"),
        ({"visible": [""]}, "'visible' must be null or a list"),
        ({"growth": "true"}, "'growth' must be true, false or null"),
        ({"growth": 1}, "'growth' must be true, false or null"),
        ({"limits": ["0"]}, "'limits' must be an object"),
        ({"limits": {"0": "1GB"}}, "whole number of MiB"),
        ({"limits": {"0": True}}, "whole number of MiB"),
        ({"limits": {"0": 0}}, "1 MiB to 1024 GiB"),
        ({"limits": {"": 5}}, "keys must be GPU references"),
        ({"splits": {"0": 1024}}, "lists of MiB"),
        ({"splits": {"0": []}}, "1 to 64 parts"),
        ({"splits": {"0": [512, 0.5]}}, "whole number of MiB"),
        ({"splits": ["0"]}, "'splits' must be an object"),
        ({"cpu_devices": "2"}, "'cpu_devices' must be an integer"),
        ({"cpu_devices": True}, "'cpu_devices' must be an integer"),
        ({"cpu_devices": 0}, "1 to 64, got 0"),
        ({"allocator": 1}, "'allocator' must be a string"),
        ({"allocator": "cuda_malloc_async"}, "'cuda_malloc_async'"),
        ({"visible": ["0"], "limits": {"1": 5}}, "not visible"),
        ({"limits": {"0": 5}, "splits": {"0": [5]}}, "both a limit and a split"),
    ],
)
def test_from_dict_rejects(data: object, expect: str) -> None:
    with pytest.raises(PolicyError) as info:
        Policy.from_dict(data)  # type: ignore[arg-type]
    assert expect in str(info.value) and "\n" not in str(info.value)


@pytest.mark.parametrize("data", [{"limits": []}, {"splits": 0}])
def test_from_dict_rejects_falsy_non_objects(data: dict) -> None:
    """A falsy value that is not an object ([], 0) is an error, not 'no limits'; only a missing key or null is."""
    with pytest.raises(PolicyError, match="must be an object"):
        Policy.from_dict(data)


@pytest.mark.parametrize("data", [{"visible": ["0,1"]}, {"visible": ["-1"]}, {"limits": {"x y": 5}}])
def test_from_dict_rejects_what_the_grammar_rejects(data: dict) -> None:
    """GPU references the grammar would refuse ('0,1', '-1') never reach CUDA_VISIBLE_DEVICES from a file."""
    with pytest.raises(PolicyError, match="not a GPU reference"):
        Policy.from_dict(data)


def test_from_dict_superscript_key_is_policy_error() -> None:
    """A non-ASCII digit such as '²' is not a GPU index: a PolicyError, not int()'s ValueError."""
    with pytest.raises(PolicyError, match="not a GPU reference: '²'"):
        Policy.from_dict({"limits": {"²": 5}})


# ----- plan -------------------------------------------------------------------------------------
def test_empty_policy_plans_nothing() -> None:
    plan = build_plan(Policy())
    assert (plan.env, plan.tf_limits, plan.tf_default_limits, plan.notes, plan.growth, plan.cpu_devices) == ((), (), None, (), None, None)


def test_cpu_split_alone_sets_no_gpu_variables() -> None:
    plan = build_plan(policy_of("split cpu 3"))
    assert plan.env == () and plan.cpu_devices == 3 and plan.has_tf_steps


def test_growth_alone_uses_set_memory_growth() -> None:
    plan = build_plan(policy_of("growth on"))
    assert plan.growth is True
    assert plan.env_map == {"CUDA_DEVICE_ORDER": "PCI_BUS_ID", GROWTH_ENV: None}  # None: make sure it is unset
    assert plan.tf_limits == () and plan.tf_default_limits is None and plan.notes == ()


@pytest.mark.parametrize("other", ["limit 1GB", "split 0 2x1GB", "split cpu 2"])
def test_growth_with_logical_devices_goes_through_the_environment(other: str) -> None:
    """TF refuses set_memory_growth next to logical devices: growth becomes TF_FORCE_GPU_ALLOW_GROWTH."""
    plan = build_plan(policy_of("growth on", other))
    assert plan.growth is None
    assert plan.env_map[GROWTH_ENV] == "true"
    assert any(GROWTH_ENV in note for note in map(note_text, plan.notes))


def test_limit_on_every_gpu_is_the_default_config() -> None:
    """The plan holds TensorFlow's arguments per GPU index, derived once (`Plan.tf_limits`)."""
    plan = build_plan(policy_of("limit 1GB", "split 1 2x256MB"))
    assert (plan.tf_limits, plan.tf_default_limits, plan.tf_indices) == (((1, (256, 256)),), (1024,), (("1", 1),))
    assert [plan.memory_limits(i) for i in range(3)] == [(1024,), (256, 256), (1024,)]


def test_the_plan_holds_limit_2gb_in_tensorflows_form() -> None:
    """The trip of one value: `limit 2GB` is `(("all", 2048),)` in the policy and `(2048,)`
    (TensorFlow's memory_limit list) in the plan, for every GPU."""
    plan = build_plan(policy_of("limit 2GB"))
    assert plan.tf_default_limits == (2048,) and plan.tf_limits == () and plan.tf_indices == () and plan.has_tf_steps
    assert plan.memory_limits(0) == plan.memory_limits(7) == (2048,)


@pytest.mark.parametrize("line, cvd", [("visible 3,1", "3,1"), ("visible none", ""), ("visible GPU-8932f937", "GPU-8932f937")])
def test_visible_sets_cuda_variables_in_pci_order(line: str, cvd: str) -> None:
    env = build_plan(policy_of(line)).env_map
    assert env["CUDA_VISIBLE_DEVICES"] == cvd
    assert env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"


def test_visible_renumbers_gpus_for_tensorflow() -> None:
    """nvidia-smi GPU 3 is TF's GPU 1 once only 2 and 3 are visible."""
    plan = build_plan(policy_of("visible 2,3", "limit 1GB 3"))
    assert plan.tf_limits == ((1, (1024,)),) and plan.tf_indices == (("3", 1),)
    assert plan.memory_limits(0) is None and plan.memory_limits(1) == (1024,)


def test_visible_order_given_is_the_tensorflow_order() -> None:
    plan = build_plan(policy_of("visible 3,1", "split 1 2x1GB"))
    assert (plan.tf_limits, plan.tf_default_limits) == (((1, (1024, 1024)),), None)


def test_inherited_visible_devices_renumber_too() -> None:
    """Without `visible`, a CUDA_VISIBLE_DEVICES set outside the tool decides the numbering."""
    policy = policy_of("limit 1GB 2")
    assert build_plan(policy).tf_indices == (("2", 2),)
    assert build_plan(policy, inherited_visible="5,2").tf_indices == (("2", 1),)
    assert build_plan(policy_of("visible 2", "limit 1GB 2"), inherited_visible="5,2").tf_indices == (("2", 0),)
    assert build_plan(policy, inherited_visible="5,2").tf_limits == ((1, (1024,)),)


def test_uuid_without_inventory_is_unresolved_with_a_note() -> None:
    plan = build_plan(policy_of("limit 1GB GPU-8932f937", "limit 2GB 0"))
    assert plan.unresolved == ("GPU-8932f937",)
    assert (plan.tf_limits, plan.tf_indices) == (((0, (2048,)),), (("0", 0),))
    assert any("GPU-8932f937" in note for note in map(note_text, plan.notes))


def test_uuid_listed_in_visible_resolves() -> None:
    plan = build_plan(policy_of("visible 1,GPU-8932f937", "limit 1GB GPU-8932f937"))
    assert plan.unresolved == () and (plan.tf_limits, plan.tf_indices) == (((1, (1024,)),), (("GPU-8932f937", 1),))


def test_async_allocator() -> None:
    plan = build_plan(policy_of("allocator async", "limit 1GB", "growth on"))
    assert plan.env_map["TF_GPU_ALLOCATOR"] == "cuda_malloc_async"
    assert any("soft" in note for note in map(note_text, plan.notes))
    assert any("moot" in note for note in map(note_text, plan.notes))


def test_async_allocator_alone_has_no_notes() -> None:
    assert build_plan(policy_of("allocator async")).notes == ()


def test_bfc_allocator_unsets_the_variable() -> None:
    assert build_plan(policy_of("allocator bfc")).env_map["TF_GPU_ALLOCATOR"] is None


def test_after_cuda_started_visible_goes_through_tf_config() -> None:
    plan = build_plan(policy_of("visible 2,3"), inherited_visible=None, cuda_started=True)
    assert "CUDA_VISIBLE_DEVICES" not in plan.env_map and "CUDA_DEVICE_ORDER" not in plan.env_map
    assert plan.visible_gpus == (2, 3)
    assert any("CUDA has already started" in note for note in map(note_text, plan.notes))


# ----- export -----------------------------------------------------------------------------------
def tensorflow_over(fake: FakeTF) -> SimpleNamespace:
    """The `tensorflow` names an exported script calls, each one tests/fake_tf.py's `FakeTF` method
    with TensorFlow's rules (CUDA reads `CUDA_VISIBLE_DEVICES` at the first listing; growth and a
    virtual configuration exclude each other; settings lock at initialization)."""
    return SimpleNamespace(config=SimpleNamespace(
        list_physical_devices=fake.devices,
        get_logical_device_configuration=fake.get_logical,
        set_logical_device_configuration=fake.set_user_logical,
        LogicalDeviceConfiguration=LogicalSpec,
        experimental=SimpleNamespace(set_memory_growth=fake.set_growth),
    ))


def run_exported(policy: Policy, gpus: int, environ: dict, monkeypatch: pytest.MonkeyPatch) -> FakeTF:
    """Run `export(policy, "python")` in a process with `gpus` GPUs (tests/fake_tf.py) and `environ` as
    os.environ; the fake TensorFlow it configured, not yet initialized."""
    code = compile(export(policy, "python"), "<export>", "exec")
    fake = FakeTF(gpus, environ=environ)
    with monkeypatch.context() as patch:
        patch.setitem(sys.modules, "tensorflow", tensorflow_over(fake))
        patch.setattr(os, "environ", environ)
        exec(code, {})
    return fake


LEFTOVER = {GROWTH_ENV: "false"}
"""Set before the script runs: growth policies must remove it, the others leave it."""
PCI = {"CUDA_DEVICE_ORDER": "PCI_BUS_ID"}


@pytest.mark.parametrize(
    "lines, gpus, env, in_force",
    [
        ((), 1, LEFTOVER, InForce((GpuInForce(0, False, None),), cpus=1)),
        (("growth on",), 2, PCI, InForce((GpuInForce(0, True, None), GpuInForce(1, True, None)), cpus=1)),
        (("growth off",), 1, PCI, InForce((GpuInForce(0, False, None),), cpus=1)),
        (
            ("visible 2,3", "limit 1GB 3", "growth on"),
            4,
            {**PCI, "CUDA_VISIBLE_DEVICES": "2,3", GROWTH_ENV: "true"},
            InForce((GpuInForce(2, True, None), GpuInForce(3, True, (1024,))), cpus=1),
        ),
        (("limit 512MB", "split 1 2x256MB"), 3, {**LEFTOVER, **PCI},
         InForce((GpuInForce(0, False, (512,)), GpuInForce(1, False, (256, 256)), GpuInForce(2, False, (512,))), cpus=1)),
        (("split cpu 3",), 0, LEFTOVER, InForce((), cpus=3)),
        (("visible none", "allocator async"), 2,
         {**LEFTOVER, **PCI, "CUDA_VISIBLE_DEVICES": "", "TF_GPU_ALLOCATOR": "cuda_malloc_async"}, InForce((), cpus=1)),
    ],
)
def test_exported_python_realises_the_policy(
    lines: tuple, gpus: int, env: dict, in_force: InForce, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The script sets the variables and makes the tf.config calls the plan asks for: once TensorFlow
    initializes, each visible card (nvidia-smi index) runs with the growth and the limits the policy
    names, and the CPU with its logical devices."""
    environ = dict(LEFTOVER)
    fake = run_exported(policy_of(*lines), gpus, environ, monkeypatch)
    assert environ == env
    assert fake.initialize() == in_force


def test_exported_python_starts_with_the_header() -> None:
    text = export(policy_of("growth on"))
    assert text.startswith("# GPU policy exported by tfgpu_magic")
    assert text.index("os.environ") < text.index("import tensorflow")


@pytest.mark.parametrize("fmt", ["python", "env"])
def test_export_mentions_what_it_cannot_express(fmt: str) -> None:
    """A limit on a GPU that export cannot number (a UUID without inventory) is named in a comment."""
    text = export(policy_of("limit 1GB GPU-8932f937"), fmt)
    assert [line for line in text.splitlines() if "GPU-8932f937" in line and line.startswith("# ")] != []


_ENV_LINE = re.compile(r"^(export [A-Z_]+=\S*|unset [A-Z_]+|#.*)$")


@pytest.mark.parametrize(
    "lines, expect",
    [
        (("growth on",), {"CUDA_DEVICE_ORDER": "PCI_BUS_ID", GROWTH_ENV: "true", "TF_GPU_ALLOCATOR": "keep"}),
        (("growth off",), {"CUDA_DEVICE_ORDER": "PCI_BUS_ID", GROWTH_ENV: "false", "TF_GPU_ALLOCATOR": "keep"}),
        (("visible none", "allocator bfc"), {"CUDA_DEVICE_ORDER": "PCI_BUS_ID", "CUDA_VISIBLE_DEVICES": ""}),
        (("visible 3,1", "allocator async", "limit 1GB 1", "growth on"),
         {"CUDA_DEVICE_ORDER": "PCI_BUS_ID", "CUDA_VISIBLE_DEVICES": "3,1", "TF_GPU_ALLOCATOR": "cuda_malloc_async",
          GROWTH_ENV: "true"}),
    ],
)
def test_exported_env_is_valid_shell(lines: tuple, expect: dict) -> None:
    """Every line is `export NAME=value`, `unset NAME` or a comment, and bash sources it as meant."""
    text = export(policy_of(*lines), "env")
    assert all(_ENV_LINE.match(line) for line in text.splitlines()), text
    names = ["CUDA_DEVICE_ORDER", "CUDA_VISIBLE_DEVICES", "TF_GPU_ALLOCATOR", GROWTH_ENV]
    show = "".join(f'[ -n "${{{n}+x}}" ] && printf "%s=%s\\n" {n} "${n}"\n' for n in names)
    out = subprocess.run(
        ["bash", "-c", text + show + "true"], env={"PATH": os.environ["PATH"], "TF_GPU_ALLOCATOR": "keep"},
        capture_output=True, text=True, check=True,
    ).stdout
    assert dict(line.split("=", 1) for line in out.splitlines()) == expect


def test_exported_env_points_to_python_for_limits() -> None:
    text = export(policy_of("limit 1GB"), "env")
    assert "export python" in text


def test_export_unknown_format() -> None:
    with pytest.raises(PolicyError, match="'xml'"):
        export(Policy(), "xml")


# ----- hostile JSON: huge ints, UUIDs with a newline, huge lists ------------------------------------
HUGE_INT = 10**5000
"""An int Python can hold but not print (`str()` refuses over 4,300 digits)."""


@pytest.mark.parametrize(
    "data, expect",
    [
        ({"cpu_devices": HUGE_INT}, "got a number of about 5,000 digits"),
        ({"limits": {"0": HUGE_INT}}, "got a number of about 5,000 digits"),
        ({"limits": {"all": -HUGE_INT}}, "got a number of about 5,000 digits"),
        ({"splits": {"0": [HUGE_INT]}}, "got a number of about 5,000 digits"),
        ({"visible": ["GPU-8932f937\n"]}, "not a GPU reference: 'GPU-8932f937\\n'"),
        ({"limits": {"GPU-ab\n": 5}}, "not a GPU reference"),
        ({"visible": ["0" * 5000 + "1"]}, "not a GPU reference: '000"),
        ({"visible": ["GPU-" + "a" * 200]}, "not a GPU reference"),
        ({"visible": [f"GPU-{n}" for n in range(40_000)]}, "policy 'visible': 40,000 GPUs listed; at most 256"),
        ({"limits": {f"GPU-{n}": 5 for n in range(300)}}, "policy 'limits': 300 GPUs listed"),
        ({"splits": {f"GPU-{n}": [5] for n in range(300)}}, "policy 'splits': 300 GPUs listed"),
    ],
)
def test_from_dict_rejects_hostile_values(data: dict, expect: str) -> None:
    """A policy file with a huge int, a UUID ending in a newline or 40k GPUs: one short PolicyError."""
    with pytest.raises(PolicyError) as info:
        Policy.from_dict(data)
    message = str(info.value)
    assert expect in message and "\n" not in message and len(message) < 200


def test_validate_caps_gpu_lists_before_any_quadratic_work() -> None:
    """`validate` on a value built in code with 40k UUIDs answers at once (it took 47.7 s)."""
    import time

    started = time.perf_counter()
    with pytest.raises(PolicyError, match="40,000 GPUs listed"):
        Policy(visible=tuple(f"GPU-{n}" for n in range(40_000))).validate()
    duplicate = Policy(visible=tuple(f"GPU-{n}" for n in range(255)) + ("GPU-0",))
    with pytest.raises(PolicyError, match="listed twice"):
        duplicate.validate()
    assert time.perf_counter() - started < 1


def test_error_quotes_only_an_excerpt_of_a_huge_value() -> None:
    with pytest.raises(PolicyError) as info:
        Policy.from_dict({"allocator": "x" * 1_000_000})
    assert "(1,000,000 characters)" in str(info.value) and len(str(info.value)) < 200



@pytest.mark.parametrize("ref", ["GPU-xyz", "GPU-8932f93g", "MIG-zz", "GPU-/1"])
def test_uuids_are_hex_as_nvml_writes_them(ref: str) -> None:
    """A UUID typo (`GPU-xyz`) is an error, not a `CUDA_VISIBLE_DEVICES` entry that hides every GPU."""
    with pytest.raises(PolicyError):
        Policy(visible=(ref,)).validate()


@pytest.mark.parametrize("ref", ["GPU-8932f937", "MIG-5e6f7a8b-9c0d", "MIG-GPU-b1c2d3e4/1/0", "gpu-ABCDEF"])
def test_nvml_uuid_forms_and_prefixes_are_accepted(ref: str) -> None:
    Policy(visible=(ref,)).validate()
