"""Transformer Engine's per-layer CUDA graphs' static buffers (``objectives.cuda_graph_memory``; Megatron-LM's
``--cuda-graph-impl transformer_engine``, ``TrainingSettings.cuda_graph_scope = "layers"``).

Oracle: the bytes by hand on gpt2_tiny (2 layers, hidden 64, sequence 128) from megatron-core 0.16.1's static inputs
and Transformer Engine's capture: per captured (layer, micro-batch) one bf16 hidden-state buffer ``H = b x s' x 64 x
2`` (``s'``: the sequence over cp, and over tp under sequence parallelism) and one bool mask ``M = b x (s / cp) x
128``, each layer's forward output kept in the graph pool beside the next layer's copy of it (``H`` more than a
launched run), and one gradient buffer ``H`` for all backward graphs: ``G = k x layers x (H + M) + H``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from objectives.cluster import make_cluster
from planner.core.settings import TrainingSettings
from planner.estimate import estimate
from planner.pipeline import graph_loader
from planner.render import _memory_json

TINY = Path(__file__).resolve().parents[1] / "data" / "gpt2_tiny.onnx"
LAYERS = TrainingSettings(engine="fused", attention="flash", cuda_graphs=True, cuda_graph_scope="layers")


@pytest.fixture(scope="module")
def loader():
    return graph_loader(TINY, {"seq": 128})


def _by_hand(*, b: int, seq_shard: int, cp: int = 1, layers: int = 2, in_flight: int = 1) -> float:
    hidden = b * (128 / seq_shard) * 64 * 2.0
    mask = b * (128 / cp) * 128 * 1.0
    return in_flight * layers * (hidden + mask) + hidden


@pytest.mark.parametrize(("tp", "sp", "cp", "seq_shard"), [(1, False, 1, 1), (2, True, 1, 2), (2, False, 1, 1),
                                                         (1, False, 2, 2)])
def test_one_stage_by_hand(loader, tp, sp, cp, seq_shard):
    cluster = make_cluster("a100-80gb", devices=4)
    dp = 4 // (tp * cp)
    launched = estimate(loader, cluster=cluster, tp=tp, cp=cp, pp=1, micro_batch=2, global_batch=2 * dp,
                        sequence_parallel=sp, settings=TrainingSettings(engine="fused", attention="flash"))
    graphed = estimate(loader, cluster=cluster, tp=tp, cp=cp, pp=1, micro_batch=2, global_batch=2 * dp,
                       sequence_parallel=sp, settings=LAYERS)
    assert launched.valid and graphed.valid
    expected = _by_hand(b=2, seq_shard=seq_shard, cp=cp)  # tp 1: 2 x (32,768 + 32,768) + 32,768 = 163,840
    assert graphed.memory.graph_buffers_bytes == pytest.approx(expected, rel=1e-12)
    assert launched.memory.graph_buffers_bytes == 0.0
    # everything else is the launched run's; the allocator's reserve grows with the live tensors
    assert graphed.memory.activations_bytes == launched.memory.activations_bytes
    assert graphed.memory_bytes - launched.memory_bytes == pytest.approx(expected * 1.1, rel=1e-9)
    assert _memory_json(graphed.memory)["cuda_graph_buffers"] == pytest.approx(expected)
    assert "cuda_graph_buffers" not in _memory_json(launched.memory)


def test_each_stage_holds_its_micro_batches_in_flight(loader):
    cluster = make_cluster("a100-80gb", devices=4)
    graphed = estimate(loader, cluster=cluster, tp=1, pp=2, micro_batch=2, global_batch=8, settings=LAYERS)
    per_stage = [stage.memory.graph_buffers_bytes for stage in graphed.point.stages]
    # 1F1B over 2 stages: the first holds 2 micro-batches' sets of its 1 layer, the last 1
    assert per_stage == pytest.approx([_by_hand(b=2, seq_shard=1, layers=1, in_flight=2),
                                       _by_hand(b=2, seq_shard=1, layers=1, in_flight=1)], rel=1e-12)


def test_a_whole_step_graph_holds_none(loader):
    cluster = make_cluster("a100-80gb", devices=4)
    step = TrainingSettings(engine="fused", attention="flash", cuda_graphs=True, cuda_graph_scope="step")
    graphed = estimate(loader, cluster=cluster, tp=1, pp=1, micro_batch=2, global_batch=8, settings=step)
    assert graphed.valid and graphed.memory.graph_buffers_bytes == 0.0


def test_a_llama_by_hand():
    """llama_tiny (2 layers, hidden 64) at micro-batch 2 of 32 tokens on one A100: ``H = 2 x 32 x 64 x 2 = 8,192``,
    ``M = 2 x 32 x 32 = 2,048``, ``2 x (8,192 + 2,048) + 8,192 = 28,672`` bytes (its rotary tables are no static input)."""
    loader = graph_loader(TINY.with_name("llama_tiny.onnx"), {"seq": 32})
    graphed = estimate(loader, cluster=make_cluster("a100-80gb", devices=1), tp=1, pp=1, micro_batch=2, global_batch=2,
                       settings=LAYERS)
    assert graphed.valid and graphed.memory.graph_buffers_bytes == pytest.approx(28_672.0, rel=1e-12)


@pytest.mark.parametrize(("tp", "sp", "cp", "seq_shard"), [(4, False, 1, 1), (2, True, 2, 4), (1, False, 4, 4)])
def test_one_sample_per_micro_batch_keeps_its_mask(loader, tp, sp, cp, seq_shard):
    """dp 1, micro-batch 1: the graph is bound at one sample and its ops have no batch dim; megatron-core still
    builds each layer's mask (b = 1): tp 4 ``2 x (16,384 + 16,384) + 16,384 = 81,920`` bytes, where the mask was
    missed (49,152)."""
    cluster = make_cluster("a100-80gb", devices=4)
    graphed = estimate(loader, cluster=cluster, tp=tp, cp=cp, pp=1, micro_batch=1, global_batch=1,
                       sequence_parallel=sp, settings=LAYERS)
    assert graphed.valid
    assert graphed.memory.graph_buffers_bytes == pytest.approx(_by_hand(b=1, seq_shard=seq_shard, cp=cp), rel=1e-12)


def test_generic_plan_file_adds_up_with_the_graph_buffers(tmp_path):
    """The exported plan's memory parts add up to its memory_bytes, per-layer graphs included, and read back whole
    (plan format 1.3): dp 4, two samples per rank, the buffers by hand."""
    import json

    from exporters.generic import read_plan
    from tests.planner.cli_helpers import run_cli

    out = tmp_path / "plan.json"
    run_cli(["plan", TINY, "-n", 4, "--device", "a100-80gb", "--dim", "seq=128", "--global-batch", 8,
             "--target", "megatron", "--fix", "cuda_graphs=on", "--fix", "pp=1", "--fix", "dp=4", "--pick", 1,
             "--export", "generic", "-o", out])
    doc = json.loads(out.read_text())
    memory = doc["objectives"]["memory"]
    assert (doc["mesh"]["dp"], doc["pipeline"]["micro_batch"]) == (4, 2)
    expected = _by_hand(b=2, seq_shard=1)  # 2 x (32,768 + 32,768) + 32,768 = 163,840 B
    assert memory["graph_buffers_bytes"] == pytest.approx(expected, rel=1e-12)
    assert sum(memory.values()) == pytest.approx(doc["objectives"]["memory_bytes"], rel=1e-12)
    assert read_plan(out).strategy().memory.total_bytes == pytest.approx(doc["objectives"]["memory_bytes"], rel=1e-12)
