"""Faults an adversarial pass found in keeping, resetting and sizing, each attacked as a user would:

- A policy kept for the next kernel (`%tfgpu restart --yes` where the front end restarts) outlives a
  later change: after `%tfgpu reset`, a plain restart brought the old policy back. A change now voids
  what is kept; an edit that leaves the policy as kept does not; the status names what is kept. Real
  kernel, real restart (`KernelManager.restart_kernel`, what a front end does).
- `%tfgpu reset` deleted a `CUDA_VISIBLE_DEVICES` the user set after the tool did (and a later edit did
  so after a reset). A value that is no longer what the tool wrote stays, and reset says so in one line.
- `limit 50MB` gave JAX and PyTorch a memory fraction of 0 (no memory at all). JAX's side goes through
  the real jaxlib's reader of the variable; PyTorch's through tests/fake_torch.py (its allocator's cap).
- A space before `backend:` in `PYTORCH_CUDA_ALLOC_CONF` slipped past the filter, leaving two backends.
  (No torch in this environment: the parser follows PyTorch's `AllocatorConfig::lexArgs`, read from
  its source; see `envvars.alloc_conf_entries`.)
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from typing import Callable

import pytest
from servers import await_new_kernel, isolated_jupyter, standalone_kernel
from test_magic import make_magic, tfgpu  # noqa: F401 (fixtures used by name)
from test_torch import INVENTORY, TOTALS, clean_process, run_cell, session  # noqa: F401 (clean_process: autouse)
from fake_torch import FakeOutOfMemoryError

from tfgpu_magic.controller import Controller
from tfgpu_magic.envvars import PYTORCH_CUDA_ALLOC_CONF, alloc_conf_entries
from tfgpu_magic.gpus.inventory import InventoryCatalog
from tfgpu_magic.jupyter import persist
from tfgpu_magic.jupyter.startup import kernel_key
from tfgpu_magic.language.policy import Policy
from tfgpu_magic.plan import Frameworks, build_plan

KEPT_ROW = "Kept:"
LOADED = "'tfgpu_magic' in get_ipython().extension_manager.loaded"
POLICY = "__import__('tfgpu_magic').current_policy().to_dict()"
LEFT = "Left as you set them after this tool did (not restored)"


# ----- a kept policy is voided by a later change --------------------------------------------------------
@pytest.mark.kernel
def test_reset_voids_the_kept_policy_and_a_restart_does_not_bring_it_back() -> None:
    with isolated_jupyter("tfgpu-keep-reset-") as env, standalone_kernel(env) as kernel:
        kept = persist.pending_path(kernel_key(kernel.connection_file.resolve()), env.runtime_dir)
        kernel.ok("%load_ext tfgpu_magic\n%tfgpu split cpu 2\n%tfgpu restart --yes")
        assert kept.exists()
        status = kernel.ok("%tfgpu")
        row = next((line for line in status.output.splitlines() if line.startswith(KEPT_ROW)), "")
        assert "cpu" in row and "next start" in row, status.output
        assert any(KEPT_ROW.rstrip(":") in html for html in status.html)
        kernel.ok("%tfgpu split cpu 2")  # the policy as kept: nothing to void
        assert kept.exists()

        said = kernel.ok("%tfgpu reset")
        assert not kept.exists(), said.output
        assert KEPT_ROW not in kernel.ok("%tfgpu").output

        pid = kernel.pid()
        kernel.manager.restart_kernel(now=False)
        new = await_new_kernel(kernel, pid)
        try:
            assert new.evaluate(LOADED) is False  # nothing pending: the startup file loaded nothing
            new.ok("%load_ext tfgpu_magic")
            assert new.evaluate(POLICY) == Policy().to_dict()
        finally:
            new.close()


def test_a_kept_policy_is_voided_only_where_the_policy_now_differs(tmp_path: Path) -> None:
    connection = tmp_path / "kernel-k.json"
    connection.touch()
    key = kernel_key(connection)
    persist.store_pending(key, Policy(cpu_devices=2), connection_file=connection, directory=tmp_path)
    assert not persist.void_pending(key, Policy(cpu_devices=2), tmp_path, connection)
    assert persist.read_pending(key, tmp_path, connection) == Policy(cpu_devices=2)
    assert not persist.void_pending(key, Policy(), tmp_path, tmp_path / "elsewhere.json")  # another kernel's
    assert persist.void_pending(key, Policy(), tmp_path, connection)
    assert persist.read_pending(key, tmp_path, connection) is None


# ----- reset leaves what the user set after the tool -----------------------------------------------------
def test_reset_leaves_a_device_list_the_user_set_after_the_tool(make_magic: Callable[..., Controller],
                                                                 tfgpu: Callable[[str], str]) -> None:
    controller = make_magic({})
    tfgpu("visible 0")
    assert controller.environ["CUDA_VISIBLE_DEVICES"] == "0"
    controller.environ["CUDA_VISIBLE_DEVICES"] = "1"  # the user's own os.environ[...] = "1"
    out = tfgpu("reset")
    assert controller.environ == {"CUDA_VISIBLE_DEVICES": "1"}, out
    assert [line for line in out.splitlines() if line.startswith(LEFT)] == [f"{LEFT}: CUDA_VISIBLE_DEVICES=1"]
    assert "No variable needed restoring" not in out
    tfgpu("growth on")
    tfgpu("reset")
    assert controller.environ.get("CUDA_VISIBLE_DEVICES") == "1"


def test_reset_leaves_a_device_list_the_user_removed(make_magic: Callable[..., Controller],
                                                    tfgpu: Callable[[str], str]) -> None:
    controller = make_magic({"CUDA_VISIBLE_DEVICES": "0,1", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"})
    tfgpu("visible 1")
    del controller.environ["CUDA_VISIBLE_DEVICES"]
    out = tfgpu("reset")
    assert "CUDA_VISIBLE_DEVICES" not in controller.environ and f"{LEFT}: CUDA_VISIBLE_DEVICES unset" in out


def test_after_a_reset_a_later_edit_leaves_the_users_value(make_magic: Callable[..., Controller],
                                                           tfgpu: Callable[[str], str]) -> None:
    """Restored by a reset, the variable is the user's again: one they set next survives later edits."""
    controller = make_magic({})
    tfgpu("visible 0")
    assert "unset CUDA_VISIBLE_DEVICES" in tfgpu("reset")
    controller.environ["CUDA_VISIBLE_DEVICES"] = "1"
    tfgpu("growth on")
    tfgpu("reset")
    assert controller.environ == {"CUDA_VISIBLE_DEVICES": "1"}


# ----- a tiny limit never becomes a fraction of 0 --------------------------------------------------------
SMALL_LIMITS = [("limit 50MB", 50), ("limit 1MB", 1)]


@pytest.mark.parametrize(("line", "mib"), SMALL_LIMITS)
def test_a_tiny_limit_reaches_jax_as_a_fraction_its_reader_takes(line: str, mib: int,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    from jaxlib import xla_client

    policy = Controller(environ={}, catalog=InventoryCatalog(INVENTORY)).edit_policy([line])
    plan = build_plan(policy, frameworks=Frameworks(jax=True, torch=True, totals={"0": 81920}))
    share = mib / 81920  # below 0.1 %, where rounding to 3 decimals gave 0
    for name, value in plan.env:
        if name.startswith("XLA_") and value is not None:
            monkeypatch.setenv(name, value)
    fraction = xla_client.generate_pjrt_gpu_plugin_options()["memory_fraction"]
    assert 0 < fraction <= share and fraction >= share * 0.99, (plan.env, fraction)
    assert all(0 < torch_share <= 1 for _, torch_share in plan.torch_fractions) and plan.torch_fractions


def test_a_tiny_limit_lets_pytorch_take_its_limit_and_no_more() -> None:
    s = session("imported")
    run_cell(s, "limit 50MB")
    s.torch.start_cuda()
    for device, fraction in s.torch.fractions.items():
        allowed = int(fraction * TOTALS[s.tf.cuda_ids[device]])
        assert 40 <= allowed <= 50, (device, fraction)  # rounded down: by 0.1 % of a 40 GB card at most
        s.torch.allocate(device, allowed)
        with pytest.raises(FakeOutOfMemoryError):
            s.torch.allocate(device, 1)


# ----- the allocator filter reads keys as PyTorch does ---------------------------------------------------
@pytest.mark.parametrize(("inherited", "kept"), [
    ("expandable_segments:True, backend:native", "expandable_segments:True"),
    (" backend : native ,max_split_size_mb:128", "max_split_size_mb:128"),
    ("roundup_power2_divisions:[256:1,512:2], backend:cudaMallocAsync", "roundup_power2_divisions:[256:1,512:2]"),
    ("back end:native", ""),  # PyTorch drops spaces inside a key too
    ("expandable_segments:True,\tbackend\n:native", "expandable_segments:True"),  # any C space (torch 2.13)
    ("backends:x,expandable_segments:False", "backends:x,expandable_segments:False"),
])
def test_a_backend_given_with_spaces_is_replaced_not_doubled(inherited: str, kept: str) -> None:
    plan = build_plan(Policy(allocator="async"), frameworks=Frameworks(torch=True, alloc_conf=inherited))
    assert plan.env_map[PYTORCH_CUDA_ALLOC_CONF] == ",".join(filter(None, [kept, "backend:cudaMallocAsync"]))
    bfc = build_plan(Policy(allocator="bfc"), frameworks=Frameworks(torch=True, alloc_conf=inherited))
    assert bfc.env_map[PYTORCH_CUDA_ALLOC_CONF] == (kept or None)


KEY_PARITY = r"""
import json, sys
import torch
found = []
for value in json.loads(sys.argv[1]):
    try:
        torch._C._accelerator_setAllocatorSettings(value)
        found.append("accepted")
    except Exception as err:
        found.append(str(err).splitlines()[0])
print(json.dumps(found))
"""
CHECKED = "expandable_segments"
"""A key the device-generic allocator configuration of a CPU build checks (its value must be True or
False); `backend` is checked only by CUDA's, which a CPU build lacks."""


@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="PyTorch is not installed in this Python")
def test_alloc_conf_keys_are_the_keys_real_torch_reads(tmp_path: Path) -> None:
    """Each value puts `Maybe` after a key written with spaces: real torch refuses it exactly where
    `alloc_conf_entries` reads the key as `expandable_segments`, and ignores it where not."""
    values = [" expandable_segments : Maybe", "max_split_size_mb:128,\texpandable_segments\n:Maybe",
              "expandable_ segments:Maybe", "roundup_power2_divisions:[256:1,512:2], expandable_segments:Maybe",
              "expandable_segmentsx:Maybe", "x:[expandable_segments:Maybe]"]
    done = subprocess.run([sys.executable, "-c", KEY_PARITY, json.dumps(values)], capture_output=True, text=True,
                          timeout=120, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    found = json.loads(done.stdout.strip().splitlines()[-1])
    ours = [any(key == CHECKED for key, _ in alloc_conf_entries(value)) for value in values]
    assert ours == [True, True, True, True, False, False]
    assert [not outcome.startswith("accepted") for outcome in found] == ours, found
    assert all("Expected 'True' or 'False'" in outcome for outcome in found if outcome != "accepted")


def test_alloc_conf_entries_split_as_pytorch_lexes() -> None:
    assert alloc_conf_entries(" a : 1 , b:[1:2, 3:4],, ,c:x") == [
        ("a", " a : 1 "), ("b", " b:[1:2, 3:4]"), ("c", "c:x")]
    assert alloc_conf_entries("") == [] and alloc_conf_entries(" , ") == []
