"""DeepSeek-V3-style MoE routers in the Megatron export (issue 25: exact or refused).

The file of ``tests/data/megatron_moe`` (``tests/integration/make_megatron_moe.py``; config in its
``counts.json``) routes as megatron-core's ``TopKRouter`` does with the router flags, so it goes out with
them, each read from the graph; ``tests/data/moe_cases``' routers do not (a group scored by the sum of its top 2
where megatron-core sums the top ``topk / group_topk = 1``; a graph-only file whose scaling factor was
stripped), so they are refused in one line naming why. The router rules themselves are checked on readings
written by hand: every flag value below is the config's, or megatron-core's rule worked by hand."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from exporters import export
from exporters.megatron.families import megatron_family
from exporters._moe_layout import _layer_of, explained_irregular, moe_layout
from exporters.megatron.moe import EXPERT_BIAS_NOTE, megatron_moe_args, megatron_router_args, moe_layer_freq
from exporters.validate import megatron_violations, parse_megatron_args
from importers.moe_router import RouterReading
from importers.transformer import analyze_transformer, moe_summary
from objectives.cluster import make_cluster
from planner.core.errors import UnsupportedExport
from planner.launchable import plan_launchable_file, row_plan_input
from planner.plan import PlanRequest
from planner.pricing import load_graph

ROOT = Path(__file__).resolve().parents[2]
CASES = ROOT / "tests" / "data" / "megatron_moe"
CONFIG = json.loads((CASES / "counts.json").read_text())["config"]
REFUSED = ROOT / "tests" / "data" / "moe_cases"
DIMS = {"batch": 4, "seq": 16}


@pytest.fixture(scope="module")
def exported():
    """The Megatron export of the first Megatron row at 2 devices (the one plan of this module): dp=2 x ep=2
    (at 8 devices the first row launches on 1 device; the router's flags do not depend on the degrees)."""
    request = PlanRequest(cluster=make_cluster("a100-80gb", devices=2, devices_per_node=8))
    _, (found,) = plan_launchable_file(CASES / "deepseek_v3_megatron_ts_consts.onnx", DIMS, [request],
                                       launchers=("megatron",))
    rows = [row for row in found.rows if "megatron" in row.targets]
    assert rows, f"no Megatron-LM row: {found.refused}"
    return export("megatron", row_plan_input(rows[0]))


def test_the_export_writes_the_router_read_from_the_graph(exported):
    args = parse_megatron_args(exported["args"])
    assert (args["num-experts"], args["moe-router-topk"]) == (CONFIG["n_routed_experts"], CONFIG["num_experts_per_tok"])
    assert args["moe-router-score-function"] == "sigmoid" and args["moe-router-enable-expert-bias"]
    assert (args["moe-router-num-groups"], args["moe-router-group-topk"]) == (CONFIG["n_group"], CONFIG["topk_group"])
    assert float(args["moe-router-topk-scaling-factor"]) == CONFIG["routed_scaling_factor"]  # 2.5
    assert "moe-router-pre-softmax" not in args  # megatron-core reads it for softmax routers only
    assert EXPERT_BIAS_NOTE in exported["notes"]
    assert not megatron_violations(args, world_size=exported["world_size"], env=exported["env"])


def test_the_dense_first_layer_is_the_layer_pattern(exported):
    args = parse_megatron_args(exported["args"])
    dense = CONFIG["first_k_dense_replace"]  # 1 of 3 layers
    assert exported["args"][exported["args"].index("--moe-layer-freq") + 1] == "([0]*1+[1]*2)"
    assert args["moe-layer-freq"] == [0] * dense + [1] * (CONFIG["num_hidden_layers"] - dense)
    assert (args["ffn-hidden-size"], args["moe-ffn-hidden-size"]) == (CONFIG["intermediate_size"],
                                                                       CONFIG["moe_intermediate_size"])  # 128, 32
    assert args["moe-shared-expert-intermediate-size"] == CONFIG["n_shared_experts"] * CONFIG["moe_intermediate_size"]
    assert args["normalization"] == "RMSNorm"  # the router's divide by a sum is not one of the layers' norms
    assert args["multi-latent-attention"] and args["num-layers"] == 3


def test_the_dynamo_file_reads_the_same():
    graph = load_graph(CASES / "deepseek_v3_megatron_dynamo_consts.onnx", DIMS)
    model = analyze_transformer(graph)
    assert megatron_family(graph, model).script == "pretrain_gpt.py"
    layout = moe_layout(graph, model)
    assert layout is not None and layout.pattern == (0, 1, 1) and (layout.expert_ffn, layout.dense_ffn) == (32, 128)
    assert layout.router == RouterReading(score_function="sigmoid", num_experts=8, top_k=4, groups=4, topk_groups=2,
                                          group_score_k=2, expert_bias=True, scaling=2.5)


def test_interleaved_moe_layers_are_the_layer_pattern():
    # Qwen3-MoE, decoder_sparse_step = 2: layers 1 and 3 of 0-3 route ((i + 1) % 2 == 0), a softmax top-2
    # renormalised (megatron-core's default router), dense layers of 128 and experts of 32
    sparse = json.loads((CASES / "counts.json").read_text())["sparse"]
    graph = load_graph(CASES / "qwen3_moe_sparse_ts_consts.onnx", DIMS)
    model = analyze_transformer(graph)
    layout = moe_layout(graph, model)
    assert megatron_family(graph, model).script == "pretrain_gpt.py" and layout is not None
    assert layout.pattern == (0, 1, 0, 1) and (layout.dense_ffn, layout.expert_ffn) == (
        sparse["intermediate_size"], sparse["moe_intermediate_size"])
    args = megatron_moe_args(moe_summary(graph), ep=1, layout=layout, model=model)
    assert args == ["--num-experts", "4", "--moe-router-topk", "2", "--expert-model-parallel-size", "1",
                    "--moe-ffn-hidden-size", "32", "--moe-layer-freq", "([0]*1+[1]*1+[0]*1+[1]*1)", "--moe-grouped-gemm"]


def _refusal(name: str) -> str:
    graph = load_graph(REFUSED / name, DIMS)
    model = analyze_transformer(graph)
    with pytest.raises(UnsupportedExport) as caught:
        megatron_moe_args(moe_summary(graph), ep=1, layout=moe_layout(graph, model), model=model)
    return str(caught.value)


def test_a_group_score_megatron_does_not_compute_is_refused():
    # top-2 of the top 2 of 4 groups, a group scored by the sum of its top 2: megatron-core sums 2 // 2 = 1
    why = _refusal("deepseek_v3_ts_consts.onnx")
    assert "\n" not in why and "by the sum of its top 2 experts" in why and "topk / group_topk = 2 / 2 = 1" in why


def test_a_stripped_scaling_factor_is_refused():
    # the dynamo exporter keeps routed_scaling_factor as a one-element initializer, external in a bare file
    why = _refusal("deepseek_v3_dynamo_bare.onnx")
    assert "a factor whose constant is not in the file" in why and "topk / group_topk" in why


DEEPSEEK_V3 = RouterReading(score_function="sigmoid", num_experts=256, top_k=8, groups=8, topk_groups=4,
                            group_score_k=2, expert_bias=True, scaling=2.5)
"""DeepSeek-V3's published router (its config: 256 experts, 8 per token, 8 groups of which 4 kept, 2.5)."""


def test_deepseek_v3s_router_flags():
    assert megatron_router_args(DEEPSEEK_V3, renormalized=True) == [
        "--moe-router-score-function", "sigmoid", "--moe-router-enable-expert-bias", "--moe-router-num-groups", "8",
        "--moe-router-group-topk", "4", "--moe-router-topk-scaling-factor", "2.5"]


@pytest.mark.parametrize("reading, renormalized, clause", [
    # megatron-core divides sigmoid top-k scores by their sum whenever topk > 1
    (DEEPSEEK_V3, False, "keeps the top-k scores as they are"),
    # and keeps a top-1 score as it is (transformers' norm_topk_prob makes it 1)
    (RouterReading(score_function="sigmoid", num_experts=8, top_k=1), True, "divides the score by itself"),
    (RouterReading(score_function="sigmoid", num_experts=8, top_k=2, expert_bias=True, weights_unbiased=False), True,
     "include the score bias"),
    (RouterReading(score_function="softmax", num_experts=8, top_k=2, expert_bias=True), True, "sigmoid routers only"),
    # TransformerConfig: "Please use --moe-router-pre-softmax when topk is 1"
    (RouterReading(score_function="softmax", num_experts=8, top_k=1), True, "needs --moe-router-pre-softmax"),
    (RouterReading(score_function="softmax", num_experts=8, top_k=4, groups=4, topk_groups=2, group_score_k=2), True,
     "ranks the groups on the logits"),
    # DeepSeek-V2's group score is a max (top 1) where megatron-core sums the top 6 / 3 = 2
    (RouterReading(score_function="softmax", num_experts=160, top_k=6, groups=8, topk_groups=3, group_score_k=1), False,
     "topk / group_topk = 6 / 3 = 2"),
    (RouterReading(score_function="sigmoid", num_experts=8, top_k=4, groups=4, topk_groups=2, group_score_k=None), True,
     "lost their shape"),
    (RouterReading(score_function="unknown", num_experts=8, top_k=2), True, "neither a softmax nor a sigmoid"),
])
def test_routers_megatron_computes_differently_are_refused_in_one_line(reading, renormalized, clause):
    with pytest.raises(UnsupportedExport) as caught:
        megatron_router_args(reading, renormalized=renormalized)
    assert clause in str(caught.value) and "\n" not in str(caught.value)


def test_a_softmax_router_without_renormalisation_groups_with_pre_softmax():
    reading = RouterReading(score_function="softmax", num_experts=8, top_k=4, groups=4, topk_groups=2, group_score_k=2)
    assert megatron_router_args(reading, renormalized=False) == [
        "--moe-router-pre-softmax", "--moe-router-num-groups", "4", "--moe-router-group-topk", "2"]
    plain = RouterReading(score_function="softmax", num_experts=8, top_k=2)
    assert megatron_router_args(plain, renormalized=True) == []  # Mixtral: megatron-core's default router


def test_the_layer_pattern_is_run_length_and_parses_back():
    assert moe_layer_freq((0, 0, 0) + (1,) * 58) == "([0]*3+[1]*58)"  # DeepSeek-V3: first_k_dense_replace = 3 of 61
    pattern = (1, 0, 1, 1)
    text = moe_layer_freq(pattern)
    assert text == "([1]*1+[0]*1+[1]*2)"
    assert parse_megatron_args(["--moe-layer-freq", text])["moe-layer-freq"] == list(pattern)


def test_the_layer_of_an_op_is_the_last_attention_before_it():
    # three layers whose attentions start at ops 10, 40 and 70: a TopK at op 55 is layer 1's
    model = SimpleNamespace(attention=[SimpleNamespace(q_proj=(s,), score=s + 3) for s in (10, 40, 70)])
    assert [_layer_of(model, i) for i in (12, 39, 55, 70, 99)] == [0, 0, 1, 2, 2]


def test_only_the_dense_layers_irregularities_are_explained():
    layout = SimpleNamespace(pattern=(0, 1, 1), dense_uniform=True)
    model = SimpleNamespace(num_layers=3, irregular=("the MLP blocks differ in size", "3 layers but 2 with shared experts",
                                                     "2 linear layer(s) outside attention, MLP and LM head, e.g. x"))
    assert explained_irregular(model, layout) == ("2 linear layer(s) outside attention, MLP and LM head, e.g. x",)
    assert explained_irregular(model, SimpleNamespace(pattern=(1, 1, 1), dense_uniform=True)) == model.irregular
    # dense layers of two sizes: --ffn-hidden-size says one
    assert "the MLP blocks differ in size" in explained_irregular(model, SimpleNamespace(pattern=(0, 1, 1),
                                                                                         dense_uniform=False))


def test_the_validator_knows_megatron_cores_router_rules():
    base = ["--num-layers", "3", "--hidden-size", "64", "--num-attention-heads", "4", "--max-position-embeddings",
            "64", "--micro-batch-size", "1"]
    assert megatron_violations(base + ["--moe-layer-freq", "([0]*1+[1]*2)"], world_size=1) == [
        "--moe-layer-freq needs --num-experts"]
    found = megatron_violations(base + ["--num-experts", "8", "--moe-router-topk", "1", "--moe-router-enable-expert-bias",
                                        "--moe-router-group-topk", "2", "--moe-layer-freq", "[1]*4"], world_size=1)
    assert found == ["--moe-router-enable-expert-bias only supports --moe-router-score-function sigmoid",
                     "Please use --moe-router-pre-softmax when topk is 1.",
                     "When using group limited routing, --moe-router-num-groups must be specified.",
                     "--moe-layer-freq's list must hold one 0 (dense) or 1 (MoE) per layer (3 layers; got 4 entries)"]
    assert megatron_violations(base + ["--num-experts", "8", "--moe-router-num-groups", "3", "--moe-router-group-topk",
                                       "2"], world_size=1) == [
        "--num-experts (8) must be divisible by --moe-router-num-groups (3), which must be at least "
        "--moe-router-group-topk (2)"]
