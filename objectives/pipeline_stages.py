r"""How a model is cut into pipeline stages: its layers and the bytes crossing each cut
(:func:`layer_structure`), and the sub-cluster one stage runs on (:func:`stage_cluster`).

The layers are the graph's repeated blocks in graph order; an op belongs to the layer whose first op
most closely precedes it, so every edge runs from a layer to the same or a later one and any cut is
a valid pipeline boundary. A tensor crosses every cut between its producer and its last consumer:
:math:`C_l = \sum_{t \text{ crossing } l} \text{bytes}(t)` for one micro-batch
(:attr:`LayerStructure.cut_bytes`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from objectives._common import element_bytes
from planner.core.cluster import Cluster
from planner.core.errors import InputError
from planner.core.graph import OpGraph
from planner.core.settings import TrainingSettings

__all__ = ["LayerStructure", "layer_structure", "stage_cluster"]


@dataclass(frozen=True, slots=True, kw_only=True, eq=False)
class LayerStructure:
    """Where each op sits in the layer sequence, and what crosses each cut."""

    position: np.ndarray
    """``(n_ops,)`` int64: -1 before the first layer, ``0..L-1`` the layer, ``L`` after the last."""
    num_layers: int
    cut_bytes: np.ndarray
    """``(L + 1,)`` bytes of activations crossing a cut just before layer ``l`` (one micro-batch of
    this graph's batch, at the training precision; entries 0 and ``L`` unused)."""

    def stage_of_ops(self, bounds: Sequence[int]) -> np.ndarray:
        """``(n_ops,)`` stage index of each op under a partition's ``bounds``."""
        b = np.asarray(bounds, dtype=np.int64)
        stages = b.size - 1
        pos = np.clip(self.position, 0, max(self.num_layers - 1, 0))
        return np.clip(np.searchsorted(b, pos, side="right") - 1, 0, stages - 1)


def layer_structure(graph: OpGraph, settings: TrainingSettings | None = None) -> LayerStructure:
    """The layers of ``graph`` (its repeated blocks, in graph order) and the bytes crossing each cut.

    An op belongs to the layer whose first op most closely precedes it in the graph's topological
    order, so every edge runs from a layer to the same or a later one and any cut is a valid pipeline
    boundary. A graph without repeated blocks has no layers: it runs as one stage.
    """
    settings = settings or TrainingSettings()
    n = len(graph.ops)
    instances = sorted((inst for group in graph.blocks for inst in group.instances if inst), key=min)
    if not instances:
        return LayerStructure(position=np.full(n, -1, dtype=np.int64), num_layers=0, cut_bytes=np.zeros(1))
    starts = np.array([min(inst) for inst in instances], dtype=np.int64)
    last = max(instances[-1])
    index = np.arange(n, dtype=np.int64)
    position = np.searchsorted(starts, index, side="right") - 1
    position[index > last] = len(instances)
    layers = len(instances)
    # Bytes crossing each cut: a tensor crosses every cut between its producer and its last consumer.
    crossing = np.zeros(layers + 2)
    last_use: dict[str, int] = {}
    producer: dict[str, int] = {}
    for edge in graph.edges:
        producer[edge.tensor] = edge.producer
        last_use[edge.tensor] = max(last_use.get(edge.tensor, -2), int(position[edge.consumer]))
    for name, consumer_position in last_use.items():
        tensor = graph.tensors.get(name)
        if tensor is None:
            continue
        start = int(position[producer[name]]) + 1
        if consumer_position >= start:
            nbytes = tensor.num_elements * element_bytes(tensor, settings)
            crossing[max(start, 0)] += nbytes
            crossing[consumer_position + 1] -= nbytes
    cut_bytes = np.cumsum(crossing)[: layers + 1]
    return LayerStructure(position=position, num_layers=layers, cut_bytes=cut_bytes)


def stage_cluster(cluster: Cluster, devices: int) -> Cluster:
    """The sub-cluster of one pipeline stage: ``devices`` consecutive ranks.

    Raises :class:`InputError` when a stage would straddle nodes unevenly (``devices`` neither
    divides nor is a multiple of the devices per node).
    """
    per_node = cluster.devices_per_node
    if devices >= per_node:
        if devices % per_node:
            raise InputError(
                f"a stage of {devices} devices does not fill whole nodes of {per_node}; choose --pp so that "
                "devices / pp is a multiple or a divisor of the devices per node"
            )
        return dataclasses.replace(cluster, nodes=devices // per_node, devices_per_node=per_node)
    if per_node % devices:
        raise InputError(
            f"a stage of {devices} devices straddles nodes of {per_node}; choose --pp so that devices / pp "
            "divides the devices per node"
        )
    return dataclasses.replace(cluster, nodes=1, devices_per_node=devices)
