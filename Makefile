# Two commands: `make demo` and `make test`. Both create .venv when it is missing.
# `make demo` installs only the package (what the demo runs); `make test` (and `make test-fast`)
# add the test toolchain on top of the same .venv: the `test` extras and a DeepSpeed build.
PY         ?= python3.11
VENV       := .venv
BIN        := $(VENV)/bin
STAMP      := $(VENV)/.installed
TEST_STAMP := $(VENV)/.installed-test
OUT        ?= out/demo
# pytest's exit 5 ("no tests collected": a tier with nothing in it) is not a failure of the run
PYTEST     := $(BIN)/python -m pytest -q -ra
ALLOW_EMPTY = || { s=$$?; [ $$s -eq 5 ] || exit $$s; echo "(no tests in this tier)"; }

.PHONY: demo test test-fast lint venv venv-test clean

$(STAMP): pyproject.toml
	@command -v $(PY) >/dev/null 2>&1 || { echo "need $(PY) on PATH (or make PY=python3)"; exit 2; }
	@test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e .
	@touch $(STAMP)

$(TEST_STAMP): $(STAMP)
	$(BIN)/pip install -q -e '.[test]'
	DS_BUILD_OPS=0 DS_BUILD_SHM_COMM=1 $(BIN)/pip install -q --no-cache-dir --no-build-isolation deepspeed==0.19.8  # an sdist: built with this torch, its CPU shared-memory op compiled now (else every new venv JIT-compiles it in its first DeepSpeed run); no cached wheel, which may lack the op
	@touch $(TEST_STAMP)

venv: $(STAMP)

venv-test: $(TEST_STAMP)

demo: $(STAMP)
	$(BIN)/python -m scripts.demo --out $(OUT)

# The fast tier (tests/helpers/tiers.py): pure and property tests, no process, no server. Only
# its modules are collected (collecting the whole suite alone takes ~20 s of CPU).
test-fast: $(TEST_STAMP)
	$(PYTEST) -m fast $$($(BIN)/python -m tests.helpers.tiers) $(ALLOW_EMPTY)

# The whole suite, each test once: the fast tier first, then the rest in three test processes
# (pytest-xdist) on two cores: many tests wait on child processes, sleeps or servers; an idle
# process takes over half of the longest queue.
test: test-fast
	$(PYTEST) -n 3 --dist worksteal -m "not fast" tests $(ALLOW_EMPTY)

# Lint and types: ruff over the repository, pyright (basic mode; [tool.pyright] in pyproject.toml:
# the loader and task_encoders). tests/project/test_lint.py runs the same three in `make test`.
lint: $(TEST_STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/pyright --project pyproject.toml

clean:
	rm -rf out .pytest_cache
