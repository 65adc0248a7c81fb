"""The package's shape, read from the source with `ast`: rooms (a subpackage or a top-level module)
import only rooms of their own layer or below (`LAYERS`, see docs/architecture.md), with no cycle
between rooms or between modules (module-level, function-level and `TYPE_CHECKING` imports all
count); no room reads another room's attributes by string; the magic and the panel never import each
other; each heavy or optional dependency stays in its one room; docs/architecture.md's layer table names
what each room imports; no module is longer than `MAX_LINES`.

`python tests/test_architecture.py` prints the room graph, then the module graph.
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

import pytest

PACKAGE = "tfgpu_magic"
ROOT = Path(__file__).resolve().parent.parent / PACKAGE
MAGIC = {f"{PACKAGE}.views.magics", f"{PACKAGE}.views.completion"}
PANEL = {f"{PACKAGE}.views.panel"}

LAYERS: tuple[tuple[str, ...], ...] = (
    ("_version", "errors", "envvars", "importhooks"),
    ("safefile",),
    ("language",),
    ("gpus",),
    ("plan",),
    ("tf", "frameworks"),
    ("jupyter",),
    ("doctor", "holders"),
    ("controller",),
    ("selftest",),
    ("views",),
    ("serverext", "__main__"),
    (PACKAGE,),
)
"""Rooms from the bottom up: a room imports only rooms of its own layer (without a cycle) or below.
`PACKAGE` is the package's `__init__`, the public API."""

def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(path): path for path in sorted(ROOT.rglob("*.py"))}


def imported_names(path: Path) -> list[tuple[str, str]]:
    """`imports_in` of a package file."""
    name = module_name(path)
    return imports_in(path.read_text(encoding="utf-8"), name if path.name == "__init__.py" else name.rpartition(".")[0])


def imports_in(source: str, package: str) -> list[tuple[str, str]]:
    """(imported module or `module.name`, how it was written) for every import statement in `source`,
    wherever it stands (module top, function, `if TYPE_CHECKING:`); relative ones resolved against
    `package`, the package the file is in."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [(alias.name, f"import {alias.name}") for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".")
                target = ".".join(parts[: len(parts) - node.level + 1] + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            written = f"from {'.' * node.level}{node.module or ''} import ..."
            found += [(f"{target}.{alias.name}", written) for alias in node.names]
    return found


def internal_target(imported: str) -> str | None:
    """The package module an import loads: `a.b.name` is module `a.b.name` if there is one, else `a.b`.
    (The parent packages it runs on the way are not counted: their `__init__` files import nothing
    of ours at top level but `errors`, or, for `doctor`, its own modules, which its `__init__` counts.)"""
    if imported in MODULES:
        return imported
    parent = imported.rpartition(".")[0]
    return parent if parent in MODULES else None


def import_graph() -> dict[str, set[str]]:
    """Module → the package modules it imports anywhere in its source."""
    graph: dict[str, set[str]] = {}
    for name, path in MODULES.items():
        targets = {internal_target(imported) for imported, _ in imported_names(path)}
        graph[name] = {target for target in targets if target is not None and target != name}
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle as a path that ends where it starts, or None."""
    done: set[str] = set()
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        if node in stack:
            return stack[stack.index(node):] + [node]
        if node in done:
            return None
        stack.append(node)
        for target in sorted(graph[node]):
            cycle = visit(target)
            if cycle:
                return cycle
        stack.pop()
        done.add(node)
        return None

    for node in sorted(graph):
        cycle = visit(node)
        if cycle:
            return cycle
    return None


def importers_of(top: str) -> dict[str, list[str]]:
    """Package modules whose source imports third-party package `top` (anywhere), with the statements."""
    found: dict[str, list[str]] = {}
    for name, path in MODULES.items():
        hits = [written for imported, written in imported_names(path) if imported.split(".")[0] == top]
        if hits:
            found[name] = hits
    return found


def room_of(module: str) -> str:
    """`tfgpu_magic.tf.runtime` → `tf`; `tfgpu_magic.doctor` → `doctor`; the package → `PACKAGE`."""
    return module.removeprefix(f"{PACKAGE}.").split(".")[0] if module != PACKAGE else PACKAGE


LAYER_OF = {room: rank for rank, rooms in enumerate(LAYERS) for room in rooms}


def room_graph(graph: dict[str, set[str]] | None = None) -> dict[str, set[str]]:
    """Room → the other rooms its modules import."""
    rooms: dict[str, set[str]] = {}
    for name, targets in (graph or import_graph()).items():
        rooms.setdefault(room_of(name), set()).update(room_of(t) for t in targets if room_of(t) != room_of(name))
    return rooms


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    """`module → module` for every import of a room of a higher layer."""
    return sorted(f"{name} → {target}" for name, targets in graph.items()
                  for target in targets if LAYER_OF[room_of(target)] > LAYER_OF[room_of(name)])


def test_every_room_has_a_layer() -> None:
    assert set(room_graph()) == set(LAYER_OF), "a room is missing from LAYERS (or LAYERS names a room that is gone)"


def test_rooms_import_downward_only() -> None:
    assert upward_imports(import_graph()) == []


DOC = ROOT.parent / "docs" / "architecture.md"


def documented_imports() -> dict[str, set[str]]:
    """docs/architecture.md's layer table: each room and the rooms its row says it imports ("–": none;
    "below", "everything below": left out, as they say nothing particular)."""
    table = DOC.read_text().split("## The layer table", 1)[1].split("\n\n", 2)[1]
    said: dict[str, set[str]] = {}
    for row in table.splitlines()[2:]:
        _, _, rooms, _, imports, _ = (cell.strip() for cell in row.split("|"))
        names = re.findall(r"`([^`]+)`", rooms)
        if "below" in imports:
            continue
        for name in names:
            part = next((text.split(":", 1)[1] for text in imports.split(";") if text.strip().startswith(f"{name}:")),
                        imports)
            said[name] = {word.strip() for word in part.split(",")} - {"–", ""}
    return said


def test_the_documented_layer_table_names_what_each_room_imports() -> None:
    """docs/architecture.md's table says, for each room of a row that names its imports, exactly the rooms
    it imports."""
    graph, said = room_graph(), documented_imports()
    assert said and set(said) <= set(graph), sorted(set(said) - set(graph))
    assert {room: sorted(rooms) for room, rooms in said.items()} == {room: sorted(graph[room]) for room in said}


def test_no_cycle_between_rooms() -> None:
    cycle = find_cycle(room_graph())
    assert cycle is None, "cycle between rooms: " + " → ".join(cycle or [])


def test_an_upward_import_and_a_room_cycle_are_seen() -> None:
    """The checks catch what they are for: `gpus` importing `tf`, and two rooms importing each other."""
    graph = {f"{PACKAGE}.gpus.x": {f"{PACKAGE}.tf.y"}, f"{PACKAGE}.tf.y": {f"{PACKAGE}.gpus.z"},
             f"{PACKAGE}.gpus.z": set()}
    assert upward_imports(graph) == [f"{PACKAGE}.gpus.x → {PACKAGE}.tf.y"]
    assert find_cycle(room_graph(graph)) == ["gpus", "tf", "gpus"]


SHELL_ATTRIBUTE = re.compile(r"_tfgpu_\w+")
"""How the package names the attributes it sets on IPython's shell (one room owns each)."""


def string_attributes() -> dict[str, set[str]]:
    """Attribute-name string constants of the package (`"_tfgpu_watch"`) → the rooms whose source
    names them, as a literal or by importing the constant that holds it."""
    holders: dict[str, str] = {}
    used: dict[str, set[str]] = {}
    for name, path in MODULES.items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and SHELL_ATTRIBUTE.fullmatch(node.value):
                used.setdefault(node.value, set()).add(room_of(name))
            if (isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant)
                    and isinstance(node.value.value, str) and SHELL_ATTRIBUTE.fullmatch(node.value.value)):
                holders.update({target.id: node.value.value for target in node.targets if isinstance(target, ast.Name)})
    for name, path in MODULES.items():
        for imported, _ in imported_names(path):
            constant = imported.rpartition(".")[2]
            if constant in holders and internal_target(imported) is not None:
                used[holders[constant]].add(room_of(name))
    return used


MAX_LINES = 600
"""A module longer than this is split along its jobs into modules named for what they do."""


def test_no_module_is_longer_than_max_lines() -> None:
    lengths = {name: len(path.read_text(encoding="utf-8").splitlines()) for name, path in MODULES.items()}
    assert {name: n for name, n in lengths.items() if n > MAX_LINES} == {}
    assert max(lengths.values()) > MAX_LINES // 2, "the check reads the package's modules"


def test_no_room_reads_another_rooms_attributes_by_string() -> None:
    shared = {attribute: rooms for attribute, rooms in string_attributes().items() if len(rooms) > 1}
    assert shared == {}, f"attributes named by string in several rooms (give them a real interface): {shared}"
    assert string_attributes(), "the check reads the package's shell attributes"


def test_the_reader_sees_every_kind_of_import() -> None:
    """Function-level and TYPE_CHECKING imports count, and `from . import module` names the module."""
    source = (
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ..controller import Controller\n"
        "def f():\n    from . import persist\n    from .. import errors\n    import tensorflow.python\n"
    )
    found = [name for name, _ in imports_in(source, f"{PACKAGE}.jupyter")]
    assert {internal_target(name) for name in found} >= {
        f"{PACKAGE}.controller", f"{PACKAGE}.jupyter.persist", f"{PACKAGE}.errors"}
    assert "tensorflow.python" in found


def test_no_import_cycles() -> None:
    cycle = find_cycle(import_graph())
    assert cycle is None, "import cycle: " + " → ".join(cycle or [])


def test_a_cycle_is_found_when_there_is_one() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set(), "c": {"a", "b"}}) is None


def test_the_magic_and_the_panel_do_not_import_each_other() -> None:
    """They are two views over one controller: the panel is opened by `actions.open_panel`, and the
    magic is reached only from the package's `load_ipython_extension`."""
    graph = import_graph()
    for name in MAGIC:
        assert not graph[name] & PANEL, f"{name} imports the panel"
    for name in PANEL:
        assert not graph[name] & MAGIC, f"{name} imports the magic"
    panel_users = {name for name, targets in graph.items() if targets & PANEL}
    assert panel_users <= {f"{PACKAGE}.views.actions"}
    magic_users = {name for name, targets in graph.items() if targets & MAGIC} - MAGIC
    assert magic_users <= {PACKAGE}


def test_actions_and_controller_import_no_interactive_view_at_top() -> None:
    """The controller imports no view (it tells its listeners; views render), and the actions import
    the panel and the restart button only inside the actions that open them."""
    graph = import_graph()
    assert not {t for t in graph[f"{PACKAGE}.controller"] if t.startswith(f"{PACKAGE}.views")}
    tree = ast.parse(MODULES[f"{PACKAGE}.views.actions"].read_text(encoding="utf-8"))
    top = {node.module or "" for node in tree.body if isinstance(node, ast.ImportFrom)}
    assert not {module for module in top if module.endswith(("panel", "confirm"))}


INTERNALS = re.compile(r"controller\.(api|environ|catalog|listeners)\b")
"""The controller's own parts; views read it through its public methods (`state()`, `environment()`,
`gpus()`, `gpu_settings()`, `pending()`, `recorded()`, `subscribe()`, `export()`)."""


@pytest.mark.parametrize("module", ["views.status", "views.results", "views.panel", "views.confirm", "doctor"])
def test_views_use_only_the_controllers_public_surface(module: str) -> None:
    source = MODULES[f"{PACKAGE}.{module}"].read_text(encoding="utf-8")
    assert not INTERNALS.findall(source)


@pytest.mark.parametrize(
    "dependency, allowed",
    [
        ("tensorflow", lambda name: name.startswith(f"{PACKAGE}.tf.")),
        ("keras", lambda name: name.startswith(f"{PACKAGE}.tf.")),
        ("pynvml", lambda name: name == f"{PACKAGE}.gpus.inventory"),
        ("ipywidgets", lambda name: name.startswith(f"{PACKAGE}.views.")),
        ("jupyter_server", lambda name: name.startswith(f"{PACKAGE}.serverext")),
        # the Slurm provisioner raises tornado's HTTPError: the one exception whose message a server shows
        ("tornado", lambda name: name.startswith(f"{PACKAGE}.serverext") or name == f"{PACKAGE}.jupyter.slurm_provisioner"),
    ],
)
def test_each_heavy_dependency_stays_in_its_room(dependency: str, allowed) -> None:
    users = importers_of(dependency)
    assert all(allowed(name) for name in users), f"{dependency} imported outside its room: {users}"


def test_the_rooms_are_imported_where_expected() -> None:
    """The checks above are about real imports: each dependency is imported somewhere."""
    assert any(name.startswith(f"{PACKAGE}.tf.") for name in importers_of("tensorflow"))
    assert set(importers_of("pynvml")) == {f"{PACKAGE}.gpus.inventory"}
    assert set(importers_of("ipywidgets")) >= {f"{PACKAGE}.views.panel", f"{PACKAGE}.views.confirm"}
    assert set(importers_of("jupyter_server")) == {f"{PACKAGE}.serverext.handlers"}


def format_graph(graph: dict[str, set[str]]) -> str:
    """One line per module: what it imports, package prefix dropped."""
    short = lambda name: name.removeprefix(f"{PACKAGE}.") if name != PACKAGE else PACKAGE  # noqa: E731
    return "\n".join(f"{short(name):<22} → {', '.join(sorted(map(short, targets))) or '-'}"
                     for name, targets in sorted(graph.items()))


if __name__ == "__main__":
    graph = import_graph()
    rooms = room_graph(graph)
    print("rooms, bottom layer first:")
    print("\n".join(f"  {LAYER_OF[room]:>2} {room:<12} → {', '.join(sorted(rooms[room], key=LAYER_OF.get)) or '-'}"
                    for room in sorted(rooms, key=lambda room: (LAYER_OF.get(room, 99), room))))
    print("\nmodules:")
    print(format_graph(graph))
    cycle = find_cycle(graph) or find_cycle(rooms)
    upward = upward_imports(graph)
    print("cycles:", " → ".join(cycle) if cycle else "none")
    print("upward imports:", ", ".join(upward) if upward else "none")
    sys.exit(1 if cycle or upward else 0)
