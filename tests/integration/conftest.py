"""The torchrun workers and the ONNX generator import torch at run time only; keep pytest's
``--doctest-modules`` from collecting them as modules of tests."""

collect_ignore = ["worker_run_plans.py", "worker_dtensor_tables.py", "worker_deepspeed_autotp_deberta.py"]
collect_ignore_glob = ["make_*.py"]
