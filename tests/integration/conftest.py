"""The torchrun workers and the ONNX generator import torch at run time only; keep pytest's
``--doctest-modules`` from collecting them as modules of tests."""

collect_ignore = ["worker_run_plans.py", "make_llama_tiny.py", "make_megatron_fixtures.py"]
