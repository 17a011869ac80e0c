"""``planner profile``: every distinct per-device op shard of a model, measured into a profile database.

The roof over :mod:`objectives.profile` (the shard signatures, the runners, the database): the model
is imported once (:func:`planner.plan.load_graph`), each op's configurations are enumerated for every
device count asked for, and :func:`objectives.profile.profile_graph` measures the shards the
database lacks (resumable: a second run measures only what is missing).
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Mapping, Sequence

from objectives.profile import ProfileDB, ProfileReport, profile_graph
from planner.core.configs import ConfigOptions, enumerate_configs
from planner.plan import load_graph

__all__ = ["profile_file"]


def profile_file(
    path: str | Path,
    dims: Mapping[str, int],
    device_counts: Sequence[int],
    profile_db: str | Path,
    *,
    devices_per_node: int | None = None,
    provider: str = "cpu",
    repeats: int = 10,
    max_shards: int | None = None,
    progress: Callable[[str, float], None] | None = None,
) -> list[ProfileReport]:
    """Measure the op shards of ``path`` (bound with ``dims``) on each of ``device_counts`` devices
    (``devices_per_node``: default ``min(count, 8)``) with ``provider`` into ``profile_db``
    (created if missing), ``repeats`` timed runs per shard, at most ``max_shards`` new shards.

    Returns
    -------
    list of ProfileReport
        One per device count, in order.
    """
    report = progress or (lambda stage, fraction: None)
    graph = load_graph(path, dims)
    spaces = [
        [enumerate_configs(op, ConfigOptions(devices=count, devices_per_node=devices_per_node or min(count, 8)))
         for op in graph.ops]
        for count in device_counts
    ]  # fmt: skip
    reports = []
    with ProfileDB(profile_db) as db:
        for count, op_spaces in zip(device_counts, spaces):
            stage = f"profiling op shards ({count} devices)"
            report(stage, 0.0)
            reports.append(
                profile_graph(
                    graph, op_spaces, db, provider=provider, repeats=repeats, max_shards=max_shards,
                    progress=lambda done, total, s=stage: report(s, done / total if total else 0.0),
                )
            )  # fmt: skip
    return reports
