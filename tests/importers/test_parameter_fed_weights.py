"""Weights that transform a learned table before it meets the activations are parameters (issue 25).

DeBERTa-v2 with ``share_att_key=False`` projects its relative-position table by each layer's own
``pos_key_proj`` and ``pos_query_proj``: ``LayerNorm(rel_embeddings) @ W + b`` reads no graph input, so
the importer took the exporters' ``val_N`` / ``onnx::MatMul_N`` copies of ``W`` (and TorchScript's ``b``)
for folded constants (``importers.parameters._trained_through_parameters``).

Torch's counts, computed in ``.venv-integration`` (torch 2.13.0+cpu, transformers 5.24.0) from the
fixture's ``counts.json`` config, ``DebertaV2ForMaskedLM(DebertaV2Config(**config))``:
``sum(p.numel() for p in model.parameters())`` = 157,224, of which the ``pos_*_proj`` weights and biases
are 2 layers x 2 x (64 x 64 + 64) = 16,640; after one MLM loss ``backward()`` on 2 x 16 random tokens
every one of the 157,224 has a gradient (``p.grad is not None``), so all are trained. Before the rule the
dynamo file counted 140,840 (157,224 - 4 x 4,096: its biases are named and recorded as parameters)
and the TorchScript file 204,584 (157,224 - 16,640 + the 64,000 of its warned LM-head copy).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper, numpy_helper

from importers import import_model
from tests.planner.cli_helpers import run_cli

CASES = Path(__file__).resolve().parents[1] / "data" / "deberta_unshared"
TORCH_COUNT = 157_224  # torch's sum(p.numel()), see the module docstring (also counts.json)
PROJECTIONS = 4 * (64 * 64 + 64)  # 2 layers x (pos_key_proj, pos_query_proj), weight and bias
_UNPROVEN_TIE = re.compile(r"may be a transposed copy of the tied .* it is counted \(([\d,]+) parameters\)")


def _graph(name: str):
    return import_model(CASES / name, {"batch": 2, "seq": 16})


def test_torchs_count_is_recorded_with_the_fixture():
    record = json.loads((CASES / "counts.json").read_text())
    assert {r["param_count"] for r in record["files"].values()} == {TORCH_COUNT}
    assert PROJECTIONS == 16_640


def test_dynamo_file_counts_the_position_projections():
    graph = _graph("deberta_unshared_dynamo_consts.onnx")
    assert graph.parameter_count == TORCH_COUNT == 140_840 + 4 * 64 * 64
    assert not graph.warnings


def test_torchscript_file_counts_them_beside_its_warned_head_copy():
    graph = _graph("deberta_unshared_ts_consts.onnx")
    # the LM head's transposed copy [64, 1000] is counted and said (no values to prove the tie)
    tied = [int(m.group(1).replace(",", "")) for w in graph.warnings if (m := _UNPROVEN_TIE.search(w))]
    assert tied == [64 * 1000]
    assert graph.parameter_count - tied[0] == TORCH_COUNT == 204_584 - 64_000 + PROJECTIONS


@pytest.mark.parametrize("name", ["deberta_unshared_dynamo_consts.onnx", "deberta_unshared_ts_consts.onnx"])
def test_a_bare_copy_counts_the_same(tmp_path, name):
    # the zoo's ``bare`` style: every initializer external (the int64 shape constants too), no data
    # file; the rule reads the graph's structure only, so the count and its warnings do not move (a bare
    # dynamo file adds one about shapes read from value_info: its shape constants have no values)
    proto = onnx.load(str(CASES / name), load_external_data=False)
    bare = tmp_path / name.replace("consts", "bare")
    onnx.save_model(proto, str(bare), save_as_external_data=True, all_tensors_to_one_file=True,
                    location="gone.data", size_threshold=0)
    (tmp_path / "gone.data").unlink()
    kept = onnx.load(str(bare), load_external_data=False)
    assert all(i.data_location == T.EXTERNAL for i in kept.graph.initializer)
    before, after = _graph(name), import_model(bare, {"batch": 2, "seq": 16})
    assert after.parameter_count == before.parameter_count
    assert [w for w in after.warnings if not w.startswith("shapes of ")] == list(before.warnings)


def test_memory_prices_the_projections_with_their_states():
    # bf16-mixed on one device: 2 bytes of weight and 2 of gradient per parameter, and 12 of optimizer
    # state (fp32 master copy and Adam's two moments). Before: params 140,840 x 2 = 281,680 B and
    # optimizer 1,690,080 B; the 16,384 projection weights add 32,768 and 196,608 B.
    table = run_cli(["plan", str(CASES / "deberta_unshared_dynamo_consts.onnx"), "-n", "1", "--dim", "batch=8",
                     "--dim", "seq=16", "--json", "-q"])
    memory = json.loads(table.stdout)["rows"][0]["memory_breakdown_bytes"]
    assert memory["params"] == memory["grads"] == TORCH_COUNT * 2 == 314_448
    assert memory["optimizer"] == TORCH_COUNT * 12 == 1_886_688


# Small graphs, one pattern each (H = 16 hidden, P = 8 positions).
H, P = 16, 8


def _tensor(name: str, shape: tuple[int, ...], seed: int) -> onnx.TensorProto:
    return numpy_helper.from_array(np.random.default_rng(seed).standard_normal(shape).astype(np.float32), name)


def _import(tmp_path: Path, nodes, initializers, outputs=("y",)):
    x = helper.make_tensor_value_info("x", T.FLOAT, ["batch", P, H])
    ys = [helper.make_tensor_value_info(o, T.FLOAT, None) for o in outputs]
    graph = helper.make_graph(nodes, "m", [x], ys, initializer=initializers)
    path = tmp_path / "m.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]), str(path))
    return import_model(path, {"batch": 2})


def _position_scores(extra_nodes=(), extra_inits=(), table: str = "rk"):
    """q = x Wq; the table LayerNorm(rel) val_7 + pos.bias, transposed, scores q against it."""
    nodes = [
        helper.make_node("MatMul", ["x", "q.weight"], ["q"]),
        helper.make_node("LayerNormalization", ["rel.weight", "ln.weight", "ln.bias"], ["r"], axis=-1),
        helper.make_node("MatMul", ["r", "val_7"], ["rp"]),
        helper.make_node("Add", ["rp", "pos.bias"], ["rk"]),
        *extra_nodes,
        helper.make_node("Transpose", [table], ["rkT"], perm=[1, 0]),
        helper.make_node("MatMul", ["q", "rkT"], ["y"]),
    ]
    inits = [_tensor("q.weight", (H, H), 0), _tensor("rel.weight", (P, H), 1), _tensor("ln.weight", (H,), 2),
             _tensor("ln.bias", (H,), 3), _tensor("val_7", (H, H), 4), _tensor("pos.bias", (H,), 5), *extra_inits]
    return nodes, inits


def test_a_projection_of_a_learned_table_is_a_parameter(tmp_path):
    graph = _import(tmp_path, *_position_scores())
    # q.weight 256 + rel.weight 8 x 16 = 128 + the norm's 2 x 16 = 32 + val_7 256 + pos.bias 16
    assert graph.parameter_count == 256 + 128 + 32 + 256 + 16 == 688


def test_a_constant_added_to_the_projected_table_stays_a_constant(tmp_path):
    # an anonymous [P, H] constant (a mask's shape: two axes over 1) added to the table is no bias
    nodes, inits = _position_scores([helper.make_node("Add", ["rk", "val_9"], ["masked"])],
                                    [_tensor("val_9", (P, H), 6)], table="masked")
    assert _import(tmp_path, nodes, inits).parameter_count == 688


def test_a_projection_of_a_precomputed_table_stays_a_constant(tmp_path):
    # rotary-style: positions from Range (no parameter) times an anonymous inv_freq [1, H/2], then
    # cos/sin multiply the activations: nothing here is trained but the output projection
    nodes = [
        helper.make_node("Range", ["start", "limit", "delta"], ["pos"]),
        helper.make_node("Unsqueeze", ["pos", "axis1"], ["pos2"]),
        helper.make_node("MatMul", ["pos2", "val_3"], ["freqs"]),
        helper.make_node("Cos", ["freqs"], ["cos"]),
        helper.make_node("Sin", ["freqs"], ["sin"]),
        helper.make_node("Concat", ["cos", "sin"], ["table"], axis=-1),
        helper.make_node("Mul", ["x", "table"], ["h"]),
        helper.make_node("MatMul", ["h", "out.weight"], ["y"]),
    ]
    inits = [numpy_helper.from_array(np.array(v, dtype=np.float32), n) for n, v in
             (("start", 0.0), ("limit", float(P)), ("delta", 1.0))]
    inits += [numpy_helper.from_array(np.array([1], dtype=np.int64), "axis1"), _tensor("val_3", (1, H // 2), 7),
              _tensor("out.weight", (H, H), 8)]
    assert _import(tmp_path, nodes, inits).parameter_count == H * H == 256


def test_a_projection_no_gradient_leaves_stays_a_constant(tmp_path):
    # the projected table only chooses (ArgMax): no gradient reaches val_7 or pos.bias
    nodes, inits = _position_scores()
    nodes = nodes[:4] + [
        helper.make_node("ArgMax", ["rk"], ["pick"], axis=1, keepdims=0),
        helper.make_node("Cast", ["pick"], ["pickf"], to=T.FLOAT),
        helper.make_node("Unsqueeze", ["pickf", "axis1"], ["pick2"]),
        helper.make_node("Mul", ["q", "pick2"], ["y"]),
    ]
    inits.append(numpy_helper.from_array(np.array([1], dtype=np.int64), "axis1"))
    # q.weight 256 + rel.weight 128 + the norm's 32 (named, read where only weights sit)
    assert _import(tmp_path, nodes, inits).parameter_count == 256 + 128 + 32 == 416
