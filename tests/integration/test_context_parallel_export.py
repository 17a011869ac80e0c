"""Issue 24 item 1 with megatron-core itself: every context-parallel row of the 32k-token Llama
frontier exports, and megatron-core 0.16.1's TransformerConfig accepts its ``--context-parallel-size``
and ``--cp-comm-type`` with the rest of the flags."""

from __future__ import annotations

import pytest

from exporters import export
from exporters.validate import parse_megatron_args
from planner.launchable import row_plan_input
from tests.exporters.test_context_parallel import long_context_frontier
from tests.exporters.test_megatron import _transformer_config_kwargs

pytestmark = pytest.mark.integration


def test_transformer_config_accepts_the_cp_rows():
    pytest.importorskip("torch")
    pytest.importorskip("megatron.core")
    from megatron.core.transformer.transformer_config import TransformerConfig

    rows = [row for row in long_context_frontier().rows if row.degrees.cp > 1 and "megatron" in row.targets]
    assert rows
    for row in rows:
        args = parse_megatron_args(export("megatron", row_plan_input(row))["args"])
        config = TransformerConfig(**_transformer_config_kwargs(args))
        assert config.context_parallel_size == row.degrees.cp
        assert config.cp_comm_type == "all_gather"
        assert args["seq-length"] % (2 * config.context_parallel_size) == 0


def test_torchtitan_config_accepts_the_cp_rows(tmp_path):
    """torchtitan's ``ConfigManager`` reads every torchtitan cp row's module and overrides, and its
    ``ParallelDims`` puts the row's cp ranks in the FSDP mesh (dp_shard x cp) at the world size."""
    pytest.importorskip("torchtitan")
    from torchtitan.distributed import ParallelDims

    from tests.integration.test_torchtitan_export import _parse

    rows = [row for row in long_context_frontier(("torchtitan",)).rows if row.degrees.cp > 1]  # its own (--target)
    assert rows
    for row in rows:
        out = export("torchtitan", row_plan_input(row))
        config = _parse(out, tmp_path)
        p = config.parallelism
        dims = ParallelDims.from_config(p, out["world_size"])
        assert (p.context_parallel_degree, p.context_parallel_load_balancer) == (row.degrees.cp, "ptrr")
        # an HSDP row (--fix hsdp or the searched node-sized shard group) splits dp as replicate x shard
        shard = row.cache.settings.dp_shard or row.degrees.dp
        assert (dims.dp_replicate * dims.dp_shard, p.tensor_parallel_degree) == (row.degrees.dp, row.degrees.tp)
        assert dims.dp_shard == shard
        assert config.training.seq_len % (2 * p.context_parallel_degree) == 0


def test_configs_accept_the_rows_across_nodes(tmp_path):
    """The 131k-token frontier (bundled Llama, global batch 4, 64 H100s in 8 nodes): its rows whose
    ``cp x tp`` spans nodes (dp=4 x cp=16, ...) export, megatron-core's TransformerConfig takes Megatron's and
    torchtitan's ConfigManager and ParallelDims take torchtitan's at world size 64, cp ranks and all."""
    pytest.importorskip("torch")
    pytest.importorskip("megatron.core")
    pytest.importorskip("torchtitan")
    from megatron.core.transformer.transformer_config import TransformerConfig
    from torchtitan.distributed import ParallelDims

    from tests.integration.test_torchtitan_export import _parse
    from tests.planner.test_context_across_nodes import long_context_frontier

    # each launcher's own table: on an H100 Megatron-LM's rows (cuDNN attention) dominate torchtitan's
    # (FlexAttention, priced at FlashAttention-2's rates) in a shared one
    mega = [row for row in long_context_frontier(launchers=("megatron",)).rows if row.degrees.cp * row.degrees.tp > 8]
    titan = [row for row in long_context_frontier(launchers=("torchtitan",)).rows
             if row.degrees.cp * row.degrees.tp > 8]
    assert mega and titan and any(row.degrees.cp == 16 for row in mega)
    for row in mega:
        out = export("megatron", row_plan_input(row))
        args = parse_megatron_args(out["args"])
        config = TransformerConfig(**_transformer_config_kwargs(args))
        assert (config.context_parallel_size, config.tensor_model_parallel_size) == (row.degrees.cp, row.degrees.tp)
        assert config.cp_comm_type == "all_gather" and out["world_size"] == 64
        assert args["seq-length"] % (2 * config.context_parallel_size) == 0
    for row in titan:
        out = export("torchtitan", row_plan_input(row))
        config = _parse(out, tmp_path)
        dims = ParallelDims.from_config(config.parallelism, out["world_size"])
        assert (dims.cp, dims.tp, dims.world_size) == (row.degrees.cp, row.degrees.tp, 64)


def _dp_cp_tp_rows(launcher: str):
    """``launcher``'s rows at ``dp=2 x cp=2 x tp=2`` on the tiny Llama at 4,096 tokens, 8 H100s (the search holds
    them since h31c: tests/planner/test_search_dp_cp_tp.py): a few CPU seconds, where the bundled Llama's own 32k
    table at 64 devices needed a search of minutes no time limit cuts."""
    from objectives.cluster import make_cluster
    from planner.core.degrees import Pins
    from planner.launchable import launch_frontier
    from planner.pipeline import PipelineOptions, graph_loader
    from planner.plan import PlanRequest
    from tests.exporters.test_context_parallel import ROOT

    loader = graph_loader(ROOT / "tests" / "data" / "llama_tiny.onnx", {"seq": 4096})
    request = PlanRequest(cluster=make_cluster("h100-sxm", devices=8, devices_per_node=8), time_limit_s=1e6)
    frontier = launch_frontier(loader, request, options=PipelineOptions(global_batch=4), headroom=False, collapse=0.0,
                               pins=Pins(dp=2, cp=2, tp=2), launchers=(launcher,))
    return frontier.rows


def test_configs_accept_the_dp_cp_tp_rows(tmp_path):
    """Rows with dp, cp and tp all above 1 that Megatron-LM's and torchtitan's searches list export at their
    degrees: megatron-core 0.16.1's TransformerConfig takes the flags and its RankGenerator (order tp-cp-ep-dp-pp) builds the row's tp, cp and dp
    groups at the world size, data parallelism being what Megatron-LM derives (world / (tp x cp x pp)); torchtitan's
    ConfigManager reads the overrides and ParallelDims puts dp_shard x cp x tp x pp at the world size."""
    pytest.importorskip("torch")
    pytest.importorskip("megatron.core")
    pytest.importorskip("torchtitan")
    from megatron.core.parallel_state import RankGenerator
    from megatron.core.transformer.transformer_config import TransformerConfig
    from torchtitan.distributed import ParallelDims

    from tests.integration.test_torchtitan_export import _parse

    mega, titan = _dp_cp_tp_rows("megatron"), _dp_cp_tp_rows("torchtitan")
    assert mega and titan
    for row in mega:
        out = export("megatron", row_plan_input(row))
        args = parse_megatron_args(out["args"])
        config = TransformerConfig(**_transformer_config_kwargs(args))
        tp, cp, pp = config.tensor_model_parallel_size, config.context_parallel_size, config.pipeline_model_parallel_size
        assert (tp, cp) == (row.degrees.tp, row.degrees.cp) and config.cp_comm_type == "all_gather"
        dp = out["world_size"] // (tp * cp * pp)
        assert dp == row.degrees.dp and args["global-batch-size"] % (args["micro-batch-size"] * dp) == 0
        ranks = RankGenerator(tp=tp, ep=1, dp=dp, pp=pp, cp=cp, order="tp-cp-ep-dp-pp")
        assert ranks.world_size == out["world_size"] == 8
        assert [len(ranks.get_ranks(name)[0]) for name in ("tp", "cp", "dp")] == [tp, cp, dp]
        assert args["seq-length"] % (2 * cp) == 0
    for row in titan:
        out = export("torchtitan", row_plan_input(row))
        config = _parse(out, tmp_path)
        dims = ParallelDims.from_config(config.parallelism, out["world_size"])
        assert (dims.dp_replicate * dims.dp_shard, dims.cp, dims.tp) == (row.degrees.dp, row.degrees.cp, row.degrees.tp)
        assert dims.world_size == 8 and dims.pp == row.point.pp
