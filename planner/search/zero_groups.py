"""Which ZeRO stages share one intra-op search of the pipeline search (:mod:`planner.search.pipeline`).

ZeRO 0 and 1 move the same bytes (an all-reduce; a reduce-scatter + all-gather) and hold different
memory, so one intra-op search serves both, unless an all-reduce across nodes runs as a tree and
beats the rings (``_Slot.zero_groups`` then splits them). ZeRO 2 and 3 move their gradient traffic
into every micro-batch, which changes the best split: each has its own.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["ZERO_GROUPS", "objective_zero_stage", "priced_zero_stages", "zero_groups"]

ZERO_GROUPS: tuple[tuple[int, ...], ...] = ((0, 1), (2,), (3,))
"""ZeRO stages that share one intra-op search where their time tables agree (module docstring)."""


def objective_zero_stage(group: tuple[int, ...]) -> int:
    """The ZeRO stage whose costs a group's intra-op search minimises (ZeRO-1's in the 0-1 group).

    >>> objective_zero_stage((0, 1)), objective_zero_stage((3,))
    (1, 3)
    """
    return 1 if 1 in group else group[0]


def priced_zero_stages(group: tuple[int, ...]) -> tuple[int, ...]:
    """The ZeRO stages of a group that are priced: ZeRO-0 only when ZeRO-1 is not searched with it
    (in a group, ZeRO-1 costs ZeRO-0's time with less memory).

    >>> priced_zero_stages((0, 1)), priced_zero_stages((0,))
    ((1,), (0,))
    """
    return tuple(z for z in group if not (z == 0 and 1 in group))


def zero_groups(zero_stages: Sequence[int], *, exact: bool) -> list[tuple[int, ...]]:
    """The groups of ``zero_stages`` searched (``exact``: :data:`ZERO_GROUPS`; else all in one).

    >>> zero_groups((0, 1, 3), exact=True), zero_groups((0, 1, 3), exact=False)
    ([(0, 1), (3,)], [(0, 1, 3)])
    """
    if not exact:
        return [tuple(sorted(set(zero_stages)))]
    groups = [tuple(z for z in group if z in zero_stages) for group in ZERO_GROUPS]
    return [g for g in groups if g]
