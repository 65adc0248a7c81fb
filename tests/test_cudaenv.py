"""`CUDA_VISIBLE_DEVICES` read the way CUDA reads it: `parse_cuda_visible` (pure)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fake_nvml import MIG_UUIDS, UUIDS
from tfgpu_magic.gpus.cudaenv import parse_cuda_visible

KNOWN = {"0", "1", "2", "3", *UUIDS, *MIG_UUIDS}
"""What exists on the standard four-GPU machine of tests/fake_nvml.py."""


@pytest.mark.parametrize("raw", [None, "", "   ", "0", "-1"])
def test_restricts_and_hides_all(raw: str | None) -> None:
    """Unset restricts nothing; empty (or only spaces) or a first invalid entry hides every GPU."""
    parsed = parse_cuda_visible(raw)
    assert parsed.restricts == (raw is not None)
    assert parsed.hides_all == (raw is not None and raw != "0")


@pytest.mark.parametrize("raw", ["", "   "])
def test_empty_hides_all_without_an_invalid_entry(raw: str) -> None:
    """An empty value is not an error: nothing to stop at."""
    assert parse_cuda_visible(raw).stopped_at is None


@pytest.mark.parametrize(
    "raw, entries",
    [
        ("0", ("0",)),
        ("2,0,1", ("2", "0", "1")),
        (" 1 , 3 ", ("1", "3")),
        ("\t0,\t1", ("0", "1")),
        ("02", ("2",)),
        (UUIDS[1], (UUIDS[1],)),
        ("GPU-b1c2", ("GPU-b1c2",)),
        ("gpu-b1c2,0", ("gpu-b1c2", "0")),
        (MIG_UUIDS[0], (MIG_UUIDS[0],)),
        ("MIG-GPU-b1c2d3e4/1/0", ("MIG-GPU-b1c2d3e4/1/0",)),
        (f"1,{UUIDS[2]}", ("1", UUIDS[2])),
    ],
)
def test_valid_entries(raw: str, entries: tuple[str, ...]) -> None:
    """Indices (normalized), GPU/MIG UUIDs and prefixes, in the order given, whitespace ignored."""
    parsed = parse_cuda_visible(raw)
    assert (parsed.raw, parsed.entries, parsed.stopped_at) == (raw, entries, None)


@pytest.mark.parametrize(
    "raw, entries, stopped_at",
    [
        ("-1", (), "-1"),
        ("0,-1,1", ("0",), "-1"),
        ("1,foo,2", ("1",), "foo"),
        ("0,1.5", ("0",), "1.5"),
        ("0 1", (), "0 1"),
        ("GPU-", (), "GPU-"),
        ("1,1", ("1",), "1"),
        (f"{UUIDS[0]},0,{UUIDS[0]}", (UUIDS[0], "0"), UUIDS[0]),
        ("0,,1", ("0",), "(empty entry)"),
        (",0", (), "(empty entry)"),
        ("0,1,", ("0", "1"), "(empty entry)"),
        ("0,00", ("0",), "00"),
        ("0,²", ("0",), "²"),
    ],
)
def test_stops_at_first_invalid_entry(raw: str, entries: tuple[str, ...], stopped_at: str) -> None:
    """CUDA uses the entries before the first invalid one (-1, garbage, a repeat, even written
    differently) and ignores the rest."""
    parsed = parse_cuda_visible(raw)
    assert (parsed.entries, parsed.stopped_at) == (entries, stopped_at)
    assert parsed.hides_all == (not entries)


@pytest.mark.parametrize(
    "raw, entries, stopped_at",
    [
        ("3,0", ("3", "0"), None),
        ("0,4,1", ("0",), "4"),
        ("7", (), "7"),
        ("GPU-b2d4,1", (UUIDS[2][:8], "1"), None),
        ("GPU-ffff,0", (), "GPU-ffff"),
        (f"{MIG_UUIDS[1]}", (MIG_UUIDS[1],), None),
        ("MIG-0000", (), "MIG-0000"),
        ("01,2", ("1", "2"), None),
    ],
)
def test_known_devices(raw: str, entries: tuple[str, ...], stopped_at: str | None) -> None:
    """With `known`, an index or UUID that does not exist on this machine is invalid too."""
    parsed = parse_cuda_visible(raw, KNOWN)
    assert (parsed.entries, parsed.stopped_at) == (entries, stopped_at)


TOKENS = st.sampled_from(["0", "1", "2", "3", "-1", "x", "", " 1 ", "GPU-ab", "MIG-cd", "GPU-ab "])


@settings(max_examples=200, deadline=None)
@given(st.lists(TOKENS, max_size=6))
def test_entries_are_a_clean_prefix(tokens: list[str]) -> None:
    """Entries are unique, come from a prefix of the tokens, and re-parse to themselves."""
    raw = ",".join(tokens)
    parsed = parse_cuda_visible(raw)
    assert len(set(parsed.entries)) == len(parsed.entries)
    assert list(parsed.entries) == [t.strip() for t in tokens[: len(parsed.entries)]]
    assert (parsed.stopped_at is None) == (len(parsed.entries) == len(tokens) or raw.strip() == "")
    again = parse_cuda_visible(",".join(parsed.entries))
    assert (again.entries, again.stopped_at) == (parsed.entries, None)


DEFAULT_ORDER = " in CUDA's default order (fastest first), not nvidia-smi's"


@pytest.mark.parametrize(
    "raw, order, line",
    [
        ("", None, "CUDA_VISIBLE_DEVICES='' hides every GPU"),
        ("-1", None, "CUDA_VISIBLE_DEVICES='-1' hides every GPU (CUDA stops at '-1')"),
        ("1,0", "PCI_BUS_ID", "CUDA_VISIBLE_DEVICES='1,0' → CUDA uses GPU 1, 0"),
        ("1,0", None, f"CUDA_VISIBLE_DEVICES='1,0' → CUDA uses GPU 1, 0{DEFAULT_ORDER}"),
        ("1,0", "FASTEST_FIRST", f"CUDA_VISIBLE_DEVICES='1,0' → CUDA uses GPU 1, 0{DEFAULT_ORDER}"),
        ("0,-1,1", "PCI_BUS_ID",
         "CUDA_VISIBLE_DEVICES='0,-1,1' → CUDA uses GPU 0; CUDA stops at '-1' and ignores the rest"),
    ],
)
def test_status_shows_cuda_visible_devices_resolved(raw: str, order: str | None, line: str) -> None:
    """The status shows an inherited `CUDA_VISIBLE_DEVICES` the way CUDA will read it: indices are
    nvidia-smi's only in PCI order (`CUDA_DEVICE_ORDER=PCI_BUS_ID`), and it says so where they are not."""
    from tfgpu_magic.gpus.inventory import Inventory
    from tfgpu_magic.views.status import describe_cuda_visible

    assert describe_cuda_visible(raw, Inventory(error="no NVML"), order) == [line]
    assert describe_cuda_visible(None, Inventory(error="no NVML"), order) == []


def test_status_checks_cuda_visible_devices_against_real_gpus() -> None:
    """With an inventory, an index that does not exist is where CUDA stops."""
    from tfgpu_magic.gpus.inventory import Gpu, Inventory
    from tfgpu_magic.views.status import describe_cuda_visible

    inventory = Inventory(gpus=(Gpu(0, "GPU-aaaa"), Gpu(1, "GPU-bbbb")))
    assert describe_cuda_visible("1,5,0", inventory, "PCI_BUS_ID") == [
        "CUDA_VISIBLE_DEVICES='1,5,0' → CUDA uses GPU 1; CUDA stops at '5' and ignores the rest"
    ]


@pytest.mark.parametrize("raw, stopped_at", [("GPU-abc\n", "GPU-abc\n"), ("0,GPU-abc\n", "GPU-abc\n"), ("1\n", "1\n")])
def test_a_trailing_newline_is_not_part_of_a_valid_entry(raw: str, stopped_at: str) -> None:
    """A full match: `GPU-abc\\n` is not a UUID (a `$` pattern accepted it), and only spaces and tabs
    around an entry are skipped."""
    assert parse_cuda_visible(raw).stopped_at == stopped_at


def test_huge_number_entry_is_invalid_not_a_value_error() -> None:
    assert parse_cuda_visible("0," + "1" * 5000).entries == ("0",)


def test_long_lists_parse_in_linear_time() -> None:
    """40k UUIDs took quadratic time (a list membership test per entry)."""
    import time

    raw = ",".join(f"GPU-{n:08x}" for n in range(40_000))
    started = time.perf_counter()
    parsed = parse_cuda_visible(raw + ",GPU-00000000")
    assert len(parsed.entries) == 40_000 and parsed.stopped_at == "GPU-00000000"
    assert time.perf_counter() - started < 2


def test_status_quotes_a_huge_value_by_excerpt() -> None:
    from tfgpu_magic.gpus.inventory import Inventory
    from tfgpu_magic.views.status import describe_cuda_visible

    raw = ",".join(str(n % 200) for n in range(100)) + ",x" * 100_000
    (line,) = describe_cuda_visible(raw, Inventory(error="no NVML"), "PCI_BUS_ID")
    assert len(line) < 300 and "(200,289 characters)" in line and "(100 in all); CUDA stops at 'x'" in line
    (many,) = describe_cuda_visible(",".join(f"GPU-{n}" for n in range(1000)), Inventory(error="no NVML"))
    assert "(1,000 in all)" in many and len(many) < 400
