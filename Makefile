# Two entry points (README): `make demo` runs the main job end to end on the CPU; `make test` runs the checks.
# Both install into .venv from pinned versions first, so a fresh clone needs nothing else.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# The CPU build of torch, pinned: any other request pulls a multi-GB CUDA build.
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[runtime,api,highs,dev,hf,lightning]'
	# Compile the solver's kernels now (numba caches them), so that no first solve spends its time limit on it.
	$(BIN)/python -m memsched.optimizer.jit
	touch $(STAMP)

.PHONY: install demo test lint unit
install: $(STAMP)

demo: $(STAMP)
	$(BIN)/memsched demo

lint: $(STAMP)
	$(BIN)/ruff format --check .
	$(BIN)/ruff check .
	$(BIN)/mypy memsched optimizer runtime api
	$(BIN)/python .ci/lint-imports

test: lint
	$(BIN)/python -m pytest -q

# The fast inner loop (under 2 minutes on 2 cores): unit tests without the slow ones and the live services.
unit: $(STAMP)
	$(BIN)/python -m pytest -q -m "not slow and not service" tests/unit
