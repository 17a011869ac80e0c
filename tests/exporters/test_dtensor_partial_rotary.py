"""The DTensor plan's ``beyond_sizes`` names a partial rotary (issue 25, h24e).

``planner.run`` derives a Hugging Face config from a plan's sizes, and a Llama-style config rotates every channel of
each head; transformers' StableLM, GPT-NeoX, Persimmon and GLM-4 rotate a fraction (``partial_rotary_factor``,
``rotary_pct``), and Llama's own config takes one (``rope_parameters["partial_rotary_factor"]``). No parameter
shows it, so the plan's model section listed nothing and a derived config would have trained full rotary
positions silently. The rotated channels are read from the file's frequencies (``importers.rotary``: ``pairs``),
as Megatron-LM's export reads them for ``--rotary-percent``.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from exporters.dtensor.export import _model_section
from importers.transformer import analyze_transformer
from planner.plan import load_graph

ROOT = Path(__file__).resolve().parents[2]
ZOO = json.loads((ROOT / "tests" / "zoo" / "zoo.json").read_text())["files"]


def _beyond(path: Path) -> list[str]:
    graph = load_graph(path, {"batch": 2, "seq": 32})
    return _model_section(analyze_transformer(graph), graph)["beyond_sizes"]


def test_stablelm_rotates_a_quarter_of_each_head():
    config = ZOO["stablelm_dynamo_consts.onnx"]["config"]
    head_dim = config["hidden_size"] // config["num_attention_heads"]  # 64 / 4 = 16
    rotated = int(config["partial_rotary_factor"] * head_dim)  # 0.25 x 16 = 4
    assert _beyond(ROOT / "tests" / "zoo" / "stablelm_dynamo_consts.onnx") == [
        f"rotary positions on {rotated} of each head's {head_dim} channels (a partial rotary)"]


@pytest.mark.parametrize("name", ["llama31_short_ts_consts.onnx", "smollm3_sub_ts_consts.onnx"])
def test_a_full_rotary_is_not_named(name):
    assert not any("partial rotary" in item for item in _beyond(ROOT / "tests" / "data" / "rotary_cases" / name))
