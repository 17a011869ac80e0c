# planner — set-up and the two jobs a fresh clone needs.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
DEMO_MODEL ?= examples/gpt2.onnx
DEMO_ARGS ?= --devices 16 --mem-limit 16GB --dim batch=32 --dim seq=1024

.PHONY: setup demo test test-fast bench examples clean

$(BIN)/planner: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[test]'
	@touch $@

setup: $(BIN)/planner

## Set up and run the main job on the bundled GPT-2 example.
demo: setup
	$(BIN)/planner plan $(DEMO_MODEL) $(DEMO_ARGS)

## Set up and run every test (unit, doctest, integration, slow).
test: setup
	$(BIN)/python -m pytest

## Skip the slow tests.
test-fast: setup
	$(BIN)/python -m pytest -m "not slow"

## Search benchmarks (results go to docs/PERFORMANCE.md by hand).
bench: setup
	$(BIN)/python bench/import_time.py

## Regenerate examples/ (needs torch: see examples/README.md).
examples:
	$(PYTHON) -m venv .venv-examples
	.venv-examples/bin/pip install --quiet torch==2.13.0
	.venv-examples/bin/pip install --quiet transformers onnxscript onnx onnxruntime
	.venv-examples/bin/python examples/make_examples.py

clean:
	rm -rf $(VENV) .pytest_cache build *.egg-info
