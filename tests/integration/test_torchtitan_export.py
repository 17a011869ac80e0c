"""torchtitan 0.3.0's own config code accepts every exported row (issue 24 item 6).

Every row of the launchable table that lists torchtitan, for the Llama example on one and two nodes
(with the interleaved and GPipe schedules, ZeRO-0 and full recomputation pinned in some cases), is
exported; its registry module is written and torchtitan's ``ConfigManager.parse_args`` reads it with
the override list, as ``torchrun -m torchtitan.train`` does. The facts read back are torchtitan's:
its ``ParallelismConfig`` degrees and ``ParallelDims`` validation at the world size, the gradient
accumulation and pipeline micro-batches it derives (``Trainer.__init__``'s formulas), the stage cut
as its model parts, its activation-checkpoint config, and the model it builds (on the meta device)
with the parameter count the Hugging Face model has (``examples/models.json``).

The gloo run: torchtitan 0.3.0's trainer is CUDA-only. ``torchtitan.tools.utils.get_device_info``
falls back to ``"cuda"`` when no accelerator is present and ``Trainer.__init__`` calls
``torch.cuda.set_device``, which on torch 2.13.0+cpu fails with ``AttributeError: module 'torch._C'
has no attribute '_cuda_setDevice'`` (:func:`test_the_trainer_needs_cuda` holds that, so the day it
runs on CPU the test says so).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from exporters import export
from objectives.cluster import make_cluster
from planner.core.degrees import Pins
from planner.core.settings import TrainingSettings
from planner.launchable import plan_launchable_file, row_plan_input
from planner.plan import PlanRequest

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
LLAMA = ROOT / "examples" / "llama.onnx"
LLAMA_PARAMS = json.loads((ROOT / "examples" / "models.json").read_text())["llama"]["param_count"]

CASES = {
    "8-devices": dict(devices=8, per_node=8, options={}),
    "16-devices-interleaved": dict(devices=16, per_node=8, options={
        "global_batch": 64, "pipeline_sizes": (2, 4), "schedule": "interleaved", "chunks": 2}),
    "8-devices-gpipe-zero0-full": dict(devices=8, per_node=4, options={
        "global_batch": 32, "pipeline_sizes": (1, 2), "schedule": "gpipe", "pins": Pins(zero=0, recompute="full")}),
    "8-devices-op": dict(devices=8, per_node=8, options={"pins": Pins(recompute="op")}),
    # HSDP: FSDP2 over the 4 ranks of a node, replicated over the 4 nodes (data_parallel_replicate_degree 4)
    "16-devices-hsdp": dict(devices=16, per_node=4, options={"global_batch": 32, "pins": Pins(hsdp=4, pp=1)}),
    # FSDP2's reshard_after_forward pinned (--fix reshard=never: the settings' policy, ZeRO-3), with pipelines
    "8-devices-reshard-never": dict(devices=8, per_node=8, settings=TrainingSettings(reshard_after_forward="never"),
                                    options={"pipeline_sizes": (1, 2), "pins": Pins(zero=3, reshard="never")}),
    # async TP (--fix tp_overlap=on --target torchtitan): sequence-parallel rows at tp > 1 only, compiled
    "8-devices-async-tp": dict(devices=8, per_node=8, options={"pins": Pins(tp_overlap="on")},
                               settings=TrainingSettings(tp_comm_overlap=True, tp_overlap_method="micro-pipeline")),
}


@pytest.fixture(scope="module", params=list(CASES))
def rows(request):
    case = CASES[request.param]
    plan_request = PlanRequest(cluster=make_cluster("a100-80gb", devices=case["devices"], devices_per_node=case["per_node"]),
                               settings=case.get("settings", TrainingSettings()))
    _, (found,) = plan_launchable_file(LLAMA, {"batch": 16, "seq": 128}, [plan_request], launchers=["torchtitan"],
                                       collapse=0.0, **case["options"])
    runnable = [row for row in found.rows if "torchtitan" in row.targets]
    assert runnable
    # --fix hsdp pins every row's shard group (the rows at dp <= 4 would be plain FSDP: none listed)
    assert all(row.cache.settings.dp_shard == (4 if "hsdp" in request.param else None) for row in runnable)
    return runnable


def _parse(out: dict, folder: Path):
    """torchtitan's ``ConfigManager`` on the exported module and overrides (a fresh import each time)."""
    from torchtitan.config import ConfigManager

    (folder / out["config_file"]["path"]).write_text(out["config_file"]["text"])
    sys.modules.pop(out["module"], None)
    sys.path.insert(0, str(folder))
    try:
        return ConfigManager().parse_args(["--module", out["module"], "--config", out["config"], *out["overrides"]])
    finally:
        sys.path.remove(str(folder))


def _rank_layers(parts: list[list[str]], pp: int) -> list[int]:
    """Transformer layers per pipeline rank: torchtitan's loop style gives rank ``s`` parts ``s, s + pp, ...``."""
    return [sum(name.startswith("layers.") for part in parts[rank::pp] for name in part) for rank in range(pp)]


def test_every_torchtitan_row_is_accepted_by_torchtitan(rows, tmp_path):
    pytest.importorskip("torchtitan")
    import torch
    from torch.distributed.pipelining.schedules import PipelineScheduleSingle, get_schedule_class
    from torchtitan.distributed import ParallelDims
    from torchtitan.distributed.activation_checkpoint import FullAC, SelectiveAC

    seen = set()
    for index, row in enumerate(rows):
        out = export("torchtitan", row_plan_input(row))
        config = _parse(out, tmp_path)
        p, t = config.parallelism, config.training
        dims = ParallelDims.from_config(p, out["world_size"])  # torchtitan's own degree checks
        dp = p.data_parallel_replicate_degree * dims.dp_shard
        assert (dp, p.tensor_parallel_degree, p.pipeline_parallel_degree) == (row.degrees.dp, row.degrees.tp, row.point.pp)
        # FSDP2 shards over dp_shard (ZeRO-3) or replicates over dp_replicate (ZeRO-0); HSDP does both
        shard = row.cache.settings.dp_shard
        expected = (1, dp) if row.point.zero_stage == 0 else (dp, 1) if shard is None else (shard, dp // shard)
        assert (dims.dp_shard, p.data_parallel_replicate_degree) == expected
        assert dims.dp_replicate_enabled == (expected[1] > 1) and dims.fsdp_enabled == (expected[0] > 1)
        assert p.context_parallel_degree == 1 and t.seq_len == 128 and config.compile.enable
        assert t.global_batch_size == row.point.global_batch
        if row.point.pp == 1:
            assert t.global_batch_size // (t.local_batch_size * dp) == row.point.micro_batches
        else:
            assert t.local_batch_size // p.pipeline_parallel_microbatch_size == row.point.micro_batches
            schedule = get_schedule_class(p.pipeline_parallel_schedule)
            stages_per_rank = len(p.module_fqns_per_model_part) // row.point.pp
            assert stages_per_rank == (1 if issubclass(schedule, PipelineScheduleSingle) else row.point.chunks)
            assert _rank_layers(p.module_fqns_per_model_part, row.point.pp) == list(row.point.layers_per_stage)
        # the policy priced (objectives.fsdp_reshard.kept_units) is the one torchtitan reads
        policy = row.cache.settings.reshard_after_forward if row.point.zero_stage == 3 else "default"
        assert p.fsdp_reshard_after_forward == policy
        # torch's micro-pipelined TP as priced (objectives.tp_overlap), which CompileConfig accepts with compile on
        overlap = row.cache.settings.tp_comm_overlap
        assert config.compile.enable_async_tensor_parallel == overlap and (not overlap or p.enable_sequence_parallel)
        # CUDA graphs as priced: torchtitan's default replay at pp = 1, disabled exactly where priced without
        assert t.disable_cuda_graphs == (not row.cache.settings.cuda_graphs) and row.cache.settings.cuda_graphs == (row.point.pp == 1)
        assert isinstance(config.activation_checkpoint, FullAC.Config) == (row.point.recompute == "full")
        # the planner's op-level mode is torchtitan's SelectiveAC (every other mm and the attention saved)
        assert isinstance(config.activation_checkpoint, SelectiveAC.Config) == (row.point.recompute == "op")
        assert config.activation_checkpoint is None or row.point.recompute in ("full", "op")
        if index == 0:
            with torch.device("meta"):
                model = config.model_spec.model.build()
            names = {name for name, _ in model.named_children()}
            assert names == {"tok_embeddings", "layers", "norm", "lm_head"}
            assert sum(param.numel() for param in model.parameters()) == LLAMA_PARAMS
            # examples/make_examples.py keeps LlamaConfig's rms_norm_eps (1e-6) and rope base (10000), read from
            # the file; llama3's _build_llama3_layers alone would build RMSNorm's default 1e-5
            import transformers

            reference, spec = transformers.LlamaConfig(), config.model_spec.model
            theta = reference.rope_parameters["rope_theta"]  # transformers 5's home of rope_theta
            norms = [spec.norm, *(n for layer in spec.layers for n in (layer.attention_norm, layer.ffn_norm))]
            assert [n.eps for n in norms] == pytest.approx([reference.rms_norm_eps] * (2 * len(spec.layers) + 1))
            assert {layer.attention.rope.theta for layer in spec.layers} == {theta}
        seen.add((row.point.pp, row.point.zero_stage, row.point.recompute, shard))
    assert seen


def test_the_trainer_needs_cuda(tmp_path):
    pytest.importorskip("torchtitan")
    import torch

    if torch.cuda.is_available():
        pytest.skip("an accelerator is present")
    plan_request = PlanRequest(cluster=make_cluster("a100-80gb", devices=2, devices_per_node=2))
    _, (found,) = plan_launchable_file(LLAMA, {"batch": 4, "seq": 64}, [plan_request], launchers=["torchtitan"])
    out = export("torchtitan", row_plan_input(next(r for r in found.rows if "torchtitan" in r.targets)))
    (tmp_path / out["config_file"]["path"]).write_text(out["config_file"]["text"])
    overrides = [o for o in out["overrides"] if o != "--compile.enable"]
    overrides[-1:-1] = ["--compile.no_enable", "--training.steps", "1"]  # the AC subcommand stays last
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port", "29641",
               "-m", "torchtitan.train", "--module", out["module"], "--config", out["config"], *overrides]
    result = subprocess.run(command, cwd=tmp_path, env={"PYTHONPATH": ".", "PATH": "/usr/bin:/bin"},
                            capture_output=True, text=True, timeout=300)
    assert result.returncode != 0
    assert "has no attribute '_cuda_setDevice'" in result.stderr
