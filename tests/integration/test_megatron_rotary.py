"""megatron-core's own RotaryEmbedding, built from the Megatron export's --rotary-base and
--rotary-percent, has the frequencies the model file holds (issue 25: exact or refused)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from exporters import export
from exporters.validate import parse_megatron_args
from objectives.cluster import make_cluster
from planner.launchable import plan_launchable_file, row_plan_input
from planner.plan import PlanRequest

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("name", ["mixtral_ts_consts", "llama_dynamo_consts", "qwen2_ts_consts"])
def test_megatrons_rotary_embedding_has_the_files_frequencies(name):
    pytest.importorskip("torch")
    rotary = pytest.importorskip("megatron.core.models.common.embeddings.rotary_pos_embedding")
    from importers.onnx_facts import file_facts
    from importers.rotary import _candidates

    path = ROOT / "tests" / "zoo" / f"{name}.onnx"
    request = PlanRequest(cluster=make_cluster("a100-80gb", devices=2, devices_per_node=2))
    _, (found,) = plan_launchable_file(path, {"batch": 4, "seq": 64}, [request], launchers=("megatron",))
    out = export("megatron", row_plan_input(found.rows[0]))
    args = parse_megatron_args(out["args"])
    kv_channels = args.get("kv-channels", args["hidden-size"] // args["num-attention-heads"])
    embedding = rotary.RotaryEmbedding(kv_channels, float(args.get("rotary-percent", 1.0)),
                                       rotary_base=args["rotary-base"], use_cpu_initialization=True)
    held = next(values for name, values in _candidates(file_facts(path)) if "inv_freq" in name or "rotary" in name)
    np.testing.assert_allclose(embedding.inv_freq.numpy(), held, rtol=1e-6)
