"""One source for the contract between the kernel, the server extension and the browser: the JSON Schema
tfgpu_magic/jupyter/tfgpu-state.schema.json.

- The browser's types (labextension/src/schema.ts) are generated from it (`npm run schema`,
  labextension/scripts/schema.mjs, json-schema-to-typescript); regenerated here into a temporary file, they
  must equal the committed one, so an edit of the schema without `npm run schema` fails.
- Its version is written in the schema alone: `$id` ends in it, every `format` ends in it, and no Python or
  TypeScript source spells a format of its own (they read the schema, or the generated file).
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

import pytest

from tfgpu_magic.gpus import inventory
from tfgpu_magic.jupyter import kernelstate
from tfgpu_magic.serverext import handlers

ROOT = Path(__file__).resolve().parents[1]
LABEXTENSION = ROOT / "labextension"
GENERATED = LABEXTENSION / "src" / "schema.ts"
GENERATOR = LABEXTENSION / "scripts" / "schema.mjs"
FORMAT_LITERAL = re.compile(r"tfgpu_magic/(?:kernel-state|gpus|kernel|keep)/\d")


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
    for name in ("GpusReply", "KernelReply", "KeepReply", "KernelState", "Error"):
        assert f"export interface {name} {{" in text, name
    codes = re.search(r"^export type ErrorCode =(.*?);", text, re.M | re.S)
    assert codes and re.findall(r"'([^']*)'", codes.group(1)) == defs["errorCode"]["enum"]
    api = (LABEXTENSION / "src" / "api.ts").read_text(encoding="utf-8")
    assert "export interface" not in api, "api.ts names the generated types; it writes no shape by hand"


def test_the_version_is_written_in_the_schema_alone() -> None:
    schema = kernelstate.contract()
    version = kernelstate.schema_version()
    formats = {name: spec["properties"]["format"]["const"] for name, spec in schema["$defs"].items()
               if "format" in spec.get("properties", {})}
    assert set(formats) == {"kernelState", "gpusReply", "kernelReply", "keepReply"}
    assert all(value.endswith(f"/{version}") for value in formats.values()), formats
    assert schema["$id"].endswith(f"/{version}")
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
