"""The MoE terms of objectives.moe_terms against figures computed by hand or from tables."""

from __future__ import annotations

import math

import numpy as np
import pytest

from objectives.moe_terms import (
    GROUPED_GEMM_TILE_M,
    expected_max_std_normal,
    kept_fraction,
    permute_bytes,
    rank_imbalance,
    tile_efficiency,
)


def test_expected_max_of_normals_matches_the_tables():
    # Tippett (1925) / Harter (1961): E[max] of 2, 3, 4, 8, 16 standard normals; n = 2 is 1/sqrt(pi)
    for n, value in ((2, 1 / math.sqrt(math.pi)), (3, 0.8463), (4, 1.0294), (8, 1.4236), (16, 1.7660)):
        assert expected_max_std_normal(n) == pytest.approx(value, abs=1e-4)
    assert expected_max_std_normal(1) == 0.0


def test_rank_imbalance_of_mixtral_at_ep_8():
    """Mixtral 8x7B at 4,096 tokens per rank, ep = 8 (one expert per rank, k = 2 of E = 8).

    mu = 4096 x 2 = 8192 rows; a token puts X of its 2 choices on one rank's expert, X ~
    hypergeometric(2 of 8, 1 marked): var = 2 x 1/8 x 7/8 x 6/7 = 0.1875; over 8 x 4096 tokens
    sigma^2 = 6144, sigma = 78.38; the busiest of 8 ranks: 1.4236 sigma above: 1 + 111.59 / 8192.
    """
    assert float(rank_imbalance(4096, top_k=2, experts=8, ep=8)) == pytest.approx(1 + 1.4236 * math.sqrt(6144) / 8192, rel=1e-5)
    assert float(rank_imbalance(4096, top_k=2, experts=8, ep=8)) == pytest.approx(1.01362, abs=1e-5)
    # one rank holds every expert: its work is T k however the tokens fall; k = E routes everywhere
    assert float(rank_imbalance(4096, top_k=2, experts=8, ep=1)) == 1.0
    assert float(rank_imbalance(64, top_k=4, experts=4, ep=4)) == 1.0
    # fewer tokens, more imbalance (sigma / mu falls as 1 / sqrt(T)): at 64 tokens sigma^2 = 96
    assert float(rank_imbalance(64, top_k=2, experts=8, ep=8)) == pytest.approx(1 + 1.4236 * math.sqrt(96) / 128, rel=1e-5)


def test_kept_fraction_under_a_capacity_factor():
    # dropless
    assert float(kept_fraction(4096, top_k=2, experts=8, capacity_factor=1.0)) == 1.0
    # T = 64, k = 2, E = 8: load ~ B(64, 1/4), mu = 16, sigma = sqrt(12) = 3.4641; c = 1.25: C = 20,
    # z = 4 / 3.4641 = 1.1547; phi(z) = 0.20481, 1 - Phi(z) = 0.12410; L = 0.20481 - 1.1547 x 0.12410
    # = 0.06151; kept = 1 - 3.4641 x 0.06151 / 16 = 0.98668
    z = 4 / math.sqrt(12)
    phi = math.exp(-z * z / 2) / math.sqrt(2 * math.pi)
    tail = 0.5 * math.erfc(z / math.sqrt(2))
    by_hand = 1 - math.sqrt(12) * (phi - z * tail) / 16
    assert by_hand == pytest.approx(0.98668, abs=1e-5)
    assert float(kept_fraction(64, top_k=2, experts=8, capacity_factor=1.25)) == pytest.approx(by_hand, rel=1e-9)
    # a capacity below the mean keeps about c of the tokens (c = 0.5: most experts are full)
    assert float(kept_fraction(4096, top_k=2, experts=8, capacity_factor=0.5)) == pytest.approx(0.5, abs=1e-3)


def test_tile_efficiency_counts_padded_rows():
    assert GROUPED_GEMM_TILE_M == 128
    # 1,024 rows per expert fill 8 tiles; 64 fill half of one; 200 take 2 tiles (256 rows)
    assert tile_efficiency(np.array([1024.0, 64.0, 200.0])).tolist() == pytest.approx([1.0, 0.5, 200 / 256])


def test_permute_bytes_by_hand():
    # N = 8192 rows of width 4096 in bf16, ep = 1: the permute reads and writes N h b = 64 MiB each way
    forward, backward = permute_bytes(8192, 8192, hidden=4096, element_bytes=2, ep=1, local_experts=8)
    assert float(forward) == float(backward) == 2 * 8192 * 4096 * 2
    # ep = 4 with 2 local experts: the chunk sorts after the dispatch and before the combine add
    # 2 x 2 x N' h b on the busiest rank's N' = 8300 rows
    forward, _ = permute_bytes(8192, 8300, hidden=4096, element_bytes=2, ep=4, local_experts=2)
    assert float(forward) == 2 * 8192 * 4096 * 2 + 4 * 8300 * 4096 * 2
    # one local expert: nothing to sort
    forward, _ = permute_bytes(8192, 8300, hidden=4096, element_bytes=2, ep=8, local_experts=1)
    assert float(forward) == 2 * 8192 * 4096 * 2
