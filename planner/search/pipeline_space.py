"""The pipeline sizes and micro-batches a pipeline search walks (:func:`_sizes_or_raise`,
:func:`_batches`): ``pp`` dividing the devices into stages of whole nodes or whole fractions of one,
at most one layer per stage and chunk; micro-batches dividing the global batch. Kept apart from the
search itself (``planner.search.pipeline``), which reads them."""

from __future__ import annotations

from typing import Any

from planner.core.configs import divisors
from planner.core.errors import InputError

PipelineOptions = Any
"""``planner.search.pipeline.PipelineOptions`` (its ``global_batch``, ``micro_batch``,
``max_micro_batches``, ``pipeline_sizes``, ``chunks``)."""


def _pipeline_sizes(devices: int, per_node: int, layers: int, chunks: int, wanted: tuple[int, ...] | None) -> list[int]:
    """The pipeline sizes of ``wanted`` (``None``: every divisor of ``devices``) whose stages fill
    whole nodes or fractions of one and, past one stage, hold at least one layer per chunk."""
    sizes = []
    for pp in divisors(devices) if wanted is None else wanted:
        if devices % pp:
            continue
        d = devices // pp
        if not (d % per_node == 0 or per_node % d == 0):
            continue
        if pp > 1 and pp * chunks > layers:
            continue
        sizes.append(pp)
    return sizes


def least_micro_batch(pricing: Any, options: PipelineOptions, devices: int, rules: Any = None) -> int:
    """The fewest samples a micro-batch of a ``devices``-device stage holds: with model parallelism
    inside a node (``PipelineOptions.model_parallel_inside_node``) the batch split spans the nodes the
    sequence split does not (``pricing.context_nodes``: context parallelism across nodes, under the rules of
    a launcher that runs it, ``pricing.context.launchers``; the headroom search, without rules, keeps the
    batch on every node: its per-op plans may split the sequence across nodes, at no more micro-batches)."""
    nodes = devices // pricing.cluster.devices_per_node
    if not options.model_parallel_inside_node or nodes <= 1:
        return 1
    context = getattr(pricing, "context", None)
    if context is None or rules is None or rules.name not in context.launchers:
        return nodes
    return max(1, nodes // pricing.context_nodes(devices, options.global_batch))


def _batches(options: PipelineOptions, devices: int, inside_node_nodes: int, pp: int = 1) -> list[tuple[int, int | None]]:
    """``(samples per micro-batch, required data-parallel degree or None)`` pairs to try, in the order a search
    stopped by its time limit should have seen them. One stage (``pp = 1``): the micro-batches that split over
    every device first (data parallelism as wide as the stage, ascending: the skip of an unfit one's multiples,
    ``_Slot._unfit``, reads them so), then the others from the widest data parallelism down (the fewest samples
    last: they leave the sequence split across the most nodes). A pipeline: the fewest samples first (the most
    micro-batches, the least bubble and activation memory: GPT-3 175B's fast plans run 48). A finished search
    finds the same frontier in any order."""
    g, most = options.global_batch, options.max_micro_batches or options.global_batch
    if options.micro_batch is not None:
        pairs = [
            (options.micro_batch * dp, dp) for dp in divisors(devices)
            if g % (options.micro_batch * dp) == 0 and dp >= inside_node_nodes and g // (options.micro_batch * dp) <= most
        ]
        return pairs if pp > 1 else sorted(pairs, key=lambda pair: -pair[1])  # one stage: the widest dp first
    batches = [b for b in divisors(g) if b >= inside_node_nodes and g // b <= most]
    if pp == 1:
        batches = [b for b in batches if b % devices == 0] + [b for b in reversed(batches) if b % devices]
    return [(b, None) for b in batches]


def _sizes_or_raise(pricing: Any, options: PipelineOptions) -> tuple[list[int], int]:
    """The pipeline sizes to search and the layer count (``pricing``: the search's, for its cluster and
    the model's layers)."""
    cluster = pricing.cluster
    probe = pricing.structure(options.global_batch if options.micro_batch is None else options.micro_batch)
    layers = probe.num_layers
    sizes = _pipeline_sizes(cluster.devices, cluster.devices_per_node, layers, options.chunks, options.pipeline_sizes)
    if not sizes and layers == 0:
        raise InputError(
            "the model has no repeated blocks (layers) to cut into pipeline stages; pass --pp 1 or leave --pp out"
        )
    if not sizes:
        raise InputError(
            f"no pipeline size fits {cluster.devices} devices and {layers} layers; pass --pp with a divisor of "
            "--devices that is at most the layer count"
        )
    return sizes, layers
