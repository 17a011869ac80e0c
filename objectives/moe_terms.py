r"""The terms a routed-experts layer pays beyond its experts' FLOPs, each from first principles.

Pure functions of the layer's shape (tokens, experts, top-k, width) and the parallel layout, used by
:func:`objectives.moe.price_moe`; each is hand-checkable (``tests/objectives/test_moe_terms.py``).

Load imbalance of top-k routing (:func:`rank_imbalance`)
    Under expert parallelism the step waits for the busiest expert-parallel rank. With :math:`T_r`
    tokens per rank and ``ep`` ranks, each holding :math:`g = E / ep` experts, a token's :math:`k`
    distinct choices put :math:`X` of them in a given rank's group; :math:`X` is hypergeometric
    (:math:`k` draws from :math:`E`, :math:`g` marked), variance
    :math:`k (g/E)(1 - g/E)(E - k)/(E - 1)`. Over the :math:`ep T_r` tokens of the group the load has
    mean :math:`\mu = T_r k` and variance :math:`\sigma^2 = ep\,T_r\,k (1/ep)(1 - 1/ep)(E-k)/(E-1)`,
    close to normal; the busiest of ``ep`` ranks expects :math:`\mu + \sigma e_{ep}` with :math:`e_n`
    the expected maximum of :math:`n` standard normals (:func:`expected_max_std_normal`; Tippett,
    Biometrika 17, 1925, tabulates 0.5642, 1.0294, 1.4236 for n = 2, 4, 8). This is routing that is
    balanced in expectation (what the auxiliary loss of Switch Transformers, Fedus et al. JMLR 2022
    eq. 4, drives towards): a trained router is at least this imbalanced; Megatron-Bridge's MoE
    benchmarks force-balance the routing (``--moe-router-force-load-balancing``), which removes it.

Capacity factor and dropped tokens (:func:`kept_fraction`)
    With capacity factor :math:`c` (Megatron ``--moe-expert-capacity-factor``; DeepSpeed
    ``capacity_factor``) an expert keeps at most :math:`C = c\,T_r k / E` of the tokens routed to it
    on a rank (Megatron computes the capacity from the rank's own tokens before dispatch). Its load
    is binomial, :math:`X \sim B(T_r, k/E)`; kept tokens are :math:`E[\min(X, C)] = \mu - \sigma
    L(z)` with :math:`z = (C - \mu)/\sigma` and the normal loss function
    :math:`L(z) = \varphi(z) - z (1 - \Phi(z))`. ``c = 1`` is dropless (the planner's convention:
    ``--capacity-factor 1.0``). Megatron without ``--moe-pad-expert-input-to-capacity`` computes
    only the kept tokens; DeepSpeed's einsum dispatch pads every expert to :math:`C` (``c T_r k``
    rows), which this term does not price.

Grouped-GEMM tiles (:func:`tile_efficiency`)
    Megatron's ``--moe-grouped-gemm`` runs each local expert's product as one problem of a grouped
    GEMM (CUTLASS ``DefaultGemmGrouped``, threadblock tile :data:`GROUPED_GEMM_TILE_M` rows); an
    expert with :math:`m` rows occupies :math:`\lceil m / 128 \rceil` row tiles, so the tensor cores
    do :math:`128 \lceil m/128 \rceil / m` times the useful work. At large per-expert token counts
    (Mixtral 8x7B at 4,096 tokens: 1,024 rows per expert) this is 1; at small ones (64 rows) 2.

Permutation and unpermutation (:func:`permute_bytes`)
    Megatron's alltoall token dispatcher (``megatron/core/transformer/moe/token_dispatcher.py``,
    ``moe_utils.permute``/``unpermute``; TE's fused ``moe_permute`` with ``--moe-permute-fusion``)
    gathers each token's :math:`k` copies into expert order before the experts (read and write of
    :math:`N h b` bytes, :math:`N = T_r k` kept rows) and scatters them back after; the backward of
    each is the other. With ``ep > 1`` and more than one local expert, the received chunks are sorted
    by local expert after the dispatch and back before the combine (``sort_chunks_by_idxs``): two
    more gathers each way, on the busiest rank's rows. The unpermute's weighted sum is in the ONNX
    graph already (the combine's Mul and ReduceSum, priced as graph ops), so only the permute and the
    chunk sorts are added here.
"""

from __future__ import annotations

import math

import numpy as np

__all__ = [
    "GROUPED_GEMM_TILE_M",
    "PERMUTE_KERNELS",
    "expected_max_std_normal",
    "rank_imbalance",
    "kept_fraction",
    "tile_efficiency",
    "permute_bytes",
]

GROUPED_GEMM_TILE_M = 128
"""Rows of one threadblock tile of the grouped GEMM Megatron's ``--moe-grouped-gemm`` runs: the
``grouped_gemm`` package (tgale96/grouped_gemm, ``csrc/grouped_gemm.cu``) instantiates CUTLASS's
``DefaultGemmGrouped`` with ``GemmShape<128, 128, 32>``; TE's grouped linear (cuBLAS per expert)
picks 128-row tiles for these shapes too."""

PERMUTE_KERNELS: dict[str, tuple[int, int]] = {"fused": (2, 1), "eager": (4, 2)}
"""Kernels of one token permutation, ``(forward, backward)``, per engine: ``fused`` = TE's
``moe_permute`` (a row-id map kernel and the permute kernel; its backward one unpermute kernel);
``eager`` = Megatron's unfused ``moe_utils.permute`` (``routing_map.T.contiguous()``,
``masked_select`` of the token indices, ``index_select`` of the rows, and the probability gather;
backward: ``index_add`` of the gradient rows and the zero fill of its output)."""


def expected_max_std_normal(n: int) -> float:
    r""":math:`E[\max(Z_1..Z_n)]` of ``n`` independent standard normals, by quadrature of
    :math:`\int z\, n \varphi(z) \Phi(z)^{n-1} dz`.

    Examples
    --------
    >>> [round(expected_max_std_normal(n), 4) for n in (1, 2, 4, 8)]
    [0.0, 0.5642, 1.0294, 1.4236]
    """
    if n <= 1:
        return 0.0
    z = np.linspace(-12.0, 12.0, 24001)
    phi = np.exp(-0.5 * z * z) / math.sqrt(2.0 * math.pi)
    cdf = 0.5 * (1.0 + np.vectorize(math.erf)(z / math.sqrt(2.0)))
    density = n * phi * cdf ** (n - 1)
    return float(np.sum(z * density) * (z[1] - z[0]))


def rank_imbalance(tokens_per_rank, *, top_k: int, experts: int, ep: int) -> np.ndarray:
    r"""Busiest expert-parallel rank's routed rows / the mean, :math:`1 + \sigma e_{ep} / \mu` (module
    docstring); 1 for ``ep = 1`` (one rank holds every expert: the work is :math:`T_r k` however it
    falls) or ``k = E``.

    Parameters
    ----------
    tokens_per_rank:
        :math:`T_r`, tokens one rank holds before the dispatch (scalar or array).

    Examples
    --------
    >>> float(rank_imbalance(128, top_k=2, experts=4, ep=4).round(5))  # sigma^2 = 4*128*2*(1/4)(3/4)(2/3) = 128
    1.04549
    """
    t = np.asarray(tokens_per_rank, dtype=float)
    if ep <= 1 or top_k >= experts:
        return np.ones_like(t)
    share = 1.0 / ep
    var_per_token = top_k * share * (1.0 - share) * (experts - top_k) / (experts - 1)
    mu = t * top_k
    sigma = np.sqrt(ep * t * var_per_token)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(mu > 0, 1.0 + sigma * expected_max_std_normal(ep) / np.where(mu > 0, mu, 1.0), 1.0)


def _normal_loss(z: np.ndarray) -> np.ndarray:
    """:math:`L(z) = \\varphi(z) - z (1 - \\Phi(z))`: expected excess of a standard normal over ``z``."""
    phi = np.exp(-0.5 * z * z) / math.sqrt(2.0 * math.pi)
    tail = 0.5 * np.vectorize(math.erfc)(z / math.sqrt(2.0))
    return phi - z * tail


def kept_fraction(tokens_per_rank, *, top_k: int, experts: int, capacity_factor: float) -> np.ndarray:
    r"""Share of the :math:`T_r k` routed rows an expert capacity of :math:`c\,T_r k / E` keeps
    (module docstring); 1 at ``capacity_factor == 1`` (dropless, the planner's convention).

    Examples
    --------
    >>> # T_r = 1024, k = 2, E = 8, c = 1.1: mu = 256, sigma = sqrt(192), z = 25.6 / 13.856 = 1.8475
    >>> float(kept_fraction(1024, top_k=2, experts=8, capacity_factor=1.1).round(4))
    0.9993
    """
    t = np.asarray(tokens_per_rank, dtype=float)
    if capacity_factor == 1.0 or top_k >= experts:
        return np.ones_like(t)
    p = top_k / experts
    mu = t * p
    sigma = np.sqrt(t * p * (1.0 - p))
    capacity = capacity_factor * mu
    with np.errstate(divide="ignore", invalid="ignore"):
        z = np.where(sigma > 0, (capacity - mu) / np.where(sigma > 0, sigma, 1.0), np.inf)
        kept = np.where(sigma > 0, mu - sigma * _normal_loss(np.where(np.isfinite(z), z, 40.0)), np.minimum(mu, capacity))
        return np.clip(np.where(mu > 0, kept / np.where(mu > 0, mu, 1.0), 1.0), 0.0, 1.0)


def tile_efficiency(rows_per_expert, tile: int = GROUPED_GEMM_TILE_M) -> np.ndarray:
    r"""Useful / computed rows of a grouped GEMM problem of ``rows_per_expert`` rows:
    :math:`m / (t \lceil m / t \rceil)`; 1 for an empty expert.

    Examples
    --------
    >>> tile_efficiency([1024, 64, 129, 0]).round(4).tolist()
    [1.0, 0.5, 0.5039, 1.0]
    """
    m = np.asarray(rows_per_expert, dtype=float)
    padded = tile * np.ceil(m / tile)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(padded > 0, m / np.where(padded > 0, padded, 1.0), 1.0)


def permute_bytes(rows, busiest_rows, *, hidden: int, element_bytes: int, ep: int,
                  local_experts: int) -> tuple[np.ndarray, np.ndarray]:
    r"""``(forward, backward)`` bytes one micro-batch's token permutations move on a rank (module
    docstring): the permute reads and writes :math:`N h b` (its backward, an unpermute of the
    gradient, the same), and with ``ep > 1`` and more than one local expert two chunk sorts of the
    busiest rank's :math:`N' h b` each way.

    Examples
    --------
    >>> # N = 2048 rows of width 64 in bf16, ep = 1: 2 x 2048 x 64 x 2 bytes each way
    >>> [float(x) for x in permute_bytes(2048, 2048, hidden=64, element_bytes=2, ep=1, local_experts=4)]
    [524288.0, 524288.0]
    """
    n = np.asarray(rows, dtype=float)
    busy = np.asarray(busiest_rows, dtype=float)
    one_way = 2.0 * n * hidden * element_bytes
    if ep > 1 and local_experts > 1:
        one_way = one_way + 2 * 2.0 * busy * hidden * element_bytes
    return one_way, one_way.copy()
