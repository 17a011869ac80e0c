r"""Alpha-beta cost of collectives over a two-level group of devices, vectorised with numpy.

A group has the shape ``(intra_size, inter_size)``: ``a = intra_size`` devices in each of
``e = inter_size`` nodes, ``n = a e`` devices in all. Devices of one node talk over the intra-node
link, devices of different nodes over the inter-node link (bandwidth :math:`\beta^{-1}` per device
and direction, latency :math:`\alpha` per message; :class:`planner.core.cluster.Link`).

Flat ring collectives over ``n`` devices on one link, ``B`` the buffer size in bytes (the full
buffer for all-reduce; the gathered result for all-gather; the input for reduce-scatter):

.. math::

    T_{AR}(B, n) = 2\frac{n-1}{n}\frac{B}{bw} + 2(n-1)\alpha \qquad
    T_{AG}(B, n) = T_{RS}(B, n) = \frac{n-1}{n}\frac{B}{bw} + (n-1)\alpha

A group inside one node (``e = 1``) uses the intra-node link. An all-reduce spanning nodes
(``e > 1``) is priced both ways and the cheaper is taken:

* hierarchical (:func:`_hierarchical_all_reduce`): reduce-scatter inside each node, all-reduce of
  the node's ``1/a`` share across nodes (``a`` of them run at once, one per NIC), all-gather inside
  the node: :math:`T_{RS}^{intra}(B, a) + T_{AR}^{inter}(B/a, e) + T_{AG}^{intra}(B, a)`;
* flat: one ring over all ``n`` devices, every step as slow as the inter-node link.

Across nodes an all-reduce step is the cheaper of a ring and NCCL's double binary tree
(:func:`tree_all_reduce_time_s`: the ring's bandwidth, :math:`2\lceil\log_2 n\rceil` latencies).
All-gather and reduce-scatter have no tree in NCCL (NVIDIA/nccl#1473; PAT, from 2.23, serves one
GPU per node only): one ring through all ``n`` devices, whose channels cross node boundaries
through the node's ``a`` NICs at once, so the bytes are the two-step gather's
(:math:`\frac{e-1}{e}\frac{B/a}{bw_{inter}} + \frac{a-1}{a}\frac{B}{bw_{intra}}`) but each of the
:math:`n-1` steps waits for an inter-node hop: :math:`(n-1)\alpha_{inter}`.

All-to-all (each device sends ``B/n`` to every other): bytes to devices of the same node go over
the intra link, the rest over the inter link, one message per peer, the two parts added.
Point-to-point: ``B / bw + messages * alpha`` on the level it crosses.

Collectives move data at the link's *collective* bandwidth (``Link.collective_efficiency`` times its
rate: NCCL's bus bandwidth, e.g. ~230 GB/s of A100 NVLink's 300 GB/s); point-to-point at the rate.
Groups of different devices run at the same time without contending (per-device links and NICs).
Every function broadcasts its array arguments, so cost tables for thousands of configurations are
one call.
"""

from __future__ import annotations

from typing import Literal

import numpy as np

from planner.core.cluster import Link

__all__ = [
    "Collective",
    "ring_all_reduce_time_s",
    "ring_all_gather_time_s",
    "tree_all_reduce_time_s",
    "all_reduce_time_s",
    "all_gather_time_s",
    "reduce_scatter_time_s",
    "all_to_all_time_s",
    "point_to_point_time_s",
    "collective_time_s",
]

Collective = Literal["all_reduce", "all_gather", "reduce_scatter", "all_to_all", "p2p"]

ArrayLike = np.ndarray | float | int


def _as_float(x: ArrayLike) -> np.ndarray:
    return np.asarray(x, dtype=np.float64)


def ring_all_reduce_time_s(num_bytes: ArrayLike, size: ArrayLike, link: Link) -> np.ndarray:
    r"""Flat ring all-reduce of ``num_bytes`` over ``size`` devices on one link.

    .. math:: 2\frac{n-1}{n}\frac{B}{bw} + 2(n-1)\alpha

    Zero when ``size`` is 1.

    Examples
    --------
    >>> link = Link(name="l", bandwidth_bytes_per_s=1e9, latency_s=1e-6)
    >>> float(ring_all_reduce_time_s(4e9, 4, link))  # 2*3/4*4 s + 6 us
    6.000006
    """
    n = _as_float(size)
    nbytes = _as_float(num_bytes)
    return 2.0 * (n - 1.0) / n * nbytes / link.collective_bandwidth_bytes_per_s + 2.0 * (n - 1.0) * link.latency_s


def ring_all_gather_time_s(num_bytes: ArrayLike, size: ArrayLike, link: Link) -> np.ndarray:
    r"""Flat ring all-gather (or reduce-scatter) of a ``num_bytes`` buffer over ``size`` devices.

    .. math:: \frac{n-1}{n}\frac{B}{bw} + (n-1)\alpha

    Examples
    --------
    >>> link = Link(name="l", bandwidth_bytes_per_s=1e9, latency_s=0.0)
    >>> float(ring_all_gather_time_s(4e9, 4, link))
    3.0
    """
    n = _as_float(size)
    nbytes = _as_float(num_bytes)
    return (n - 1.0) / n * nbytes / link.collective_bandwidth_bytes_per_s + (n - 1.0) * link.latency_s


def tree_all_reduce_time_s(num_bytes: ArrayLike, size: ArrayLike, link: Link) -> np.ndarray:
    r"""All-reduce over ``size`` devices as NCCL's double binary tree runs it across nodes.

    .. math:: 2\frac{n-1}{n}\frac{B}{bw} + 2\lceil\log_2 n\rceil\alpha

    The two trees together move what a ring moves (each carries half the data, up and down), but a
    message crosses only :math:`\log_2 n` hops: NCCL picks it for small buffers over many nodes, where
    the ring's :math:`2(n-1)` latencies dominate (Sanders, Speck, Träff, "Two-tree algorithms for full
    bandwidth broadcast, reduction and scan", Parallel Computing 35(12), 2009; NCCL 2.4 release notes).

    Examples
    --------
    >>> link = Link(name="l", bandwidth_bytes_per_s=1e9, latency_s=1e-5)
    >>> round(float(tree_all_reduce_time_s(0.0, 64, link)), 6)  # 2 x 6 hops x 10 us
    0.00012
    >>> round(float(ring_all_reduce_time_s(0.0, 64, link)), 6)  # 2 x 63 hops
    0.00126
    """
    n = _as_float(size)
    nbytes = _as_float(num_bytes)
    hops = np.ceil(np.log2(np.maximum(n, 1.0)))
    return 2.0 * (n - 1.0) / n * nbytes / link.collective_bandwidth_bytes_per_s + 2.0 * hops * link.latency_s


def _all_reduce_across_nodes(nbytes: np.ndarray, n: np.ndarray, link: Link) -> np.ndarray:
    return np.minimum(ring_all_reduce_time_s(nbytes, n, link), tree_all_reduce_time_s(nbytes, n, link))


def _hierarchical_all_reduce(nbytes: np.ndarray, a: np.ndarray, e: np.ndarray, intra: Link, inter: Link) -> np.ndarray:
    return (
        ring_all_gather_time_s(nbytes, a, intra)  # reduce-scatter in node (same cost)
        + _all_reduce_across_nodes(nbytes / a, e, inter)
        + ring_all_gather_time_s(nbytes, a, intra)
    )


def _ring_all_gather_across_nodes(
    nbytes: np.ndarray, a: np.ndarray, e: np.ndarray, intra: Link, inter: Link
) -> np.ndarray:
    # NCCL runs all-gather and reduce-scatter as one ring through all n = a e devices: it has no
    # tree for them (the tree is all-reduce's; PAT, from 2.23, serves one GPU per node only).
    # The ring's channels leave each node through different NICs, so the bytes cross nodes at the
    # node's aggregate rate, the slow link moving B/a per device as in a two-step gather; but every
    # one of the n - 1 steps waits for an inter-node hop: n - 1 inter-node latencies, which at a
    # thousand devices dominate ZeRO-3's per-module gathers.
    bandwidth = (e - 1.0) / e * (nbytes / a) / inter.collective_bandwidth_bytes_per_s + (
        a - 1.0
    ) / a * nbytes / intra.collective_bandwidth_bytes_per_s
    return bandwidth + (a * e - 1.0) * inter.latency_s


def all_reduce_time_s(
    num_bytes: ArrayLike,
    *,
    intra_size: ArrayLike,
    inter_size: ArrayLike,
    intra_link: Link,
    inter_link: Link,
) -> np.ndarray:
    """Ring all-reduce of a ``num_bytes`` buffer over a two-level group (seconds).

    Parameters
    ----------
    num_bytes:
        Buffer size per device (bytes).
    intra_size, inter_size:
        Group shape: devices per node in the group, and nodes spanned.
    intra_link, inter_link:
        The cluster's two link levels.

    Returns
    -------
    numpy.ndarray
        Seconds, broadcast shape of the inputs; 0 where the group has one device.

    Examples
    --------
    >>> fast = Link(name="nv", bandwidth_bytes_per_s=100e9, latency_s=0.0)
    >>> slow = Link(name="ib", bandwidth_bytes_per_s=10e9, latency_s=0.0)
    >>> t = all_reduce_time_s(8e9, intra_size=8, inter_size=2, intra_link=fast, inter_link=slow)
    >>> round(float(t), 6)  # hierarchical: 2 * 0.07 (in node) + 0.1 (1 GB across 2 nodes)
    0.24
    """
    nbytes, a, e = np.broadcast_arrays(_as_float(num_bytes), _as_float(intra_size), _as_float(inter_size))
    inside = ring_all_reduce_time_s(nbytes, a, intra_link)
    spanning = np.minimum(
        _hierarchical_all_reduce(nbytes, a, e, intra_link, inter_link),
        _all_reduce_across_nodes(nbytes, a * e, inter_link),
    )
    return np.where(e > 1.0, spanning, inside)


def all_gather_time_s(
    num_bytes: ArrayLike,
    *,
    intra_size: ArrayLike,
    inter_size: ArrayLike,
    intra_link: Link,
    inter_link: Link,
) -> np.ndarray:
    """Ring all-gather producing a ``num_bytes`` buffer on every device of the group (seconds).

    Examples
    --------
    >>> link = Link(name="l", bandwidth_bytes_per_s=1e9, latency_s=0.0)
    >>> float(all_gather_time_s(4e9, intra_size=4, inter_size=1, intra_link=link, inter_link=link))
    3.0
    """
    nbytes, a, e = np.broadcast_arrays(_as_float(num_bytes), _as_float(intra_size), _as_float(inter_size))
    inside = ring_all_gather_time_s(nbytes, a, intra_link)
    return np.where(e > 1.0, _ring_all_gather_across_nodes(nbytes, a, e, intra_link, inter_link), inside)


def reduce_scatter_time_s(
    num_bytes: ArrayLike,
    *,
    intra_size: ArrayLike,
    inter_size: ArrayLike,
    intra_link: Link,
    inter_link: Link,
) -> np.ndarray:
    """Ring reduce-scatter of a ``num_bytes`` input buffer (seconds); the mirror of all-gather.

    Examples
    --------
    >>> link = Link(name="l", bandwidth_bytes_per_s=1e9, latency_s=0.0)
    >>> float(reduce_scatter_time_s(2e9, intra_size=2, inter_size=1, intra_link=link, inter_link=link))
    1.0
    """
    return all_gather_time_s(
        num_bytes, intra_size=intra_size, inter_size=inter_size, intra_link=intra_link, inter_link=inter_link
    )


def all_to_all_time_s(
    num_bytes: ArrayLike,
    *,
    intra_size: ArrayLike,
    inter_size: ArrayLike,
    intra_link: Link,
    inter_link: Link,
) -> np.ndarray:
    r"""All-to-all of a ``num_bytes`` buffer per device (``B/n`` to each peer), seconds.

    .. math::

        \frac{(a-1) B/n}{bw_{intra}} + (a-1)\alpha_{intra}
        + \frac{(n-a) B/n}{bw_{inter}} + (n-a)\alpha_{inter}

    Examples
    --------
    >>> link = Link(name="l", bandwidth_bytes_per_s=1e9, latency_s=0.0)
    >>> float(all_to_all_time_s(4e9, intra_size=4, inter_size=1, intra_link=link, inter_link=link))
    3.0
    """
    nbytes, a, e = np.broadcast_arrays(_as_float(num_bytes), _as_float(intra_size), _as_float(inter_size))
    n = a * e
    chunk = nbytes / n
    intra_part = (a - 1.0) * (chunk / intra_link.collective_bandwidth_bytes_per_s + intra_link.latency_s)
    inter_part = (n - a) * (chunk / inter_link.collective_bandwidth_bytes_per_s + inter_link.latency_s)
    return intra_part + inter_part


def point_to_point_time_s(
    num_bytes: ArrayLike,
    *,
    crosses_node: ArrayLike,
    intra_link: Link,
    inter_link: Link,
    messages: ArrayLike = 1,
) -> np.ndarray:
    """Send ``num_bytes`` to neighbours in ``messages`` messages; 0 where nothing is sent.

    Examples
    --------
    >>> nv = Link(name="nv", bandwidth_bytes_per_s=1e9, latency_s=1e-6)
    >>> ib = Link(name="ib", bandwidth_bytes_per_s=1e8, latency_s=1e-5)
    >>> point_to_point_time_s([1e6, 1e6, 0.0], crosses_node=[False, True, True],
    ...                       intra_link=nv, inter_link=ib).round(6).tolist()
    [0.001001, 0.01001, 0.0]
    """
    nbytes, crosses, msgs = np.broadcast_arrays(
        _as_float(num_bytes), np.asarray(crosses_node, dtype=bool), _as_float(messages)
    )
    bandwidth = np.where(crosses, inter_link.bandwidth_bytes_per_s, intra_link.bandwidth_bytes_per_s)
    latency = np.where(crosses, inter_link.latency_s, intra_link.latency_s)
    return np.where(nbytes > 0.0, nbytes / bandwidth + msgs * latency, 0.0)


def collective_time_s(
    collective: Collective,
    num_bytes: ArrayLike,
    *,
    intra_size: ArrayLike,
    inter_size: ArrayLike,
    intra_link: Link,
    inter_link: Link,
) -> np.ndarray:
    """Dispatch on the collective's name; ``p2p`` crosses nodes where ``inter_size > 1``.

    Examples
    --------
    >>> link = Link(name="l", bandwidth_bytes_per_s=1e9, latency_s=0.0)
    >>> float(collective_time_s("all_reduce", 1e9, intra_size=2, inter_size=1,
    ...                         intra_link=link, inter_link=link))
    1.0
    """
    levels = dict(intra_size=intra_size, inter_size=inter_size, intra_link=intra_link, inter_link=inter_link)
    if collective == "all_reduce":
        return all_reduce_time_s(num_bytes, **levels)
    if collective == "all_gather":
        return all_gather_time_s(num_bytes, **levels)
    if collective == "reduce_scatter":
        return reduce_scatter_time_s(num_bytes, **levels)
    if collective == "all_to_all":
        return all_to_all_time_s(num_bytes, **levels)
    if collective == "p2p":
        crosses = np.asarray(inter_size) > 1
        return point_to_point_time_s(num_bytes, crosses_node=crosses, intra_link=intra_link, inter_link=inter_link)
    raise ValueError(f"unknown collective '{collective}'")
