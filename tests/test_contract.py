"""One source for the contract between the kernel, the server extension and the browser: the JSON Schema
tfgpu_magic/jupyter/tfgpu-state.schema.json.

- The browser's types (labextension/src/schema.ts) are generated from it (`npm run schema`,
  labextension/scripts/schema.mjs, json-schema-to-typescript); regenerated here into a temporary file, they
  must equal the committed one, so an edit of the schema without `npm run schema` fails.
- Its version is written once, in the schema's `$defs/version`: nothing else in the schema spells it (not
  `$id`, not a `format`), every record's `version` refers there, and no Python or TypeScript source spells
  a format of its own (they read the schema, or the generated file).
- Every error code the code sets is one the schema names, and every code the schema names is set somewhere
  (`gpus.inventory` where NVML fails, `jupyter.kernelstate` where a state file is refused, the handlers
  where a request is).

The replies and the state a kernel writes are checked against the schema where they are made:
tests/test_serverext.py (`conforms`, a real jupyter_server and real kernels), tests/test_memory_history.py.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tfgpu_magic.gpus import inventory
from tfgpu_magic.jupyter import kernelstate
from tfgpu_magic.serverext import handlers

ROOT = Path(__file__).resolve().parents[1]
LABEXTENSION = ROOT / "labextension"
GENERATED = LABEXTENSION / "src" / "schema.ts"
GENERATOR = LABEXTENSION / "scripts" / "schema.mjs"
FORMAT_LITERAL = re.compile(r"[\"'`]tfgpu_magic/(?:kernel-state|gpus|kernel|keep)(?:/\d+)?[\"'`]")
"""A record's `format` as a source would spell it (quoted), of this version or of one that ended it in its number."""
LIMITS = frozenset({"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf", "minLength",
                    "maxLength", "minItems", "maxItems", "minProperties", "maxProperties"})
"""JSON Schema's bounds: numbers that are sizes, never the version."""
RECORDS = {"kernelState", "gpusReply", "kernelReply", "keepReply"}
"""The definitions that are whole records (the state file, each reply): each names itself in `format`."""


def test_the_browsers_types_are_generated_from_the_schema_and_fresh(tmp_path: Path) -> None:
    node = shutil.which("node")
    if node is None or not (LABEXTENSION / "node_modules" / "json-schema-to-typescript").is_dir():
        pytest.skip("needs node and labextension/node_modules (npm ci in labextension/)")
    fresh = tmp_path / "schema.ts"
    done = subprocess.run([node, str(GENERATOR), str(fresh)], cwd=LABEXTENSION, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert fresh.read_text(encoding="utf-8") == GENERATED.read_text(encoding="utf-8"), (
        "labextension/src/schema.ts is stale: run `npm run schema` in labextension/")


def test_the_generated_types_carry_what_the_schema_says() -> None:
    """A few anchors, so that a generator which wrote nothing useful cannot pass the freshness check."""
    text = GENERATED.read_text(encoding="utf-8")
    defs = kernelstate.contract()["$defs"]
    assert f"export const SCHEMA_VERSION = {kernelstate.schema_version()};" in text
    assert f"export const VERSION_HEADER = '{kernelstate.contract()['x-version-header']}';" in text
    assert f"export type Version = {kernelstate.schema_version()};" in text
    for name in ("GpusReply", "KernelReply", "KeepReply", "KernelState", "Error"):
        assert f"export interface {name} {{" in text, name
    codes = re.search(r"^export type ErrorCode =(.*?);", text, re.M | re.S)
    assert codes and re.findall(r"'([^']*)'", codes.group(1)) == defs["errorCode"]["enum"]
    listed = re.search(r"^export const ERROR_CODES: readonly ErrorCode\[\] = \[(.*?)\];", text, re.M | re.S)
    assert listed and re.findall(r"'([^']*)'", listed.group(1)) == defs["errorCode"]["enum"]
    api = (LABEXTENSION / "src" / "api.ts").read_text(encoding="utf-8")
    assert "export interface" not in api, "api.ts names the generated types; it writes no shape by hand"


def version_spellings(node: Any, version: int, where: str = "") -> list[str]:
    """Where the schema `node` spells `version` other than in `$defs/version` (JSON pointers): a number equal
    to it (bounds aside), or a string or key with it as a number of its own (`tfgpu_magic/gpus/4`, "version
    4."; not "4.0", "2.4" or "404")."""
    if where == "/$defs/version":
        return []
    number = re.compile(rf"(?<![\d.]){version}(?!\.?\d)")
    if isinstance(node, dict):
        spelled = [f"{where}/{key}" for key in node if number.search(key)]
        return spelled + [found for key, value in node.items() if key not in LIMITS
                          for found in version_spellings(value, version, f"{where}/{key}")]
    if isinstance(node, list):
        return [found for index, item in enumerate(node)
                for found in version_spellings(item, version, f"{where}/{index}")]
    if isinstance(node, str):
        return [where] if number.search(node) else []
    return [where] if isinstance(node, (int, float)) and not isinstance(node, bool) and node == version else []


def test_the_version_is_written_once_in_the_schema() -> None:
    schema = kernelstate.contract()
    version = kernelstate.schema_version()
    assert schema["$defs"]["version"]["const"] == version and type(version) is int
    assert version_spellings(schema, version) == []
    records = {name: spec for name, spec in schema["$defs"].items() if "format" in spec.get("properties", {})}
    assert set(records) == RECORDS
    for name, spec in records.items():
        assert spec["properties"]["version"] == {"$ref": "#/$defs/version"}, name
        assert {"format", "version"} <= set(spec["required"]), name
        assert kernelstate.stamp(name) == {"format": spec["properties"]["format"]["const"], "version": version}
    sources = [*(ROOT / "tfgpu_magic").rglob("*.py"), *(LABEXTENSION / "src").glob("*.ts*")]
    spelled = [str(path.relative_to(ROOT)) for path in sources
               if path != GENERATED and FORMAT_LITERAL.search(path.read_text(encoding="utf-8"))]
    assert spelled == [], f"a format spelled outside the schema: {spelled}"


def test_every_error_code_is_set_where_its_error_happens_and_named_by_the_schema() -> None:
    named = set(kernelstate.contract()["$defs"]["errorCode"]["enum"])
    at_nvml = {inventory.NVML_MISSING, inventory.NO_DRIVER_FOUND, inventory.NVML_FAILED, inventory.DRIVER_NOT_ANSWERING}
    at_state = {kernelstate.STATE_INVALID, kernelstate.JSONSCHEMA_MISSING, kernelstate.JSONSCHEMA_OLD}
    at_request = {handlers.UNKNOWN_KERNEL, handlers.BAD_SINCE, handlers.POLICY_REFUSED, handlers.KEEP_FAILED,
                  handlers.VERSION_MISMATCH, handlers.FORBIDDEN, handlers.SERVER_ERROR}
    assert at_nvml | at_state | at_request == named
    gather_source = (ROOT / "tfgpu_magic" / "serverext" / "gather.py").read_text(encoding="utf-8")
    assert "NO_BINDING" not in gather_source and "NO_DRIVER:" not in gather_source, "codes found from messages"


def test_the_walk_finds_a_version_written_twice() -> None:
    """The check above can fail: a schema that writes its version as version 3's did (in `$id` and a
    `format`), or as a number of its own in a record, is caught at each place."""
    schema = kernelstate.contract()
    version = kernelstate.schema_version()
    defs = schema["$defs"]
    gpus, keep = defs["gpusReply"], defs["keepReply"]
    twice = {**schema, "$id": f"tfgpu_magic/schema/{version}", "$defs": {
        **defs,
        "gpusReply": {**gpus, "properties": {**gpus["properties"], "format": {"const": f"tfgpu_magic/gpus/{version}"}}},
        "keepReply": {**keep, "description": f"Version {version}.", "properties": {
            **keep["properties"], "version": {"const": version}}}}}
    assert version_spellings(twice, version) == [
        "/$id", "/$defs/gpusReply/properties/format/const", "/$defs/keepReply/description",
        "/$defs/keepReply/properties/version/const"]
    assert version_spellings({"maxItems": version, "description": "jsonschema 4.0, 2.4, 404"}, version) == []
