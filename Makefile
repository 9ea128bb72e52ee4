# nearmiss — set-up, demo and tests. Everything installs into .venv in the repo root.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: setup sandbox demo test test-fast bench lint docs clean

setup: $(STAMP) sandbox

# Candidate code runs only under bubblewrap: install it where missing (as root; elsewhere say how).
sandbox:
	@command -v bwrap >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ]; then \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq bubblewrap >/dev/null; \
	  else \
	    echo "nearmiss: bubblewrap is missing: 'sudo apt-get install bubblewrap' (checks refuse candidates without it)" >&2; \
	  fi; }

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev,tpu]'
	touch $(STAMP)

demo: setup
	$(BIN)/nearmiss demo

test: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports
	$(BIN)/mypy
	$(BIN)/pytest -n 2 --durations=40

# The engine's own tests: no Temporal, no PostgreSQL, no corpus sweep.
FAST_TESTS := tests/test_integrity_static.py tests/test_integrity_dynamic.py tests/test_inputs.py \
	tests/test_forgeries.py tests/test_loop.py tests/test_edits.py tests/test_spec.py \
	tests/test_forensics.py tests/test_heatmap.py tests/test_agent_conversation.py tests/test_cli.py \
	tests/test_replay.py tests/test_learning_gate.py tests/test_fixer_registry.py tests/test_events.py \
	tests/test_device_run.py tests/test_chip_arithmetic.py tests/test_trim.py tests/test_docs.py

test-fast: setup
	$(BIN)/ruff check .
	$(BIN)/pytest -n 2 -m "not end_to_end" $(FAST_TESTS)

# Capability counts the suite leaves out (it keeps one corpus variant per bug family and target,
# a planted case per class and kind of lead): the zero-token playbook over every corpus variant,
# repaired against expected, and over every planted set, each diagnosis against its pins.
bench: setup
	$(BIN)/python benchmarks/playbook_corpus.py
	$(BIN)/python benchmarks/held_out.py --sets all --fixers playbook

lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports
	$(BIN)/mypy

# The documentation site (docs/, mkdocs.yml) into site/; a broken link or anchor fails it.
docs: setup
	$(BIN)/mkdocs build --strict -d site

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .mypy_cache .import_linter_cache *.egg-info site
