"""Issue 25 leftovers: a model file rewritten in place (same path, other content) is read again by the
attention-scale and rotary readers in the same process (importers/attention_scale.py, importers/rotary.py),
and by the norm-epsilon reader without a hash (every reader keeps its answer per reading of the file:
:func:`importers.onnx_facts.per_reading`).

Both used to be ``functools.lru_cache``d by path alone. Now they keep an answer per reading of the file
(:func:`importers.onnx_facts.file_facts`): the op graph's SHA-256 of the file when the caller passes it,
else the file's size and modification time. The rewrites below keep the file's size (only a float
constant's value changes), so the path-only and size-only keys could not tell them apart.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import onnx
from onnx import TensorProto as T
from onnx import helper, numpy_helper

from exporters.megatron.families import _rotary_of
from importers import import_model
from importers.attention_scale import attention_scales
from importers.layer_features import attention_scale_of
from importers.rotary import rotary_frequencies


def _sha(path: Path) -> str:
    """The file's SHA-256, as ``OpGraph.source_sha256`` holds it (importers/onnx_load.py hashes the bytes)."""
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _scores_file(path: Path, divisor: float) -> Path:
    """``softmax((q @ k) / divisor)`` as transformers' eager attention writes it (a ``Div`` by a Constant)."""
    nodes = [helper.make_node("MatMul", ["q", "k"], ["s"], name="mm"),
             helper.make_node("Constant", [], ["c"], value=helper.make_tensor("v", T.FLOAT, [], [divisor])),
             helper.make_node("Div", ["s", "c"], ["t"], name="scale"),
             helper.make_node("Softmax", ["t"], ["p"], name="sm", axis=-1)]
    io = [helper.make_tensor_value_info(n, T.FLOAT, [2, 4, 4]) for n in ("q", "k", "p")]
    model = helper.make_model(helper.make_graph(nodes, "g", io[:2], io[2:]), opset_imports=[helper.make_opsetid("", 18)])
    onnx.save(model, path)
    return path


def _rotary_file(path: Path, base: float, rotated: int = 16) -> Path:
    """A model whose only constant is RoFormer's ``b^(-2i/d)``, i < d/2 (Su et al. 2021, eq. 15), named as
    Hugging Face's ``inv_freq`` buffer."""
    theta = (base ** (-np.arange(0, rotated, 2) / rotated)).astype(np.float32)
    name = "model.rotary_emb.inv_freq"
    const = helper.make_node("Constant", [], [name], value=numpy_helper.from_array(theta))
    out = helper.make_tensor_value_info(name, T.FLOAT, [len(theta)])
    model = helper.make_model(helper.make_graph([const], "g", [], [out]), opset_imports=[helper.make_opsetid("", 18)])
    onnx.save(model, path)
    return path


def _later(path: Path, seconds: int) -> None:
    """Set the file's modification time ``seconds`` past its current one (a rewrite within the
    filesystem's timestamp granularity may otherwise keep it)."""
    mtime = os.stat(path).st_mtime_ns + seconds * 10**9
    os.utime(path, ns=(mtime, mtime))


def test_attention_scale_of_a_rewritten_file_with_its_hash(tmp_path):
    path = _scores_file(tmp_path / "m.onnx", 8.0)  # GPT-2's head of 64: / sqrt(64)
    first, size = _sha(path), path.stat().st_size
    assert attention_scales(str(path), first) == {"sm": 1 / 8}
    _scores_file(path, 4.0)  # a head of 16 (DeBERTa's zoo config): / sqrt(16)
    assert path.stat().st_size == size and _sha(path) != first
    assert attention_scales(str(path), _sha(path)) == {"sm": 1 / 4}


def test_attention_scale_of_a_rewritten_file_by_its_stamp(tmp_path):
    path = _scores_file(tmp_path / "m.onnx", 8.0)
    assert attention_scales(str(path)) == {"sm": 0.125}
    _scores_file(path, 16.0)  # sqrt(256): a head of 256 (Gemma's), exact in float32
    _later(path, 2)
    assert attention_scales(str(path)) == {"sm": 1 / 16}


def test_attention_scale_of_a_graph_follows_its_file(tmp_path):
    # the caller that has the graph (importers/layer_features.py) passes the graph's hash of the file
    path = _scores_file(tmp_path / "m.onnx", 8.0)
    graph = import_model(path, {})
    softmaxes = [i for i, op in enumerate(graph.ops) if op.kind == "softmax"]
    assert len(softmaxes) == 1 and attention_scale_of(graph, softmaxes) == 0.125
    _scores_file(path, 4.0)
    again = import_model(path, {})
    assert again.source_sha256 == _sha(path) != graph.source_sha256
    assert attention_scale_of(again, softmaxes) == 0.25


def test_rotary_base_of_a_rewritten_file(tmp_path):
    path = _rotary_file(tmp_path / "m.onnx", 10_000)  # Llama 2
    first, size = _sha(path), path.stat().st_size
    found = rotary_frequencies(path, first)
    assert (found.pairs, found.geometric, found.base) == (8, True, 10_000)
    _rotary_file(path, 500_000)  # Llama 3
    assert path.stat().st_size == size
    found = rotary_frequencies(path, _sha(path))
    assert (found.pairs, found.geometric, found.base) == (8, True, 500_000)
    _rotary_file(path, 1_000_000)  # Qwen2, read by the file's size and modification time
    _later(path, 4)
    assert rotary_frequencies(path).base == 1_000_000


def test_megatron_reads_the_base_of_the_graphs_version_of_the_file(tmp_path):
    # exporters/megatron/families.py passes the graph's hash: --rotary-base follows the file
    path = _rotary_file(tmp_path / "m.onnx", 10_000)
    model = SimpleNamespace(position_table_rows=None, head_dim=16, attention=())
    graph = SimpleNamespace(source_path=str(path), source_sha256=_sha(path))
    assert _rotary_of(graph, model)[0].base == 10_000
    _rotary_file(path, 500_000)
    graph = SimpleNamespace(source_path=str(path), source_sha256=_sha(path))
    assert _rotary_of(graph, model)[0].base == 500_000


def _norm_file(path: Path, epsilon: float) -> Path:
    """One ``LayerNormalization`` with its ``epsilon`` attribute (opset 17)."""
    scale = numpy_helper.from_array(np.ones(4, dtype=np.float32), "w")
    node = helper.make_node("LayerNormalization", ["x", "w"], ["y"], name="ln", epsilon=epsilon, axis=-1)
    io = [helper.make_tensor_value_info(n, T.FLOAT, [2, 4]) for n in ("x", "y")]
    graph = helper.make_graph([node], "g", io[:1], io[1:], initializer=[scale])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]), path)
    return path


def test_norm_epsilon_of_a_rewritten_file_without_its_hash(tmp_path):
    # the path-and-hash cache returned the first epsilon for a caller without the hash ("")
    from importers.norm_eps import _file_epsilons

    path = _norm_file(tmp_path / "m.onnx", 1e-5)  # GPT-2's
    assert _file_epsilons(str(path)) == {"ln": np.float32(1e-5)}
    _norm_file(path, 1e-6)  # Llama's (same size: a float attribute's value changes)
    _later(path, 2)
    assert _file_epsilons(str(path)) == {"ln": np.float32(1e-6)}
