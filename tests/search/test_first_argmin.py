"""The chunked minimisation's argmin found from the column minima (issue 22, thirteenth speed round):
``planner.search.elimination._first_argmin`` against numpy's ``argmin(axis=0)``, and ``_min_by_chunks``
against the broadcast sum minimised whole, written out here, on small random tables full of ties, infinities,
signed zeros and NaNs, with chunks of one row and of many."""

from __future__ import annotations

import numpy as np
import pytest

from planner.search import elimination
from planner.search.elimination import _first_argmin, _min_by_chunks


def _awkward(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    """Values from a few levels (many ties), some ``inf``, ``-0.0`` beside ``0.0``."""
    values = rng.choice(np.array([0.0, -0.0, 1.0, 2.5, 2.5, 7.0, np.inf]), size=shape)
    return values * rng.choice(np.array([1.0, 1.0, 3.0]), size=shape)


@pytest.fixture(autouse=True)
def _every_size_by_minima(monkeypatch: pytest.MonkeyPatch) -> None:
    """The tables here are small: take the path of the large ones (minima, then the first equal row) at every size."""
    monkeypatch.setattr(elimination, "_ARGMIN_DIRECT_CELLS", 0)


@pytest.mark.parametrize("seed", range(60))
def test_first_argmin_is_numpy_argmin(seed: int) -> None:
    rng = np.random.default_rng(seed)
    shape = (int(rng.integers(1, 9)), *(int(n) for n in rng.integers(1, 6, size=int(rng.integers(1, 3)))))
    acc = _awkward(rng, shape)
    if seed % 3 == 0:  # a NaN somewhere: argmin's first NaN
        acc[tuple(int(rng.integers(0, n)) for n in shape)] = np.nan
    np.testing.assert_array_equal(_first_argmin(acc), acc.argmin(axis=0))


def test_first_argmin_by_hand() -> None:
    acc = np.array([[3.0, 0.0, np.inf, 2.0], [1.0, -0.0, np.inf, 2.0], [1.0, -1.0, np.inf, np.nan]])
    # column 0: the first of the tied 1.0s; 1: -1.0; 2: every row inf, the first; 3: the NaN (argmin's rule)
    assert _first_argmin(acc).tolist() == [1, 2, 0, 2]


def _whole(aligned: list[np.ndarray], out_shape: tuple[int, ...], k_v: int) -> tuple[np.ndarray, np.ndarray]:
    """The broadcast sum in one array (starting from zeros, as the chunks did), its argmin and minimum."""
    total = np.zeros((k_v, *out_shape))
    for a in aligned:
        total = total + a
    arg = total.argmin(axis=0)
    return np.take_along_axis(total, arg[None], axis=0)[0], arg


@pytest.mark.parametrize("seed", range(40))
@pytest.mark.parametrize("chunk_cells", [1, 7, 1 << 22])
def test_min_by_chunks_equals_the_whole_sum(seed: int, chunk_cells: int, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(elimination, "_CHUNK_CELLS", chunk_cells)
    rng = np.random.default_rng(1000 + seed)
    k_v = int(rng.integers(1, 7))
    out_shape = tuple(int(n) for n in rng.integers(1, 6, size=int(rng.integers(1, 3))))
    aligned = []
    for _ in range(int(rng.integers(1, 4))):  # each factor spans v or not, and some of the dependent axes
        shape = (k_v if rng.random() < 0.8 else 1, *(n if rng.random() < 0.6 else 1 for n in out_shape))
        aligned.append(_awkward(rng, shape))
    best, arg = _min_by_chunks(aligned, out_shape, k_v)
    expected_best, expected_arg = _whole(aligned, out_shape, k_v)
    np.testing.assert_array_equal(arg, expected_arg)
    assert best.tobytes() == expected_best.tobytes()  # the same floats, signed zeros included


def test_min_by_chunks_signed_zero_by_hand() -> None:
    """One configuration of ``v`` whose only factor holds ``-0.0``: the sum started from zeros holds ``0.0``."""
    best, arg = _min_by_chunks([np.array([[-0.0, 2.0]])], (2,), 1)
    assert arg.tolist() == [0, 0]
    assert best.tobytes() == np.array([0.0, 2.0]).tobytes()
