r"""The fixed costs inside one op's priced seconds, split out for ``planner explain`` (issue 23 item 1).

Under an execution model (:mod:`objectives.execution`) an op's passes and its collectives carry fixed
costs that the pricing folds into its compute and communication (:mod:`objectives.fixed_costs`). This
module reads them back for one op at one configuration, with the same functions and arguments the
cost model priced it with (:func:`objectives.tables._roofline_detail`), so that they add up to the
op's priced figures:

Kernel launches
    Each pass costs :math:`t = \max(w + n\kappa,\; n h)` (:mod:`objectives.compute`), with :math:`w`
    the pass's bare work (roofline and streamed traffic), :math:`n` its kernels
    (:func:`objectives.compute.kernel_counts`), :math:`\kappa` = ``kernel_overhead_s`` and :math:`h` =
    ``host_dispatch_s``. The launch overhead is :math:`t - w = \max(n\kappa,\; nh - w)`: what
    :func:`objectives.fixed_costs.launch_time_s` adds over the bare work. Of it, :math:`n\kappa` is spent
    on the GPU and the rest, :math:`\max(0,\; nh - w - n\kappa)`, is the GPU waiting for the host to
    issue the kernels: what replaying them from a CUDA graph would remove (one graph launch instead of
    :math:`n` dispatches; the per-kernel GPU time stays). A recomputed op runs its
    forward again before its backward, launches included. A shard timed by a profile
    (``--cost measured``) has its launches inside its measured time, and an MoE layer's ops are priced
    apart (:func:`objectives.moe.price_moe`: the routed rows, the busiest rank, the all-to-alls): their
    kernels are counted, their launch seconds (and an MoE op's collectives) are not split out.
    Priced inside a captured CUDA graph (``TrainingSettings.cuda_graphs``), :math:`h = 0`: the launches
    are :math:`n\kappa` and none of them is host-bound.

Collective latency
    Each intra-op collective (:func:`objectives.intra_op.intra_op_terms`) is priced by
    :func:`objectives.intra_op.term_time_s`: inside one node by NCCL's tuner
    (:func:`objectives.fixed_costs.nccl_collective_time_s`; latency ``base + hops x hw`` of the
    algorithm and protocol it picks, :func:`~objectives.fixed_costs.nccl_latency_s`), across nodes
    by the alpha-beta model (latency: the time less the same collective on links of no latency, as
    :func:`objectives.intra_op.bucketed_grad_sync_s` splits it). Each (kind, link level) of the op's
    communication also pays ``Device.collective_overhead_s`` once (the call's setup), as the tables
    add it; it is listed on the first collective of that kind and level (0 inside a CUDA graph,
    :func:`objectives.fixed_costs.collective_setup_s`).

Gradient synchronisation (bucketed per launcher) and redistribution between ops are not split here.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import numpy as np

from objectives._common import is_float
from objectives.compute import casts_parameters, eager_kernel_nodes, folded_nodes, kernel_counts, op_compute_time_s
from objectives.execution import execution_of
from objectives.fixed_costs import collective_setup_s, nccl_choice, nccl_latency_s
from objectives.graph_facts import _graph_facts, _graph_outputs, _roles, op_settings
from objectives.intra_op import CommTerm, intra_op_terms, term_time_s
from objectives.parameters import ParameterView
from objectives.tp_overlap import is_tp_gemm
from planner.core.cluster import Cluster

__all__ = ["CollectiveFixedCost", "OpFixedCosts", "eager_extra_kernels", "op_fixed_costs"]

_NCCL_COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter")


@dataclass(frozen=True, slots=True, kw_only=True)
class CollectiveFixedCost:
    """One intra-op collective of an op at its configuration, per micro-batch (``count`` included)."""

    kind: str
    """``partial_sum``, ``input_grad``, ``norm_stats`` or ``halo`` (:mod:`objectives.intra_op`)."""
    collective: str
    tensor: str
    num_bytes: float
    """Bytes per device of one call."""
    devices: int
    """Devices of its group inside one node."""
    nodes: int
    """Nodes its group spans (> 1: priced by the alpha-beta model)."""
    count: float
    model: str
    """``nccl`` (NCCL's tuner, inside one node), ``alpha-beta`` (across nodes) or ``p2p``."""
    algorithm: str | None
    protocol: str | None
    """The (algorithm, protocol) NCCL's tuner picks (``model == "nccl"``), else ``None``."""
    seconds: float
    """Its priced time, latency and transfer (seconds), without the call's setup."""
    latency_s: float
    """The latency part of :attr:`seconds`."""
    setup_s: float
    """``Device.collective_overhead_s`` where this collective carries its kind and level's setup, else 0."""

    @property
    def fixed_s(self) -> float:
        """Its fixed seconds: latency and setup."""
        return self.latency_s + self.setup_s


@dataclass(frozen=True, slots=True, kw_only=True)
class OpFixedCosts:
    """One op's fixed costs at one configuration, per micro-batch (module docstring)."""

    kernels_forward: int
    kernels_backward: int
    recomputed: bool
    """Its forward runs again before its backward (its kernels and launches with it)."""
    work_forward_s: float
    work_backward_s: float
    """The passes' bare work (seconds): the roofline and the streamed traffic, no launch."""
    launch_forward_s: float | None
    launch_backward_s: float | None
    """What the kernel launches add over the bare work (seconds); ``None`` where :attr:`priced_apart`."""
    collectives: tuple[CollectiveFixedCost, ...]
    kernel_overhead_s: float = 0.0
    """The device's GPU-side seconds per kernel (``Device.kernel_overhead_s``) it was priced with."""
    priced_apart: str | None = None
    """``measured`` (a profile's time) or ``moe`` (:mod:`objectives.moe`): the op's seconds are not the
    launch formula's, so its launches (and an MoE op's collectives) are not split out; ``None`` otherwise."""
    overlapped: bool = False
    """Its tensor-parallel collectives run under its GEMMs (``--fix tp_overlap=on``): the op's
    communication is what the overlap leaves, and its collectives' seconds are before overlap."""

    @property
    def launch_s(self) -> float:
        """Launch seconds per micro-batch: forward, backward, and the recomputed forward (0 when measured)."""
        forward, backward = self.launch_forward_s or 0.0, self.launch_backward_s or 0.0
        return forward * (2.0 if self.recomputed else 1.0) + backward

    @property
    def host_bound_s(self) -> float:
        """Of :attr:`launch_s`, the seconds the GPU waits for the host to issue the kernels (beyond their
        ``kernel_overhead_s`` each on the GPU): what a CUDA graph's replay would remove (module docstring)."""
        passes = [(self.launch_forward_s, self.kernels_forward), (self.launch_backward_s, self.kernels_backward)]
        if self.recomputed:
            passes.append(passes[0])
        return sum((max(launch - n * self.kernel_overhead_s, 0.0) for launch, n in passes if launch is not None), 0.0)

    @property
    def kernels(self) -> int:
        """Kernels per micro-batch, the recomputed forward's included."""
        return self.kernels_forward * (2 if self.recomputed else 1) + self.kernels_backward

    @property
    def collective_fixed_s(self) -> float:
        """Latency and setup seconds of its collectives per micro-batch."""
        return sum((c.fixed_s for c in self.collectives), 0.0)


def _kernels(op: Any, tensors: Any, execution: Any, role: str | None, settings: Any) -> tuple[int, int]:
    """``(forward, backward)`` kernels as :func:`objectives.compute._execution_times` counts them."""
    parameters = [t for a in op.inputs
                  if (t := tensors.get(a.tensor)) is not None and t.role == "parameter" and is_float(t)]
    counts = kernel_counts(op, execution, role if execution.flash else None,
                           parameters=len(parameters) if casts_parameters(settings) else 0,
                           biases=sum(1 for t in parameters if len(t.shape) == 1),
                           folded=eager_kernel_nodes(op, tensors) if execution.eager else folded_nodes(op, tensors))
    return counts.forward, counts.backward


def eager_extra_kernels(graph: Any, settings: Any) -> tuple[float, float]:
    """``(forward, backward)`` kernels per repeated layer (a transformer block) that the eager engine launches beyond
    the fused engine's, the attention kept as it is (:func:`objectives.compute.kernel_counts`: unfused elementwise
    chains, autocast's casts); ``(0, 0)`` outside the eager engine or without repeated layers. The host dispatches
    each of them (``Device.host_dispatch_s``) on top of the layer's host work that ``Device.layer_host_s`` prices
    for the fused kernels it was fitted on (:func:`objectives.fixed_costs.host_floor_s`)."""
    execution = execution_of(settings)
    facts = _graph_facts(graph)
    layers = {instance for instance in facts.instance_of if instance >= 0}
    if execution is None or not execution.eager or not layers:
        return 0.0, 0.0
    fused = dataclasses.replace(execution, engine="fused")
    roles, tensors = _roles(graph, facts), ParameterView(graph)
    extra_f = extra_b = 0
    for index, op in enumerate(graph.ops):
        if facts.instance_of[index] < 0:
            continue
        settings_here = op_settings(graph, settings, index)
        eager_f, eager_b = _kernels(op, tensors, execution, roles[index], settings_here)
        fused_f, fused_b = _kernels(op, tensors, fused, roles[index], settings_here)
        extra_f, extra_b = extra_f + eager_f - fused_f, extra_b + eager_b - fused_b
    return max(extra_f, 0) / len(layers), max(extra_b, 0) / len(layers)


def _collectives(terms: list[CommTerm], cluster: Cluster, *, cuda_graphs: bool = False) -> tuple[CollectiveFixedCost, ...]:
    """Each of ``terms`` (on a one-configuration space) priced and split (module docstring)."""
    bare = cluster.without_latency()
    out, seen = [], set()
    for term in terms:
        seconds = float(term_time_s(term, cluster=cluster, nccl=True)[0])
        if seconds <= 0.0:
            continue
        size, nodes, num_bytes = int(term.intra_size[0]), int(term.inter_size[0]), float(term.num_bytes[0])
        algorithm = protocol = None
        if term.collective in _NCCL_COLLECTIVES and nodes == 1:
            model = "nccl"
            algorithm, protocol = nccl_choice(term.collective, num_bytes, size, cluster.intra_link)
            latency = term.count * nccl_latency_s(term.collective, num_bytes, size, cluster.intra_link)
        else:
            model = "p2p" if term.collective == "p2p" else "alpha-beta"
            latency = seconds - float(term_time_s(term, cluster=bare, nccl=True)[0])
        level = "inter" if nodes > 1 else "intra"
        setup = 0.0 if (term.kind, level) in seen else collective_setup_s(cluster.device, cuda_graphs=cuda_graphs)
        seen.add((term.kind, level))
        out.append(CollectiveFixedCost(
            kind=term.kind, collective=term.collective, tensor=term.tensor, num_bytes=num_bytes, devices=size,
            nodes=nodes, count=term.count, model=model, algorithm=algorithm, protocol=protocol, seconds=seconds,
            latency_s=latency, setup_s=setup,
        ))  # fmt: skip
    return tuple(out)


def op_fixed_costs(model: Any, index: int, pick: int) -> OpFixedCosts | None:
    """Op ``index``'s fixed costs at configuration ``pick`` of ``model`` (an
    :class:`objectives.tables.CostModel`), per micro-batch; ``None`` without an execution model (the plain
    roofline and PaSE's model price no fixed cost of this kind)."""
    execution = execution_of(model.settings) if model.cost_model != "pase" else None
    if execution is None:
        return None
    graph, cluster = model.graph, model.cluster
    settings = op_settings(graph, model.settings, index)  # inside a per-layer CUDA graph or launched (captured_ops)
    op, detail = graph.ops[index], model.op_details[index]
    space = model.tables.configs[index].subset(np.array([pick]))
    facts = _graph_facts(graph)
    tensors = ParameterView(graph)
    role, flash_shape = _roles(graph, facts)[index], facts.flash_shapes[index]
    common = dict(tensors=tensors, settings=settings, execution=execution, role=role,
                  graph_output=_graph_outputs(graph, facts)[index], flash_shape=flash_shape)
    priced = op_compute_time_s(op, space, device=cluster.device, **common)
    bare_device = dataclasses.replace(cluster.device, kernel_overhead_s=0.0, host_dispatch_s=0.0)
    bare = op_compute_time_s(op, space, device=bare_device, **common)
    forward, backward = float(priced.forward_s[0]), float(priced.backward_s[0])
    work_f, work_b = float(bare.forward_s[0]), float(bare.backward_s[0])
    # an MoE layer's op and a measured shard are not the formula's: their launches are inside their seconds
    moe = detail.moe_s is not None
    timed = moe or (detail.forward_s is not None
                    and not np.isclose(float(detail.forward_s[pick]), forward, rtol=1e-12, atol=0.0))
    kernels_f, kernels_b = _kernels(op, tensors, execution, role, settings)
    return OpFixedCosts(
        kernels_forward=kernels_f, kernels_backward=kernels_b, recomputed=bool(detail.recompute_s[pick] > 0.0),
        work_forward_s=work_f, work_backward_s=work_b,
        launch_forward_s=None if timed else forward - work_f, launch_backward_s=None if timed else backward - work_b,
        collectives=() if moe else _collectives(intra_op_terms(op, space, tensors=tensors, settings=settings), cluster,
                                                cuda_graphs=settings.cuda_graphs),
        kernel_overhead_s=cluster.device.kernel_overhead_s,
        priced_apart=("moe" if moe else "measured") if timed else None,
        overlapped=settings.tp_comm_overlap and is_tp_gemm(op, tensors),
    )  # fmt: skip
