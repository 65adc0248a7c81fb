"""The documentation: `make docs` builds the site from docs/ with no warning (Sphinx and MyST, as Read the Docs
does), a broken link there fails that build, and the README, the front door, stays short, opens with the two
commands and links only to what exists. The examples in the pages that tests compare with real output are
checked where the behaviour is tested (tests/test_registry.py: docs/grammar.md, docs/provisioner.md;
tests/test_architecture.py: docs/architecture.md)."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
VENV = Path(sys.prefix)
"""The venv running the tests: `make docs` uses its Python (the Makefile's VENV, given on the command line)."""
README_MAX_LINES = 250
BUILD_TIMEOUT = 120


def make_docs(root: Path, out: Path) -> subprocess.CompletedProcess[str]:
    """`make docs` in `root`, building into `out`, with this venv's docs extra as it is: the stamp counts as
    up to date (`-o`), so nothing is installed during the tests."""
    for module in ("sphinx", "myst_parser", "furo"):
        pytest.importorskip(module, reason="the docs extra is not installed in this venv: run `make docs` once")
    return subprocess.run(["make", "-s", "-C", str(root), "-o", str(VENV / ".docs-stamp"), "docs", f"VENV={VENV}",
                           f"DOCS_OUT={out}"], capture_output=True, text=True, timeout=BUILD_TIMEOUT, check=False)


def test_make_docs_builds_every_page_without_a_warning(tmp_path: Path) -> None:
    built = make_docs(ROOT, tmp_path / "html")
    assert built.returncode == 0, built.stdout + built.stderr
    assert "WARNING" not in built.stderr + built.stdout
    pages = {path.stem for path in (ROOT / "docs").glob("*.md")}
    assert pages and {path.stem for path in (tmp_path / "html").glob("*.html")} >= pages


def test_a_broken_link_fails_make_docs(tmp_path: Path) -> None:
    """The same build over a copy of the sources with one link to a page that is not there."""
    copy = tmp_path / "source"
    shutil.copytree(ROOT / "docs", copy / "docs", ignore=shutil.ignore_patterns("_build"))
    for name in ("Makefile", "CONTRIBUTING.md", "CHANGELOG.md", "labextension/package.json"):
        (copy / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / name, copy / name)
    index = copy / "docs" / "index.md"
    broken = index.read_text(encoding="utf-8") + "\nSee [the missing page](no-such-page.md).\n"
    index.write_text(broken, encoding="utf-8")
    built = make_docs(copy, tmp_path / "html")
    assert built.returncode != 0
    assert "no-such-page" in built.stderr + built.stdout


def github_anchor(heading: str) -> str:
    """The anchor GitHub gives a Markdown heading: lower case, punctuation dropped, spaces as hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_readme_is_a_short_front_door() -> None:
    text = README.read_text(encoding="utf-8")
    assert len(text.splitlines()) <= README_MAX_LINES
    first_block = re.search(r"```bash\n(.*?)\n```", text, re.S)
    assert first_block is not None
    assert [line.split()[:2] for line in first_block.group(1).splitlines()] == [["make", "demo"], ["make", "test"]]
    assert text.index("![") < text.index("## ")  # a screenshot before the first section


def test_readme_links_lead_somewhere() -> None:
    """Every relative link is a file of the repository, every `#anchor` a heading of the README."""
    text = README.read_text(encoding="utf-8")
    anchors = {github_anchor(heading) for heading in re.findall(r"^#+ (.*)$", text, re.M)}
    targets = re.findall(r"\]\(([^)\s]+)\)", text)
    assert targets
    local = [target for target in targets if not target.startswith(("http://", "https://"))]
    missing = [target for target in local
               if (target[1:] not in anchors if target.startswith("#") else not (ROOT / target.split("#")[0]).exists())]
    assert missing == []


def test_readme_five_directives_parse() -> None:
    """The README's five directives are lines the grammar accepts, each a different directive (on the test
    suite's four fake cards, since `visible auto` needs an inventory)."""
    from fake_nvml import FakeNvml, four_gpus

    from tfgpu_magic.gpus.inventory import InventoryCatalog, Nvml, read_inventory
    from tfgpu_magic.language.grammar import parse_line

    catalog = InventoryCatalog(read_inventory(Nvml(module=FakeNvml(four_gpus()))))

    block = re.search(r"^## Five directives\n\n```\n(.*?)\n```$", README.read_text(encoding="utf-8"), re.S | re.M)
    assert block is not None, "README has no block of five directives"
    lines = [re.split(r"\s{2,}", line)[0].removeprefix("%tfgpu ") for line in block.group(1).splitlines()]
    assert len({parse_line(line, catalog).name for line in lines}) == len(lines) == 5
