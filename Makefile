# The two commands of the README: `make demo` and `make test`. Everything else builds on them.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp
# Jupyter refuses to run as root without --allow-root; Docker GPU images (TensorFlow's among them) run as root.
ALLOW_ROOT := $(if $(filter 0,$(shell id -u)),--allow-root)

.PHONY: demo test bench bench-against soak clean

$(STAMP): setup.cfg pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e ".[test,demo,nvml]"
	touch $(STAMP)

demo: $(STAMP)  ## set up and open JupyterLab on the quickstart notebook
	$(BIN)/jupyter lab $(ALLOW_ROOT) notebooks/quickstart.ipynb

test: $(STAMP)  ## set up and run the whole test suite
	$(BIN)/python -m pytest

bench: $(STAMP)  ## speed figures, as ratios against baselines measured in the same run
	$(BIN)/python benchmarks/run.py

bench-against: $(STAMP)  ## this tree against an earlier revision: make bench-against REV=<commit or tag>
	$(if $(REV),,$(error give the revision to compare against: make bench-against REV=<commit or tag>))
	$(BIN)/python benchmarks/against.py $(REV)

soak: $(STAMP)  ## long runs: 100,000 fuzzed directive lines, 50 restart-and-apply cycles
	TFGPU_FUZZ_EXAMPLES=100000 $(BIN)/python -m pytest -q -p no:cacheprovider \
		tests/test_grammar.py tests/test_magic.py -k "fuzz or any_line"
	TFGPU_RESTART_CYCLES=50 $(BIN)/python -m pytest -q -p no:cacheprovider tests/test_restart.py -k cycles

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache
