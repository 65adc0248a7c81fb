# The two commands of the README: `make demo` and `make test`. Everything else builds on them.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp
# Jupyter refuses to run as root without --allow-root; Docker GPU images (TensorFlow's among them) run as root.
ALLOW_ROOT := $(if $(filter 0,$(shell id -u)),--allow-root)

DEMO_DIR := notebooks
DEMO_NOTEBOOK := quickstart.ipynb
# JupyterLab's autosave would write the demo's outputs into the tracked notebook; in this venv only, it is off
# (File > Save still saves). Settings in overrides.json: https://jupyterlab.readthedocs.io/en/stable/user/directories.html
LAB_OVERRIDES := $(VENV)/share/jupyter/lab/settings/overrides.json

.PHONY: demo test bench bench-against soak screenshots clean

# The JupyterLab extension (TypeScript in labextension/, built into tfgpu_magic/labextension/ by npm; node is
# needed here, by developers, never by users of the wheel). setup.py builds it during `pip install`; the venv
# then links it (`jupyter-builder develop`, what `jupyter labextension develop` runs), so that a rebuild after
# an edit is live at the next reload.
LABEXT_BUILT := tfgpu_magic/labextension/package.json
LABEXT_SOURCES := $(wildcard labextension/src/*.ts labextension/style/* labextension/schema/*) \
	labextension/package.json labextension/package-lock.json labextension/tsconfig.json

$(STAMP): setup.cfg pyproject.toml setup.py labextension/package.json labextension/package-lock.json
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip setuptools  # `jupyter-builder develop` runs setup.py
	$(BIN)/python -m pip install -q -e ".[test,demo,nvml]"
	$(BIN)/jupyter-builder develop --overwrite .
	mkdir -p $(dir $(LAB_OVERRIDES))
	echo '{"@jupyterlab/docmanager-extension:plugin": {"autosave": false}}' > $(LAB_OVERRIDES)
	touch $(STAMP)

$(LABEXT_BUILT): $(LABEXT_SOURCES) | $(STAMP)
	cd labextension && npm run build
	touch $(LABEXT_BUILT)

demo: $(STAMP) $(LABEXT_BUILT)  ## set up and open JupyterLab on the quickstart notebook
	$(BIN)/jupyter lab $(ALLOW_ROOT) --ServerApp.root_dir=$(DEMO_DIR) --LabApp.default_url=/lab/tree/$(DEMO_NOTEBOOK)

test: $(STAMP) $(LABEXT_BUILT)  ## set up and run the whole test suite
	$(BIN)/python -m pytest

bench: $(STAMP)  ## speed figures, as ratios against baselines measured in the same run
	$(BIN)/python benchmarks/run.py

bench-against: $(STAMP)  ## this tree against an earlier revision: make bench-against REV=<commit or tag>
	$(if $(REV),,$(error give the revision to compare against: make bench-against REV=<commit or tag>))
	$(BIN)/python benchmarks/against.py $(REV)

soak: $(STAMP)  ## long runs: 100,000 fuzzed directive lines, 50 timed restart-and-apply cycles
	TFGPU_FUZZ_EXAMPLES=100000 $(BIN)/python -m pytest -q -p no:cacheprovider \
		tests/test_grammar.py tests/test_magic.py -k "fuzz or any_line"
	TFGPU_RESTART_CYCLES=50 $(BIN)/python -m pytest -q -p no:cacheprovider tests/test_restart.py -k cycles

screenshots: $(STAMP) $(LABEXT_BUILT)  ## refresh the screenshots in docs/ (tests never write there otherwise)
	TFGPU_SCREENSHOTS=docs $(BIN)/python -m pytest -q -p no:cacheprovider tests/test_browser.py tests/test_labextension.py

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache labextension/node_modules labextension/lib tfgpu_magic/labextension
