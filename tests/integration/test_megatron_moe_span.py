"""Issue 25 (h29g) with megatron-core itself: the Megatron export of a Mixtral exported with its loss
(``tests/data/megatron_moe_loss``), whose MoE token rules now end at each layer's combine
(``exporters._tp.moe_spans``): ``TransformerConfig`` accepts its ``dp=2 x tp=2 sp x ep=2`` export, and megatron-core's
loss, run on two gloo ranks, reads the whole ``[s, b]`` labels on every tp rank beside its vocabulary shard of the
logits, as the masks lay out the labels (batch split dp ways only) and the loss (vocabulary split tp ways)."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import numpy as np
import pytest

from exporters.validate import parse_megatron_args
from tests.exporters.test_megatron import _transformer_config_kwargs
from tests.integration.forked_python import run_pythons

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
CASES = ROOT / "tests" / "data" / "megatron_moe_loss"
FILES = sorted(json.loads((CASES / "counts.json").read_text())["files"])


@pytest.mark.parametrize("name", FILES)
def test_transformer_config_accepts_the_export_with_its_loss(name: str):
    pytest.importorskip("megatron.core")
    from megatron.core.transformer.transformer_config import TransformerConfig

    from planner.plan import load_graph
    from tests.exporters.test_megatron_features import _export

    args = parse_megatron_args(_export(load_graph(CASES / name, {"batch": 4, "seq": 16}), dp=2, tp=2, ep=2,
                                       sequence_parallel=True)["args"])
    config = TransformerConfig(**_transformer_config_kwargs(args))
    assert (config.tensor_model_parallel_size, config.sequence_parallel, config.expert_tensor_parallel_size) == (2, True, 2)
    assert (config.num_moe_experts, config.moe_router_topk, config.expert_model_parallel_size) == (4, 2, 2)


_LOSS_ON_TWO_RANKS = r"""
import json, sys, torch
import torch.distributed as dist
torch.cuda.current_device = lambda: "cpu"
rank, store = int(sys.argv[1]), sys.argv[2]
dist.init_process_group("gloo", store=dist.FileStore(store, 2), rank=rank, world_size=2)
from megatron.core import parallel_state, tensor_parallel
parallel_state.initialize_model_parallel(2, 1)
torch.manual_seed(0)
logits = torch.randn(16, 4, 96)  # [s, b, vocab], as every rank's output layer returns it after gathering the sequence
labels = torch.randint(0, 96, (16, 4))  # the same on both ranks
shard = logits[..., rank * 48:(rank + 1) * 48].clone()
loss = tensor_parallel.vocab_parallel_cross_entropy(shard, labels)
full = torch.nn.functional.cross_entropy(logits.reshape(-1, 96), labels.reshape(-1), reduction="none").reshape(16, 4)
try:  # half the batch of labels beside the rank's vocabulary shard
    tensor_parallel.vocab_parallel_cross_entropy(shard, labels[:, rank * 2:(rank + 1) * 2])
    halved = None
except Exception as error:
    halved = type(error).__name__
print(json.dumps({"shape": list(loss.shape), "error": float((loss - full).abs().max()), "halved": halved}))
"""


def test_megatron_cores_loss_reads_whole_labels_on_each_tp_rank():
    """Two gloo ranks (tp=2): ``vocab_parallel_cross_entropy`` of each rank's half of the vocabulary with the whole
    [16, 4] labels equals torch's cross entropy on the whole logits; half the batch of labels is refused."""
    pytest.importorskip("megatron.core")
    store = tempfile.mktemp()
    workers = run_pythons(_LOSS_ON_TWO_RANKS, [[str(rank), store] for rank in (0, 1)], cwd=ROOT, timeout=600)
    assert all(w.returncode == 0 for w in workers), workers[0].stderr[-3000:] + workers[1].stderr[-3000:]
    for worker in workers:
        out = json.loads(worker.stdout.strip().splitlines()[-1])
        assert out["shape"] == [16, 4] and np.isclose(out["error"], 0.0, atol=1e-5) and out["halved"] is not None
