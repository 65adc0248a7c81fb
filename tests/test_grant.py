"""The grant: the GPUs a process was started with (`CUDA_VISIBLE_DEVICES` inherited:
indices, GPU UUIDs, MIG UUIDs) are all it may take. `visible auto[:N]` ranks only those, `visible N`
counts within the grant as CUDA does, asking for more is one line, and the status marks the other
cards as not this kernel's.

Four fake cards (tests/fake_nvml.py's `four_gpus`: GPU 0 busy, 1 and 2 tied, 3 a 40 GB card with two
MIG instances) and a fake TensorFlow before import (tests/fake_tf.py): what CUDA will be given is the
plan's `CUDA_VISIBLE_DEVICES`, which `%tfgpu export` writes out too.
"""

from __future__ import annotations

import sys

import pytest
from fake_nvml import MIG_UUIDS, UUIDS, FakeNvml, four_gpus
from fake_tf import FakeTF

from tfgpu_magic.controller import Controller
from tfgpu_magic.errors import PolicyError
from tfgpu_magic.gpus.cudaenv import Grant, grant_of
from tfgpu_magic.gpus.inventory import InventoryCatalog, Nvml, read_inventory
from tfgpu_magic.tf import quietimport
from tfgpu_magic.views.results import StatusResult
from tfgpu_magic.views.status import snapshot

PCI = {"CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
INVENTORY = read_inventory(Nvml(module=FakeNvml(four_gpus(this_kernel=False))))


@pytest.fixture(autouse=True)
def _disarm():
    yield
    quietimport.disarm()
    assert "tensorflow" not in sys.modules


def started_with(**environ: str) -> Controller:
    """A controller for a process started with `environ` (CUDA_VISIBLE_DEVICES and friends)."""
    env = dict(environ)
    return Controller(api=FakeTF(4, imported=False, environ=env), environ=env, catalog=InventoryCatalog(INVENTORY))


def edit(ctl: Controller, *lines: str) -> None:
    ctl.edit([ctl.parse(line) for line in lines])


GRANTS = {
    "index in PCI order": ({"CUDA_VISIBLE_DEVICES": "2", **PCI}, "2", 2),
    "GPU UUID prefix": ({"CUDA_VISIBLE_DEVICES": UUIDS[2][:12]}, UUIDS[2], 2),
    "MIG UUID": ({"CUDA_VISIBLE_DEVICES": MIG_UUIDS[1]}, MIG_UUIDS[1], 3),
}
"""A grant of one GPU each way: (the environment, how a policy pins that GPU, its card)."""


@pytest.mark.parametrize("grant", GRANTS)
def test_the_grant_is_placed_on_its_card(grant: str) -> None:
    environ, pin, card = GRANTS[grant]
    found = started_with(**environ).grant()
    assert found == Grant(environ["CUDA_VISIBLE_DEVICES"], (pin,), (card,))
    assert found.granted_cards() == {card} and found.placed


@pytest.mark.parametrize("grant", GRANTS)
def test_visible_auto_picks_within_the_grant(grant: str) -> None:
    """Was: GPU 1 (tied for the most free memory with GPU 2), another job's card."""
    environ, pin, card = GRANTS[grant]
    ctl = started_with(**environ)
    edit(ctl, "visible auto")
    assert ctl.policy.visible == (INVENTORY.gpus[2].uuid if pin == "2" else pin,)
    assert dict(ctl.policy.sources)["visible"].startswith(f"auto picked GPU {card} (")
    assert ctl.environ["CUDA_VISIBLE_DEVICES"] == ctl.policy.visible[0]


@pytest.mark.parametrize("grant", GRANTS)
def test_visible_0_is_the_granted_gpu_and_export_says_so(grant: str) -> None:
    environ, pin, _ = GRANTS[grant]
    ctl = started_with(**environ)
    edit(ctl, "visible 0", "limit 2GB 0")
    assert ctl.policy.visible == (pin,) and dict(ctl.policy.limits) == {pin: 2048}
    assert ctl.plan().env_map["CUDA_VISIBLE_DEVICES"] == pin
    assert f"export CUDA_VISIBLE_DEVICES={pin}" in ctl.export("env").splitlines()
    assert "memory_limits = {0: [2048]}" in ctl.export("python")  # TensorFlow's GPU:0 is that GPU


@pytest.mark.parametrize("grant", GRANTS)
@pytest.mark.parametrize("line", ["visible 1", "visible 0,1", "limit 1GB 1", "visible auto:2"])
def test_more_than_the_grant_is_one_line(grant: str, line: str) -> None:
    environ, _, _ = GRANTS[grant]
    ctl = started_with(**environ)
    with pytest.raises(PolicyError) as raised:
        edit(ctl, line)
    said = str(raised.value)
    value = environ["CUDA_VISIBLE_DEVICES"]
    assert f"this kernel was granted 1 GPU (CUDA_VISIBLE_DEVICES={value})" in said and "\n" not in said
    assert ctl.policy.is_empty and "CUDA_VISIBLE_DEVICES" not in ctl.plan().env_map


def test_a_gpu_named_outside_the_grant_is_refused() -> None:
    ctl = started_with(CUDA_VISIBLE_DEVICES="2", **PCI)
    with pytest.raises(PolicyError, match=r"^GPU-b1c2d3e4…: this kernel was granted 1 GPU \(CUDA_VISIBLE_DEVICES=2\), "
                                          r"and this GPU is not among them$"):
        edit(ctl, f"visible {UUIDS[1]}")
    edit(ctl, f"visible {UUIDS[2][:12]}")  # the granted card by its own UUID is fine
    assert ctl.policy.visible == (UUIDS[2],)


def test_a_card_given_whole_covers_its_mig_instances_and_a_mig_grant_not_its_card() -> None:
    edit(started_with(CUDA_VISIBLE_DEVICES="3", **PCI), f"visible {MIG_UUIDS[0]}")
    with pytest.raises(PolicyError, match="not among them"):
        edit(started_with(CUDA_VISIBLE_DEVICES=MIG_UUIDS[1]), f"visible {UUIDS[3]}")


def test_indices_count_within_a_grant_of_several() -> None:
    """`visible 1,0` on a grant of GPUs 2 and 3 (PCI order): CUDA's 1 is card 3, its 0 card 2."""
    ctl = started_with(CUDA_VISIBLE_DEVICES="2,3", **PCI)
    edit(ctl, "visible 1,0", "limit 50%")
    assert ctl.policy.visible == ("3", "2") and dict(ctl.policy.limits) == {"2": 40960, "3": 20480}
    assert ctl.plan().env_map["CUDA_VISIBLE_DEVICES"] == "3,2"
    edit(ctl, "visible auto:2")
    assert ctl.policy.visible == (UUIDS[2], UUIDS[3])  # 79 GiB free before 40


def test_a_grant_by_index_in_cudas_default_order_is_kept_and_not_guessed() -> None:
    """`CUDA_VISIBLE_DEVICES=2` without PCI_BUS_ID (Slurm's way): which card is CUDA's 2 nvidia-smi
    cannot tell. `visible auto` and `visible 0` say so in one line; a policy without `visible` keeps
    the grant and its order (PCI_BUS_ID would make CUDA read the 2 as nvidia-smi's card 2)."""
    ctl = started_with(CUDA_VISIBLE_DEVICES="2")
    assert ctl.grant() == Grant("2", (None,), (None,)) and ctl.grant().granted_cards() == frozenset()
    for line in ("visible auto", "visible 0"):
        with pytest.raises(PolicyError) as raised:
            edit(ctl, line)
        assert "CUDA_DEVICE_ORDER=PCI_BUS_ID" in str(raised.value) and "\n" not in str(raised.value)
    edit(ctl, "growth on", "limit 2GB")
    assert "CUDA_DEVICE_ORDER" not in ctl.plan().env_map and ctl.environ["CUDA_VISIBLE_DEVICES"] == "2"
    assert "export CUDA_VISIBLE_DEVICES=2" in ctl.export("env") and "CUDA_DEVICE_ORDER" not in ctl.export("env")
    text = StatusResult(snapshot(ctl)).text()
    assert "CUDA_VISIBLE_DEVICES='2' → CUDA uses GPU 2 in CUDA's default order (fastest first), not nvidia-smi's" in text
    assert "not this kernel's" not in text  # nothing marked that cannot be told


def test_the_status_marks_the_cards_outside_the_grant() -> None:
    ctl = started_with(CUDA_VISIBLE_DEVICES=MIG_UUIDS[1])
    result = StatusResult(snapshot(ctl))
    lines = result.text().splitlines()
    marked = [lines[at - 1].split()[0] for at, line in enumerate(lines)
              if line == f"       not this kernel's to take: outside its grant (CUDA_VISIBLE_DEVICES={MIG_UUIDS[1]})"]
    assert marked == ["0", "1", "2"]
    html = result.html()
    assert html.count("not this kernel&#x27;s to take") == 3 and html.count("<tr style='opacity:.75'>") == 3


def test_without_a_grant_nothing_changes() -> None:
    ctl = started_with()
    assert ctl.grant() == Grant(None) and ctl.grant().granted_cards() is None
    edit(ctl, "visible auto")
    assert ctl.policy.visible == (UUIDS[2],)
    assert "not this kernel's" not in StatusResult(snapshot(ctl)).text()


@pytest.mark.parametrize("value, order, cards", [
    ("2,0", "PCI_BUS_ID", (2, 0)), ("2,0", None, (None, None)), (f"1,{UUIDS[3][:8]}", None, (None, 3)),
    ("1,9,2", "PCI_BUS_ID", (1,)), ("", None, ()),
])
def test_grant_of_places_entries_as_cuda_reads_them(value: str, order: str | None, cards: tuple) -> None:
    """Parsed as CUDA parses (it stops at an index no card has); an index is a card only in PCI order."""
    assert grant_of(value, order, INVENTORY).cards == cards
