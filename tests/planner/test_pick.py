"""The pick at the host floor (issue 25, task H2): rows within 0.01% of the fastest that fits are a
tie, picked by fewest devices, then fewest model-parallel ways, then least memory (``planner.pick``).

Oracles: hand-built frontiers whose expected pick is worked out below from the rule's statement, with
the step times and memories of real runs (the zoo's wav2vec2 at batch 4 on 8 devices, whose fastest row
was one device at 18.8 MiB and whose rows on 2 to 8 devices were 6.9e-8 to 7.7e-6 slower; the README's
GPT-2 job, whose three fastest rows at 16 devices differ by 2.2e-8 and 6.5e-8; Mixtral's ZeRO-3 and
ZeRO-2 rows of one layout, 3.2e-5 apart), and a boundary pair either side of the tolerance.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest

from planner.core.degrees import Degrees
from planner.pick import PICK_TIE, listed, pick_note, tie_key, tie_pick
from planner.search.pareto import TIME_TIE, pareto_mask

MIB = 2**20


@dataclass(frozen=True)
class FakeRow:
    """What the rule reads of a :class:`planner.launchable.Row`."""

    time_s: float
    memory_bytes: float
    degrees: Degrees
    fits: bool = True


def test_the_tolerance_is_a_hundredth_of_a_percent():
    assert PICK_TIE == 1e-4


def test_one_device_as_fast_as_eight_is_picked_and_said():
    """wav2vec2 (HuBERT's encoder) at batch 4 on 8 devices: five rows within 7.7e-6 of 7.96 ms. The
    fewest devices is row 0's one, so it stays the pick; rows 1-4 run on 2, 4, 8 and 8 devices."""
    rows = [
        FakeRow(7.960000e-3, 18.816 * MIB, Degrees()),
        FakeRow(7.960001e-3, 14.774 * MIB, Degrees(tp=2)),
        FakeRow(7.960001e-3, 12.753 * MIB, Degrees(tp=4)),
        FakeRow(7.960025e-3, 6.561 * MIB, Degrees(dp=2, tp=4)),
        FakeRow(7.960061e-3, 3.996 * MIB, Degrees(dp=4, tp=2)),
        FakeRow(8.364795e-3, 3.490 * MIB, Degrees(dp=4, pp=2)),  # 5.1% slower: no tie
    ]
    assert tie_pick(rows, 0) == 0
    note = pick_note(rows, 0, 0, devices=8)
    assert note is not None
    assert note.startswith("#1-#5 step within 0.01% of the fastest that fits (#1, 7.96 ms), a tie")
    assert note.endswith("#1 runs on 1 of the 8 devices, as fast as #2-#5 on more")


def test_the_readme_job_picks_the_leanest_of_its_tied_rows_and_says_nothing():
    """GPT-2, batch 32 on 16 devices (2026-12-02): dp=16, dp=8 x tp=2, dp=4 x tp=4 within 6.5e-8, all on
    the host floor. Their times are equal for dominance (``planner.search.pareto.TIME_TIE``, 1e-6), so
    the two holding more memory are no rows; dp=4 x tp=4 (1.47 GiB) is the fastest row and the pick,
    with no note (no tied row on more devices). Before the tie rule dp=16 (1.71 GiB) was picked, the
    fewest model-parallel ways among three rows."""
    gib = 2**30
    rows = [
        FakeRow(37.851408e-3, 1.715 * gib, Degrees(dp=16)),
        FakeRow(37.851409e-3, 1.557 * gib, Degrees(dp=8, tp=2)),
        FakeRow(37.851411e-3, 1.475 * gib, Degrees(dp=4, tp=4)),
        FakeRow(38.192174e-3, 1.446 * gib, Degrees(dp=4, tp=4)),  # 0.9% slower: a trade-off, no tie
    ]
    kept = pareto_mask(np.array([r.time_s for r in rows]), np.array([r.memory_bytes for r in rows]), time_tie=TIME_TIE)
    assert kept.tolist() == [False, False, True, True]
    frontier = [row for row, keep in zip(rows, kept) if keep]
    assert tie_pick(frontier, 0) == 0 and frontier[0].degrees == Degrees(dp=4, tp=4)
    assert pick_note(frontier, 0, 0, devices=16) is None


def test_one_layout_at_two_zero_stages_picks_the_leaner():
    """Mixtral on 8 devices: dp=4 x tp=2 x ep=4 at ZeRO-3 (1.213 MiB, 7.030000 ms) and ZeRO-2
    (1.051 MiB, 7.030222 ms, 3.2e-5 slower): same devices (8) and ways (tp x ep = 8): the leaner wins,
    and the note names the fastest and how to take it."""
    degrees = Degrees(dp=4, tp=2, ep=4)
    rows = [FakeRow(7.030000e-3, 1.213 * MIB, degrees), FakeRow(7.030222e-3, 1.051 * MIB, degrees),
            FakeRow(8.830222e-3, 1.014 * MIB, degrees)]
    assert tie_key(rows[0]) == (8, 8, 1.213 * MIB, 7.030000e-3)
    assert tie_pick(rows, 0) == 1
    note = pick_note(rows, 1, 0, devices=8)
    assert note is not None and note.startswith("#1, #2 step within 0.01% of the fastest that fits (#1, 7.03 ms)")
    # (7.030222 / 7.030000 - 1) = 3.158e-5
    assert "#2 (dp=4 x tp=2 x ep=4, 1.05 MiB/device) is slower than #1 (dp=4 x tp=2 x ep=4, 1.21 MiB/device) by 3.2e-05" in note
    assert note.endswith("--pick 1 for it")


@pytest.mark.parametrize("slower, expected", [(0.9e-4, 1), (1.1e-4, 0)])
def test_the_tie_ends_at_the_tolerance(slower, expected):
    """A row on fewer devices 0.9e-4 slower ties (picked); 1.1e-4 slower does not."""
    rows = [FakeRow(1.0, 8.0, Degrees(dp=8)), FakeRow(1.0 + slower, 16.0, Degrees(dp=4))]
    assert tie_pick(rows, 0) == expected


def test_rows_over_the_limit_are_never_picked():
    """Row 0 is faster but over the limit; the fastest that fits is row 1; row 2 ties with it (1e-6)
    on fewer devices and fits: it is the pick; row 3 ties too and has fewest devices but does not fit."""
    rows = [FakeRow(0.9, 99.0, Degrees(), fits=False), FakeRow(1.0, 10.0, Degrees(dp=8)),
            FakeRow(1.000001, 9.0, Degrees(dp=4)), FakeRow(1.000002, 8.0, Degrees(dp=2), fits=False)]
    assert tie_pick(rows, 1) == 2


def test_a_tight_pick_and_no_pick_are_left_alone():
    """No row fits: ``None`` stays; a tight pick (over the limit by the allocator's reserve) is the only candidate."""
    rows = [FakeRow(1.0, 10.0, Degrees(dp=8), fits=False), FakeRow(1.000001, 9.0, Degrees(dp=1), fits=False)]
    assert tie_pick(rows, None) is None
    assert tie_pick(rows, 0) == 0
    assert pick_note(rows, 0, 0, devices=8) is None


def test_the_collapse_keeps_the_pick_and_the_fastest():
    """Row 1 is within 1% of row 0 in time (0.5%) and memory (0.5%), so --collapse 0.01 merges it, unless kept."""
    rows = [FakeRow(1.0, 10.0, Degrees()), FakeRow(1.005, 9.95, Degrees()), FakeRow(1.2, 5.0, Degrees())]
    assert listed(rows, (None,), 0.01) == [0, 2]
    assert listed(rows, (0, 1), 0.01) == [0, 1, 2]
    assert listed(rows, (0,), 0.0) == [0, 1, 2]
