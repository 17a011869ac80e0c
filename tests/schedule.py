"""The order test files go out to pytest-xdist's workers: longest first (LPT), so the last minutes of a suite run
many short files on both workers instead of one long file on one.

``make test-unit`` / ``make test-integration`` run ``--dist loadfile --no-loadscope-reorder``: xdist then hands out
files in collection order (without the flag it sorts them by test count, which sent ``test_zero0_floor.py``, one
test of ~23-80 s, out last, alone on one worker). :func:`longest_files_first` reorders the collection by each file's
recorded CPU seconds (``tests/file_costs.json``); a file not recorded is estimated at :data:`MEAN_TEST_CPU_S` a test.
A file's tests keep their order and stay together, so module fixtures are built once as before. Order only: no test
is added, dropped or changed.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Protocol

FILE_COSTS = Path(__file__).with_name("file_costs.json")

MEAN_TEST_CPU_S = 0.12
"""CPU seconds a test of a file not in :data:`FILE_COSTS`: the unit suite's mean at 254fae9 (1,093.5 CPU s over
9,285 tests; the median test is far cheaper, but new files are mostly plans)."""


class _Item(Protocol):
    nodeid: str


def file_of(nodeid: str) -> str:
    """The file part of a pytest node id (``tests/a.py::Class::test[x]`` -> ``tests/a.py``): xdist's loadfile unit."""
    return nodeid.split("::", 1)[0]


def recorded_costs(path: Path = FILE_COSTS) -> dict[str, float]:
    """File -> CPU seconds, from ``tests/file_costs.json`` (empty when the file is missing or unreadable)."""
    try:
        return {str(name): float(seconds) for name, seconds in json.loads(path.read_text())["cpu_s"].items()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return {}


def longest_files_first(items: list[_Item], costs: dict[str, float]) -> list[_Item]:
    """``items`` ordered by their file's cost in CPU seconds, largest first (recorded, else
    :data:`MEAN_TEST_CPU_S` per collected test); files of equal cost keep collection order, and each file's items
    keep theirs.

    >>> class I:
    ...     def __init__(self, nodeid): self.nodeid = nodeid
    >>> items = [I("a.py::t1"), I("a.py::t2"), I("b.py::t"), I("c.py::t")]
    >>> [i.nodeid for i in longest_files_first(items, {"b.py": 5.0, "c.py": 0.1})]
    ['b.py::t', 'a.py::t1', 'a.py::t2', 'c.py::t']
    """
    counts = Counter(file_of(item.nodeid) for item in items)
    first_seen: dict[str, int] = {}
    for index, item in enumerate(items):
        first_seen.setdefault(file_of(item.nodeid), index)

    def cost_s(name: str) -> float:
        return costs.get(name, counts[name] * MEAN_TEST_CPU_S)

    return sorted(items, key=lambda item: (-cost_s(file_of(item.nodeid)), first_seen[file_of(item.nodeid)]))
