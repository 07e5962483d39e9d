# Two commands on a fresh machine: `make demo` and `make test`.
# Both create .venv and install what they need; torch is pinned through
# constraints.txt to the local CPU build (never resolved from the registry).
PY      ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed
PIP     := $(BIN)/pip install --quiet --constraint constraints.txt

.PHONY: demo test lint bench venv clean redis-server iproute2

venv: $(STAMP)

$(STAMP): pyproject.toml constraints.txt
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(PIP) --upgrade pip
	$(PIP) torch==2.13.0
	$(PIP) -e '.[dev,redis]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/headrace demo

# The Redis tests run against a real server (Debian's redis-server), installed when missing.
redis-server:
	command -v redis-server >/dev/null || { \
	  SUDO=$$(test "$$(id -u)" = 0 || echo sudo); \
	  $$SUDO apt-get update && $$SUDO apt-get install -y --no-install-recommends redis-server; }

# The near-storage tests shape a real link (network namespace, veth, tc): iproute2.
iproute2:
	command -v ip >/dev/null && command -v tc >/dev/null || { \
	  SUDO=$$(test "$$(id -u)" = 0 || echo sudo); \
	  $$SUDO apt-get update && $$SUDO apt-get install -y --no-install-recommends iproute2; }

test: $(STAMP) redis-server iproute2
	$(BIN)/python -m pytest -q --timeout=300 --durations=20 tests

lint: $(STAMP)
	$(BIN)/ruff check src tests
	$(BIN)/mypy src/headrace

bench: $(STAMP)
	$(BIN)/headrace bench --out bench-out

clean:
	rm -rf $(VENV) bench-out demo-out
