# Two commands: `make demo` and `make test`. Both create .venv when it is missing.
PY      ?= python3.11
VENV    := .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed
OUT     ?= out/demo

.PHONY: demo test venv clean

$(STAMP): pyproject.toml
	@command -v $(PY) >/dev/null 2>&1 || { echo "need $(PY) on PATH (or make PY=python3)"; exit 2; }
	@test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[test]'
	DS_BUILD_OPS=0 DS_BUILD_SHM_COMM=1 $(BIN)/pip install -q --no-cache-dir --no-build-isolation deepspeed==0.19.8  # an sdist: built with this torch, its CPU shared-memory op compiled now (else every new venv JIT-compiles it in its first DeepSpeed run); no cached wheel, which may lack the op
	@touch $(STAMP)

venv: $(STAMP)

demo: $(STAMP)
	$(BIN)/python scripts/demo.py --out $(OUT)

test: $(STAMP)
	$(BIN)/python -m pytest -n 3 --dist worksteal -q -ra tests  # three test processes (pytest-xdist) on two cores: many tests wait on child processes, sleeps or servers; an idle process takes over half of the longest queue

clean:
	rm -rf out .pytest_cache
