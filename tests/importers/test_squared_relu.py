"""Squared ReLU, ``relu(x)^2``, is its own MLP activation (issue 25, task H6), and Megatron-LM trains it with
``--squared-relu`` (megatron-core 0.16.1 ``core/activations.py:9-11``: ``torch.pow(F.relu(x), 2)``).

Persimmon's ``hidden_act="relu2"`` (transformers' ``ReLUSquaredActivation``) exports as ``Relu`` then
``Mul(r, r)``; it was read as ReLU and Megatron refused it ("its MLP uses ReLU"). File:
``tests/data/sweep_cases/persimmon_noqk_ts_bare.onnx`` (``tests/importers/make_sweep_cases.py``).
"""

from __future__ import annotations

import json
from pathlib import Path

from importers import import_model
from importers.transformer import analyze_transformer

ROOT = Path(__file__).resolve().parents[2]
CASES = ROOT / "tests" / "data" / "sweep_cases"
COUNTS = json.loads((CASES / "counts.json").read_text())


def _graph(name: str, **dims: int):
    return import_model(CASES / f"{name}_bare.onnx", dims)


def test_persimmon_relu2_reads_as_squared_relu():
    assert COUNTS["persimmon_noqk_ts"]["config"]["hidden_act"] == "relu2"  # transformers' ReLUSquaredActivation
    model = analyze_transformer(_graph("persimmon_noqk_ts", batch=2, seq=64))
    assert model.features.mlp_activation == "squared-relu" and not model.gated_mlp
    assert model.num_layers == 2 and model.ffn_hidden_size == 256



def test_squared_relu_rule_keeps_relu_and_gated_relu():
    from importers.layer_features import mlp_activation, squared_relu
    assert mlp_activation(("MatMul", "Add", "Relu")) == "relu"
    # a gated ReLU's Mul of gate and up is its own op (two matmuls write it), so no op holds Relu then Mul
    gated = [("MatMul", "Relu"), ("MatMul",), ("Mul",)]
    assert not any(squared_relu(t) for t in gated)
    assert squared_relu(("MatMul", "Relu", "Pow"))
    assert mlp_activation(("Relu", "Mul")) == "relu"  # by types alone; mlp_activation_of applies the per-op rule



def megatron_args_of_persimmon(devices: int = 1) -> dict:
    """The flags of the fastest Megatron row for the Persimmon file at ``devices`` GPUs (batch 16, seq 64)."""
    from exporters import export
    from exporters.validate import parse_megatron_args
    from objectives.cluster import make_cluster
    from planner.launchable import plan_launchable_file, row_plan_input
    from planner.plan import PlanRequest

    request = PlanRequest(cluster=make_cluster("a100-80gb", devices=devices, devices_per_node=8))
    _, (found,) = plan_launchable_file(CASES / "persimmon_noqk_ts_bare.onnx", {"batch": 16, "seq": 64}, [request],
                                       launchers=("megatron",))
    row = next(r for r in found.rows if "megatron" in r.targets)
    return parse_megatron_args(export("megatron", row_plan_input(row))["args"])


def test_megatron_exports_persimmon_with_squared_relu():
    from exporters.megatron.families import family_refusals

    model = analyze_transformer(_graph("persimmon_noqk_ts", batch=2, seq=64))
    assert not any("MLP uses" in r for r in family_refusals(model, "gpt"))  # was "its MLP uses ReLU ..."
    args = megatron_args_of_persimmon()
    assert args["squared-relu"] is True and "swiglu" not in args
    # Persimmon's config: 2 layers, hidden 64, 4 heads, ffn 256, partial_rotary_factor 0.5
    config = COUNTS["persimmon_noqk_ts"]["config"]
    assert (args["num-layers"], args["hidden-size"], args["ffn-hidden-size"]) == (
        config["num_hidden_layers"], config["hidden_size"], config["intermediate_size"])
    assert float(args["rotary-percent"]) == config["partial_rotary_factor"]
