"""Issue 25 (h29g): Megatron-Core's MoE token rules cover each MoE layer from its router to its combine, not to the next
router (``exporters._tp.moe_spans``, one rule for the GPT family and the hybrid stack).

Fixture: ``tests/data/megatron_moe_loss`` (``tests/exporters/make_megatron_moe_loss.py``), a 2-layer Mixtral (4 experts,
top-2) exported with its loss. After the last layer's combine come the LM head, the labels' shift (``Pad`` to
``[batch, seq + 1]``, then a slice) and ``SoftmaxCrossEntropyLoss``. megatron-core 0.16.1 hands every tp rank the whole
``[b, s]`` labels (``LanguageModule.compute_language_model_loss``, ``models/common/language_module/language_module.py``:
``labels.transpose(0, 1)`` then ``vocab_parallel_cross_entropy(logits, labels)``; the output layer gathers the sequence
shards first, ``GPTModel._postprocess``), so the padded labels split their batch ``dp`` ways only. The old span (to the
next router, or the end of the graph) ruled that ``Pad`` a routing op and split its batch ``dp x tp`` ways.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from exporters._tp import moe_spans
from exporters.megatron import export_megatron, megatron_masks
from exporters.validate import parse_megatron_args, validate_megatron
from importers.moe import find_moe_layers
from planner.core.settings import TrainingSettings
from planner.plan import load_graph
from tests.exporters.graphs import first_rows, make_input, spaces_for

CASES = Path(__file__).resolve().parents[1] / "data" / "megatron_moe_loss"
RECORD = json.loads((CASES / "counts.json").read_text())
FILES = sorted(RECORD["files"])
DIMS = {"batch": 4, "seq": 16}


@pytest.fixture(scope="module", params=FILES)
def graph(request):
    return load_graph(CASES / request.param, DIMS)


def _factors(spaces, masks, index: int) -> list[dict[str, int]]:
    """The split factor of each dim, for every configuration of op ``index`` the masks allow."""
    space = spaces[index]
    return [dict(zip(space.dim_names, map(int, space.factors[row]))) for row in np.flatnonzero(masks[index])]


def _labels_pad(graph) -> int:
    return next(i for i, op in enumerate(graph.ops) if op.op_type == "Pad" and op.inputs[0].tensor == "labels")


def test_each_span_ends_at_the_combine_the_residual_add_reads(graph):
    """Each layer's span ends at the op whose output the layer's residual ``Add`` reads (the weighted combine, a
    ``ReduceSum`` over the top-k); the residual add, and after the last layer the head, labels and loss, lie outside."""
    routers, span = moe_spans(graph)
    layers = find_moe_layers(graph)
    assert len(layers) == RECORD["config"]["num_hidden_layers"] and routers == {layer.router_op for layer in layers}
    producers = {o.tensor: i for i, op in enumerate(graph.ops) for o in op.outputs}
    for layer in layers:
        residual = next(i for i in range(layer.topk_op + 1, len(graph.ops)) if graph.ops[i].op_type == "Add"
                        and any(producers.get(a.tensor, -1) in range(layer.topk_op, i) for a in graph.ops[i].inputs)
                        and len(graph.ops[i].outputs[0].axes) == 3)
        combine = max(producers[a.tensor] for a in graph.ops[residual].inputs if a.tensor in producers)
        assert "ReduceSum" in graph.ops[combine].node_types
        assert set(range(layer.router_op + 1, combine + 1)) <= span and residual not in span
    assert max(span) < min(i for i, op in enumerate(graph.ops) if op.op_type == "Pad")


def test_labels_split_over_data_parallel_ranks_only(graph):
    """dp=2 x tp=2 with --sequence-parallel: the padded labels split their batch 2 ways (whole on each tp rank, as
    megatron-core's loss reads them; 4 ways before), the loss its vocabulary 2 ways and its batch 2 ways, while
    the routing ops (TopK) still split their flattened tokens dp x tp = 4 ways."""
    spaces = spaces_for(graph, 4)
    masks = megatron_masks(graph, spaces, dp=2, tp=2, sequence_parallel=True)
    assert masks is not None
    pad = _labels_pad(graph)
    batch, padded = (axis[0] for axis in graph.ops[pad].outputs[0].axes)
    assert graph.ops[pad].dim(padded).size == DIMS["seq"] + 1
    assert _factors(spaces, masks, pad) == [{batch: 2, padded: 1}]
    loss = next(i for i, op in enumerate(graph.ops) if op.op_type == "SoftmaxCrossEntropyLoss")
    axes = [axis[0] for axis in graph.ops[loss].inputs[0].axes]  # the logits' [batch, seq, vocab]
    assert [[factors[d] for d in axes] for factors in _factors(spaces, masks, loss)] == [[2, 1, 2]]
    for layer in find_moe_layers(graph):
        batch_dims = [d.name for d in graph.ops[layer.topk_op].dims if d.is_batch]
        rows = _factors(spaces, masks, layer.topk_op)
        assert rows and all(np.prod([factors[d] for d in batch_dims]) == 4 for factors in rows)


def test_the_export_validates(graph):
    spaces = spaces_for(graph, 4)
    masks = megatron_masks(graph, spaces, dp=2, tp=2, sequence_parallel=True)
    out = export_megatron(make_input(graph, spaces, first_rows(masks), global_batch=16,
                                     settings=TrainingSettings(expert_parallel=2)))
    args = parse_megatron_args(out["args"])
    assert args["sequence-parallel"] and args["tensor-model-parallel-size"] == 2 and args["num-experts"] == 4
    validate_megatron(out["args"], world_size=out["world_size"], env=out["env"])
