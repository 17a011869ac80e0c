"""Disentangled attention (DeBERTa-v2, issue 25) read as attention: importers.attention_terms and what it
feeds (heads, sequence, --tokens, flash pricing, the launchers' refusals).

Expected sizes come from the DebertaV2Config the zoo was built with (``tests/zoo/zoo.json``'s ``config``,
``tests/zoo/make_zoo.py::deberta_v2``) and transformers' ``DisentangledSelfAttention`` (5.24):
``attention_head_size = hidden_size // num_attention_heads``; one product per entry of ``pos_att_type``
(``c2p``: ``bmm(query_layer, pos_key_layer^T)``, ``p2c``: ``bmm(key_layer, pos_query_layer^T)``), each over
``att_span * 2`` relative positions, ``att_span = position_buckets``; with ``share_att_key`` the position
table is projected by ``query_proj`` and ``key_proj`` themselves (two projections per layer).
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from exporters.dtensor.export import _degree_problem
from exporters.deepspeed.ulysses import ulysses_degrees, ulysses_problem, unwrapped_attention
from exporters.megatron.families import megatron_family
from exporters.torchtitan.families import torchtitan_arch
from importers.attention_terms import score_terms
from importers.transformer import _walk, analyze_transformer
from objectives.attention import find_attention_cores
from planner.core.errors import UnsupportedExport
from planner.plan import load_graph
from planner.run_cost import tokens_per_sample
from tests.planner.cli_helpers import run_cli

ZOO = Path(__file__).resolve().parents[1] / "zoo"
FILES = ("deberta_v2_ts_bare", "deberta_v2_ts_consts", "deberta_v2_dynamo_bare", "deberta_v2_dynamo_consts")
SEQ = 32
CONFIG = json.loads((ZOO / "zoo.json").read_text())["files"]["deberta_v2_ts_bare.onnx"]["config"]


@pytest.fixture(scope="module", params=FILES)
def deberta(request):
    graph = load_graph(ZOO / f"{request.param}.onnx", {"batch": 2, "seq": SEQ})
    return request.param, graph, analyze_transformer(graph)


def test_the_zoo_config_is_the_one_these_numbers_assume():
    # 2 layers of 4 heads over 64 channels (head size 16), FFN 128; c2p and p2c over 2 x 32 buckets
    assert (CONFIG["num_hidden_layers"], CONFIG["hidden_size"], CONFIG["num_attention_heads"]) == (2, 64, 4)
    assert (CONFIG["intermediate_size"], CONFIG["position_buckets"], sorted(CONFIG["pos_att_type"])) == (128, 32, ["c2p", "p2c"])
    assert CONFIG["relative_attention"] and CONFIG["share_att_key"]


def test_read_as_attention_with_the_configs_sizes(deberta):
    name, graph, model = deberta
    heads = CONFIG["num_attention_heads"]
    sizes = (model.num_layers, model.hidden_size, model.num_attention_heads, model.num_query_groups, model.head_dim,
             model.ffn_hidden_size, model.seq_length)
    # no grouped-query attention in DeBERTa: as many KV heads as heads
    assert sizes == (CONFIG["num_hidden_layers"], CONFIG["hidden_size"], heads, heads, CONFIG["hidden_size"] // heads,
                     CONFIG["intermediate_size"], SEQ), name
    assert model.vocab_size == CONFIG["vocab_size"]
    # the MLM head's transform (dense, GELU, LayerNorm) is the only linear outside the layers, as in BERT
    assert len(model.irregular) == 1 and "1 linear layer(s) outside attention" in model.irregular[0]


def test_each_layer_has_its_two_position_terms_and_projections(deberta):
    name, graph, model = deberta
    span = 2 * CONFIG["position_buckets"]
    for block in model.attention:
        assert len(block.position_scores) == len(CONFIG["pos_att_type"]) == 2
        assert len(block.position_proj) == 2  # share_att_key: query_proj and key_proj read the position table
        for i in block.position_scores:
            op = graph.ops[i]
            # [b h, s, 2k]: the query (or key) against every relative position, gathered per key afterwards
            shape = graph.tensors[op.outputs[0].tensor].shape
            assert shape == (2 * CONFIG["num_attention_heads"], SEQ, span), (name, shape)
            assert model.roles[i] == "attention-score"
        # the score itself reads Q and K, s x s
        assert graph.tensors[graph.ops[block.score].outputs[0].tensor].shape[-2:] == (SEQ, SEQ)
        # both read the shared weight: TorchScript its own initializer, dynamo a second copy it folded, which
        # is counted once (importers.parameters._find_module_copies)
        assert {model.roles[i] for i in block.position_proj} == {"qkv"}


def test_tokens_count_by_the_attention_query_length(deberta):
    name, graph, _ = deberta
    assert tokens_per_sample(graph, name) == SEQ


def test_no_flash_core_for_disentangled_attention(deberta):
    # HF's DisentangledSelfAttention is eager (bmm, masked_fill, softmax, bmm): no fused core to price
    _, graph, _ = deberta
    assert find_attention_cores(graph) == ()


def test_bert_keeps_its_flash_cores():
    graph = load_graph(ZOO / "bert_ts_bare.onnx", {"batch": 2, "seq": SEQ})
    cores = find_attention_cores(graph)
    assert len(cores) == 2 and all(c.batch_heads == 2 * 4 and c.seq_q == SEQ for c in cores)
    assert all(not a.position_scores and not a.position_proj for a in analyze_transformer(graph).attention)


def test_launchers_refuse_it_in_one_true_line(deberta):
    name, graph, model = deberta
    with pytest.raises(UnsupportedExport) as megatron:
        megatron_family(graph, model)
    assert "relative-position terms computed from its queries or keys" in megatron.value.reason
    assert "no Megatron-Core model class" in megatron.value.reason and "\n" not in megatron.value.reason
    with pytest.raises(UnsupportedExport) as titan:
        torchtitan_arch(graph)
    assert "relative-position terms computed from its queries or keys" in titan.value.reason
    assert "\n" not in titan.value.reason
    # DeepSpeed-Ulysses: 4 heads and 2 ranks would do (ulysses_problem); the position terms do not
    assert ulysses_problem(model, 2) is None and ulysses_degrees(model, 2) == []
    assert "DeepSpeed-Ulysses wraps the attention function" in unwrapped_attention(model)


def test_dtensor_refuses_tensor_parallel_degrees_only(deberta):
    # transformers' DisentangledSelfAttention views q/k/v as (num_attention_heads, -1): on a colwise shard
    # that would split each head's 16 dims, not the 4 heads; at tp=1 nothing is reshaped differently
    _, _, model = deberta
    assert _degree_problem(model, 1) is None
    for tp in (2, 4):  # 4 heads, 4 KV heads and FFN 128 divide: the position terms alone refuse
        reason = _degree_problem(model, tp)
        assert reason is not None and "disentangled attention" in reason and "\n" not in reason


def test_cli_megatron_refusal_is_one_line_exit_2():
    result = run_cli(["plan", ZOO / "deberta_v2_dynamo_consts.onnx", "-n", "8", "--dim", "batch=8",
                      "--dim", "seq=128", "--target", "megatron"], 2)
    lines = [line for line in result.stderr.strip().splitlines() if not line.startswith("warning:")]
    assert len(lines) == 1 and "no Megatron-Core model class (GPT, BERT, T5)" in lines[0], result.stderr


# ---- score_terms on hand-made graphs: what is not read as attention

def _graph(kinds: dict[int, str]) -> SimpleNamespace:
    return SimpleNamespace(ops=[SimpleNamespace(kind=kinds.get(i, "elementwise")) for i in range(max(kinds) + 1)])


def _walk_back(producers: dict[int, tuple[int, ...]]):
    return lambda starts, verdict: _walk(starts, lambda i: producers.get(i, ()), verdict)  # the recogniser's own walk


def _terms(producers, kinds, products):
    return score_terms(_graph(kinds), softmax=7, products=products, back=lambda i: producers.get(i, ()),
                       walk_back=_walk_back(producers), barrier=lambda i: kinds.get(i) in ("matmul", "softmax"))


def test_a_term_gathered_from_q_times_positions_is_read():
    # 0 q, 1 k, 2 positions (a projection), 3 = q k^T, 4 = q p^T, 5 gather(4), 6 = 3 + 5, 7 softmax
    producers = {3: (0, 1), 4: (0, 2), 5: (4,), 6: (3, 5), 7: (6,)}
    kinds = {0: "matmul", 1: "matmul", 2: "matmul", 3: "matmul", 4: "matmul", 5: "gather", 7: "softmax"}
    terms = _terms(producers, kinds, {3, 4})
    assert (terms.score, terms.products, terms.projections) == (3, (4,), (2,))


def test_two_ungathered_products_are_not_attention():
    producers = {3: (0, 1), 4: (0, 2), 6: (3, 4), 7: (6,)}
    kinds = {0: "matmul", 1: "matmul", 2: "matmul", 3: "matmul", 4: "matmul", 7: "softmax"}
    assert _terms(producers, kinds, {3, 4}) is None


def test_a_gathered_product_that_reads_neither_q_nor_k_is_not_attention():
    producers = {3: (0, 1), 4: (2, 8), 5: (4,), 6: (3, 5), 7: (6,)}
    kinds = {0: "matmul", 1: "matmul", 2: "matmul", 3: "matmul", 4: "matmul", 5: "gather", 7: "softmax", 8: "matmul"}
    assert _terms(producers, kinds, {3, 4}) is None
