"""The fixture generators (``make_*.py``) need torch (.venv-integration); the planner's own
environment has none, so ``--doctest-modules`` must not import them."""

collect_ignore_glob = ["make_*.py"]
