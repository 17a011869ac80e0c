"""make_param_cases.py and make_moe_cases.py need torch (.venv-integration); the planner's own
environment has none, so ``--doctest-modules`` must not import them."""

collect_ignore = ["make_param_cases.py", "make_moe_cases.py"]
