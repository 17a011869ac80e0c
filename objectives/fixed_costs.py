r"""Fixed costs of a training step: what a step pays whatever its FLOPs and bytes.

Small models, small micro-batches and tensor parallelism make kernels short; the step is then set
by what each kernel, layer, micro-batch and collective costs *beyond* its work (issue 23: GPT runs
of width 1,024 on one 8-GPU A100 node, 3.5 ms per layer and micro-batch whatever the split, where
the kernels' work is 0.3-1 ms). The terms, each with its source:

Kernel launches per op
    :func:`objectives.compute.kernel_counts` (``eager``: one kernel per ONNX node, autocast casts
    and gradient casts; ``fused``: one per coarse op plus a product's epilogue); each kernel costs
    the device's ``kernel_overhead_s`` on the GPU and ``host_dispatch_s`` on the host
    (:func:`launch_time_s` for a list of ops, hand-checkable).

Host work per layer and per micro-batch (:func:`host_floor_s`)
    A launcher's host runs each layer's Python module code, dispatches its kernels, and keeps
    autograd's and activation checkpointing's books: ``Device.layer_host_s`` per layer and forward
    pass, :data:`BACKWARD_HOST_PASSES` of it per backward pass (autograd launches about twice the
    forward's kernels) plus one more forward under full recomputation, and
    ``Device.microbatch_host_s`` per micro-batch and stage. CUDA launches are asynchronous, so the
    host runs ahead while kernels are long; a stage's pass takes the longer of its kernels' time and
    its host time (:mod:`objectives.pipeline_price`).

NCCL latency per collective by algorithm, protocol and message size (:func:`nccl_collective_time_s`)
    NCCL's own cost model (``src/graph/tuning.cc``, ``ncclTopoTuneModel`` / ``ncclTopoGetAlgoTime``,
    NCCL 2.8-2.12; the constants below are its tables): for each algorithm (ring, tree) and
    protocol (LL, LL128, Simple) a base latency plus a per-hop latency times the hops, plus the
    bytes over the algorithm bandwidth (the link's bus bandwidth times the protocol's share); NCCL
    runs the cheapest, and so does the model. Used for collectives inside one node under an
    execution model (tensor-parallel all-reduces); groups across nodes keep the hierarchical
    alpha-beta model of :mod:`objectives.collectives`.

Pipeline send/receive latency
    Each stage boundary, micro-batch and direction pays ``Device.p2p_overhead_s`` on top of the
    alpha-beta transfer (NCCL send/recv launch, and Megatron-LM's ``torch.cuda.synchronize()``
    after ``batch_isend_irecv`` in ``p2p_communication.py``): :func:`p2p_fixed_s`.

The optimizer step
    :func:`objectives.compute.optimizer_step_time_s`: one memory-bound pass of
    ``OPTIMIZER_BYTES_PER_PARAMETER`` bytes per owned parameter, at least ``host_dispatch_s`` per
    parameter tensor; once per step.

Inside a captured CUDA graph (``TrainingSettings.cuda_graphs``: torchtitan 0.3.0 replays each micro-batch's
forward and backward as one graph at ``pp = 1``)
    The host issues one ``cudaGraphLaunch`` per micro-batch instead of every kernel: a pass costs its
    work plus ``kernel_overhead_s`` per kernel (the GPU's own gap between kernels stays), with no
    ``host_dispatch_s`` term and no per-layer host floor; the micro-batch's host time is the replay's
    launch, :data:`GRAPH_LAUNCH_S`. A collective keeps its NCCL latency (the kernels' own protocol,
    :func:`nccl_collective_time_s`) and loses ``collective_overhead_s``, the call's host-side setup
    (launch and proxy enqueue, recorded once at capture). The optimizer step runs after the replay, eager,
    and keeps its per-tensor host floor.

The [Empirical] constants are ``planner.core.cluster.Device`` fields (``planner calibrate`` fits
them; docs/VALIDATION.md names the rows each preset value was fitted on).
"""

from __future__ import annotations

from typing import Literal, Sequence

import numpy as np

from planner.core.cluster import Device, Link

__all__ = [
    "BACKWARD_HOST_PASSES",
    "GRAPH_LAUNCH_S",
    "NCCL_BASE_LATENCY_US",
    "NCCL_NVLINK_HOP_LATENCY_US",
    "NCCL_PROTOCOL_BANDWIDTH",
    "NCCL_TREE_MAX_BUS_BANDWIDTH",
    "collective_setup_s",
    "host_dispatch_s",
    "host_floor_s",
    "launch_time_s",
    "nccl_collective_time_s",
    "nccl_choice",
    "nccl_latency_s",
    "p2p_fixed_s",
]

BACKWARD_HOST_PASSES = 2.0
"""Host time of a layer's backward pass / its forward pass: autograd launches about twice the
forward's kernels (two products per linear layer, a norm's input and parameter gradients) from C++,
with no module code; we count it as two forward passes of host work."""

GRAPH_LAUNCH_S = 2.5e-6
"""[Empirical] Host seconds of one ``cudaGraphLaunch`` of a captured micro-batch (torchtitan's ``CUDAGraphWrapper``
replays one graph per ``fwd_bwd_fn`` call, after copying the batch into its static inputs): a few microseconds
whatever the graph's length for a straight-line graph from CUDA 12.6 (NVIDIA technical blog, "Constant Time Launch
for Straight-Line CUDA Graphs and Other Performance Enhancements", Sep 2024; 2.5 us is our reading of its figure,
not measured here), against ``Device.host_dispatch_s`` per kernel without a graph. It is the captured pass's host
floor, which any micro-batch's kernels exceed: its value moves no price."""

Algorithm = Literal["ring", "tree"]
Protocol = Literal["LL", "LL128", "Simple"]

NCCL_BASE_LATENCY_US: dict[tuple[str, str], float] = {
    ("tree", "LL"): 4.4, ("tree", "LL128"): 4.4, ("tree", "Simple"): 0.0,
    ("ring", "LL"): 3.6, ("ring", "LL128"): 10.0, ("ring", "Simple"): 8.4,
}
"""NCCL's ``baseLat`` (microseconds) per algorithm and protocol (``src/graph/tuning.cc``)."""

NCCL_NVLINK_HOP_LATENCY_US: dict[tuple[str, str], float] = {
    ("tree", "LL"): 0.52, ("tree", "LL128"): 1.2, ("tree", "Simple"): 28.0,
    ("ring", "LL"): 0.47, ("ring", "LL128"): 1.9, ("ring", "Simple"): 3.4,
}
"""NCCL's ``hwLat`` for NVLink (microseconds per hop) per algorithm and protocol (tuning.cc; its
PCI row is 1.0/1.9/28 and 1.0/2.5/5.7, its network row 5.0/8.5/50 and 2.7/4.0/9.6)."""

NCCL_PROTOCOL_BANDWIDTH: dict[tuple[str, str], float] = {
    ("ring", "LL"): 1.0 / 4.0, ("ring", "LL128"): 0.92, ("ring", "Simple"): 1.0,
    ("tree", "LL"): 0.9 / 3.8, ("tree", "LL128"): 0.9 * 7.0 / 9.0, ("tree", "Simple"): 0.9,
}
"""Share of the bus bandwidth each (algorithm, protocol) reaches in NCCL's model (tuning.cc): LL
sends 4 bytes of data per 8-byte line with its flag and is priced at 1/4 for ring all-reduce; LL128
keeps 120 of 128 bytes (0.92); the tree runs at 0.9 of the bus bandwidth, LL at 1/3.8 of that and
LL128 at 7/9 of it inside a node."""

NCCL_TREE_MAX_BUS_BANDWIDTH = 110e9
"""NCCL caps the tree's bus bandwidth at 110 GB/s on one or two nodes (tuning.cc ``maxTreeBw``;
130 GB/s for LL128 on compute capability 8.0, not distinguished here) (bytes/s)."""

_ALGORITHMS: tuple[str, ...] = ("ring", "tree")
_PROTOCOLS: tuple[str, ...] = ("LL", "LL128", "Simple")


def _nccl_parts(
    collective: str, num_bytes: np.ndarray, n: np.ndarray, link: Link
) -> dict[tuple[str, str], tuple[np.ndarray, np.ndarray]]:
    """Per (algorithm, protocol), ``(latency, transfer)`` seconds of one collective in NCCL's model:
    ``base + hops x hw`` and the bytes over the algorithm bandwidth (module docstring)."""
    bus = link.collective_bandwidth_bytes_per_s
    out: dict[tuple[str, str], tuple[np.ndarray, np.ndarray]] = {}
    for algorithm in _ALGORITHMS:
        if algorithm == "tree" and collective != "all_reduce":
            continue  # NCCL's tree serves all-reduce only
        steps = 2.0 * (n - 1.0) if collective == "all_reduce" else n - 1.0
        for protocol in _PROTOCOLS:
            share = NCCL_PROTOCOL_BANDWIDTH[(algorithm, protocol)]
            if algorithm == "ring":
                if protocol == "LL" and collective != "all_reduce":
                    share = 1.0 / 3.0  # tuning.cc: ring LL at 1/3 for all-gather / reduce-scatter in a node
                hops = steps
                # bytes / algorithm bandwidth, algbw = busbw x n / steps
                moved = num_bytes * steps / np.maximum(n, 1.0) / (bus * share)
            else:
                bandwidth = min(bus * 0.9, NCCL_TREE_MAX_BUS_BANDWIDTH) * share / 0.9
                hops = 2.0 * (n - 1.0)  # one node: up and down the chain of n - 1 intra-node hops
                moved = num_bytes / (bandwidth * 0.5)
            latency = (NCCL_BASE_LATENCY_US[(algorithm, protocol)]
                       + hops * NCCL_NVLINK_HOP_LATENCY_US[(algorithm, protocol)]) * 1e-6
            out[(algorithm, protocol)] = (latency, moved)
    return out


def _nccl_times(collective: str, num_bytes: np.ndarray, n: np.ndarray, link: Link) -> dict[tuple[str, str], np.ndarray]:
    return {pair: latency + moved for pair, (latency, moved) in _nccl_parts(collective, num_bytes, n, link).items()}


def nccl_collective_time_s(collective: str, num_bytes, size, link: Link) -> np.ndarray:
    r"""Seconds of an NCCL collective inside one node, as NCCL's tuner prices it (module docstring).

    For each algorithm :math:`a` and protocol :math:`p`,

    .. math:: t_{a,p} = \text{base}_{a,p} + \text{hops}_a \cdot \text{hw}_{a,p}
                        + \frac{B}{\text{busbw} \cdot s_{a,p} \cdot r_a}

    with ring all-reduce :math:`2(n-1)` hops and :math:`r = n / 2(n-1)`, ring all-gather and
    reduce-scatter :math:`n-1` hops and :math:`r = n/(n-1)`, the tree (all-reduce only)
    :math:`2(n-1)` hops inside a node and :math:`r = 1/2`; ``busbw`` is the link's collective
    bandwidth (:attr:`planner.core.cluster.Link.collective_bandwidth_bytes_per_s`). The time is the
    minimum over the pairs (NCCL picks the fastest); 0 for one device or no bytes.

    Examples
    --------
    A 2 MiB all-reduce over 8 A100s on NVLink (231 GB/s bus bandwidth): ring LL128,
    10 us + 14 x 1.9 us + 2 MiB x 14/8 / (231 GB/s x 0.92):

    >>> link = Link(name="nv", bandwidth_bytes_per_s=300e9, latency_s=2e-6, collective_efficiency=0.77)
    >>> round(float(nccl_collective_time_s("all_reduce", 2 * 2**20, 8, link)) * 1e6, 1)
    53.9
    >>> nccl_choice("all_reduce", 2 * 2**20, 8, link)
    ('ring', 'LL128')
    >>> round(float(nccl_collective_time_s("all_reduce", 8, 8, link)) * 1e6, 2)  # ring LL: 3.6 + 14 x 0.47
    10.18
    """
    nbytes, n = np.broadcast_arrays(np.asarray(num_bytes, dtype=np.float64), np.asarray(size, dtype=np.float64))
    times = _nccl_times(collective, nbytes, n, link)
    best = np.minimum.reduce(list(times.values()))
    return np.where((n > 1.0) & (nbytes > 0.0), best, 0.0)


def nccl_choice(collective: str, num_bytes: float, size: int, link: Link) -> tuple[str, str]:
    """The (algorithm, protocol) :func:`nccl_collective_time_s` picks for one message."""
    times = _nccl_times(collective, np.asarray(float(num_bytes)), np.asarray(float(size)), link)
    return min(times, key=lambda k: float(times[k]))


def nccl_latency_s(collective: str, num_bytes: float, size: int, link: Link) -> float:
    r"""The latency part of :func:`nccl_collective_time_s` for one message: :math:`\text{base}_{a,p} +
    \text{hops}_a \cdot \text{hw}_{a,p}` of the pair :func:`nccl_choice` picks (the rest is its bytes over
    the algorithm bandwidth); 0 for one device or no bytes.

    Examples
    --------
    The 2 MiB all-reduce over 8 A100s of :func:`nccl_collective_time_s` (ring LL128): 10 + 14 x 1.9 us.

    >>> link = Link(name="nv", bandwidth_bytes_per_s=300e9, latency_s=2e-6, collective_efficiency=0.77)
    >>> round(nccl_latency_s("all_reduce", 2 * 2**20, 8, link) * 1e6, 1)
    36.6
    """
    if size <= 1 or num_bytes <= 0:
        return 0.0
    parts = _nccl_parts(collective, np.asarray(float(num_bytes)), np.asarray(float(size)), link)
    return float(parts[nccl_choice(collective, num_bytes, size, link)][0])


def host_floor_s(
    layers: np.ndarray | Sequence[float] | float, *, device: Device, recompute: str = "none",
    recomputed_share: float | None = None, cuda_graphs: bool = False, scope: str = "step",
    extra_kernels: tuple[float, float] = (0.0, 0.0),
) -> tuple[np.ndarray, np.ndarray]:
    r"""``(forward, backward)`` host seconds of a stage's pass per micro-batch (module docstring).

    .. math:: h_{fwd} = L\,h_{layer} + h_{mb}, \qquad
              h_{bwd} = (2 + r)\,L\,h_{layer}

    with :math:`L` the stage's layers, :math:`h_{layer}` = ``device.layer_host_s``,
    :math:`h_{mb}` = ``device.microbatch_host_s`` and :math:`r` the share of a layer's forward the
    backward replays: ``recomputed_share`` (:func:`objectives.graph_facts.recomputed_share`: the
    recomputed ops over the layers' ops, a replayed op relaunching its kernels), else 1 for ``full``
    and 0 otherwise. ``extra_kernels``: the ``(forward, backward)`` kernels per layer the eager engine launches beyond
    the fused kernels ``layer_host_s`` was fitted on (:func:`objectives.fixed_cost_parts.eager_extra_kernels`), each
    adding ``device.host_dispatch_s`` to the layer's host work (a recomputed forward's as well), where the device has
    a layer floor: :math:`h_{layer}` becomes :math:`h_{layer} + x_f\,h_{k}` forward and the backward gains
    :math:`x_b\,h_k` per layer. ``cuda_graphs``: the pass is one graph's replay (module docstring), whose host
    time is one :data:`GRAPH_LAUNCH_S` per micro-batch, in the forward, whatever the layers; under
    ``scope="layers"`` (Megatron-LM's per-layer Transformer Engine graphs) each layer's forward and
    backward is one replay, :math:`L\,G + h_{mb}` forward and :math:`L\,G` backward, the micro-batch's
    own host work (embedding, head, loss, schedule) launched as before.

    Examples
    --------
    >>> from dataclasses import replace
    >>> from objectives.cluster import get_device
    >>> dev = replace(get_device("a100-80gb"), layer_host_s=1e-3, microbatch_host_s=2e-3)
    >>> f, b = host_floor_s([12, 6], device=dev, recompute="full")
    >>> [round(float(x), 6) for x in f], [round(float(x), 6) for x in b]   # 12 ms + 2 ms; 3 x 12 ms
    ([0.014, 0.008], [0.036, 0.018])
    >>> f, b = host_floor_s([12, 6], device=replace(dev, host_dispatch_s=1e-4), extra_kernels=(5, 10))
    >>> [round(float(x), 6) for x in f], [round(float(x), 6) for x in b]   # 12 x 1.5 ms + 2 ms; 12 x (2 ms + 1 ms)
    ([0.02, 0.011], [0.036, 0.018])
    >>> f, b = host_floor_s([12, 6], device=dev, recompute="full", cuda_graphs=True)
    >>> [round(float(x) * 1e6, 3) for x in f], [float(x) for x in b]   # one replay's launch
    ([2.5, 2.5], [0.0, 0.0])
    >>> f, b = host_floor_s([12, 6], device=dev, cuda_graphs=True, scope="layers")
    >>> [round(float(x) * 1e6, 3) for x in f], [round(float(x) * 1e6, 3) for x in b]   # 12 x 2.5 us + 2 ms; 12 x 2.5 us
    ([2030.0, 2015.0], [30.0, 15.0])
    """
    count = np.asarray(layers, dtype=np.float64)
    if cuda_graphs and scope == "layers":  # one replay per layer and pass; the micro-batch's own work launched
        return count * GRAPH_LAUNCH_S + device.microbatch_host_s, count * GRAPH_LAUNCH_S
    if cuda_graphs:
        return np.full_like(count, GRAPH_LAUNCH_S), np.zeros_like(count)
    share = recomputed_share if recomputed_share is not None else (1.0 if recompute == "full" else 0.0)
    passes = BACKWARD_HOST_PASSES + share
    extra_f, extra_b = (x * device.host_dispatch_s if device.layer_host_s > 0 else 0.0 for x in extra_kernels)
    forward = count * (device.layer_host_s + extra_f) + device.microbatch_host_s
    backward = count * (passes * device.layer_host_s + share * extra_f + extra_b)
    return forward, backward


def p2p_fixed_s(boundaries: int, *, device: Device) -> float:
    """Fixed seconds per micro-batch and direction of a pipeline's send/receive calls: one
    ``device.p2p_overhead_s`` per stage boundary.

    Examples
    --------
    >>> from dataclasses import replace
    >>> from objectives.cluster import get_device
    >>> round(p2p_fixed_s(3, device=replace(get_device("a100-80gb"), p2p_overhead_s=5e-5)) * 1e6, 1)
    150.0
    """
    return max(int(boundaries), 0) * device.p2p_overhead_s


def launch_time_s(kernels: Sequence[tuple[int, float]], *, device: Device, cuda_graphs: bool = False) -> float:
    r"""Seconds of a sequence of ops launched one kernel after another, each op given as
    ``(kernels, device seconds of its work)``: per op
    :math:`\max(t_{work} + n\,\kappa,\; n\,h)` (:mod:`objectives.compute`'s execution-model pass),
    with :math:`\kappa` = ``kernel_overhead_s`` and :math:`h` = ``host_dispatch_s``; inside a captured
    CUDA graph (``cuda_graphs``) no kernel waits for the host: :math:`t_{work} + n\,\kappa`.

    Examples
    --------
    Three one-kernel ops of 2, 50 and 10 us on a device with 5 us per kernel and 30 us of host
    dispatch: max(7, 30) + max(55, 30) + max(15, 30) = 115 us.

    >>> from dataclasses import replace
    >>> from objectives.cluster import get_device
    >>> dev = replace(get_device("a100-80gb"), kernel_overhead_s=5e-6, host_dispatch_s=3e-5)
    >>> round(launch_time_s([(1, 2e-6), (1, 5e-5), (1, 1e-5)], device=dev) * 1e6, 3)
    115.0
    >>> round(launch_time_s([(1, 2e-6), (1, 5e-5), (1, 1e-5)], device=dev, cuda_graphs=True) * 1e6, 3)  # 7 + 55 + 15
    77.0
    """
    host = 0.0 if cuda_graphs else device.host_dispatch_s
    total = 0.0
    for count, work in kernels:
        total += max(work + count * device.kernel_overhead_s, count * host)
    return total


def host_dispatch_s(device: Device, *, cuda_graphs: bool) -> float:
    """Host seconds the GPU may wait per kernel of a pass: ``device.host_dispatch_s``, 0 inside a captured
    CUDA graph (module docstring)."""
    return 0.0 if cuda_graphs else device.host_dispatch_s


def collective_setup_s(device: Device, *, cuda_graphs: bool) -> float:
    """Fixed seconds of one collective call beyond its NCCL or alpha-beta price: ``device.collective_overhead_s``
    (the call's launch, proxy setup and the ranks' meeting, :class:`planner.core.cluster.Device`), 0 inside a
    captured CUDA graph: the call's launch and proxy setup were recorded once at capture, and what remains is
    NCCL's kernel, whose latency :func:`nccl_collective_time_s` (or the link's alpha) prices (module docstring)."""
    return 0.0 if cuda_graphs else device.collective_overhead_s
