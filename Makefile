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
	@touch $(STAMP)

venv: $(STAMP)

demo: $(STAMP)
	$(BIN)/python scripts/demo.py --out $(OUT)

test: $(STAMP)
	$(BIN)/python -m pytest -q -ra tests

clean:
	rm -rf out .pytest_cache
