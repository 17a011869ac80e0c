# planner — set-up and the two jobs a fresh clone needs.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# Integration tests run the real launch libraries (torch CPU, megatron-core, deepspeed) in their own
# environment, so the planner's own environment stays free of them (planning never needs torch).
IVENV ?= .venv-integration
IBIN := $(IVENV)/bin
DEMO_MODEL ?= examples/gpt2.onnx
DEMO_ARGS ?= --devices 16 --mem-limit 16GB --dim batch=32 --dim seq=1024
# Where the environment sets PYTHONDONTWRITEBYTECODE (this machine's does), pytest cannot keep its rewritten
# test modules: each worker of each suite rewrites the asserts of all ~800 modules it collects again (the
# integration suite's collection: 27.7 CPU s a worker, 15.3 s once cached, as the unit suite leaves them).
unexport PYTHONDONTWRITEBYTECODE
# pip --no-compile: byte-compiling every installed module (18,000 files in the integration environment, 7,500 in
# the unit one) costs more than compiling, at first import, the few the tests import: the unit environment's
# install took 44.8 CPU s with it and 16.1 s without (load 8).

.PHONY: setup setup-integration demo test test-unit test-integration bench examples clean

$(BIN)/planner: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet --no-compile -e '.[test]'
	@touch $@

setup: $(BIN)/planner

$(IVENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(IVENV)
	$(IBIN)/pip install --quiet --upgrade pip
	# torch 2.13.0 first: a CPU build lies on this machine's disk (a newer one would be a CUDA download).
	$(IBIN)/pip install --quiet --no-compile torch==2.13.0
	$(IBIN)/pip install --quiet --no-compile -e '.[integration]'
	DS_BUILD_OPS=0 $(IBIN)/pip install --quiet --no-compile --no-build-isolation deepspeed==0.19.8
	# torchtitan 0.3.0 without its declared requirements: they add wandb and datasets<4.8, whose
	# huggingface_hub<2 and fsspec pins would downgrade what transformers uses; its config parser and
	# model modules import only what the second line installs (triton imports on a CPU machine).
	# torchao 0.18.0 (3.4 MB, no requirements): the float8 that torchtitan's Float8LinearConverter builds,
	# for the FP8 rows' check (tests/integration/test_torchtitan_fp8.py); its compiled CUDA kernels do not load on
	# this CPU torch (a printed warning), and its float8 Python code does not need them.
	$(IBIN)/pip install --quiet --no-compile --no-deps torchtitan==0.3.0 torchao==0.18.0 'datasets>=3.6,<4.8'
	$(IBIN)/pip install --quiet --no-compile tyro spmd_types==0.2.3 triton torchdata torch_checkpointing tensorboard \
		'dill>=0.3,<0.4.1' 'multiprocess<0.70.19' xxhash pyarrow pandas requests httpx
	@touch $@

setup-integration: $(IVENV)/.installed

## Set up and run the main job on the bundled GPT-2 example.
demo: setup
	$(BIN)/planner plan $(DEMO_MODEL) $(DEMO_ARGS)

## Set up and run every test: unit, doctests, slow, and the integration cross-checks.
# The two suites run side by side, the integration environment's install first on its side (its pip process,
# 102 CPU s, ran beside the unit suite already), so neither suite's last minutes leave a core idle: the
# integration suite's file-per-worker split ends unevenly (its two workers' CPU: 513 and 382 s, h25e), and the
# unit suite ends on one worker. A plan bound by a wall-clock --time-limit (the zoo's 1 s) takes no longer
# sharing a core, and less CPU.
# The integration side starts after `setup`, whose editable install writes planner.egg-info in the tree as its
# own does (the two never run at once); its output is held in a file and printed after the unit suite's,
# which stays live. Either suite failing fails the target, after both have run.
test: setup
	@log=$$(mktemp); $(MAKE) --no-print-directory test-integration >"$$log" 2>&1 & integration=$$!; \
	unit=0; $(MAKE) --no-print-directory test-unit || unit=$$?; \
	echo "== the integration side (make test-integration), held while the unit suite ran =="; \
	integrated=0; wait $$integration || integrated=$$?; cat "$$log"; rm -f "$$log"; \
	if [ $$integrated -ne 0 ]; then echo "make test-integration failed (exit $$integrated): its output is above" >&2; fi; \
	if [ $$unit -ne 0 ]; then echo "make test-unit failed (exit $$unit)" >&2; exit $$unit; fi; \
	exit $$integrated

# The unit tests are independent: pytest-xdist runs them on every core (8.7 min against 16.6 on two).
# --dist loadfile: a module is one unit of work, so its module-scoped plans, the import cache's graphs and the
# zoo's per-worker graph cache are built once, not on both workers when `load` cuts a file between them; units
# go out most tests first, then each to whichever worker is free. (`loadscope` made each class a unit of its own:
# in h27a's profiled run 73 modules ran on both workers, and test_cli_pipeline.py's module plan (9-11 CPU s),
# test_hostile_outputs.py's saved plan and test_megatron_mamba.py's hybrid imports were built on each; `loadgroup`
# would not do: xdist 3.8 writes the group into `item._nodeid`, which pytest 9's nodes no longer read.)
# --no-loadscope-reorder: files go out in the order tests/conftest.py gives them, longest recorded CPU first
# (tests/schedule.py, tests/file_costs.json), not most tests first, which sent a one-test file of ~23-80 s
# (test_zero0_floor.py) out last, alone on one worker while the other sat idle (h33e).
# --durations: each run lists its slowest tests, what to look at first when the suite grows slow.
test-unit: setup
	$(BIN)/python -m pytest -m "not integration" -n auto --dist loadfile --no-loadscope-reorder --durations=30

# The integration tests are independent too (torchrun jobs take free ports; in-process groups use file stores
# or the fake backend): a file per worker (--dist loadfile: a module's fixtures, such as the one-rank
# DeepSpeed group on its fixed port, run once), 376 s against 606 s on 8 files on two loaded cores; longest first,
# as the unit suite's.
# tests/integration alone: every integration-marked test lives there (tests/conftest.py refuses one elsewhere).
test-integration: setup-integration
	$(IBIN)/python -m pytest -m integration -n auto --dist loadfile --no-loadscope-reorder --durations=30 tests/integration

## Benchmarks (results are recorded in docs/PERFORMANCE.md).
bench: setup
	$(BIN)/python bench/import_time.py
	$(BIN)/python bench/search.py

## Regenerate examples/ (needs torch: see examples/README.md).
examples:
	$(PYTHON) -m venv .venv-examples
	.venv-examples/bin/pip install --quiet torch==2.13.0
	.venv-examples/bin/pip install --quiet transformers onnxscript onnx onnxruntime
	.venv-examples/bin/python examples/make_examples.py

clean:
	rm -rf $(VENV) $(IVENV) .pytest_cache build *.egg-info
