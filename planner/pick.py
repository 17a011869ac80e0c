r"""Which frontier rows the table lists, and which one it picks (``*``).

The rows are the Pareto frontier of step time :math:`T` against memory per device :math:`M`, fastest
first. Two decisions are made on it here:

* **The collapse** (:func:`listed`, ``--collapse`` :math:`c`): a row is merged into a listed faster
  row :math:`k` when :math:`T_k \le (1 + c)\,T` and :math:`M_k \le (1 + c)\,M`; the fastest row that
  fits and the pick are always listed.
* **The pick** (:func:`tie_pick`): the fastest row that fits, :math:`T^* = \min\{T_r : r \text{ fits}\}`,
  is the exact optimum of the searched plans. Every row that fits with
  :math:`T_r \le (1 + \tau)\,T^*` (:data:`PICK_TIE` :math:`\tau = 10^{-4}`) is as fast: a tie. The
  pick is the tied row on the fewest devices, then with the fewest model-parallel ways
  (:math:`tp \cdot pp \cdot cp \cdot ep`), then with the least memory per device, then the fastest.

Why a tie and why that order: when fixed costs (the launchers' host work per layer and micro-batch)
floor every stage, the rows' times differ only by communication left over under that floor, 1e-8 to
3e-5 of the step on the zoo's small models at batch 4 on 8 devices, so "the fastest" was decided by
that residue: a plan on one device of eight, or a plan holding 4.7x the memory of one as fast. Such
residues are far below the cost model's accuracy (percent level, ``docs/VALIDATION.md``) and below
what the table prints (four digits). Among plans that fast, fewer devices leave the rest free for
other work at no cost in time; data parallelism's gradient reduction runs beside the backward, while
tensor, pipeline, context and expert parallelism put communication on every layer's path, so a tie
they join rests more on hidden communication; memory last, because below the limit it is slack.

The tie is taken among the frontier's rows: a plan as fast but dominated (slower by any amount and
larger) is not a row, so it is not a candidate; nor is one within :data:`planner.search.pareto.TIME_TIE`
(:math:`10^{-6}`) of a leaner row, whose times the frontier holds equal (``planner.launchable._pareto_rows``). :func:`pick_note` says when the tie decided
something a reader might not expect: the pick is not the fastest row, or it runs on fewer devices
than a tied row.

This is the roof (``planner.launchable`` calls it). Rows are :class:`planner.launchable.Row`, typed
``Any`` here (that module imports this one): each has ``time_s``, ``memory_bytes``, ``fits`` and
``degrees`` (:class:`planner.core.degrees.Degrees`).
"""

from __future__ import annotations

from typing import Any, Sequence

from planner.core.units import format_bytes, format_seconds
from planner.search.pipeline import widest_split

__all__ = ["PICK_TIE", "listed", "tie_pick", "tie_key", "pick_note", "row_devices", "row_label"]

PICK_TIE = 1e-4
"""Relative step-time tolerance within which rows that fit are as fast as the fastest (0.01%)."""


def row_devices(row: Any) -> int:
    """The devices a row's plan runs on: its degrees' product, or ``pp`` times the most devices one op's
    split takes where that is more (``ConfigSpace.devices_used``, the generic plan's ``mesh.devices_used``).
    The degrees are read off the ops of the most FLOPs, so a per-op layout that splits only the vocabulary
    (Mesh-TF's ``m:8 vocab:m``: the embedding and LM head 8 ways, the rest replicated) reads ``1 device``
    and runs on 8.

    >>> import numpy as np
    >>> from types import SimpleNamespace as Row
    >>> from planner.core.degrees import Degrees
    >>> head = Row(devices_used=np.array([1, 8]))  # an op's two configurations: whole, split 8 ways
    >>> row_devices(Row(degrees=Degrees(), point=Row(pp=1, graph=object(), spaces=[head], choice=[1])))
    8
    """
    devices = row.degrees.devices
    point = getattr(row, "point", None)
    if point is None or getattr(point, "graph", None) is None:
        return devices
    return max(devices, point.pp * widest_split(point))


def row_label(row: Any) -> str:
    """The row's degrees (``"dp=2"``), or its layout (else its degrees) and devices where an op splits wider than
    they say (``"m:8 vocab:m, 8 devices"``: :func:`row_devices`), as the pick's note and the row's summary name it.

    >>> import numpy as np
    >>> from types import SimpleNamespace as Row
    >>> from planner.core.degrees import Degrees
    >>> head = Row(devices_used=np.array([1, 8]))
    >>> row_label(Row(degrees=Degrees(), layout="m:8 vocab:m", point=Row(pp=1, graph=object(), spaces=[head], choice=[1])))
    'm:8 vocab:m, 8 devices'
    >>> row_label(Row(degrees=Degrees(dp=2), layout="b:2 batch:b", point=Row(pp=1, graph=object(), spaces=[head], choice=[0])))
    'dp=2'
    >>> row_label(Row(degrees=Degrees(dp=2), layout="", point=Row(pp=1, graph=object(), spaces=[head], choice=[1])))
    'dp=2, 8 devices'
    >>> row_label(Row(degrees=Degrees(), layout="", point=Row(pp=1, graph=object(), spaces=[head], choice=[1])))
    '8 devices'
    """
    devices = row_devices(row)
    if devices == row.degrees.devices:
        return row.degrees.label()
    # the layout where a launcher names one, else the degrees (unless they say nothing: "1 device")
    named = getattr(row, "layout", "") or (row.degrees.label() if row.degrees.devices > 1 else "")
    return f"{named}, {devices} devices" if named else f"{devices} devices"


def tie_key(row: Any) -> tuple[int, int, float, float]:
    """The order among tied rows, least first: devices (:func:`row_devices`), model-parallel ways
    (``tp * pp * cp * ep``), memory per device (bytes), step time (s).

    >>> from types import SimpleNamespace as Row
    >>> from planner.core.degrees import Degrees
    >>> tie_key(Row(degrees=Degrees(dp=4, tp=2, ep=4), memory_bytes=2.0, time_s=1.0))
    (8, 8, 2.0, 1.0)
    """
    d = row.degrees
    return (row_devices(row), d.tp * d.pp * d.cp * d.ep, row.memory_bytes, row.time_s)


def tie_pick(rows: Sequence[Any], fastest: int | None, tolerance: float = PICK_TIE) -> int | None:
    """The index of the pick among ``rows`` (fastest first): the least :func:`tie_key` among the rows
    that fit within ``tolerance`` (relative) of ``rows[fastest]``, the fastest that fits.

    ``fastest`` is returned unchanged when it is ``None`` (nothing fits) or does not fit (a tight
    pick, ``planner.launch_messages.tight_pick``: the only candidate).

    >>> from types import SimpleNamespace as Row
    >>> from planner.core.degrees import Degrees
    >>> rows = [Row(time_s=1.0, memory_bytes=9.0, fits=True, degrees=Degrees(dp=8)),
    ...         Row(time_s=1.00001, memory_bytes=5.0, fits=True, degrees=Degrees(dp=4)),
    ...         Row(time_s=1.1, memory_bytes=1.0, fits=True, degrees=Degrees(dp=2))]
    >>> tie_pick(rows, 0)
    1
    """
    if fastest is None or not rows[fastest].fits:
        return fastest
    bound = rows[fastest].time_s * (1 + tolerance)
    tied = [i for i, row in enumerate(rows) if row.fits and row.time_s <= bound]
    return min(tied, key=lambda i: (tie_key(rows[i]), i))


def listed(rows: Sequence[Any], keep: Sequence[int | None], tolerance: float) -> list[int]:
    """The indices of ``rows`` (fastest first) the table lists: without those within ``tolerance``
    of a listed faster row in both time and memory; the indices in ``keep`` always (``None`` ignored).

    >>> from types import SimpleNamespace as Row
    >>> rows = [Row(time_s=1.0, memory_bytes=10.0), Row(time_s=1.005, memory_bytes=9.95), Row(time_s=1.2, memory_bytes=5.0)]
    >>> listed(rows, [None], 0.01), listed(rows, [1], 0.01)
    ([0, 2], [0, 1, 2])
    """
    kept: list[int] = []
    for index, row in enumerate(rows):
        near = any(rows[k].time_s <= row.time_s * (1 + tolerance) and rows[k].memory_bytes <= row.memory_bytes * (1 + tolerance)
                   for k in kept)  # fmt: skip
        if index in keep or not near:
            kept.append(index)
    return kept


def _ranks(indices: Sequence[int]) -> str:
    """``"#1-#5"`` for consecutive indices, else ``"#1, #3"`` (ranks are 1-based)."""
    if len(indices) > 2 and list(indices) == list(range(indices[0], indices[-1] + 1)):
        return f"#{indices[0] + 1}-#{indices[-1] + 1}"
    return ", ".join(f"#{i + 1}" for i in indices)


def pick_note(rows: Sequence[Any], chosen: int | None, fastest: int | None, devices: int,
              tolerance: float = PICK_TIE) -> str | None:
    """The one line on a pick the tie decided (``None``: nothing to say): when the pick is not the
    fastest row that fits, or when it runs on fewer than ``devices`` (the cluster's) while a tied row
    runs on more. ``rows`` are the listed rows, ``chosen`` and ``fastest`` indices into them."""
    if chosen is None or fastest is None or not rows[fastest].fits:
        return None
    pick, best = rows[chosen], rows[fastest]
    bound = best.time_s * (1 + tolerance)
    tied = [i for i, row in enumerate(rows) if row.fits and row.time_s <= bound]
    more = [i for i in tied if row_devices(rows[i]) > row_devices(pick)]
    if chosen == fastest and not more:
        return None
    why = (f"{_ranks(tied)} step within {tolerance:.2%} of the fastest that fits (#{fastest + 1}, "
           f"{format_seconds(best.time_s)}), a tie: the pick is the tied row on the fewest devices, then the fewest "
           "tp x pp x cp x ep ways, then the least memory")
    if chosen != fastest:
        why += (f"; #{chosen + 1} ({row_label(pick)}, {format_bytes(pick.memory_bytes)}/device) is "
                f"slower than #{fastest + 1} ({row_label(best)}, {format_bytes(best.memory_bytes)}/device) by "
                f"{pick.time_s / best.time_s - 1:.1e} of its step: --pick {fastest + 1} for it")
    if more:
        why += (f"; #{chosen + 1} runs on {row_devices(pick)} of the {devices} devices, as fast as "
                f"{_ranks(more)} on more")
    return why
