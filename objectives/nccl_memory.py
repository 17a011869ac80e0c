r"""NCCL's own device buffers: memory a rank holds outside PyTorch's caching allocator.

Each NCCL communicator a rank joins allocates, per channel and per peer connection, a staging buffer
for each of its three protocols with ``cudaMalloc`` (or cuMem) directly, not through PyTorch's
allocator. They count in the GPU's memory (``nvidia-smi``) but never in
``torch.cuda.max_memory_allocated`` nor ``max_memory_reserved`` (nor torchtitan's memory monitor,
which reads ``torch.cuda.memory_stats()["reserved_bytes.all.peak"]``,
``torchtitan/components/metrics.py``). So this term is not part of the peak the cost model compares
with the allocator's figures (:mod:`objectives.memory`); ``bench/fidelity.py`` reports it beside
them, per row, for what a whole device holds.

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
"""

from __future__ import annotations

from typing import Iterable

__all__ = [
    "NCCL_SIMPLE_BUFFSIZE",
    "NCCL_LL_BUFFSIZE",
    "NCCL_LL128_BUFFSIZE",
    "NCCL_MAX_CHANNELS",
    "NCCL_CONNECTION_BYTES",
    "communicator_sizes",
    "nccl_buffer_bytes",
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
