"""Issue 25: MPT's ALiBi, folded by the exporters to a constant ``[heads, 1, max_seq_len]`` table added to the
scores, is read as ALiBi (importers/position_bias.py), so Megatron-LM and torchtitan refuse it in one line
(they used to export it with ``--position-embedding-type rope`` assumed), every launcher prices its scores
explicit (they were fused+flash), and a sequence past the table's width is refused on import.

Fixtures: ``tests/data/mpt_alibi_cases/`` (``tests/importers/make_mpt_alibi_cases.py``: transformers'
``MptForCausalLM``, 2 layers, hidden 64, 8 heads, ``max_seq_len`` 16, both exporters, graph-only). Oracles,
from torch in ``counts.json``: the config (heads, layers, ``max_seq_len``), the slopes of
``build_mpt_alibi_tensor`` (the table's step per key position, per head: ``2^-(h+1)`` for 8 heads), and
whether torch runs the model at ``max_seq_len`` tokens (yes) and one past it (no).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from exporters.megatron.families import family_refusals as megatron_refusals
from exporters.torchtitan.families import family_refusals as torchtitan_refusals
from importers.attention_masks import _bias_tables, attention_biases
from importers.position_bias import UNREAD
from importers.transformer import analyze_transformer
from objectives.cluster import make_cluster
from planner.core.errors import ModelError
from planner.launchable import launch_frontier
from planner.launcher_options import launcher_execution
from planner.pipeline import PipelineOptions, graph_loader
from planner.plan import PlanRequest, load_graph
from tests.planner.cli_helpers import error_line, run_cli

ROOT = Path(__file__).resolve().parents[2]
CASES = ROOT / "tests" / "data" / "mpt_alibi_cases"
TRUTH = json.loads((CASES / "counts.json").read_text())
CONFIG = TRUTH["config"]
FILES = sorted(TRUTH["files"])
MAX_SEQ = CONFIG["max_seq_len"]  # 16


def _tables(path: Path) -> dict:
    model = onnx.load(path, load_external_data=False)
    return _bias_tables(model, {out: n for n in model.graph.node for out in n.output if out})


def _table_values(path: Path, name: str) -> np.ndarray | None:
    """The table's values, ``[heads, keys]``, from its initializer or ``Constant`` node; None when external."""
    model = onnx.load(path, load_external_data=False)
    tensors = {t.name: t for t in model.graph.initializer} | {
        n.output[0]: a.t for n in model.graph.node if n.op_type == "Constant" for a in n.attribute if a.name == "value"}
    tensor = tensors[name]
    if tensor.external_data:
        return None
    return numpy_helper.to_array(tensor).reshape(CONFIG["n_heads"], -1)


class TestReading:
    @pytest.mark.parametrize("name", FILES)
    def test_every_layer_reads_as_alibi(self, name):
        graph = load_graph(CASES / name, {"batch": 2, "seq": MAX_SEQ})
        assert list(graph.attention_biases.values()) == ["alibi"] * CONFIG["n_layers"]
        assert analyze_transformer(graph).features.alibi

    @pytest.mark.parametrize("name", FILES)
    def test_the_table_is_heads_by_max_seq_len(self, name):
        tables = list(_tables(CASES / name).values())
        assert len(tables) == CONFIG["n_layers"]
        assert {(t.heads, t.keys) for t in tables} == {(CONFIG["n_heads"], MAX_SEQ)}
        assert TRUTH["table_shape"] == [CONFIG["n_heads"], 1, MAX_SEQ]

    @pytest.mark.parametrize("name", FILES)
    def test_values_in_the_file_are_torchs_slopes_times_positions(self, name):
        (table, *_) = _tables(CASES / name).values()
        values = _table_values(CASES / name, table.name)
        if values is None:  # the dynamo export saved with every initializer external
            assert name == "mpt_dynamo_bare.onnx" and table.values == UNREAD
            return
        assert table.values == "linear"
        # torch's build_mpt_alibi_tensor: slope_h * (k - (max_seq_len - 1)), zero at the last key
        slopes = np.array(TRUTH["slopes"])
        assert np.allclose(slopes, 2.0 ** -np.arange(1, CONFIG["n_heads"] + 1))
        assert np.allclose(values, slopes[:, None] * np.arange(1 - MAX_SEQ, 1)[None, :])

    def test_a_table_not_linear_in_the_key_position_is_not_alibi(self):
        model = onnx.load(CASES / "mpt_ts_consts.onnx", load_external_data=False)
        constant = next(n for n in model.graph.node if n.op_type == "Constant"
                        and list(n.attribute[0].t.dims) == [CONFIG["n_heads"], 1, MAX_SEQ])
        squares = (np.arange(MAX_SEQ, dtype=np.float32) ** 2)[None, None, :].repeat(CONFIG["n_heads"], 0)
        constant.attribute[0].t.CopyFrom(numpy_helper.from_array(squares, constant.output[0]))
        producer = {out: n for n in model.graph.node for out in n.output if out}
        assert {t.values for t in _bias_tables(model, producer).values()} == {"other"}
        assert attention_biases(model, {}) == {}


class TestLaunchers:
    @pytest.mark.parametrize("name", ["mpt_dynamo_bare.onnx", "mpt_ts_consts.onnx"])
    def test_megatron_and_torchtitan_refuse_it(self, name):
        model = analyze_transformer(load_graph(CASES / name, {"batch": 2, "seq": MAX_SEQ}))
        assert any("ALiBi" in clause and "learned_absolute, rope, mrope, yarn or none" in clause
                   for clause in megatron_refusals(model))
        assert "it adds ALiBi biases to the attention scores" in torchtitan_refusals(model, "llama3")

    @pytest.mark.parametrize(("launcher", "expected"), [("deepspeed", ("fused", "explicit")),
                                                        ("dtensor", ("eager", "explicit")),
                                                        ("meshtf", ("fused", "explicit"))])
    def test_each_launcher_prices_explicit_scores(self, launcher, expected):
        graph = graph_loader(CASES / "mpt_dynamo_bare.onnx", {"seq": MAX_SEQ})(8)
        execution = launcher_execution(launcher, graph, None, None)
        assert (execution.engine, execution.attention) == expected

    def test_the_rows_are_explicit_and_no_megatron_or_torchtitan_row(self):
        loader = graph_loader(CASES / "mpt_ts_bare.onnx", {"seq": MAX_SEQ})
        request = PlanRequest(cluster=make_cluster("a100-80gb", devices=2, devices_per_node=2))
        frontier = launch_frontier(loader, request, options=PipelineOptions(global_batch=4), headroom=False,
                                   collapse=0.0)
        assert frontier.rows
        assert {row.execution.attention for row in frontier.rows} == {"explicit"}  # was flash
        assert not {"megatron", "torchtitan"} & {t for row in frontier.rows for t in row.targets}


class TestPastTheTable:
    def test_torch_runs_to_the_table_and_not_past_it(self):
        assert TRUTH["runs_at_table"] and not TRUTH["runs_past_table"]

    @pytest.mark.parametrize("name", FILES)
    def test_a_sequence_past_the_table_is_refused(self, name):
        load_graph(CASES / name, {"batch": 2, "seq": MAX_SEQ})  # its width: accepted
        with pytest.raises(ModelError) as info:
            load_graph(CASES / name, {"batch": 2, "seq": MAX_SEQ + 1})
        message = str(info.value)
        assert "\n" not in message
        assert (f"the model's position bias covers {MAX_SEQ} tokens" in message
                and f"--dim seq={MAX_SEQ + 1} is past it: plan with --dim seq={MAX_SEQ} or less" in message)

    def test_the_command_line_exits_2_with_one_line(self):
        # the command, on the tiny MPT: it used to plan and export Megatron-LM with rope assumed
        result = run_cli(["plan", CASES / "mpt_ts_bare.onnx", "-n", "8", "--dim", "batch=64", "--dim", "seq=2048",
                          "--target", "megatron"], expected_exit_code=2)
        assert error_line(result) == (
            "error: mpt_ts_bare.onnx: the model's position bias covers 16 tokens (onnx::Slice_174, 8 heads x 16 key "
            "positions); --dim seq=2048 is past it: plan with --dim seq=16 or less, or re-export the model with a "
            "longer bias table (MPT's max_seq_len)")
