PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
TEST_STAMP := $(VENV)/.installed-test

.PHONY: run test lint bench clean

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/pip install -q -e .
	touch $@

$(TEST_STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/pip install -q -e '.[test]'
	touch $@ $(STAMP)

run: $(STAMP)
	$(BIN)/coderouterd

test: $(TEST_STAMP)
	$(BIN)/python -m pytest

lint: $(TEST_STAMP)
	$(BIN)/ruff check .

bench: $(TEST_STAMP)
	$(BIN)/python bench/proxy.py

clean:
	rm -rf $(VENV)
