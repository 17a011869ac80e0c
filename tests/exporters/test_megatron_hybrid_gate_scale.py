"""Falcon-H1's MLP is a SwiGLU whose gate is scaled before its SiLU, not an activation Megatron lacks (issue 25, h30g).

transformers 5.24's ``FalconH1MLP`` computes ``down_proj(up_proj(x) * silu(gate_proj(x) * m0)) * m1``
(``mlp_multipliers`` = (m0, m1)); the dynamo export writes ``silu(a g)`` as ``Mul(g, a)``, ``Sigmoid``, and a
``Mul`` of the two, the node types of quick-GELU's ``g * sigmoid(a g)``. The Megatron refusal said "its MLP activation
(neither GELU, squared ReLU nor SwiGLU)"; it now names the factor (a muP multiplier, which ``--swiglu`` lacks) beside
the parallel hybrid layer and the stream's multipliers.

Files: ``tests/data/hybrid_cases`` (``tests/exporters/make_hybrid_cases.py``): ``falcon_h1_mup`` (round 3's
multipliers, m0 = 0.8) and ``falcon_h1_parallel`` (the multipliers at 1: the exporter folds ``x * 1``).
"""

from __future__ import annotations

import json
from pathlib import Path

from exporters.megatron.mamba import hybrid_refusals, hybrid_stack
from planner.plan import load_graph

CASES = Path(__file__).resolve().parents[1] / "data" / "hybrid_cases"
DIMS = {"batch": 2, "seq": 16}


def test_falcon_h1s_scaled_gate_is_read_as_a_swiglu_with_its_factor():
    m0 = json.loads((CASES / "counts.json").read_text())["files"]["falcon_h1_mup_dynamo_consts.onnx"]["config"][
        "mlp_multipliers"][0]
    graph = load_graph(CASES / "falcon_h1_mup_dynamo_consts.onnx", DIMS)
    stack = hybrid_stack(graph)
    assert stack.mlp == "swiglu" and stack.pattern == "M-M-"
    clauses = hybrid_refusals(stack, graph)
    assert not any("neither GELU" in c for c in clauses)
    assert any(f"gate projection by {m0:g} before the SiLU" in c for c in clauses)
    assert any("parallel hybrid layer" in c for c in clauses)
    assert any("token embedding" in c and "logits" in c for c in clauses)


def test_a_gate_factor_of_one_adds_no_clause():
    graph = load_graph(CASES / "falcon_h1_parallel_dynamo_consts.onnx", DIMS)
    stack = hybrid_stack(graph)
    assert stack.mlp == "swiglu"
    assert not any("gate projection" in c or "neither GELU" in c for c in hybrid_refusals(stack, graph))
