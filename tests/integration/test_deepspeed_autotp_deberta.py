"""DeepSpeed AutoTP on DeBERTa-v2 with ``share_att_key=False``, as deepspeed 0.19.8 runs it (issue 25).

``share_att_key=False`` gives every ``DisentangledSelfAttention`` two more ``nn.Linear``: ``pos_key_proj``
(c2p) and ``pos_query_proj`` (p2c), which project the relative-position table into the attention's heads
(transformers 5.24 ``modeling_deberta_v2.py``, ``disentangled_attention_bias``:
``transpose_for_scores(self.pos_key_proj(rel_embeddings), self.num_attention_heads)``). What deepspeed does:

* its heuristic parser (no ``partition_config``; ``module_inject/auto_tp.py``, ``AutoTP.tp_parser``) finds
  the policy ``(DebertaV2Layer, ['output.dense'])``: only the linears named ``output.dense`` (the linear
  before each LayerNorm) become ``LinearAllreduce`` (row); every other linear of the layer, the position
  projections too, becomes a column-parallel ``LinearLayer`` (``AutoTP._replace``);
* with the planner's ``partition_config`` (``AutoTP._replace_with_config``) a linear no spec matches stays
  whole, while ``update_mp_params`` divides the attention module's ``num_attention_heads`` and
  ``all_head_size`` by ``tp`` as soon as anything under it is sharded. A whole ``pos_key_proj`` then
  reshapes into ``heads / tp`` heads of ``tp x head_dim`` columns, and the c2p ``bmm`` stops at the first
  forward (measured below: the export before this fix).

So the position projections are column-parallel, as the query and key projections are; the planner prices
and exports them so (``exporters/_tp.py``, ``_position_projection_dims``; ``exporters/deepspeed/export.py``,
``layer_specs``). Checked three ways on ``tests/data/deberta_unshared/`` (``tests/exporters/make_deberta_unshared.py``):
deepspeed's heuristic parser on the transformers model, ``AutoTPConfig.find_matching_spec`` on the export's
``partition_config`` for every linear, and a two-rank CPU (gloo) ``deepspeed.initialize`` with that
``partition_config`` whose logits equal the whole model's.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from exporters.deepspeed import deepspeed_masks, export_deepspeed
from importers.transformer import analyze_transformer
from planner.plan import load_graph
from tests.exporters.graphs import first_rows, make_cluster, make_input, spaces_for

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
CASES = ROOT / "tests" / "data" / "deberta_unshared"
FILES = ("deberta_unshared_dynamo_consts.onnx", "deberta_unshared_ts_consts.onnx")
CONFIG = json.loads((CASES / "counts.json").read_text())["config"]
_KIND = {"qkv": "column", "fc1": "column", "out-proj": "row", "fc2": "row"}
TIMEOUT_S = 600


def _model():
    transformers = pytest.importorskip("transformers")
    return transformers.DebertaV2ForMaskedLM(transformers.DebertaV2Config(**CONFIG))


def _partition_config(name: str) -> dict:
    graph = load_graph(CASES / name, {"batch": 16, "seq": 16})
    spaces = spaces_for(graph, 8)
    plan = make_input(graph, spaces, first_rows(deepspeed_masks(graph, spaces, dp=4, tp=2)), cluster=make_cluster(1, 8))
    return export_deepspeed(plan)["ds_config"]["tensor_parallel"]["partition_config"]


def test_deepspeeds_heuristic_parser_shards_the_position_projections_by_columns():
    pytest.importorskip("deepspeed")
    from deepspeed.module_inject.auto_tp import AutoTP

    model = _model()
    assert AutoTP.supported(model)  # 'deberta' is refused, 'debertav2' is not (auto_tp.py, AutoTP.supported)
    policy = AutoTP.tp_parser(model)
    # one layer class; its all-reduce (row) linears are the two 'output.dense' before a LayerNorm
    assert [(cls.__name__, sorted(gems)) for cls, gems in policy] == [("DebertaV2Layer", ["output.dense"])]
    layer = model.deberta.encoder.layer[0].attention.self
    assert hasattr(layer, "pos_key_proj") and hasattr(layer, "pos_query_proj")


@pytest.mark.parametrize("name", FILES)
def test_the_export_names_every_linear_as_autotp_must_split_it(name):
    torch = pytest.importorskip("torch")
    autotp = pytest.importorskip("deepspeed.module_inject.autotp_config")
    model = _model()
    config = autotp.AutoTPConfig.from_dict(_partition_config(name))
    found = {}
    for linear, module in model.named_modules():
        if isinstance(module, torch.nn.Linear):
            spec = config.find_matching_spec(linear + ".weight")
            found[linear] = None if spec is None else spec.partition_type.value
    graph = load_graph(CASES / name, {"batch": 16, "seq": 16})
    found_model = analyze_transformer(graph)
    positions = {i for block in found_model.attention for i in block.position_proj}
    planned = {op.module_path: "column" if i in positions else _KIND.get(role)
               for i, (op, role) in enumerate(zip(graph.ops, found_model.roles)) if op.module_path in found}
    # 18 linears: 2 layers x (q, k, v, pos_key, pos_query, attention output, intermediate, output), the
    # head's transform and decoder; 12 column (q, k, v, pos_key, pos_query, intermediate per layer), 4 row
    assert len(found) == 18 and set(planned) == set(found), sorted(set(found) ^ set(planned))
    assert found == planned
    assert sum(kind == "column" for kind in found.values()) == 12 and sum(kind == "row" for kind in found.values()) == 4
    assert found["deberta.encoder.layer.1.attention.self.pos_query_proj"] == "column"


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    pytest.importorskip("deepspeed")
    pytest.importorskip("transformers")
    root = tmp_path_factory.mktemp("autotp_deberta")
    exported = _partition_config(FILES[0])
    # the export before this fix: the same specs without the position projections
    before = {**exported, "layer_specs": [
        {**spec, "patterns": [p for p in spec["patterns"] if "pos_" not in p]} for spec in exported["layer_specs"]]}
    jobs = [{"partition_config": config, "report": str(root / f"{label}.json")}
            for label, config in (("exported", exported), ("before", before))]
    (root / "jobs.json").write_text(json.dumps(jobs))
    command = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",  # (a free port)
        str(ROOT / "tests" / "integration" / "worker_deepspeed_autotp_deberta.py"), str(root / "jobs.json"),
    ]
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""), "OMP_NUM_THREADS": "1"}
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=TIMEOUT_S)
    assert done.returncode == 0, done.stderr[-6000:]
    return {label: json.loads((root / f"{label}.json").read_text()) for label in ("exported", "before")}


def test_autotp_trains_the_exported_split_and_matches_the_whole_model(runs):
    report = runs["exported"]
    assert "error" not in report, report.get("error")
    # 4 heads of 16 over tp=2: 2 heads, 32 columns per rank (update_mp_params)
    assert (report["heads"], report["all_head_size"]) == (2, 32)
    kinds = report["kinds"]
    for layer in (0, 1):
        prefix = f"deberta.encoder.layer.{layer}."
        for linear in ("query_proj", "key_proj", "value_proj", "pos_key_proj", "pos_query_proj"):
            assert kinds[prefix + "attention.self." + linear] == "LinearLayer"
        assert kinds[prefix + "attention.output.dense"] == kinds[prefix + "output.dense"] == "LinearAllreduce"
    assert kinds["cls.predictions.decoder"] == "Linear"
    # the same function as the whole model: float32 sums in another order only
    assert report["max_logit_difference"] < 1e-5


def test_autotp_stops_where_the_position_projections_stay_whole(runs):
    report = runs["before"]
    assert report["kinds"]["deberta.encoder.layer.0.attention.self.pos_key_proj"] == "Linear"
    # the query shard is 2 heads x 16, the whole pos_key_proj reshaped into 2 heads of 32: the c2p bmm refuses
    assert "max_logit_difference" not in report
    assert "batch2" in report["error"] and "[4, 16]" in report["error"] and "[4, 32]" in report["error"], report["error"]
