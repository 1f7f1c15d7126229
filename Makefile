# CacheRoute developer commands. `make help` lists them.
# Everything installs itself into .venv on first use (Python >= 3.11, Java >= 17 and Maven needed;
# see README "Requirements").

PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
CR     := $(BIN)/cacheroute
STAMP  := $(VENV)/.installed

.DEFAULT_GOAL := help
.PHONY: help install demo test unit integration lint format broker-start broker-stop clean

help: ## Show this help
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk 'BEGIN {FS = ":.*## "}; {printf "  make %-14s %s\n", $$1, $$2}'

$(STAMP): pyproject.toml setup.py dispatcher/routing.py
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "CacheRoute needs Python >= 3.11 (set PYTHON=python3.11)")'
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# strict editable mode: a static link tree that mypy can follow (re-run after adding a module);
	# setup.py compiles dispatcher/routing.py with mypyc, so editing it reinstalls (a stale build warns)
	$(BIN)/pip install -q -e '.[all,dev]' --config-settings editable_mode=strict
	@touch $(STAMP)

install: $(STAMP) ## Create .venv and install CacheRoute with its dev tools

demo: $(STAMP) ## The main job: start a local Kafka broker and run the demo
	$(CR) demo

test: $(STAMP) ## All tests (unit + integration on a real broker, started and stopped here)
	@started=0; \
	if ! $(CR) kafka status >/dev/null 2>&1; then \
	  $(CR) kafka start || exit 1; started=1; \
	fi; \
	$(BIN)/pytest; rc=$$?; \
	if [ $$started = 1 ]; then $(CR) kafka stop; fi; \
	exit $$rc

unit: $(STAMP) ## Unit tests only (no broker needed, seconds)
	$(BIN)/pytest tests/unit

integration: $(STAMP) ## Integration tests only (needs `cacheroute kafka start`)
	$(BIN)/pytest -m kafka tests/integration

lint: $(STAMP) ## ruff check, ruff format --check, mypy --strict
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

format: $(STAMP) ## Apply ruff fixes and formatting
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

broker-start: $(STAMP) ## Start the local broker (same as `cacheroute kafka start`)
	$(CR) kafka start

broker-stop: $(STAMP) ## Stop the local broker
	$(CR) kafka stop

clean: ## Remove .venv and build artefacts (broker data under ~/.cache/cacheroute stays)
	rm -rf $(VENV) build *.egg-info .pytest_cache .mypy_cache .ruff_cache .hypothesis
