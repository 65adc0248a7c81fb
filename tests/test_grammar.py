"""The `%tfgpu` directive language, pure: no IPython, no TensorFlow."""

from __future__ import annotations

import re
import shlex
import string

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cases import HASH_IN_WORD, HUGE, HUGE_LISTS, HUGE_NUMBERS, NON_ASCII, params
from strategies import FUZZ_EXAMPLES, directive_lines
from tfgpu_magic.errors import PolicyError
from tfgpu_magic.language import grammar
from tfgpu_magic.language.grammar import Action, Edit, apply_edit, parse_cell, parse_line
from tfgpu_magic.language.policy import Policy

RICH = Policy(
    visible=("0", "1", "2"),
    growth=True,
    limits=(("all", 1024), ("1", 2048)),
    splits=(("0", (512, 512)), ("2", (256,))),
    cpu_devices=2,
    allocator="async",
)


def apply_lines(*lines: str, policy: Policy = Policy()) -> Policy:
    """The policy that `lines`, parsed and applied in turn, make of `policy`."""
    for line in lines:
        directive = parse_line(line)
        assert isinstance(directive, Edit), line
        policy = directive.change(policy)
    return policy


# ----- valid directives -------------------------------------------------------------------------
@pytest.mark.parametrize(
    "line, expected",
    [
        ("growth on", Policy(growth=True)),
        ("growth all", Policy(growth=True)),
        ("growth off", Policy(growth=False)),
        ("GROWTH On", Policy(growth=True)),
        ("limit 4096", Policy(limits=(("all", 4096),))),
        ("limit 1GB 0,2", Policy(limits=(("0", 1024), ("2", 1024)))),
        ("limit 1GB 2,0", Policy(limits=(("0", 1024), ("2", 1024)))),
        ("limit 1GB 0-3", Policy(limits=tuple((str(i), 1024) for i in range(4)))),
        ("limit 2GB GPU-8932f937", Policy(limits=(("GPU-8932f937", 2048),))),
        ("visible 0,2", Policy(visible=("0", "2"))),
        ("visible 0-3", Policy(visible=("0", "1", "2", "3"))),
        ("visible 3,1,2", Policy(visible=("3", "1", "2"))),
        ("visible 01", Policy(visible=("1",))),
        ("visible gpu-8932f937,1", Policy(visible=("GPU-8932f937", "1"))),
        ("visible MIG-3e1b2c4d/1/0", Policy(visible=("MIG-3e1b2c4d/1/0",))),
        ("visible all", Policy()),
        ("visible none", Policy(visible=())),
        ("split 0 2x2GB", Policy(splits=(("0", (2048, 2048)),))),
        ("split 1 3×512MB", Policy(splits=(("1", (512, 512, 512)),))),
        ("split 0 1GB,3GB", Policy(splits=(("0", (1024, 3072)),))),
        ("split 0 1GB", Policy(splits=(("0", (1024,)),))),
        ("split cpu 3", Policy(cpu_devices=3)),
        ("split cpu 64", Policy(cpu_devices=64)),
        ("allocator async", Policy(allocator="async")),
        ("allocator BFC", Policy(allocator="bfc")),
        ("reset", Policy()),
    ],
)
def test_directive_builds_policy(line: str, expected: Policy) -> None:
    """Each directive form, applied to the empty policy, gives exactly the expected policy."""
    assert apply_lines(line) == expected


@pytest.mark.parametrize(
    "size, mib",
    [
        ("4096", 4096),
        ("1", 1),
        ("512MB", 512),
        ("512mb", 512),
        ("1024MiB", 1024),
        ("1.5GB", 1536),
        (".5GB", 512),
        ("2GiB", 2048),
        ("3G", 3072),
        ("'2 GB'", 2048),
        ("1024GB", 1024 * 1024),
    ],
)
def test_sizes_are_binary_mib(size: str, mib: int) -> None:
    """Sizes become whole MiB; every unit is binary (1GB == 1024 MiB, like TF and nvidia-smi)."""
    assert apply_lines(f"limit {size}").limit_map == {"all": mib}


def test_gigabyte_equals_1024_mebibytes() -> None:
    assert apply_lines("limit 1GB 0") == apply_lines("limit 1024MiB 0") == apply_lines("limit 1024 0")


def test_edit_returns_new_policy_and_leaves_input_alone() -> None:
    before = Policy(growth=False)
    after = parse_line("growth on").change(before)
    assert before == Policy(growth=False) and after == Policy(growth=True)


def test_per_gpu_limits_merge_and_a_plain_limit_replaces_them() -> None:
    """`limit SIZE GPUS` adds or overrides per GPU; `limit SIZE` alone caps every GPU instead."""
    merged = apply_lines("limit 1GB 0", "limit 2GB 1", "limit 3GB 0")
    assert merged.limit_map == {"0": 3072, "1": 2048}
    assert apply_lines("limit 2GB", policy=merged).limit_map == {"all": 2048}


@pytest.mark.parametrize("line, limits", [("limit off", {}), ("limit off 1", {"all": 1024})])
def test_limit_off(line: str, limits: dict) -> None:
    assert apply_lines(line, policy=RICH).limit_map == limits


def test_limit_off_without_gpus_and_without_a_limit_is_a_no_op() -> None:
    assert apply_lines("limit off") == Policy()


def test_limit_off_list_removes_only_those_gpus() -> None:
    assert apply_lines("limit 1GB 0-3", "limit off 1,3").limit_map == {"0": 1024, "2": 1024}


@pytest.mark.parametrize(
    "line, splits, cpu",
    [
        ("split off", (), None),
        ("split off 0", (("2", (256,)),), 2),
        ("split off cpu", RICH.splits, None),
    ],
)
def test_split_off(line: str, splits: tuple, cpu: int | None) -> None:
    policy = apply_lines(line, policy=RICH)
    assert (policy.splits, policy.cpu_devices) == (splits, cpu)
    assert policy.limits == RICH.limits  # a split change leaves the limits alone


def test_reset_forgets_everything() -> None:
    assert apply_lines("reset", policy=RICH).is_empty


@pytest.mark.parametrize(
    "line, action",
    [
        ("", Action("status")),
        ("   ", Action("status")),
        ("# only a comment", Action("status")),
        ("status", Action("status")),
        ("apply", Action("apply")),
        ("restart", Action("restart")),
        ("export", Action("export", "python")),
        ("export python", Action("export", "python")),
        ("export env", Action("export", "env")),
        ("export JSON", Action("export", "json")),
    ],
)
def test_actions(line: str, action: Action) -> None:
    assert parse_line(line) == action


def test_trailing_comment_is_ignored() -> None:
    assert apply_lines("limit 1GB 0  # the small card") == apply_lines("limit 1GB 0")


class Catalog:
    """A machine with two GPUs of 16 GiB and 8 GiB (the grammar's GpuCatalog seam)."""

    totals = {"0": 16384, "1": 8192}

    def resolve(self, ref: str) -> str:
        if ref not in self.totals:
            raise PolicyError(f"there is no GPU {ref}")
        return ref

    def total_mib(self, ref: str) -> int | None:
        return self.totals[ref]

    def refs(self) -> list[str]:
        return list(self.totals)

    def is_mig(self, ref: str) -> bool:
        return False


@pytest.mark.parametrize(
    "line, limits, splits",
    [
        ("limit 50%", {"0": 8192, "1": 4096}, {}),
        ("limit 25% 1", {"1": 2048}, {}),
        ("split 0 2x25%", {}, {"0": (4096, 4096)}),
        ("split 1 50%,1GB", {}, {"1": (4096, 1024)}),
    ],
)
def test_percent_with_an_inventory_is_per_card(line: str, limits: dict, splits: dict) -> None:
    """With an inventory, NN% becomes MiB of each card's own total."""
    catalog = Catalog()
    policy = parse_line(line, catalog).change(Policy(), catalog)
    assert (policy.limit_map, policy.split_map) == (limits, splits)


def test_catalog_rejects_a_gpu_the_machine_lacks() -> None:
    with pytest.raises(PolicyError, match="no GPU 2"):
        parse_line("limit 1GB 0-2", Catalog())


# ----- cells ------------------------------------------------------------------------------------
def test_cell_with_comments_and_blank_lines() -> None:
    cell = "# the shared box\n\ngrowth on\n   \nlimit 1GB 0  # small card\n\nsplit cpu 2\n"
    edits = parse_cell(cell)
    assert [(edit.name, edit.line) for edit in edits] == [("growth", 3), ("limit", 5), ("split", 7)]
    policy = Policy()
    for edit in edits:
        policy = edit.change(policy)
    assert policy == Policy(growth=True, limits=(("0", 1024),), cpu_devices=2)


def test_empty_cell_has_no_edits() -> None:
    assert parse_cell("\n# nothing\n\n") == []


@pytest.mark.parametrize(
    "cell, expect",
    [
        ("growth on\n\nlimit 0\n", "line 3: "),
        ("# c\nfoo bar\n", "line 2: unknown directive 'foo'"),
        ("growth on\nexport json\n", "line 2: `export` is not allowed in a %%tfgpu cell"),
        ("status\n", "line 1: `status` is not allowed"),
    ],
)
def test_cell_error_names_the_line(cell: str, expect: str) -> None:
    with pytest.raises(PolicyError) as info:
        parse_cell(cell)
    assert expect in str(info.value) and "\n" not in str(info.value)


# ----- bad input --------------------------------------------------------------------------------
@pytest.mark.parametrize("case", params("grammar"))
def test_bad_line_is_one_line_policy_error(case) -> None:
    """Each malformed or contradictory line raises PolicyError with one line naming the problem."""
    policy = apply_lines(*case.setup)
    with pytest.raises(PolicyError) as info:
        apply_lines(case.line, policy=policy)
    message = str(info.value)
    assert case.expect in message
    assert "\n" not in message and message.strip() == message


def test_quoted_newline_stays_out_of_the_message() -> None:
    """A quoted word with a newline in it is quoted in the message, which stays one line."""
    with pytest.raises(PolicyError) as info:
        parse_line("split 'a\nb'")
    assert "\n" not in str(info.value) and "'a\\nb'" in str(info.value)


@pytest.mark.parametrize("line", ["split 0", "split cpu"])
def test_suggested_example_is_valid(line: str) -> None:
    """An error that says `e.g. ...` suggests a directive that parses."""
    with pytest.raises(PolicyError) as info:
        parse_line(line)
    example = re.search(r"e\.g\. `([^`]+)`", str(info.value))
    assert example is not None
    assert isinstance(parse_line(example.group(1)), Edit)


# ----- property: any line is a directive or a PolicyError ---------------------------------------
@settings(max_examples=FUZZ_EXAMPLES, deadline=None)
@given(directive_lines())
def test_any_line_is_a_directive_or_a_policy_error(line: str) -> None:
    try:
        directive = parse_line(line)
    except PolicyError as err:
        assert "\n" not in str(err)
        return
    assert isinstance(directive, (Edit, Action))
    if isinstance(directive, Edit):
        for base in (Policy(), RICH):
            try:
                result = directive.change(base)
            except PolicyError:
                continue
            assert isinstance(result, Policy)
            result.validate()


# ----- hostile input: huge numbers, non-ASCII digits, `#` inside words, huge lists ------------------
@pytest.mark.parametrize("line", HUGE_NUMBERS + HUGE_LISTS)
def test_huge_numbers_are_policy_errors(line: str) -> None:
    """Every form that reads a number, and GPU lists beyond any machine: a one-line PolicyError that
    quotes only an excerpt."""
    with pytest.raises(PolicyError) as info:
        apply_lines(line)
    message = str(info.value)
    assert "Exceeds the limit" not in message and "\n" not in message and len(message) < 200


def test_huge_number_in_a_cell_names_the_line() -> None:
    with pytest.raises(PolicyError, match=r"^line 2: GPU index '1+'…'1+' \(5,000 characters\) is out of range"):
        parse_cell(f"growth on\nvisible {HUGE}\n")


@pytest.mark.parametrize("line", ["visible 0" + "0" * 5000, "split cpu " + "0" * 5000 + "2"])
def test_leading_zeros_do_not_count_against_the_digit_limit(line: str) -> None:
    """`visible 01` means GPU 1; so does a very long run of zeros before the 1 (no int() of 5,000 digits)."""
    assert apply_lines(line) in (Policy(visible=("0",)), Policy(cpu_devices=2))


@pytest.mark.parametrize("line", NON_ASCII)
def test_only_ascii_digits_units_and_uuids(line: str) -> None:
    """Arabic-Indic, full-width and mathematical digits are not digits here; nor are the Kelvin sign and
    the long s letters of a UUID (a case-insensitive Unicode regex would take them for `k` and `s`)."""
    with pytest.raises(PolicyError):
        apply_lines(line)


@pytest.mark.parametrize("line", HASH_IN_WORD)
def test_hash_inside_a_word_is_part_of_it(line: str) -> None:
    """Only a word that starts with `#` starts a comment: `visible 0#1` is no GPU, not `visible 0`."""
    with pytest.raises(PolicyError, match="#"):
        parse_line(line)


@pytest.mark.parametrize(
    "line, expected",
    [
        ("visible 0 #1", Policy(visible=("0",))),
        ("visible 0 #", Policy(visible=("0",))),
        ("visible 0\t# note, with 'quotes", Policy(visible=("0",))),
        ("limit '1 GB' 0 # note", Policy(limits=(("0", 1024),))),
        ("split 0 \"2x1GB\" # it's fine", Policy(splits=(("0", (1024, 1024)),))),
    ],
)
def test_word_starting_with_hash_is_a_comment(line: str, expected: Policy) -> None:
    assert apply_lines(line) == expected


@pytest.mark.parametrize("line", ["kernelspec '#a'", 'kernelspec "a #b"', "kernelspec a\\#b"])
def test_quoted_or_escaped_hash_is_no_comment(line: str) -> None:
    """A quoted or escaped `#` is text (and then no valid kernelspec name), not a comment."""
    with pytest.raises(PolicyError, match="is not a valid name"):
        parse_line(line)


def test_uuid_longer_than_any_real_one_is_refused() -> None:
    with pytest.raises(PolicyError, match="not a GPU"):
        parse_line("visible GPU-" + "a" * 200)


def test_gpu_list_is_capped_at_what_a_machine_can_have() -> None:
    uuids = ",".join(f"GPU-{n:08x}" for n in range(300))
    with pytest.raises(PolicyError, match="300 GPUs listed; at most 256"):
        parse_line(f"visible {uuids}")
    assert len(apply_lines("visible 0-255").visible) == 256


def test_gpu_list_check_is_linear() -> None:
    """2,000 distinct UUIDs and a repeat at the end: quadratic `list.count` took seconds per 10k."""
    import time

    uuids = [f"GPU-{n:08x}" for n in range(256)]
    started = time.perf_counter()
    for _ in range(50):
        with pytest.raises(PolicyError, match="listed twice"):
            parse_line("visible " + ",".join(uuids[:255] + uuids[:1]))
    assert time.perf_counter() - started < 2


def test_a_huge_line_is_refused_before_any_work_and_not_echoed() -> None:
    line = "visible " + "GPU-0," * 200_000
    with pytest.raises(PolicyError) as info:
        parse_line(line)
    assert "line too long (1,200,008 characters" in str(info.value) and len(str(info.value)) < 200


# ----- messages that help -------------------------------------------------------------------------
@pytest.mark.parametrize(
    "line, says",
    [
        ("grwoth on", "unknown directive 'grwoth'; did you mean `growth`?"),
        ("visble 0", "did you mean `visible`?"),
        ("alocator async", "did you mean `allocator`?"),
        ("growth onn", "did you mean `on`?"),
        ("allocator asnyc", "did you mean `async`?"),
        ("export jsno", "did you mean `json`?"),
        ("loglevel errror", "did you mean `error`?"),
        ("limit 4 GB", "limit: write `4GB` (no space between a number and its unit)"),
        ("limit 1.5 gb 0", "write `1.5gb`"),
        ("split 0 2 GB", "split: write `2GB`"),
        ("split 0 2x", "split 0: '2x' is missing the size of each part, e.g. `split 0 2x2GB`"),
        ("split 0 x2GB", "split 0: 'x2GB' is missing the number of parts"),
    ],
)
def test_typos_get_a_suggestion(line: str, says: str) -> None:
    with pytest.raises(PolicyError) as info:
        parse_line(line)
    assert says in str(info.value)
    assert "expected one of growth, limit" not in str(info.value)  # a suggestion, not the whole list


def test_no_suggestion_lists_the_directives() -> None:
    with pytest.raises(PolicyError, match="unknown directive 'zzz'; expected one of growth, limit"):
        parse_line("zzz")


# ----- a cell is validated as a whole ---------------------------------------------------------------
def test_apply_edit_does_not_validate_but_change_does() -> None:
    """`apply_edit` gives the intermediate policy of a cell (may contradict itself); `change` validates."""
    edit = parse_line("limit 1GB 1")
    assert isinstance(edit, Edit)
    base = Policy(visible=("0",))
    assert apply_edit(base, edit) == Policy(visible=("0",), limits=(("1", 1024),))
    with pytest.raises(PolicyError, match="not visible"):
        edit.change(base)


def test_a_huge_cell_is_refused_at_once() -> None:
    with pytest.raises(PolicyError, match=r"^%%tfgpu cell too long \(1,000,000 characters"):
        parse_cell("growth on\n" * 100_000)


def test_default_edit_gives_a_field_back_to_tensorflow():
    """The panel's "TF default": the grammar's own edit sets the field to None; directives that set
    no single field have none."""
    from tfgpu_magic.language.grammar import apply_edit, default_edit

    policy = Policy(growth=True, allocator="async")
    assert apply_edit(policy, default_edit("growth")).growth is None
    assert apply_edit(policy, default_edit("allocator")).allocator is None
    with pytest.raises(PolicyError, match="sets no single policy field"):
        default_edit("limit")


@settings(max_examples=FUZZ_EXAMPLES, deadline=None)
@given(st.text(alphabet=st.sampled_from([*string.printable, "\x0b", "\x0c", "\xa0", "é", "\u2003"]), max_size=24))
def test_plain_lines_split_as_shlex_splits_them(line: str) -> None:
    """The `str.split` shortcut is taken only where shlex (POSIX, shell spaces) gives the same words;
    every other line goes through shlex and the comment rule."""
    if grammar._PLAIN_LINE.fullmatch(line):
        assert grammar.split_words(line) == shlex.split(line)
    else:
        assert any(c in line for c in "'\"\\#") or not all(c in string.printable and c not in "\x0b\x0c" for c in line)


# ----- a limit as the user wrote it --------------------------------------------------------------------
def test_a_percentage_limit_is_shown_as_written_until_another_limit_replaces_it() -> None:
    """`limit 50%` keeps the MiB it applies and how it was written, per card; a later limit on a card,
    `limit off` on it, or a limit on every GPU drops the percentage of the cards it changes."""
    from fake_nvml import FakeNvml, four_gpus

    from tfgpu_magic.gpus.inventory import InventoryCatalog, Nvml, read_inventory
    from tfgpu_magic.language.directives import describe_policy

    catalog = InventoryCatalog(read_inventory(Nvml(module=FakeNvml(four_gpus(this_kernel=False)))))
    policy = Policy()
    shown = []
    for line in ("limit 50%", "limit 1GB 1", "limit off 2", "limit 25% 1", "limit 2GB"):
        policy = apply_edit(policy, parse_line(line, catalog), catalog)
        shown.append(describe_policy(policy))
    assert shown == [
        ["limit 50% (40.0 GiB) on GPU 0, 1, 2, 50% (20.0 GiB) on GPU 3"],
        ["limit 50% (40.0 GiB) on GPU 0, 2, 1GB on GPU 1, 50% (20.0 GiB) on GPU 3"],
        ["limit 50% (40.0 GiB) on GPU 0, 1GB on GPU 1, 50% (20.0 GiB) on GPU 3"],
        ["limit 50% (40.0 GiB) on GPU 0, 25% (20.0 GiB) on GPU 1, 50% (20.0 GiB) on GPU 3"],
        ["limit 2GB on every visible GPU"],
    ]
    assert policy.limits_written == () and Policy.from_dict(policy.to_dict()) == policy
