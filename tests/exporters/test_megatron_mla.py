"""Multi-latent attention in the Megatron export (issue 25 item 3: exact or refused): the DeepSeek-V3-style
files of ``tests/data/mla_cases`` (configs in its ``counts.json``) go out with ``--multi-latent-attention``
and their latent and head sizes, their latents' norms as ``--qk-layernorm`` and the rotary embedding over
the rope channels only; a YaRN-scaled one is refused in one line; tensor parallelism splits the heads of
the up-projections and the output projection and replicates the down-projections, as megatron-core's
MLA layer spec does, and the DTensor and DeepSpeed AutoTP plans say the same; the planner plans the files
at 8 and 64 devices."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from exporters import export
from exporters._tp import tp_layout
from exporters.megatron.families import megatron_family
from exporters.megatron.mla import YARN_REFUSAL
from exporters.validate import megatron_violations, parse_megatron_args
from importers.transformer import analyze_transformer, head_dims, output_side_dims, reduction_side_dims
from objectives.cluster import make_cluster
from planner.core.errors import UnsupportedExport
from planner.launchable import plan_launchable_file, row_plan_input
from planner.plan import PlanRequest, load_graph

CASES = Path(__file__).resolve().parents[2] / "tests" / "data" / "mla_cases"
CONFIGS = json.loads((CASES / "counts.json").read_text())["configs"]


def _rows(name: str, devices: int, dims: dict[str, int]):
    request = PlanRequest(cluster=make_cluster("a100-80gb", devices=devices, devices_per_node=8))
    _, (found,) = plan_launchable_file(CASES / name, dims, [request], launchers=("megatron",))
    return [row for row in found.rows if "megatron" in row.targets]


@pytest.fixture(scope="module")
def rows_at_8():
    return _rows("mla_ts_bare.onnx", 8, {"batch": 16, "seq": 64})


def test_the_export_says_the_latent_sizes(rows_at_8):
    config = CONFIGS["mla"]
    assert rows_at_8, "no Megatron-LM row for the MLA model"
    for row in rows_at_8[:4]:
        out = export("megatron", row_plan_input(row))
        args = parse_megatron_args(out["args"])
        assert args["multi-latent-attention"] and args["qk-layernorm"] and args["rope-type"] == "rope"
        assert (args["q-lora-rank"], args["kv-lora-rank"]) == (config["q_lora_rank"], config["kv_lora_rank"])
        # Megatron's qk_head_dim is DeepSeek's qk_nope_head_dim; qk_pos_emb_head_dim its qk_rope_head_dim
        assert (args["qk-head-dim"], args["qk-pos-emb-head-dim"], args["v-head-dim"]) == (16, 8, 20)
        assert args["num-attention-heads"] == 4 and "num-query-groups" not in args
        assert "rotary-percent" not in args  # all 8 rope channels turn (the file's 4 frequencies)
        assert not megatron_violations(args, world_size=out["world_size"], env=out["env"])


def test_a_full_rank_query_has_no_q_lora_rank():
    rows = _rows("mla_lite_ts_consts.onnx", 2, {"batch": 16, "seq": 64})  # the latent flags do not depend on devices
    args = parse_megatron_args(export("megatron", row_plan_input(rows[0]))["args"])
    assert args["multi-latent-attention"] and "q-lora-rank" not in args and args["kv-lora-rank"] == 16


def test_yarn_is_refused_in_one_line():
    graph = load_graph(CASES / "mla_yarn_ts_consts.onnx", {"batch": 2, "seq": 16})
    with pytest.raises(UnsupportedExport) as refused:
        megatron_family(graph, analyze_transformer(graph))
    assert YARN_REFUSAL in refused.value.reason and "\n" not in refused.value.reason


def test_tensor_parallelism_splits_the_heads_and_replicates_the_latents():
    graph = load_graph(CASES / "mla_ts_bare.onnx", {"batch": 2, "seq": 16})
    model = analyze_transformer(graph)
    rules = tp_layout(graph, model, target="megatron").rules

    for block in model.attention:
        mla, score = block.mla, block.score
        heads = model.classes.of[score][head_dims(graph, graph.ops[score])[0]]  # this layer's heads

        def head_split(i: int, dims: tuple[str, ...]) -> bool:
            return rules[i].split == dims and model.classes.of[i][dims[0]] == heads

        for down in (mla.q_down, mla.kv_down):  # TELinear(parallel_mode="duplicated"), on the sequence shard
            assert rules[down].split == () and rules[down].sequence is not None and rules[down].sequence_required
        for up in (mla.q_up, mla.kv_up):  # column-parallel over heads: 4 x 24 and 4 x (16 + 20) columns
            assert head_split(up, output_side_dims(graph, graph.ops[up]))
        (o_proj,) = block.out_proj  # row-parallel over the heads of its 4 x 20 inputs
        assert head_split(o_proj, reduction_side_dims(graph, graph.ops[o_proj]))  # (heads, 20), heads outer


def test_the_planner_plans_it_at_64_devices():
    rows = _rows("mla_ts_bare.onnx", 64, {"batch": 128, "seq": 64})
    assert rows
    # Megatron splits 4 heads at most 4 ways (TransformerConfig: heads % tp == 0)
    tps = {parse_megatron_args(export("megatron", row_plan_input(r))["args"])["tensor-model-parallel-size"]
           for r in rows[:6]}
    assert tps and all(4 % tp == 0 for tp in tps)


def test_the_dtensor_plan_is_torchtitans_deepseek_plan():
    # torchtitan's DeepSeek-V3 parallelize (core_v0.16.1's layout too): wq_a / wkv_a NoParallel (replicated),
    # wq_b / wkv_b colwise over heads (kv_b's columns are per head, not a packed K | V), wo rowwise
    request = PlanRequest(cluster=make_cluster("a100-80gb", devices=2, devices_per_node=8))  # tp=2 rows: the same plan
    _, (found,) = plan_launchable_file(CASES / "mla_ts_bare.onnx", {"batch": 16, "seq": 64}, [request],
                                       launchers=("dtensor",))
    row = next(r for r in found.rows if "dtensor" in r.targets and r.degrees.tp > 1 and " sp" not in r.layout)
    plan = export("dtensor", row_plan_input(row))["tp_plan"]
    attn = "model.model.layers.*.self_attn."
    assert {k[len(attn):]: v["style"] for k, v in plan.items() if k.startswith(attn)} == {
        "q_b_proj": "colwise", "kv_b_proj": "colwise", "o_proj": "rowwise"}
    assert "packed" not in plan[attn + "kv_b_proj"]


def test_no_dtensor_row_is_sequence_parallel():
    # exporters/dtensor/export.py: the replicated down-projections would read sequence-sharded DTensors
    from exporters.dtensor.export import dtensor_families

    graph = load_graph(CASES / "mla_ts_bare.onnx", {"batch": 2, "seq": 16})
    families = dtensor_families(graph, devices=8)
    assert any(f.tp > 1 for f in families) and not any(f.sequence_parallel for f in families)


def test_deepspeed_autotp_partitions_only_the_up_projections():
    # partition_config.layer_specs: q_b / kv_b column (kv_b per head, no packed [2, -1] K|V shape), o_proj row;
    # q_a / kv_a match no pattern, so AutoTP leaves them replicated
    request = PlanRequest(cluster=make_cluster("a100-80gb", devices=2, devices_per_node=8))  # tp=2 rows: the same specs
    _, (found,) = plan_launchable_file(CASES / "mla_dynamo_consts.onnx", {"batch": 16, "seq": 64}, [request],
                                       launchers=("deepspeed",))
    row = next(r for r in found.rows if "deepspeed" in r.targets and r.degrees.tp > 1)
    specs = export("deepspeed", row_plan_input(row))["ds_config"]["tensor_parallel"]["partition_config"]["layer_specs"]
    attn = {p.split("self_attn\\.")[1].split("\\.")[0]: s["partition_type"] for s in specs for p in s["patterns"]
            if "self_attn" in p}
    assert attn == {"q_b_proj": "column", "kv_b_proj": "column", "o_proj": "row"}
    assert not any("shape" in s for s in specs if any("kv_b_proj" in p for p in s["patterns"]))


def test_a_file_without_frequencies_says_yarn_cannot_be_seen(tmp_path):
    # a bare graph-only file: no inv_freq constant, so neither the base nor a YaRN scaling shows
    from types import SimpleNamespace

    import onnx
    from onnx import TensorProto, helper

    from exporters.megatron.families import megatron_rotary_args
    from exporters.megatron.mla import UNSEEN_SCALING_NOTE
    from importers.transformer import LatentAttention

    x, y = (helper.make_tensor_value_info(n, TensorProto.FLOAT, [4]) for n in "xy")
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g", [x], [y])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]), tmp_path / "bare.onnx")
    mla = LatentAttention(q_down=None, q_up=0, kv_down=1, kv_up=2, hidden_size=64, heads=4, q_lora_rank=None,
                          kv_lora_rank=16, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=20)
    model = SimpleNamespace(position_table_rows=None, head_dim=24, attention=(SimpleNamespace(mla=mla),))
    args, note = megatron_rotary_args(SimpleNamespace(source_path=str(tmp_path / "bare.onnx")), model)
    assert args == [] and note.endswith(UNSEEN_SCALING_NOTE)
