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
	$(BIN)/python .ci/typecheck
	$(BIN)/python .ci/lint-imports

# Two pytest workers, a module each at a time (module-scoped servers start once), one torch thread each: the
# 2-core CI machine's cores, without two workers' torch threads contending for them (per-layer timings would
# inflate). Serial, the suite took 25.5 min here; so, 13.2 min, with every test's own time about the same.
# Then the tests of wall-clock promises (marker `wallclock`, tests/conftest.py), alone: a user's solve has the
# machine to itself.
PYTEST := OMP_NUM_THREADS=1 $(BIN)/python -m pytest -q
PARALLEL := -n 2 --dist loadfile

test: lint
	$(PYTEST) $(PARALLEL) -m "not wallclock"
	$(PYTEST) -m wallclock

# The inner loop (5 min on 2 cores here, against 13 for `make test`): unit tests without the slow ones and the
# live services.
unit: $(STAMP)
	$(PYTEST) $(PARALLEL) -m "not slow and not service and not wallclock" tests/unit
	$(PYTEST) -m "wallclock and not slow and not service" tests/unit
