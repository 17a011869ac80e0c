"""make_zoo.py needs torch (.venv-integration); the planner's own environment has none, so
``--doctest-modules`` must not import it."""

collect_ignore = ["make_zoo.py", "zoo_counts.py"]
