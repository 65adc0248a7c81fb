# The two commands of the README: `make demo` and `make test`. Everything else builds on them.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp
DOCS_STAMP := $(VENV)/.docs-stamp
DOCS_OUT := build/docs/html
# Test files run in parallel, each file whole in one worker (its servers, kernels and clusters are shared by its
# tests): most of the suite waits on kernels, servers and browsers rather than on the 2 cores it was sized for.
TEST_WORKERS ?= 3
# Jupyter refuses to run as root without --allow-root; Docker GPU images (TensorFlow's among them) run as root.
ALLOW_ROOT := $(if $(filter 0,$(shell id -u)),--allow-root)

# The demo serves its own copy of notebooks/, made once in a git-ignored folder and never overwritten: JupyterLab's
# autosave stays on, what a user writes there (new notebooks too) survives reloads and the next `make demo`, and
# the tracked notebooks stay as they are.
DEMO_DIR := .demo
DEMO_NOTEBOOK := quickstart.ipynb

.PHONY: demo test bench bench-against soak screenshots docs clean

# The venv: the README's install (`pip install -e .`), with the extras the tests and the demo need. It builds the
# JupyterLab extension when it is missing (hatch-jupyter-builder, see pyproject.toml) and enables both
# extensions in the venv.
$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q -e ".[test,demo,nvml]"
	touch $(STAMP)

# The JupyterLab extension: TypeScript in labextension/, built into tfgpu_magic/labextension/ by npm (node is
# needed here, by developers, never by users of the wheel). After an edit the old build goes and the install
# runs again: its build hook makes a new build (`npm run build`) and copies it into the venv.
LABEXT_BUILT := tfgpu_magic/labextension/package.json
LABEXT_SOURCES := $(wildcard labextension/src/*.ts labextension/src/*.tsx labextension/style/* labextension/schema/*) \
	labextension/package.json labextension/package-lock.json labextension/tsconfig.json

$(LABEXT_BUILT): $(LABEXT_SOURCES) | $(STAMP)
	rm -rf $(dir $(LABEXT_BUILT))
	$(BIN)/python -m pip install -q --no-deps -e .

$(DEMO_DIR)/$(DEMO_NOTEBOOK):
	mkdir -p $(DEMO_DIR)
	for notebook in notebooks/*.ipynb; do test -e "$(DEMO_DIR)/$${notebook##*/}" || cp "$$notebook" $(DEMO_DIR)/; done

demo: $(STAMP) $(LABEXT_BUILT) $(DEMO_DIR)/$(DEMO_NOTEBOOK)  ## set up and open JupyterLab on the quickstart notebook
	$(BIN)/jupyter lab $(ALLOW_ROOT) --ServerApp.root_dir=$(DEMO_DIR) --LabApp.default_url=/lab/tree/$(DEMO_NOTEBOOK)

# The labextension's jest tests (labextension/src/__tests__) run on its npm packages, installed as the build hook
# installs them (pyproject.toml), again after package.json or the lock changed.
LABEXT_NPM := labextension/node_modules/.tfgpu-installed-stamp

$(LABEXT_NPM): labextension/package.json labextension/package-lock.json
	cd labextension && npm install --prefer-offline --no-save
	touch $(LABEXT_NPM)

test: $(STAMP) $(DOCS_STAMP) $(LABEXT_BUILT) $(LABEXT_NPM)  ## set up and run the whole test suite (the docs extra too: tests/test_docs.py builds the site): the labextension's jest tests, then pytest
	cd labextension && npm test
	$(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadfile --durations=10

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
	TFGPU_SCREENSHOTS=docs $(BIN)/python -m pytest -q -p no:cacheprovider tests/test_browser.py tests/test_labextension.py tests/test_labext_history.py

# The documentation site: docs/*.md through Sphinx and MyST into $(DOCS_OUT), with the docs extra installed into
# the venv (the venv is made here when `make docs` comes first). Warnings are errors, and every page is read
# again each time (-E), so a warning on a page that did not change still fails the build.
$(DOCS_STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q -e ".[docs]"
	touch $(DOCS_STAMP)

docs: $(DOCS_STAMP)  ## build the documentation site into build/docs/html, failing on any warning
	$(BIN)/python -m sphinx -W --keep-going -E -q -b html docs $(DOCS_OUT)

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache labextension/node_modules labextension/lib tfgpu_magic/labextension
