# Two commands that work on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
OUT ?= out/demo

.PHONY: demo test setup clean

$(BIN)/fedfilter: pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e ".[dev]"
	touch $(BIN)/fedfilter

setup: $(BIN)/fedfilter

demo: setup
	$(BIN)/fedfilter demo --clients 10 --rounds 5 --out $(OUT)

test: setup
	$(BIN)/python -m pytest -q

clean:
	rm -rf $(VENV) out
