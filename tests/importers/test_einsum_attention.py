"""Einsum-form attention is read as attention (issue 25): ``Einsum -> (scale, mask) -> Softmax -> Einsum``,
as XLNet and Funnel write Transformer-XL's relative attention (importers/transformer.py, importers/attention_terms.py).

Before, XLNet and Funnel read as "no attention (matmul -> softmax -> matmul)": Funnel's per-head bias
``q + r_w_bias``, fused into the score einsum, made it a linear layer (a parameter indexed by a reduction and an
output dim), and XLNet's position term reaches the softmax through a relative shift written as a reshape and a
slice, no index gather, so no product was the score. Now two activations sharing a reduction are a product of
activations whatever is fused in, and the score is the one product whose operands both read the model's inputs
(the position operand is computed from parameters and constants alone).

The hand-built graphs (onnx.helper, static shapes) are Transformer-XL layers with 3-D einsum weights; their
expected sizes and FLOPs are worked out by hand below. The real files are ``tests/data/einsum_attention_cases``
(``make_einsum_attention_cases.py``), whose sizes are their transformers configs'.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper, numpy_helper

from exporters._tp import AUTOTP_LINEARS, DTENSOR_LINEARS, tp_layout
from exporters.deepspeed.export import _autotp_problem
from exporters.megatron.families import megatron_family
from exporters.torchtitan.families import torchtitan_arch
from importers.transformer import analyze_transformer
from planner.core.errors import UnsupportedExport
from planner.plan import load_graph
from tests.planner.cli_helpers import run_cli

DATA = Path(__file__).resolve().parents[1] / "data" / "einsum_attention_cases"
B, S, H, N, D, F, V, L = 2, 16, 32, 4, 8, 128, 64, 2
"""Batch, tokens, hidden, heads, head size (H / N), FFN, vocabulary, layers of the hand-built graphs."""


class _Builder:
    def __init__(self, seed: int = 0) -> None:
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self.rng = np.random.default_rng(seed)
        self.count = 0

    def param(self, name: str, *shape: int) -> str:
        self.inits.append(numpy_helper.from_array((0.02 * self.rng.standard_normal(shape)).astype(np.float32), name))
        return name

    def const(self, value: np.ndarray) -> str:
        self.count += 1
        name = f"c{self.count}"
        self.nodes.append(helper.make_node("Constant", [], [name], value=numpy_helper.from_array(value, name)))
        return name

    def node(self, op: str, inputs: list[str], name: str, **attrs) -> str:
        self.nodes.append(helper.make_node(op, inputs, [name], name=name, **attrs))
        return name


def _layer(g: _Builder, x: str, i: int, *, equations: dict[str, str], relative: bool) -> str:
    """One pre-norm layer: einsum attention (Transformer-XL's relative terms when ``relative``), then a ReLU MLP."""
    p = f"l{i}"
    h = g.node("LayerNormalization", [x, g.param(f"{p}.ln1.w", H), g.param(f"{p}.ln1.b", H)], f"{p}/ln1", axis=-1)
    q, k, v = (g.node("Einsum", [h, g.param(f"{p}.{w}", H, N, D)], f"{p}/{w}", equation=equations["proj"])
               for w in ("q", "k", "v"))
    if relative:  # scores = (q + u) k^T + shift((q + v') r^T), r = the sinusoid table projected, as XLNet and Funnel
        table = np.concatenate([np.sin(np.outer(np.arange(2 * S, 0, -1), 1e-2 * np.arange(H // 2))),
                                np.cos(np.outer(np.arange(2 * S, 0, -1), 1e-2 * np.arange(H // 2)))], 1)
        r = g.node("Einsum", [g.const(table.astype(np.float32)), g.param(f"{p}.r", H, N, D)], f"{p}/r", equation="rh,hnd->rnd")
        qu = g.node("Add", [q, g.param(f"{p}.r_w_bias", N, D)], f"{p}/qu")
        qv = g.node("Add", [q, g.param(f"{p}.r_r_bias", N, D)], f"{p}/qv")
        ac = g.node("Einsum", [qu, k], f"{p}/ac", equation="bind,bjnd->bnij")
        bd = g.node("Einsum", [qv, r], f"{p}/bd", equation="bind,rnd->bnir")  # [b, n, s, 2s]
        bd = g.node("Reshape", [bd, g.const(np.array([B, N, 2 * S, S], np.int64))], f"{p}/shift1")
        bd = g.node("Slice", [bd, g.const(np.array([1])), g.const(np.array([2 * S])), g.const(np.array([2]))], f"{p}/shift2")
        bd = g.node("Reshape", [bd, g.const(np.array([B, N, S, 2 * S - 1], np.int64))], f"{p}/shift3")
        bd = g.node("Slice", [bd, g.const(np.array([0])), g.const(np.array([S])), g.const(np.array([3]))], f"{p}/shift4")
        scores = g.node("Add", [ac, bd], f"{p}/add_scores")
    else:
        scores = g.node("Einsum", [q, k], f"{p}/score", equation=equations["score"])
    scores = g.node("Mul", [scores, g.const(np.array(1 / math.sqrt(D), np.float32))], f"{p}/scale")
    probs = g.node("Softmax", [scores], f"{p}/softmax", axis=-1)
    ctx = g.node("Einsum", [probs, v], f"{p}/value", equation=equations["value"])
    out = g.node("Einsum", [ctx, g.param(f"{p}.o", N, D, H)], f"{p}/o", equation=equations["out"])
    x = g.node("Add", [x, out], f"{p}/res1")
    h = g.node("LayerNormalization", [x, g.param(f"{p}.ln2.w", H), g.param(f"{p}.ln2.b", H)], f"{p}/ln2", axis=-1)
    h = g.node("Add", [g.node("MatMul", [h, g.param(f"{p}.fc1.w", H, F)], f"{p}/fc1"), g.param(f"{p}.fc1.b", F)], f"{p}/fc1b")
    h = g.node("Relu", [h], f"{p}/relu")
    h = g.node("Add", [g.node("MatMul", [h, g.param(f"{p}.fc2.w", F, H)], f"{p}/fc2"), g.param(f"{p}.fc2.b", H)], f"{p}/fc2b")
    return g.node("Add", [x, h], f"{p}/res2")


PLAIN = {"proj": "bsh,hnd->bnsd", "score": "bnqd,bnkd->bnqk", "value": "bnqk,bnkd->bqnd", "out": "bqnd,ndh->bqh"}
"""Batch-first einsum attention, the generic form (``torch.einsum("bnqd,bnkd->bnqk", q, k)``)."""
LETTERS = {"proj": "zyx,xwv->zwyv", "score": "zwyv,zwuv->zwyu", "value": "zwyu,zwuv->zywv", "out": "zywv,wvx->zyx"}
"""The same contractions under other letters: nothing reads the equations as strings."""
ELLIPSIS = {"proj": "bsh,hnd->bnsd", "score": "...qd,...kd->...qk", "value": "...qk,...kd->...qd",
            "out": "bnqd,ndh->bqh"}
"""The score and value with the batch and heads under an ellipsis."""
RELATIVE = {"proj": "bih,hnd->bind", "value": "bnij,bjnd->bind", "out": "bind,ndh->bih"}
"""Transformer-XL's layout (XLNet's equations, batch-first): heads after the tokens."""


def _save(tmp_path: Path, equations: dict[str, str], *, relative: bool = False) -> Path:
    g = _Builder()
    x = g.node("Gather", [g.param("emb", V, H), "ids"], "embed")
    for i in range(L):
        x = _layer(g, x, i, equations=equations, relative=relative)
    x = g.node("LayerNormalization", [x, g.param("lnf.w", H), g.param("lnf.b", H)], "lnf", axis=-1)
    g.node("MatMul", [x, g.param("head", H, V)], "logits")
    graph = helper.make_graph(g.nodes, "einsum_attention", [helper.make_tensor_value_info("ids", T.INT64, [B, S])],
                              [helper.make_tensor_value_info("logits", T.FLOAT, [B, S, V])], initializer=g.inits)
    path = tmp_path / "einsum_attention.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def _op(graph, name: str) -> int:
    return next(i for i, op in enumerate(graph.ops) if name in op.onnx_nodes)


@pytest.mark.parametrize("equations", [PLAIN, LETTERS, ELLIPSIS], ids=["plain", "letters", "ellipsis"])
def test_einsum_attention_has_the_built_sizes(tmp_path, equations):
    graph = load_graph(_save(tmp_path, equations), {})
    model = analyze_transformer(graph)
    sizes = (model.num_layers, model.hidden_size, model.num_attention_heads, model.num_query_groups, model.head_dim,
             model.ffn_hidden_size, model.seq_length, model.vocab_size)
    assert sizes == (L, H, N, N, D, F, S, V)
    assert model.irregular == ()
    for i, block in enumerate(model.attention):
        assert graph.ops[block.score].name == f"l{i}/score" and graph.ops[block.value].name == f"l{i}/value"
        # q k^T: 2 FLOPs per (b, n, q, k, d) point, and p v likewise; the 1/sqrt(d) Mul fused in is one per score
        assert graph.ops[block.score].flops == 2 * B * N * S * S * D + B * N * S * S
        assert graph.ops[block.value].flops == 2 * B * N * S * S * D
        assert [model.roles[j] for j in (*block.q_proj, *block.k_proj, *block.v_proj)] == ["qkv"] * 3


@pytest.mark.parametrize("equations", [PLAIN, LETTERS, ELLIPSIS], ids=["plain", "letters", "ellipsis"])
def test_tensor_parallelism_splits_the_heads(tmp_path, equations):
    graph = load_graph(_save(tmp_path, equations), {})
    model = analyze_transformer(graph)
    layout = tp_layout(graph, model, target="megatron")
    for block in model.attention:
        for index in (block.score, block.value):
            split = layout.rules[index].split
            assert [graph.ops[index].dim(d).size for d in split] == [N]  # the 4 heads, no other dim
        for index in (*block.q_proj, *block.out_proj):  # column-parallel [h, n, d] (heads first), row-parallel [n, d, h]
            split = layout.rules[index].split
            assert graph.ops[index].dim(split[0]).size == N


def test_relative_einsum_attention_is_attention_with_a_position_term(tmp_path):
    graph = load_graph(_save(tmp_path, RELATIVE, relative=True), {})
    model = analyze_transformer(graph)
    assert (model.num_layers, model.num_attention_heads, model.head_dim, model.hidden_size, model.ffn_hidden_size) == (
        L, N, D, H, F)
    assert model.seq_length == S and model.irregular == ()
    for i, block in enumerate(model.attention):
        # the content score reads q + r_w_bias (fused in) and k; the position term q + r_r_bias against the table
        assert f"l{i}/ac" in graph.ops[block.score].onnx_nodes
        assert [graph.ops[j].name for j in block.position_scores] == [f"l{i}/bd"]
        assert [graph.ops[j].name for j in block.position_proj] == [f"l{i}/r"]
        assert model.roles[block.position_scores[0]] == "attention-score"
        # [b, n, s, 2s] relative scores: 2 b n s (2s) d FLOPs; both bias Adds joined the query's projection
        assert graph.ops[block.position_scores[0]].flops == 2 * B * N * S * (2 * S) * D
        assert graph.ops[block.q_proj[0]].flops == 2 * B * S * H * N * D + 2 * B * S * N * D
        # the [2s, h] table projected to [2s, n, d] once per step: 2 (2s) h n d, no batch
        assert graph.ops[block.position_proj[0]].flops == 2 * (2 * S) * H * N * D
        layout = tp_layout(graph, model, target="megatron")
        for index in (block.score, *block.position_scores, *block.position_proj):
            assert graph.ops[index].dim(layout.rules[index].split[0]).size == N


def test_megatron_refuses_the_relative_terms_not_the_attention(tmp_path):
    graph = load_graph(_save(tmp_path, RELATIVE, relative=True), {})
    with pytest.raises(UnsupportedExport) as refused:
        megatron_family(graph, analyze_transformer(graph))
    assert "relative-position terms" in refused.value.reason and "no attention" not in refused.value.reason
    plain = load_graph(_save(tmp_path, PLAIN), {})
    with pytest.raises(UnsupportedExport) as bert:  # unmasked: an encoder, compared with Megatron's BERT as one
        megatron_family(plain, analyze_transformer(plain))
    assert bert.value.reason.startswith("Megatron-LM's BERT") and "its MLP uses ReLU" in bert.value.reason


def test_deepspeed_autotp_refuses_einsum_projections(tmp_path):
    # AutoTP partitions torch.nn.Linear layers; these projections are [h, n, d] Parameters multiplied by torch.einsum
    graph = load_graph(_save(tmp_path, PLAIN), {})
    problem = _autotp_problem(graph, analyze_transformer(graph), 2)
    assert problem == f"projection l0/q multiplies its weight l0.q with torch.einsum, not as a torch.nn.Linear layer; {AUTOTP_LINEARS}"


@pytest.mark.parametrize("target, shards", [("deepspeed", AUTOTP_LINEARS), ("dtensor", DTENSOR_LINEARS)])
def test_a_pinned_tp_says_which_projection_no_linear_shards(target, shards):
    # XLNet's q, k, v, o and r are [d, n, d_head] Parameters read by torch.einsum: both launchers run tp 1 only
    result = run_cli(["plan", DATA / "xlnet_ts_bare.onnx", "-n", "8", "--dim", "batch=8", "--dim", "seq=64",
                      "--target", target, "--fix", "tp=2"], 2)
    lines = [line for line in result.stderr.strip().splitlines() if not line.startswith("warning:")]
    assert len(lines) == 1 and f"{target} runs tp 1 on this model at 8 devices (tp=2: projection " in lines[0]
    assert "rel_attn.q with torch.einsum, not as a torch.nn.Linear layer; " + shards in lines[0]


# ---- the real files: XLNet and Funnel as transformers 5.24 builds them (make_einsum_attention_cases.py)

COUNTS = json.loads((DATA / "counts.json").read_text())


def test_xlnet_is_read_as_its_config():
    config = COUNTS["xlnet_ts_bare.onnx"]["config"]
    graph = load_graph(DATA / "xlnet_ts_bare.onnx", {"batch": 2, "seq": 64})
    model = analyze_transformer(graph)
    heads = config["n_head"]
    assert (model.num_layers, model.hidden_size, model.num_attention_heads, model.head_dim, model.ffn_hidden_size) == (
        config["n_layer"], config["d_model"], heads, config["d_model"] // heads, config["d_inner"])
    assert model.seq_length == 64 and model.irregular == ()
    for block in model.attention:
        # bd: the query against 2 x 64 relative positions (klen + qlen, no memory), projected by r
        (term,) = block.position_scores
        assert graph.tensors[graph.ops[term].outputs[0].tensor].shape == (2, heads, 64, 128)
        assert len(block.position_proj) == 1


def test_torchtitan_names_xlnets_relative_terms_and_no_rotary_embedding():
    # its sinusoid table's frequencies (a geometric constant from 1) are no RoPE's: positions come from the terms
    graph = load_graph(DATA / "xlnet_ts_bare.onnx", {"batch": 2, "seq": 64})
    with pytest.raises(UnsupportedExport) as refused:
        torchtitan_arch(graph)
    assert "relative-position terms computed from its queries or keys" in refused.value.reason
    assert "rotates" not in refused.value.reason and "\n" not in refused.value.reason


def test_funnel_is_read_as_its_config():
    config = COUNTS["funnel_ts_bare.onnx"]["config"]
    graph = load_graph(DATA / "funnel_ts_bare.onnx", {"batch": 2, "seq": 64})
    model = analyze_transformer(graph)
    # blocks [1, 1] and one decoder layer: 3 attentions of 4 heads of 32 channels
    assert len(model.attention) == sum(config["block_sizes"]) + config["num_decoder_layers"]
    assert (model.num_attention_heads, model.head_dim, model.hidden_size, model.ffn_hidden_size) == (
        config["n_head"], config["d_head"], config["d_model"], config["d_inner"])
    # the second block attends from the pooled 32 queries to the 64 keys: the others 64 to 64
    assert [graph.tensors[graph.ops[a.score].outputs[0].tensor].shape[-2:] for a in model.attention] == [
        (64, 64), (32, 64), (64, 64)]
    for block in model.attention:
        assert len(block.position_scores) == 1 and len(block.position_proj) == 1
        # the token-type term, q against the 2-row seg_embed, is the attention's own (no extra linear)
        tables = [i for i in block.glue if graph.ops[i].kind == "matmul"]
        assert len(tables) == 1 and graph.ops[tables[0]].dim("s").size == 2
    assert not any("linear layer(s) outside" in reason for reason in model.irregular)

