"""The breadth-first walk the structure readers run over an op graph (:mod:`importers.transformer`'s recognisers,
:mod:`importers.conv_mixer`): from some ops along a step function, each op classified as recorded, a barrier, or
passed through."""

from __future__ import annotations

from collections import deque
from typing import Callable, Iterable

__all__ = ["walk"]


def walk(
    starts: Iterable[int], step: Callable[[int], Iterable[int]], classify: Callable[[int], str | None]
) -> tuple[set[int], set[int]]:
    """Breadth-first walk: ``classify(op)`` returns ``"record"`` (collect, stop), ``"stop"`` or
    ``None`` (pass through). Returns ``(recorded, passed)``.

    >>> edges = {0: [1, 2], 1: [3], 2: [], 3: []}
    >>> walk([0], edges.__getitem__, {2: "record", 3: "stop"}.get)
    ({2}, {0, 1})
    """
    recorded: set[int] = set()
    passed: set[int] = set()
    seen: set[int] = set()
    queue = deque(starts)
    while queue:
        op = queue.popleft()
        if op in seen:
            continue
        seen.add(op)
        verdict = classify(op)
        if verdict == "record":
            recorded.add(op)
        elif verdict is None:
            passed.add(op)
            queue.extend(step(op))
    return recorded, passed
