"""DeBERTa-v2's disentangled attention as transformers builds it and as DeepSpeed partitions it (issue 25).

The zoo's ``DebertaV2ForMaskedLM`` (its DebertaV2Config from ``tests/zoo/zoo.json``, random weights) is
rebuilt with transformers, and what the planner reads from the ONNX exports is checked against the module:
its layer count, heads and head size (``DisentangledSelfAttention``), the ``2 * pos_ebd_size`` relative
positions each position term spans, and that the model runs only eager attention (transformers refuses
``attn_implementation="sdpa"``), which is why :mod:`objectives.attention` finds no fused core in it. Then
deepspeed 0.19.8's ``AutoTPConfig.from_dict`` reads the ``dp=4 x tp=2`` plan's ``partition_config`` and
``find_matching_spec`` looks up every ``nn.Linear`` of the model, as ``AutoTP._replace_with_config`` does:
the linears it partitions, and how, are exactly the plan's (Q/K/V and the intermediate dense by columns,
the attention output and output dense by rows, the MLM head replicated). ``query_proj`` and ``key_proj``
also project the relative-position table (``share_att_key``), so their column split carries the position
terms' heads with them; AutoTP divides the module's ``num_attention_heads`` and ``all_head_size``
(``module_inject/auto_tp.py``, ``update_mp_params``), which ``transpose_for_scores`` reads.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from exporters.deepspeed import deepspeed_masks, export_deepspeed
from importers.transformer import analyze_transformer, weight_access
from planner.plan import load_graph
from tests.exporters.graphs import first_rows, make_cluster, make_input, spaces_for

pytestmark = pytest.mark.integration

ZOO = Path(__file__).resolve().parents[1] / "zoo"
FILES = ("deberta_v2_dynamo_consts", "deberta_v2_ts_consts")
_KIND = {"qkv": "column", "fc1": "column", "out-proj": "row", "fc2": "row"}


def _model(name: str):
    transformers = pytest.importorskip("transformers")
    entry = json.loads((ZOO / "zoo.json").read_text())["files"][f"{name}.onnx"]
    settings = {k: v for k, v in entry["config"].items() if not k.startswith("example_")}
    return transformers, settings, transformers.DebertaV2ForMaskedLM(transformers.DebertaV2Config(**settings))


@pytest.mark.parametrize("name", FILES)
def test_the_planner_reads_what_transformers_builds(name):
    transformers, settings, model = _model(name)
    graph = load_graph(ZOO / f"{name}.onnx", {"batch": 2, "seq": 16})
    found = analyze_transformer(graph)
    layers = model.deberta.encoder.layer
    attention = layers[0].attention.self
    assert found.num_layers == len(layers) == 2
    assert (found.num_attention_heads, found.head_dim) == (attention.num_attention_heads, attention.attention_head_size)
    for block in found.attention:
        assert len(block.position_scores) == len(attention.pos_att_type)
        for i in block.position_scores:
            assert graph.tensors[graph.ops[i].outputs[0].tensor].shape[-1] == 2 * attention.pos_ebd_size
    # eager attention only: no fused kernel runs it (objectives.attention prices its scores as written)
    assert model.config._attn_implementation == "eager"
    with pytest.raises(ValueError, match="scaled_dot_product_attention"):
        transformers.DebertaV2ForMaskedLM(transformers.DebertaV2Config(**settings, attn_implementation="sdpa"))


@pytest.mark.parametrize("name", FILES)
def test_deepspeed_partitions_exactly_the_planned_deberta_linears(name):
    torch = pytest.importorskip("torch")
    autotp = pytest.importorskip("deepspeed.module_inject.autotp_config")
    _, _, model = _model(name)
    graph = load_graph(ZOO / f"{name}.onnx", {"batch": 16, "seq": 16})
    spaces = spaces_for(graph, 8)
    plan = make_input(graph, spaces, first_rows(deepspeed_masks(graph, spaces, dp=4, tp=2)), cluster=make_cluster(1, 8))
    config = autotp.AutoTPConfig.from_dict(export_deepspeed(plan)["ds_config"]["tensor_parallel"]["partition_config"])
    linears = [name for name, module in model.named_modules() if isinstance(module, torch.nn.Linear)]
    found = {}
    for linear in linears:
        spec = config.find_matching_spec(linear + ".weight")
        found[linear] = None if spec is None else spec.partition_type.value
    # the ops with the module's own weight (dynamo's position projections read an exporter-made copy of it)
    roles = analyze_transformer(graph).roles
    planned = {op.module_path: _KIND.get(role) for op, role in zip(graph.ops, roles)
               if op.module_path in found and weight_access(graph, op) is not None}
    # 14 linears: 2 layers x (q, k, v, attention output, intermediate, output), the head's transform and decoder;
    # 8 column (q, k, v, intermediate per layer), 4 row, 2 replicated
    assert len(found) == 14 and set(planned) == set(found), sorted(set(found) ^ set(planned))
    assert found == planned
    assert sum(kind == "column" for kind in found.values()) == 8 and sum(kind == "row" for kind in found.values()) == 4
