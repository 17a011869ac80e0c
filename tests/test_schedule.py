"""The order the test suites' files go out to xdist's workers (tests/schedule.py): longest recorded first, each file's
tests together and in their order, and the Makefile's suites run with xdist's own reordering off (without
``--no-loadscope-reorder`` xdist sorts files by test count and the order below is ignored)."""

from __future__ import annotations

import itertools
import json
import re
from pathlib import Path

from tests.schedule import FILE_COSTS, file_of, longest_files_first, recorded_costs

ROOT = Path(__file__).resolve().parents[1]


class Item:
    def __init__(self, nodeid: str) -> None:
        self.nodeid = nodeid


def test_longest_first_and_each_files_tests_together_in_order():
    items = [Item(n) for n in ("tests/a.py::t1", "tests/a.py::C::t2[x]", "tests/b.py::t", "pkg/m.py::pkg.m.f",
                               "tests/c.py::t1", "tests/c.py::t2", "tests/c.py::t3")]
    # a.py 2 tests, not recorded: 2 x 0.12 = 0.24 s; b.py recorded 30 s; m.py recorded 0.2 s; c.py 3 x 0.12 = 0.36 s
    ordered = [i.nodeid for i in longest_files_first(items, {"tests/b.py": 30.0, "pkg/m.py": 0.2})]
    assert ordered == ["tests/b.py::t", "tests/c.py::t1", "tests/c.py::t2", "tests/c.py::t3",
                       "tests/a.py::t1", "tests/a.py::C::t2[x]", "pkg/m.py::pkg.m.f"]


def test_equal_costs_keep_collection_order():
    items = [Item(f"tests/f{k}.py::t") for k in range(5)]
    assert longest_files_first(items, {}) == items


def test_a_missing_or_broken_table_is_no_error(tmp_path):
    assert recorded_costs(tmp_path / "none.json") == {}
    broken = tmp_path / "broken.json"
    broken.write_text("{not json")
    assert recorded_costs(broken) == {}


def test_the_recorded_table_reads_as_seconds_per_file():
    costs = recorded_costs(FILE_COSTS)
    raw = json.loads(FILE_COSTS.read_text())["cpu_s"]
    assert costs and len(costs) == len(raw)
    assert all(name.endswith(".py") and file_of(name) == name and seconds >= 1.0 for name, seconds in costs.items())


def test_the_makefiles_suites_keep_the_order():
    """Both suites run ``--dist loadfile --no-loadscope-reorder``: xdist's own reordering (most tests first) would
    override the collection order."""
    makefile = (ROOT / "Makefile").read_text()
    runs = [line for line in makefile.splitlines() if re.search(r"-m pytest .*--dist loadfile", line)]
    assert len(runs) == 2
    assert all("--no-loadscope-reorder" in line for line in runs)


def test_xdist_is_new_enough_for_the_flag():
    """``--no-loadscope-reorder`` came with pytest-xdist 3.8.0: the test extras ask for it."""
    text = (ROOT / "pyproject.toml").read_text()
    pins = re.findall(r'"pytest-xdist>=([0-9.]+)"', text)
    assert len(pins) == 2
    assert all(tuple(map(int, pin.split("."))) >= (3, 8) for pin in pins)


def test_the_collected_suite_is_a_permutation_grouped_by_file():
    """The order is a permutation of what pytest collected, with every file's tests contiguous (one xdist unit)."""
    names = [f"tests/x{k % 3}.py::t{k}" for k in range(9)]
    items = sorted((Item(n) for n in names), key=lambda i: file_of(i.nodeid))
    ordered = longest_files_first(items, {"tests/x2.py": 9.0, "tests/x0.py": 3.0})
    assert sorted(i.nodeid for i in ordered) == sorted(names)
    files = [name for name, _ in itertools.groupby(file_of(i.nodeid) for i in ordered)]
    assert files == ["tests/x2.py", "tests/x0.py", "tests/x1.py"]
