"""StableLM's per-head QK LayerNorms at tp > 1 (issue 25, task H6, item 1; leftovers of 20acfaa).

``StableLmLayerNormPerHead`` holds one ``LayerNorm(head_dim)`` per head, each with its own weights; DeepSpeed's AutoTP
and a DTensor plan keep it whole while a rank holds ``1/tp`` of the heads, and the module zips its norms with the
rank's heads in order (``tests/integration/test_stablelm_per_head_norm.py`` runs transformers' module). 20acfaa
dropped both launchers' tp > 1 families; here (a) ``--fix tp=2`` says why, and (b) a tp=2 plan saved from elsewhere
(the generic plan, re-exported) is refused by both exports in one line, where it was written out before.

Oracles: the file's own node names (``q_layernorm/norms.0 .. norms.3``: four norms per projection, one per head, the
config's ``num_attention_heads`` = 4 in ``counts.json``); the tp=2 plan is the Llama-style column/row layout every
AutoTP plan follows (:func:`exporters._tp.tp_layout`), and a Llama of shared-weight norms exports from it.
"""

from __future__ import annotations

import re
from pathlib import Path

import onnx
import pytest

from exporters._tp import layout_masks, tp_layout
from exporters.deepspeed.export import export_deepspeed
from exporters.dtensor.export import export_dtensor
from importers.transformer import analyze_transformer
from objectives.cluster import make_cluster
from planner.core.degrees import Pins
from planner.core.errors import UnsupportedExport
from planner.launch_messages import pinned_refusal
from planner.pipeline import PipelineOptions, graph_loader
from planner.plan import PlanRequest, load_graph
from tests.exporters.graphs import first_rows, make_input, spaces_for
from tests.planner.cli_helpers import run_cli

ROOT = Path(__file__).resolve().parents[2]
STABLELM = ROOT / "tests" / "data" / "importer_sweep_cases" / "stablelm_qk_ts_bare.onnx"
LLAMA = ROOT / "tests" / "data" / "llama_tiny.onnx"
DIMS = {"batch": 8, "seq": 16}
DEVICES, DP, TP = 8, 4, 2
REASON = "its queries and keys are normalised by one LayerNorm per head, each with its own weights"
EXPORTS = {"deepspeed": export_deepspeed, "dtensor": export_dtensor}


def test_the_file_holds_one_norm_per_head():
    names = [n.name for n in onnx.load(str(STABLELM), load_external_data=False).graph.node]
    per_head = {m.group(1) for n in names if (m := re.search(r"layers\.0/self_attn/q_layernorm/norms\.(\d+)/LayerNorm", n))}
    assert per_head == {"0", "1", "2", "3"}  # 4 heads (counts.json: num_attention_heads 4), 4 weights
    assert analyze_transformer(load_graph(STABLELM, DIMS)).features.qk_norm == "per-head-weights"


def _tp_plan(path: Path):
    """A dp=4 x tp=2 plan with the attention and MLP split the AutoTP way (heads, then FFN columns)."""
    graph = load_graph(path, DIMS)
    spaces = spaces_for(graph, DEVICES)
    layout = tp_layout(graph, analyze_transformer(graph), target="deepspeed")
    result = layout_masks(graph, spaces, layout, dp=DP, tp=TP, sequence_parallel=False, devices_per_node=DEVICES)
    assert result.masks is not None, result.reason
    return make_input(graph, spaces, first_rows(result.masks), global_batch=DIMS["batch"] * 2)


@pytest.mark.parametrize("launcher", sorted(EXPORTS))
def test_a_saved_tp_plan_is_refused_in_one_line(launcher):
    with pytest.raises(UnsupportedExport) as caught:
        EXPORTS[launcher](_tp_plan(STABLELM))
    reason = caught.value.reason
    assert "\n" not in reason and REASON in reason and reason.endswith("; plan tp=1")


@pytest.mark.parametrize("launcher", sorted(EXPORTS))
def test_shared_weight_norms_still_export_at_tp_2(launcher):
    plan = EXPORTS[launcher](_tp_plan(LLAMA))
    assert plan["degrees"]["tp"] == TP and plan["degrees"]["dp"] == DP


def _refusal(launcher: str, tp: int) -> str:
    graph = graph_loader(STABLELM, DIMS)(DIMS["batch"])
    request = PlanRequest(cluster=make_cluster("a100-80gb", devices=DEVICES, devices_per_node=DEVICES))
    return pinned_refusal(graph, request, PipelineOptions(global_batch=DIMS["batch"]), Pins(tp=tp), [launcher])


@pytest.mark.parametrize("launcher", sorted(EXPORTS))
def test_pinned_tp_gives_the_reason(launcher):
    line = _refusal(launcher, TP)
    assert line.startswith(f"{launcher} runs tp 1 on this model at {DEVICES} devices (tp={TP}: {REASON}")
    assert line.endswith(f"); --fix tp={TP} leaves none: drop it or use --fix tp=1")
    assert "plan tp=1" not in line  # the exporter's own advice gives way to the pin's


def test_cli_one_line_exit_2():
    result = run_cli(["plan", STABLELM, "-n", str(DEVICES), "--dim", "batch=8", "--dim", "seq=16", "--target",
                      "deepspeed", "--fix", f"tp={TP}"], expected_exit_code=2)
    lines = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and "Traceback" not in result.stderr
    assert REASON in lines[0] and "AutoTP keeps whole" in lines[0]


@pytest.mark.parametrize("launcher", sorted(EXPORTS))
def test_export_and_rules_give_the_same_words(launcher):
    from importlib import import_module

    rules, export = (import_module(f"exporters.{launcher}.{name}") for name in ("rules", "export"))
    assert rules.per_head_weights_tp(load_graph(STABLELM, DIMS)) == export.PER_HEAD_WEIGHTS_TP
    assert rules.per_head_weights_tp(load_graph(LLAMA, DIMS)) is None
