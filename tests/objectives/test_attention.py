"""Attention-core recognition: one core per attention layer of every transformer we ship, in every
export style, and nothing else (a mixture-of-experts router's Softmax is not attention)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from objectives.attention import AttentionCore, attention_roles, find_attention_cores
from planner.core.graph import IterDim, Op
from planner.plan import load_graph
from tests.objectives.graphs import GraphBuilder, _acc, gpt2_like

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = json.loads((ROOT / "examples" / "models.json").read_text())
TEST_DATA = json.loads((ROOT / "tests" / "data" / "models.json").read_text())


def _small_dims(entry: dict) -> dict[str, int]:
    config = entry.get("config", {})
    dims = {}
    for name in entry.get("dims", ["batch", "seq"]):
        dims[name] = {"batch": 2, "seq": config.get("example_seq", 16), "tgt_seq": config.get("example_tgt_seq", 8)}[name]
    return dims


def _expected_cores(entry: dict) -> int:
    """Attention layers from the model's own config (not from the graph): self-attention per encoder
    or decoder layer, plus cross-attention per decoder layer of an encoder-decoder."""
    config = entry["config"]
    if "encoder_layers" in config:  # torch.nn.Transformer: 6 encoder self, 6 decoder self + 6 cross
        return config["encoder_layers"] + 2 * config["decoder_layers"]
    if "decoder_layers" in config:  # T5: encoder self, decoder self + cross
        return config["layers"] + 2 * config["decoder_layers"]
    if "heads" not in config:
        return 0  # MLP, ResNet, RNN language models
    return config["layers"]


def _head_dim(entry: dict) -> int | None:
    config = entry["config"]
    if "heads" not in config:
        return None
    return config.get("head_dim", config["hidden"] // config["heads"])


CASES = [
    pytest.param(ROOT / "examples" / entry["file"], entry, id=name)
    for name, entry in EXAMPLES.items()
    if (ROOT / "examples" / entry["file"]).exists()
] + [
    pytest.param(ROOT / "tests" / "data" / f"{name}.onnx", entry, id=name)
    for name, entry in TEST_DATA.items()
    if (ROOT / "tests" / "data" / f"{name}.onnx").exists()
]


@pytest.mark.parametrize(("path", "entry"), CASES)
def test_one_core_per_attention_layer(path, entry):
    graph = load_graph(path, _small_dims(entry))
    cores = find_attention_cores(graph)
    assert len(cores) == _expected_cores(entry)
    head_dim = _head_dim(entry)
    for core in cores:
        assert core.head_dim == head_dim
        assert core.value_dim == head_dim
        assert graph.ops[core.softmax].kind == "softmax"
        assert core.score < core.softmax < core.value


def test_llama_tiny_counts_its_softmax_nodes():
    """llama_tiny has no models.json entry: every Softmax node of the file is an attention layer's."""
    graph = load_graph(ROOT / "tests" / "data" / "llama_tiny.onnx", {"batch": 2, "seq": 16})
    assert len(find_attention_cores(graph)) == graph.raw_op_types["Softmax"] == 2


def test_sizes_of_a_dynamo_gpt2_core():
    graph = load_graph(ROOT / "tests" / "data" / "gpt2_tiny.onnx", {"batch": 3, "seq": 16})
    core = find_attention_cores(graph)[0]
    # 3 samples x 4 heads, 16 x 16 scores, head dim 64 / 4 = 16
    assert (core.batch_heads, core.seq_q, core.seq_k, core.head_dim) == (12, 16, 16, 16)
    assert core.score_elements == 12 * 16 * 16
    assert core.flops == 2.0 * 12 * 16 * 16 * (16 + 16)


def test_hand_built_gpt2_like():
    graph = gpt2_like(layers=3, hidden=64, heads=4, vocab=100, positions=32, batch=2, seq=32)
    cores = find_attention_cores(graph)
    assert len(cores) == 3
    for core, instance in zip(cores, graph.blocks[0].instances):
        names = {graph.ops[i].name for i in core.ops}
        assert names == {f"{graph.ops[instance[0]].name.split('.')[0]}.{layer}.attn.{part}"
                         for layer in [graph.ops[instance[0]].name.split('.')[1]] for part in ("qk", "softmax", "av")}
        assert (core.batch_heads, core.seq_q, core.seq_k, core.head_dim, core.value_dim) == (8, 32, 32, 16, 16)


def _attention_with(between_before: int, between_after: int, *, router: bool = False):
    """q, k, v inputs -> scores -> `between_before` parameter-free elementwise ops -> Softmax ->
    `between_after` elementwise ops -> probs @ v. ``router``: the scores come from a product with
    a weight instead (a mixture-of-experts gate)."""
    b, h, s, d = 2, 2, 8, 4
    g = GraphBuilder("attn")
    q = g.tensor("q", (b, h, s, d), role="input")
    k = g.tensor("k", (b, h, s, d), role="input")
    v = g.tensor("v", (b, h, s, d), role="input")
    scores = g.tensor("scores", (b, h, s, s))
    dims4 = (IterDim(name="b", size=b, is_batch=True), IterDim(name="h", size=h), IterDim(name="s", size=s),
             IterDim(name="t", size=s))
    if router:
        w = g.tensor("w", (d, s), role="parameter")
        g.op(Op(name="gate", kind="matmul", op_type="MatMul",
                dims=(*dims4, IterDim(name="d", size=d, kind="reduction")),
                inputs=(_acc(q, "b", "h", "s", "d"), _acc(w, "d", "t")), outputs=(_acc(scores, "b", "h", "s", "t"),),
                flops=1.0))
    else:
        g.op(Op(name="qk", kind="matmul", op_type="MatMul",
                dims=(*dims4, IterDim(name="d", size=d, kind="reduction")),
                inputs=(_acc(q, "b", "h", "s", "d"), _acc(k, "b", "h", "t", "d")),
                outputs=(_acc(scores, "b", "h", "s", "t"),), flops=1.0))
    mask = g.tensor("mask", (1, 1, s, s), role="input")
    x = scores
    for i in range(between_before):
        y = g.tensor(f"pre{i}", (b, h, s, s))
        g.op(Op(name=f"mask{i}", kind="elementwise", op_type="Add", dims=dims4,
                inputs=(_acc(x, "b", "h", "s", "t"), _acc(mask, (), (), "s", "t")),
                outputs=(_acc(y, "b", "h", "s", "t"),), flops=1.0))
        x = y
    probs = g.tensor("probs", (b, h, s, s))
    g.op(Op(name="softmax", kind="softmax", op_type="Softmax", dims=dims4, inputs=(_acc(x, "b", "h", "s", "t"),),
            outputs=(_acc(probs, "b", "h", "s", "t"),), flops=1.0))
    x = probs
    for i in range(between_after):
        y = g.tensor(f"post{i}", (b, h, s, s))
        g.op(Op(name=f"dropout{i}", kind="elementwise", op_type="Mul", dims=dims4,
                inputs=(_acc(x, "b", "h", "s", "t"),), outputs=(_acc(y, "b", "h", "s", "t"),), flops=1.0))
        x = y
    out = g.tensor("out", (b, h, s, d))
    g.op(Op(name="av", kind="matmul", op_type="MatMul",
            dims=(*dims4[:3], IterDim(name="d", size=d), IterDim(name="t", size=s, kind="reduction")),
            inputs=(_acc(x, "b", "h", "s", "t"), _acc(v, "b", "h", "t", "d")),
            outputs=(_acc(out, "b", "h", "s", "d"),), flops=1.0))
    return g.build()


@pytest.mark.parametrize(("before", "after"), [(0, 0), (1, 0), (2, 1), (0, 2)])
def test_scale_mask_and_dropout_between(before, after):
    graph = _attention_with(before, after)
    (core,) = find_attention_cores(graph)
    assert len(core.between) == before + after
    roles = attention_roles(graph)
    assert sorted(role for role, _ in roles.values()).count("between") == before + after
    assert {graph.ops[i].name for i, (role, _) in roles.items() if role == "score"} == {"qk"}
    assert (core.batch_heads, core.seq_q, core.seq_k, core.head_dim, core.value_dim) == (4, 8, 8, 4, 4)


def test_a_router_softmax_is_not_attention():
    assert find_attention_cores(_attention_with(0, 0, router=True)) == ()


def test_core_is_frozen():
    core = AttentionCore(score=0, softmax=1, value=2, batch_heads=1, seq_q=2, seq_k=3, head_dim=4, value_dim=5)
    with pytest.raises(AttributeError):
        core.score = 3  # type: ignore[misc]
    assert core.ops == (0, 1, 2)


class TestMaskOps:
    """transformers 5's decoder mask (objectives.attention.mask_ops): the zoo's TorchScript Llama gathers
    ``attention_mask.flatten()`` at ``arange(batch) * seq + arange(seq)`` (``/model/Gather_4``) and ANDs it with the
    causal comparison, then writes one additive ``Where`` per layer, fused into ``/model/And_1`` (read from the
    ONNX nodes by hand); each layer's score product adds it. Flash attention builds none of it."""

    LLAMA = ROOT / "tests" / "zoo" / "llama_ts_consts.onnx"

    @staticmethod
    def _priced(graph, attention):
        from objectives.cluster import make_cluster
        from objectives.tables import build_cost_model
        from planner.core.configs import ConfigOptions
        from planner.core.settings import TrainingSettings

        return build_cost_model(graph, cluster=make_cluster("h100-sxm", devices=1),
                                settings=TrainingSettings(engine="fused", attention=attention),
                                config_options=ConfigOptions(devices=1, devices_per_node=1))

    def test_the_mask_ops_are_the_gather_and_the_and(self):
        from objectives.attention import mask_ops

        graph = load_graph(self.LLAMA, {"batch": 2, "seq": 64})
        cores = find_attention_cores(graph)
        found = mask_ops(graph, cores)
        assert sorted(graph.ops[i].name for i in found) == ["/model/And_1", "/model/Gather_4"]
        assert {found[i].score for i in found} == {cores[0].score}  # the first layer's core reads it first
        assert {role for role, _ in attention_roles(graph).values()} == {"score", "softmax", "value", "mask"}

    @pytest.mark.parametrize("name", ["examples/gpt2.onnx", "tests/zoo/t5_ts_consts.onnx", "tests/zoo/bert_ts_consts.onnx"])
    def test_no_mask_op_where_none_is_built_on_the_grid(self, name):
        # GPT-2's dynamo export has no attention_mask input; T5's relative bias reads its table (a parameter);
        # BERT's padding mask is per key ([b, 1, 1, s]), not on the grid
        from objectives.attention import mask_ops

        graph = load_graph(ROOT / name, {"batch": 2, "seq": 64, "tgt_seq": 16})
        assert mask_ops(graph, find_attention_cores(graph)) == {}

    def test_flash_prices_no_mask_explicit_attention_does(self):
        import numpy as np

        from objectives.attention import grid_inputs

        graph = load_graph(self.LLAMA, {"batch": 2, "seq": 64})
        masks = [i for i, op in enumerate(graph.ops) if op.name in ("/model/And_1", "/model/Gather_4")]
        score = find_attention_cores(graph)[0].score
        flash, explicit = self._priced(graph, "flash"), self._priced(graph, "explicit")
        for i in masks:
            assert np.all(flash.op_details[i].time_s == 0) and np.all(flash.op_details[i].memory.activations_bytes == 0)
            assert np.all(explicit.op_details[i].time_s > 0)
        # the score product reads the mask on its grid (the flash price leaves that operand out), Q and K off it
        (mask_input,) = [k for k, a in enumerate(graph.ops[score].inputs) if a.tensor.endswith("Where_2_output_0")]
        assert grid_inputs(graph.ops[score]) == (mask_input,)
