r"""NCCL's own device buffers: memory a rank holds outside PyTorch's caching allocator.

Each NCCL communicator a rank joins allocates, per channel and per peer connection, a staging buffer
for each of its three protocols with ``cudaMalloc`` (or cuMem) directly, not through PyTorch's
allocator. They count in the GPU's memory (``nvidia-smi``) but never in
``torch.cuda.max_memory_allocated`` nor ``max_memory_reserved`` (nor torchtitan's memory monitor,
which reads ``torch.cuda.memory_stats()["reserved_bytes.all.peak"]``,
``torchtitan/components/metrics.py``). So it is a term of its own in a plan's memory
(``MemoryBreakdown.nccl_bytes``, :func:`layout_buffer_bytes` below): in the whole a device must hold and the
fit check, never in the allocator's figures (:mod:`objectives.memory`) that ``bench/fidelity.py`` holds
against measured peaks.

Per connection (NCCL 2.x ``src/init.cc``, ``computeBuffSizes``; ``NCCL_BUFFSIZE`` and friends
override them, NCCL docs "Environment Variables"):

=========  ===============================================================  ==============
protocol   default                                                          bytes
=========  ===============================================================  ==============
Simple     ``DEFAULT_BUFFSIZE (1 << 22)``, the documented ``NCCL_BUFFSIZE``  4,194,304
LL         ``NCCL_LL_LINES_PER_THREAD (8) x NCCL_LL_MAX_NTHREADS (512) x``   524,288
           ``NCCL_STEPS (8) x sizeof(ncclLLFifoLine) (16)``
LL128      ``NCCL_LL128_ELEMS_PER_THREAD (120) x NCCL_LL128_MAX_NTHREADS``   4,915,200
           ``(640) x NCCL_STEPS (8) x sizeof(uint64_t)``
=========  ===============================================================  ==============

The receiving side of each ring connection allocates all three (``src/transport/p2p.cc``,
``p2pRecvSetup``: ``recvSize += comm->buffSizes[p]`` for every protocol, the Simple one on the sender
instead under P2P read), so a rank holds one set per ring channel of each communicator; the channels
are at most ``MAXCHANNELS`` (32, ``src/include/device.h``), which this term takes: NCCL sizes its
channel count to the topology (``ncclTopoCompute``), so this is an upper bound of the ring buffers.
Left out: tree connections (up to three children and a parent per channel on multi-node trees),
NVLS / CollNet buffers, the proxy's host-pinned memory, the CUDA context itself (outside both).

**What a plan's rank holds** (:func:`layout_buffer_bytes`, since 2026-12-02, h28d: a term of every plan's
memory, ``MemoryBreakdown.nccl_bytes``). NCCL connects lazily: from 2.22 ``NCCL_RUNTIME_CONNECT`` (default 1,
``src/init.cc``) connects a collective algorithm's peers at its first call instead of at
``ncclCommInitRank``, and point-to-point peers were always connected at the first ``ncclSend`` /
``ncclRecv`` to them (``src/enqueue.cc``/``src/group.cc``: ``connectSend`` / ``connectRecv`` masks set per
peer, connected in ``ncclTransportP2pSetup`` at the group's end). So a rank holds buffers only for the
communicators its training step calls and, for send/receive, only for the peers it exchanges with:

* each collective group of two or more ranks (tensor parallelism, context parallelism, the gradient
  group ``dp x cp``, and under expert parallelism the expert-gradient group ``dp x cp / ep``): one ring
  connection per channel (above);
* pipeline parallelism sends and receives, no collective: a rank's point-to-point peers are its previous
  and next stage (one peer when ``pp = 2``, and for the first and last stage of a non-interleaved
  schedule; two under an interleaved schedule, whose last stage sends its chunk to the first);
* expert parallelism's all-to-all (``ncclSend`` / ``ncclRecv`` to every rank of the group in one group
  call): ``ep - 1`` peers.

A point-to-point peer inside a node goes through the same ``p2pRecvSetup`` (the three protocols' buffers
on each of ``p2pnChannelsPerPeer`` channels, ``src/graph/paths.cc`` ``ncclTopoComputeP2pChannels``:
``pow2Up`` of at most ``p2pnChannels``, itself at most ``MAXCHANNELS``), so it is priced as a ring
connection on :data:`NCCL_MAX_CHANNELS` channels; across nodes NCCL's network transport holds less (shared
Simple buffers of ``NCCL_P2P_NET_CHUNKSIZE`` x ``NCCL_STEPS`` per channel, no LL buffer unless
``NCCL_ALLOC_P2P_NET_LL_BUFFERS=1``, ``src/transport/net.cc``), so the same figure is an upper bound there.
NVLS (NVLink SHARP) and CollNet (SHARP in the switches) are off: NVLS needs NVSwitch multicast (H100
with ``NCCL_NVLS_ENABLE`` and a CUDA driver with multicast objects) and allocates its own buffers
(``src/transport/nvls.cc``), CollNet a plugin; the launchers here set neither, and their buffers are not
counted.

``NCCL_BUFFSIZE`` sets the Simple buffer (the largest of the three): a cluster file's ``nccl_buffsize``
(``planner.core.cluster.Cluster.nccl_buffsize_bytes``) follows it, so a job run with
``NCCL_BUFFSIZE=1048576`` is priced with 1 MiB.
"""

from __future__ import annotations

import math
from typing import Iterable

import numpy as np

__all__ = [
    "NCCL_SIMPLE_BUFFSIZE",
    "NCCL_LL_BUFFSIZE",
    "NCCL_LL128_BUFFSIZE",
    "NCCL_MAX_CHANNELS",
    "NCCL_CONNECTION_BYTES",
    "communicator_sizes",
    "nccl_buffer_bytes",
    "connection_bytes",
    "layout_buffer_bytes",
    "pipeline_peers",
    "pipeline_links",
    "net_p2p_bytes",
]

NCCL_SIMPLE_BUFFSIZE = 1 << 22
"""Bytes of a connection's Simple-protocol buffer: NCCL's ``DEFAULT_BUFFSIZE`` (``src/init.cc``),
the ``NCCL_BUFFSIZE`` default the NCCL docs give (4 MiB)."""

NCCL_LL_BUFFSIZE = 8 * 512 * 8 * 16
"""Bytes of a connection's LL buffer: ``DEFAULT_LL_BUFFSIZE`` = ``NCCL_LL_LINES_PER_THREAD`` (8) x
``NCCL_LL_MAX_NTHREADS`` (512) x ``NCCL_STEPS`` (8) x 16-byte ``ncclLLFifoLine`` (``src/init.cc``,
``src/include/device.h``)."""

NCCL_LL128_BUFFSIZE = 120 * 640 * 8 * 8
"""Bytes of a connection's LL128 buffer: ``DEFAULT_LL128_BUFFSIZE`` = ``NCCL_LL128_ELEMS_PER_THREAD``
(120) x ``NCCL_LL128_MAX_NTHREADS`` (640) x ``NCCL_STEPS`` (8) x 8 bytes (``src/init.cc``,
``src/include/device.h``)."""

NCCL_MAX_CHANNELS = 32
"""Channels a communicator uses at most: ``MAXCHANNELS`` (``src/include/device.h``, NCCL 2.x), the
default ``NCCL_MAX_NCHANNELS``."""

NCCL_CONNECTION_BYTES = NCCL_SIMPLE_BUFFSIZE + NCCL_LL_BUFFSIZE + NCCL_LL128_BUFFSIZE
"""Bytes one ring connection holds on a rank: the three protocols' buffers (9,633,792)."""


def communicator_sizes(*, tp: int = 1, cp: int = 1, pp: int = 1, dp: int = 1) -> tuple[int, ...]:
    """Sizes of the NCCL communicators one rank of a ``tp x cp x pp x dp`` layout joins with a peer:
    the tensor-parallel group, the context-parallel group (ring attention's exchanges), the
    pipeline group (its send/receive pairs) and the gradient group, data parallelism with context
    parallelism folded in (Megatron-LM's ``data_parallel_group_with_cp``, torchtitan's
    ``dp_shard_cp`` FSDP mesh); a group of one rank has no peer and so no buffers. ``cp > 1`` with
    ``dp = 1`` still has the folded group, of ``cp`` ranks.

    >>> communicator_sizes(tp=8, pp=1, dp=32)
    (8, 32)
    >>> communicator_sizes(cp=2, dp=4)
    (2, 8)
    >>> communicator_sizes()
    ()
    """
    groups = (tp, cp, pp, dp * cp)
    return tuple(size for size in groups if size > 1)


def nccl_buffer_bytes(sizes: Iterable[int], *, channels: int = NCCL_MAX_CHANNELS) -> float:
    """Bytes of NCCL ring buffers one rank holds over communicators of ``sizes`` ranks: each of two
    or more ranks holds ``channels`` connections of :data:`NCCL_CONNECTION_BYTES` (module docstring).

    >>> nccl_buffer_bytes([8, 32])  # 2 x 32 x 9,633,792
    616562688.0
    """
    if channels < 1:
        raise ValueError(f"channels must be at least 1 (got {channels})")
    return float(sum(channels * NCCL_CONNECTION_BYTES for size in sizes if size > 1))


def connection_bytes(buffsize: int = NCCL_SIMPLE_BUFFSIZE) -> int:
    """Bytes one connection holds on a rank per channel with a Simple buffer of ``buffsize`` bytes
    (``NCCL_BUFFSIZE``), the LL and LL128 buffers at their defaults.

    >>> connection_bytes() == NCCL_CONNECTION_BYTES
    True
    >>> connection_bytes(1 << 20)  # NCCL_BUFFSIZE=1048576: 1,048,576 + 524,288 + 4,915,200
    6488064
    """
    if buffsize < 1:
        raise ValueError(f"the NCCL Simple buffer must be at least 1 byte (got {buffsize})")
    return int(buffsize) + NCCL_LL_BUFFSIZE + NCCL_LL128_BUFFSIZE


NCCL_P2P_NET_CHUNKSIZE = 1 << 17
"""Bytes of a send/receive step across nodes: ``NCCL_P2P_NET_CHUNKSIZE``'s default (128 KiB, ``src/init.cc``
``computeBuffSizes``: ``p2pChunkSize`` when the communicator spans nodes)."""

NCCL_SHARED_STEPS = 16
"""Steps of each channel in the network transport's shared send/receive buffers (``src/transport/net.cc``)."""


def net_p2p_bytes(channels: int = NCCL_MAX_CHANNELS) -> float:
    """Bytes of the network transport's shared point-to-point buffers on a rank with a peer on another node:
    one send and one receive pool of ``channels x NCCL_SHARED_STEPS x NCCL_P2P_NET_CHUNKSIZE``, shared by every
    such peer (``src/transport/net.cc`` ``sharedNetBuffersInit``, per local rank; ``NCCL_NET_SHARED_BUFFERS``
    default 1); no LL buffer (``NCCL_ALLOC_P2P_NET_LL_BUFFERS`` default 0, ``src/init.cc``).

    >>> net_p2p_bytes()  # 2 x 32 x 16 x 131,072
    134217728.0
    """
    return float(2 * channels * NCCL_SHARED_STEPS * NCCL_P2P_NET_CHUNKSIZE)


def pipeline_links(stages: int, *, devices_per_stage: int, devices_per_node: int,
                   interleaved: bool = False) -> list[tuple[int, bool]]:
    """Per pipeline stage, ``(neighbours on its node, whether one is on another node)`` of a rank
    (:func:`pipeline_peers`; stages take consecutive ranks, pipeline outermost, as
    ``objectives.schedules.boundary_crosses_node`` places them; an interleaved schedule's wrap from the last
    stage to the first crosses a node when the pipeline spans more than one).

    >>> pipeline_links(4, devices_per_stage=4, devices_per_node=8)
    [(1, False), (1, True), (1, True), (1, False)]
    >>> pipeline_links(2, devices_per_stage=8, devices_per_node=8)
    [(0, True), (0, True)]
    """
    if stages <= 1:
        return [(0, False)]
    bounds = np.arange(1, stages) * devices_per_stage
    crosses = [True] * (stages - 1) if devices_per_stage >= devices_per_node else list(bounds % devices_per_node == 0)
    links = []
    for s in range(stages):
        sides = ([crosses[s - 1]] if s > 0 else []) + ([crosses[s]] if s < stages - 1 else [])
        if interleaved and stages > 2 and s in (0, stages - 1):
            sides.append(stages * devices_per_stage > devices_per_node)
        if stages == 2:
            sides = sides[:1]  # the one neighbour, forward and back
        links.append((sum(1 for c in sides if not c), any(sides)))
    return links


def pipeline_peers(stages: int, *, interleaved: bool = False) -> list[int]:
    """Point-to-point peers of a rank of each pipeline stage (module docstring): the previous and the
    next stage, the same rank when there are two stages; an interleaved schedule wraps the last stage
    to the first.

    >>> pipeline_peers(1), pipeline_peers(2), pipeline_peers(4), pipeline_peers(4, interleaved=True)
    ([0], [1, 1], [1, 2, 2, 1], [2, 2, 2, 2])
    """
    if stages <= 1:
        return [0]
    if stages == 2:
        return [1, 1]
    if interleaved:
        return [2] * stages
    return [1] + [2] * (stages - 2) + [1]


def layout_buffer_bytes(
    *, tp: int = 1, cp: int = 1, dp: int = 1, ep: int = 1, p2p_peers: int = 0, net_peer: bool = False,
    dp_shard: int | None = None, buffsize: int = NCCL_SIMPLE_BUFFSIZE, channels: int = NCCL_MAX_CHANNELS,
    hpz: int | None = None,
) -> float:
    """Bytes of NCCL's buffers on one rank of a ``tp x cp x dp`` stage (module docstring, "What a plan's
    rank holds"): a ring connection per channel of each collective group with a peer (tensor, context,
    gradient ``dp x cp``, and with ``ep > 1`` the expert-gradient group ``dp x cp / ep``), and as much per
    point-to-point peer on the rank's node (``p2p_peers`` pipeline neighbours, :func:`pipeline_links`, and
    ``ep - 1`` all-to-all peers, taken as on the node: the larger figure), and with a neighbour on another node
    (``net_peer``) the network transport's shared buffers (:func:`net_p2p_bytes`). Under hybrid sharding (``dp_shard``: ``TrainingSettings.dp_shard``, FSDP2 on a 2-D
    ``("dp_replicate", "dp_shard")`` mesh) the gradient group is two: the shard group and the replicas'. Under
    ZeRO++'s hpZ (``hpz``: ``TrainingSettings.hpz_partition``) the secondary group of ``gcd(dp x cp, hpz)`` ranks
    is one more communicator (DeepSpeed 0.19.8 ``utils/groups.py``: ``dist.new_group`` per group), where smaller
    than the gradient group.

    >>> layout_buffer_bytes(tp=2, dp=4, p2p_peers=1) / (32 * NCCL_CONNECTION_BYTES)  # tp, dp rings + a stage
    3.0
    >>> layout_buffer_bytes(dp=16, dp_shard=8) / (32 * NCCL_CONNECTION_BYTES)  # HSDP: shard and replicate groups
    2.0
    >>> layout_buffer_bytes(dp=16, hpz=8) / (32 * NCCL_CONNECTION_BYTES)  # hpZ: the dp ring and the secondary group
    2.0
    >>> layout_buffer_bytes(dp=8, ep=8) / (32 * NCCL_CONNECTION_BYTES)  # dp ring + 7 all-to-all peers
    8.0
    >>> layout_buffer_bytes()
    0.0
    """
    grads = dp * cp
    shard = math.gcd(grads, dp_shard) if dp_shard else grads
    rings = [tp, cp, shard, grads // shard] + ([grads // ep] if ep > 1 else [])
    rings += [math.gcd(grads, hpz)] if hpz and math.gcd(grads, hpz) < grads else []
    connections = sum(1 for size in rings if size > 1) + int(p2p_peers) + max(int(ep) - 1, 0)
    return float(connections * channels * connection_bytes(buffsize)) + (net_p2p_bytes(channels) if net_peer else 0.0)
