"""Every integration-marked test lives in tests/integration: ``make test-integration`` collects that folder
alone (the unit suite's ~8,000 tests and the packages' doctests cost each of its workers ~12 CPU s to
collect and deselect), so one marked anywhere else would silently never run."""

from __future__ import annotations

import pytest

from tests.schedule import longest_files_first, recorded_costs

INTEGRATION_FOLDER = "tests/integration/"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    stray = [item.nodeid for item in items
             if item.get_closest_marker("integration") is not None and not item.nodeid.startswith(INTEGRATION_FOLDER)]
    if stray:
        raise pytest.UsageError(f"{len(stray)} integration-marked test(s) outside {INTEGRATION_FOLDER}, which "
                                f"`make test-integration` alone collects: move them there (first: {stray[0]})")
    # longest files first: with `--no-loadscope-reorder` (the Makefile's) xdist hands files out in this order
    items[:] = longest_files_first(items, recorded_costs())
