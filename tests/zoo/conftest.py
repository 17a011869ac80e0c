"""make_zoo.py needs torch (.venv-integration); the planner's own environment has none, so
``--doctest-modules`` must not import it."""

from pathlib import Path

collect_ignore = ["make_zoo.py", "zoo_counts.py"]


def pytest_collection_modifyitems(items) -> None:
    """Run each zoo file's checks one after another (the checks' own order kept within a file): its import
    checks import it (``test_zoo._graph``) and its two plans then find that graph in ``import_model``'s cache
    (``importers.CACHED_GRAPHS``, the last 8), where in the checks' order, 150 files apart, each plan imported the
    file again. Only the zoo module's items move, among the places they hold; every other item keeps its place."""
    module = Path(__file__).resolve().parent / "test_zoo.py"
    places = [index for index, item in enumerate(items) if Path(item.path).resolve() == module]
    zoo = [items[index] for index in places]
    zoo.sort(key=lambda item: str(getattr(getattr(item, "callspec", None), "params", {}).get("name", "")))
    for index, item in zip(places, zoo):
        items[index] = item
