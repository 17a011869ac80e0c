"""A pipeline point's devices: the widest op split and the tie groups of the launchable table's time tie.

Moved out of :mod:`planner.search.pipeline` unchanged but for :func:`widest_split`'s memo (issue 22, nineteenth round
of the search-speed bars), which keeps that module under the size bar; it imports them from here (and its callers,
``planner.launchable`` and ``planner.estimate``, from it).
"""

from __future__ import annotations

from typing import Any

__all__ = ["tie_group", "widest_split"]

PipelinePoint = Any
"""``planner.search.pipeline.PipelinePoint`` (``pp``, ``dp``, ``tp``, ``spaces``, ``choice``)."""

def tie_group(point: PipelinePoint) -> tuple[int, int]:
    """A point's devices and model-parallel ways (devices over its data-parallel degree): the groups within
    which :data:`planner.search.pareto.TIME_TIE` holds step times equal (``planner.search.pareto``). Its
    devices are those its ops use (``pp`` times the widest op's split, or ``pp x dp x tp``), as
    :func:`planner.pick.row_devices` counts them, not the stage's share of the cluster.

    >>> import numpy as np
    >>> from types import SimpleNamespace as Point
    >>> head = Point(devices_used=np.array([1, 8]))  # an op's two configurations: whole, split 8 ways
    >>> tie_group(Point(pp=2, dp=4, tp=2, spaces=(head,), choice=(1,)))
    (16, 4)
    >>> tie_group(Point(pp=1, dp=1, tp=1, spaces=(head,), choice=(0,)))  # one device of a larger stage
    (1, 1)
    """
    devices = point.pp * max(point.dp * point.tp, widest_split(point))
    return devices, devices // max(point.dp, 1)


def widest_split(point: PipelinePoint) -> int:
    """The most devices one op of ``point`` splits over (its configuration's ``devices_used``; 1 without spaces).

    >>> import numpy as np
    >>> from types import SimpleNamespace as Point
    >>> widest_split(Point(spaces=(Point(devices_used=np.array([1, 8])),), choice=(1,)))
    8
    """
    # each distinct space's ``devices_used`` once (the layers share their spaces): an ``np.prod`` over every row
    # of each of a 175B plan's ~1,000 ops per point was 2.8 of its 135 profiled s (issue 22, nineteenth round)
    picks_of: dict[int, tuple[Any, list[int]]] = {}
    for space, pick in zip(point.spaces, point.choice):
        found = picks_of.get(id(space))
        if found is None:
            found = picks_of[id(space)] = (space, [])
        found[1].append(int(pick))
    return max((int(space.devices_used[picks].max()) for space, picks in picks_of.values()), default=1)
