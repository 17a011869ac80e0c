"""make_param_cases.py needs torch (.venv-integration); the planner's own environment has none, so
``--doctest-modules`` must not import it."""

collect_ignore = ["make_param_cases.py"]
