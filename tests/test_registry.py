"""The registry of directives (`tfgpu_magic.language.directives`) is the one place a directive is
declared: the docs' grammar page, `%tfgpu?`, parsing, dispatch, completion, cell checking and the status agree
with it. Also `loglevel`, the directive added through it."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Callable, Iterator

import pytest
from IPython.core.completer import provisionalcompleter

from tfgpu_magic.views import actions
from tfgpu_magic.controller import Controller
from tfgpu_magic.errors import PolicyError
from tfgpu_magic.language import directives, grammar
from tfgpu_magic.language.directives import ACTIONS, EDITS, OPTIONS, REGISTRY, describe_policy, lookup
from tfgpu_magic.language.grammar import Action, Edit, apply_edit, parse_cell, parse_line
from tfgpu_magic.language.policy import LOGLEVELS, Policy
from tfgpu_magic.tf import quietimport
from tfgpu_magic.views.magics import check_options, split_options
from tfgpu_magic.views.magics import TFGPUMagics

DOCS = Path(__file__).resolve().parent.parent / "docs"
"""The documentation pages (the site `make docs` builds) whose examples these tests check."""
RICH = Policy(visible=("0", "1"), growth=True, limits=(("all", 1024), ("1", 2048)), splits=(("0", (512, 512)),),
              cpu_devices=2, allocator="async", loglevel="error")
IDS = [d.name for d in REGISTRY]


def docs_grammar_block() -> list[str]:
    text = (DOCS / "grammar.md").read_text(encoding="utf-8")
    block = re.search(r"^# The grammar\n\n```\n(.*?)\n```$", text, re.S | re.M)
    assert block is not None, "docs/grammar.md has no grammar block"
    return block.group(1).split("\n")


# ----- the docs and `%tfgpu?` -----------------------------------------------------------------------
def test_docs_grammar_block_is_the_registry() -> None:
    """Line for line: regenerate the block from `directives.grammar_lines()` after changing the registry."""
    assert docs_grammar_block() == directives.grammar_lines()


def docs_block_after(page: str, words: str) -> list[str]:
    """The lines of the first code block after `words` in docs/`page`."""
    text = (DOCS / page).read_text(encoding="utf-8")
    block = re.search(re.escape(words) + r".*?\n```\n(.*?)\n```", text, re.S)
    assert block is not None, f"docs/{page} has no code block after {words!r}"
    return block.group(1).splitlines()


def four_gpus_started_with(environ: dict[str, str]) -> Controller:
    """A controller on tests/fake_nvml.py's four cards, TensorFlow not imported, in a process started
    with `environ`."""
    from fake_nvml import FakeNvml, four_gpus
    from fake_tf import FakeTF

    from tfgpu_magic.gpus.inventory import InventoryCatalog, Nvml, read_inventory

    inventory = read_inventory(Nvml(module=FakeNvml(four_gpus(this_kernel=False))))
    return Controller(api=FakeTF(4, imported=False, environ=environ), environ=environ,
                      catalog=InventoryCatalog(inventory))


def four_gpu_status(environ: dict[str, str], *lines: str) -> list[str]:
    """What `%tfgpu` prints after `lines` (`four_gpus_started_with`)."""
    from tfgpu_magic.views.results import StatusResult
    from tfgpu_magic.views.status import snapshot

    ctl = four_gpus_started_with(environ)
    ctl.edit([ctl.parse(line) for line in lines])
    quietimport.disarm()
    return StatusResult(snapshot(ctl)).text().splitlines()


def test_docs_status_example_is_what_the_status_prints(installed_frameworks: Callable[..., None]) -> None:
    """docs/grammar.md's status example is the status's real text, line for line (JAX installed, as it says;
    PyTorch not)."""
    installed_frameworks(jax_installed=True)
    assert docs_block_after("grammar.md", "the status prints:") == four_gpu_status({}, "visible auto:2", "limit 50%")


def test_docs_grant_example_is_what_the_status_prints() -> None:
    """docs/provisioner.md's grant example: the refusal's words and the status lines it quotes are real."""
    from tfgpu_magic.views.magics import run_line

    shown = docs_block_after("provisioner.md", "on the fake four cards (real output):")
    granted = {"CUDA_VISIBLE_DEVICES": "2", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
    status = four_gpu_status(dict(granted), "visible auto")
    assert [line for line in shown if line.startswith("  ")] == status[status.index(shown[-3]):][:3]
    ctl = four_gpus_started_with(dict(granted))
    with pytest.raises(PolicyError) as raised:
        run_line(ctl, None, "visible 1")
    assert shown[1] == f"UsageError: {raised.value}"


def test_help_lists_every_usage_line_and_option() -> None:
    """`%tfgpu?` asks the magic's `getdoc()` (IPython's oinspect does, before `__doc__`)."""
    doc = TFGPUMagics.tfgpu.getdoc()
    missing = [line for line in directives.grammar_lines() if line not in doc]
    assert missing == []
    assert all(name in doc for name in OPTIONS) and "SIZE:" in doc and "GPUS:" in doc


def test_pinfo_shows_the_registry(shell, capsys) -> None:
    """What a user sees with `%tfgpu?` on a real shell."""
    shell.run_line_magic("pinfo", "%tfgpu")
    out = capsys.readouterr().out
    assert [d.name for d in REGISTRY if not all(usage in out for usage in d.usage)] == []


def test_usage_lines_name_their_directive() -> None:
    for directive in REGISTRY:
        for usage in directive.usage:
            assert usage == "%tfgpu" if directive.name == "status" else usage.startswith(f"%tfgpu {directive.name}")


# ----- parsing and dispatch -------------------------------------------------------------------------
@pytest.mark.parametrize("directive", REGISTRY, ids=IDS)
def test_every_example_parses_to_its_directive(directive: directives.Directive) -> None:
    assert directive.examples, f"{directive.name} has no example"
    for example in directive.examples:
        parsed = parse_line(example)
        assert isinstance(parsed, Edit if directive.kind == "edit" else Action) and parsed.name == directive.name


def test_every_action_has_a_handler_and_every_handler_an_action() -> None:
    assert set(actions.ACTIONS) == set(ACTIONS)


def test_every_edit_has_one_way_to_parse() -> None:
    """A field edit is parsed from its `values`; every other edit has a parser of its own. Every edit
    is applied alike (`apply_edit`), from the policy fields it sets."""
    fields = {d.name for d in REGISTRY if d.field is not None}
    parsed = {d.name for d in REGISTRY if d.kind == "edit" and d.parse is not None}
    assert fields.isdisjoint(parsed) and fields | parsed == set(EDITS)
    assert all(d.kind == "edit" for d in REGISTRY if d.field is not None)


def test_field_edits_set_their_field_from_each_word() -> None:
    for directive in REGISTRY:
        for word, value in directive.values:
            edit = parse_line(f"{directive.name} {word.upper()}")
            assert isinstance(edit, Edit)
            assert getattr(apply_edit(Policy(), edit), directive.field or "") == value


def test_an_edit_is_data() -> None:
    """Name, the policy fields it sets in the policy's own form, and cell line: equal edits for equal
    lines, no closures, no text."""
    assert parse_line("limit 1GB 0") == parse_line("limit  1024MiB  0") == Edit("limit", (("limits", (("0", 1024),)),))
    assert [(e.name, e.line) for e in parse_cell("growth on\n\nloglevel info\n")] == [("growth", 1), ("loglevel", 3)]


@pytest.mark.parametrize(
    "line, changes, policy",
    [
        ("limit 2GB", (("limits", (("all", 2048),)),), Policy(limits=(("all", 2048),))),
        ("growth on", (("growth", True),), Policy(growth=True)),
        ("split 0 2x1GB", (("splits", (("0", (1024, 1024)),)),), Policy(splits=(("0", (1024, 1024)),))),
        ("split cpu 3", (("cpu_devices", 3),), Policy(cpu_devices=3)),
        ("visible 1,0", (("visible", ("1", "0")), ("sources", (("visible", None),))), Policy(visible=("1", "0"))),
    ],
)
def test_an_edit_carries_the_policys_own_value(line: str, changes: tuple, policy: Policy) -> None:
    """`limit 2GB` is `limits == (("all", 2048),)` from the parser on: the value the policy then holds."""
    edit = parse_line(line)
    assert edit == Edit(line.split()[0], changes)
    assert apply_edit(Policy(), edit) == policy


def test_per_gpu_entries_merge_and_none_removes_one() -> None:
    """A limit or split given for some GPUs merges with the policy's; `off GPU` removes that GPU's,
    `off` alone (an empty list) and a limit on every GPU replace them all."""
    policy = Policy(limits=(("all", 1024), ("1", 2048)), splits=(("0", (512, 512)),), cpu_devices=2)
    assert apply_edit(policy, parse_line("limit 3GB 2")).limits == (("all", 1024), ("1", 2048), ("2", 3072))
    assert apply_edit(policy, parse_line("limit off 1")).limits == (("all", 1024),)
    assert apply_edit(policy, parse_line("limit 4GB")).limits == (("all", 4096),)
    assert apply_edit(policy, parse_line("limit off")).limits == ()
    assert apply_edit(policy, parse_line("split 2 1GB,2GB")).splits == (("0", (512, 512)), ("2", (1024, 2048)))
    assert apply_edit(policy, parse_line("split off")) == Policy(limits=policy.limits)
    assert apply_edit(policy, parse_line("reset")) == Policy()
    with pytest.raises(PolicyError, match="^limit off: GPU 0 has no limit of its own \\(a limit on all GPUs stays"):
        apply_edit(policy, parse_line("limit off 0"))


def test_names_are_unique_lower_case_words() -> None:
    assert len(set(IDS)) == len(IDS) and all(re.fullmatch(r"[a-z]+", name) for name in IDS)
    assert lookup("GROWTH") is lookup("growth") and lookup("grow") is None


@pytest.mark.parametrize("directive", REGISTRY, ids=IDS)
def test_a_typo_of_every_name_gets_a_suggestion(directive: directives.Directive) -> None:
    typo = directive.name[0] + directive.name[2:] if len(directive.name) > 4 else directive.name + "x"
    with pytest.raises(PolicyError, match=f"did you mean `{directive.name}`"):
        parse_line(f"{typo} x")


# ----- cells ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("directive", REGISTRY, ids=IDS)
def test_a_cell_takes_edits_only(directive: directives.Directive) -> None:
    cell = f"growth on\n{directive.examples[0]}\n"
    if directive.in_cell:
        assert [e.name for e in parse_cell(cell)] == ["growth", directive.name]
    else:
        with pytest.raises(PolicyError, match=f"line 2: `{directive.name}` is not allowed in a %%tfgpu cell"):
            parse_cell(cell)


# ----- options ------------------------------------------------------------------------------------
@pytest.mark.parametrize("option", sorted(OPTIONS))
def test_an_option_goes_only_with_its_directives(option: str) -> None:
    """`--yes` belongs to restart and who; with any other directive it is a one-line error naming them."""
    owners, declared = OPTIONS[option]
    word = f"{option}=x" if declared.value else option
    expected = " or ".join(f"`{owner.name}`" for owner in owners)
    for directive in REGISTRY:
        words, options = split_options(f"{directive.examples[0]} {word}")
        parsed = grammar.parse_words(words)
        if directive in owners:
            check_options(options, parsed)
        else:
            with pytest.raises(PolicyError, match=f"^{option} only goes with {expected}$"):
                check_options(options, parsed)


def test_a_shared_option_is_declared_alike_by_every_owner() -> None:
    """An option several directives share takes a value in all of them or in none (the parser reads
    it before it knows the directive)."""
    for owners, declared in OPTIONS.values():
        for owner in owners:
            same = [o for o in owner.options if o.name == declared.name]
            assert [o.value is None for o in same] == [declared.value is None]


# ----- completion ---------------------------------------------------------------------------------
def _complete(shell, text: str) -> list[str]:
    with provisionalcompleter():
        return sorted({c.text for c in shell.Completer.completions(text, len(text))})


@pytest.mark.parametrize("directive", [d for d in REGISTRY if d.choices], ids=[d.name for d in REGISTRY if d.choices])
def test_tab_offers_each_closed_set(shell, directive: directives.Directive) -> None:
    assert _complete(shell, f"%tfgpu {directive.name} ") == sorted(directive.choices)


# ----- describe -----------------------------------------------------------------------------------
def test_every_edit_describes_its_part_and_nothing_of_an_empty_policy() -> None:
    for directive in REGISTRY:
        assert (directive.describe is not None) == (directive.kind == "edit"), directive.name
        if directive.describe is not None:
            assert directive.describe(Policy()) == []
    assert describe_policy(RICH) == [
        "visible 0,1", "growth on", "limit 2GB on GPU 1, 1GB on every other visible GPU",
        "split 0 2x512MB", "split cpu into 2 logical devices", "allocator async", "loglevel error",
    ]


def test_describe_phrases_parse_back_for_field_edits() -> None:
    """`growth on`, `allocator async`, `loglevel error`: what the status shows is what one types."""
    for directive in REGISTRY:
        if directive.field is None:
            continue
        for phrase in directive.describe(RICH):  # type: ignore[misc]
            assert getattr(apply_edit(Policy(), parse_line(phrase)), directive.field) == getattr(RICH, directive.field)


# ----- light to import ----------------------------------------------------------------------------
def test_the_magic_module_imports_almost_nothing_of_the_package() -> None:
    """`%load_ext` imports the magic's module: the registry, the grammar and the policy stay out (the
    registry comes with the first `%tfgpu` or `%tfgpu?`). The package's `__init__` brings its one-line
    `_version`, written at build time."""
    code = ("import sys, tfgpu_magic.views.magics; "
            "print(sorted(m for m in sys.modules if m.startswith('tfgpu_magic')))")
    loaded = json.loads(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
                        .stdout.replace("'", '"'))
    assert loaded == ["tfgpu_magic", "tfgpu_magic._version", "tfgpu_magic.errors", "tfgpu_magic.views",
                      "tfgpu_magic.views.magics"]


# ----- loglevel -------------------------------------------------------------------------------------
@pytest.mark.parametrize("level", LOGLEVELS)
def test_loglevel_sets_the_policy_and_off_clears_it(level: str) -> None:
    policy = parse_line(f"loglevel {level}").change(Policy())
    assert policy == Policy(loglevel=level) and describe_policy(policy) == [f"loglevel {level}"]
    assert parse_line("loglevel off").change(policy) == Policy()
    assert Policy.from_dict(json.loads(json.dumps(policy.to_dict()))) == policy


@pytest.mark.parametrize(
    "data, says",
    [({"loglevel": "loud"}, "loglevel: expected one of debug, info, warning, error, got 'loud'"),
     ({"loglevel": 3}, "policy 'loglevel' must be a string or null"),
     ({"loglevel": "x" * 100_000}, "…")],
)
def test_loglevel_from_a_file_is_checked(data: dict, says: str) -> None:
    with pytest.raises(PolicyError) as info:
        Policy.from_dict(data)
    assert says in str(info.value) and len(str(info.value)) < 200


# ----- a cell is validated once, on its result -------------------------------------------------------
@pytest.fixture
def controller() -> Iterator[Controller]:
    """A private controller (its own environment); the import hook it arms is disarmed after."""
    yield Controller(environ={})
    quietimport.disarm()


def test_controller_validates_the_result_of_edits_once(controller: Controller, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[Policy] = []
    validate = Policy.validate
    monkeypatch.setattr(Policy, "validate", lambda self, aliases=None: (calls.append(self), validate(self, aliases)))
    controller.edit(parse_cell("limit 1GB 1\nvisible 0,1\ngrowth on\nloglevel info\n"))
    assert calls == [controller.policy] and controller.policy.loglevel == "info"
    calls.clear()
    with pytest.raises(PolicyError, match="^the cell's result: GPU 0 has both a limit and a split"):
        controller.edit(parse_cell("limit 1GB 0\nsplit 0 2x1GB\n"))
    assert len(calls) == 1 and controller.policy.loglevel == "info"


def test_an_error_while_applying_an_edit_names_its_cell_line(controller: Controller) -> None:
    with pytest.raises(PolicyError, match="^line 2: split off: GPU 1 is not split$"):
        controller.edit(parse_cell("growth on\nsplit off 1\n"))
    assert controller.policy == Policy()
