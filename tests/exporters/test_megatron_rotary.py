"""The rotary embedding's base and rotated share reach the Megatron export exactly, or it refuses
(issue 25: no silently different model): read from the file's ``inv_freq``-shaped constant."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from exporters.megatron.export import megatron_rotary_args
from exporters.validate import megatron_violations, parse_megatron_args
from importers.rotary import rotary_frequencies
from planner.core.errors import UnsupportedExport

ROOT = Path(__file__).resolve().parents[2]


def _file(tmp_path: Path, values: np.ndarray, name: str = "model.rotary_emb.inv_freq") -> Path:
    """A model whose only constant is ``values`` (as an exporter writes ``inv_freq``)."""
    const = helper.make_node("Constant", [], [name], value=numpy_helper.from_array(values.astype(np.float32)))
    out = helper.make_tensor_value_info(name, TensorProto.FLOAT, [len(values)])
    model = helper.make_model(helper.make_graph([const], "g", [], [out]), opset_imports=[helper.make_opsetid("", 18)])
    path = tmp_path / "m.onnx"
    onnx.save(model, path)
    return path


def _theta(base: float, rotated: int) -> np.ndarray:
    """RoFormer's frequencies b^(-2i/d) for i < d/2 (Su et al. 2021, eq. 15)."""
    return base ** (-np.arange(0, rotated, 2) / rotated)


@pytest.mark.parametrize(("base", "rotated"), [(10000, 128), (500000, 128), (1000000, 64), (10000, 32)])
def test_the_base_is_read_back(tmp_path, base, rotated):
    found = rotary_frequencies(_file(tmp_path, _theta(base, rotated)))
    assert found is not None and found.geometric and found.pairs == rotated // 2 and found.base == base


def test_the_zoo_mixtral_rotates_with_base_a_million():
    # transformers' MixtralConfig: rope_theta 1e6 (the zoo's config keeps the library default)
    found = rotary_frequencies(ROOT / "tests" / "zoo" / "mixtral_ts_consts.onnx")
    assert found is not None and found.base == 1_000_000


def _model(head_dim: int = 128):
    return SimpleNamespace(position_table_rows=None, head_dim=head_dim, attention=())  # no MLA


def _graph(path: Path):
    return SimpleNamespace(source_path=str(path))


def test_megatron_writes_the_base_and_the_partial_share(tmp_path):
    args, note = megatron_rotary_args(_graph(_file(tmp_path, _theta(500000, 32))), _model(128))
    assert args == ["--rotary-base", "500000", "--rotary-percent", "0.25"]
    assert "base 500000 over 32 of 128 channels" in note
    parsed = parse_megatron_args(["--num-layers", "2", "--hidden-size", "256", "--num-attention-heads", "2",
                                  "--seq-length", "64", "--max-position-embeddings", "64", "--micro-batch-size", "1",
                                  "--position-embedding-type", "rope", *args])
    assert parsed["rotary-base"] == 500000 and parsed["rotary-percent"] == "0.25"
    assert not megatron_violations(parsed, world_size=1, env={})


def test_a_scaled_rope_is_refused(tmp_path):
    theta = _theta(500000, 128)
    theta[32:] /= 8.0  # Llama 3.1's low-frequency band divided by its factor: not geometric
    with pytest.raises(UnsupportedExport, match="not a geometric series"):
        megatron_rotary_args(_graph(_file(tmp_path, theta)), _model(128))


def test_no_frequencies_in_the_file_is_said(tmp_path):
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])
    relu = helper.make_node("Relu", ["x"], ["y"])
    model = helper.make_model(helper.make_graph([relu], "g", [x], [y]), opset_imports=[helper.make_opsetid("", 18)])
    path = tmp_path / "empty.onnx"
    onnx.save(model, path)
    args, note = megatron_rotary_args(_graph(path), _model())
    assert args == [] and "--rotary-base 10000 applies; set your model's" in note
    assert megatron_rotary_args(_graph(path), SimpleNamespace(position_table_rows=1024, head_dim=64)) == ([], "")


def test_the_family_refuses_what_the_export_would(tmp_path):
    """A scaled RoPE is refused where the Megatron family is decided, so no row lists megatron that
    its export refuses; plain frequencies are no reason."""
    from exporters.megatron.families import _rotary_refusal

    theta = _theta(500000, 128)
    theta[32:] /= 8.0
    (clause,) = _rotary_refusal(_graph(_file(tmp_path, theta)), _model(128))
    assert clause.startswith("its rotary frequencies are not a geometric series") and "export as" not in clause
    plain = tmp_path / "plain"
    plain.mkdir()
    assert _rotary_refusal(_graph(_file(plain, _theta(10000, 128))), _model(128)) == []
