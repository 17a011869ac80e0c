"""Keep pytest (``--doctest-modules``) from importing the generator, which needs torch.

torch lives only in ``.venv-examples``; the project's venv, which runs the tests, has none.
"""

collect_ignore = ["make_examples.py"]
