"""Graph-only files whose every initializer is external and missing import like the originals (issue 15).

Each real export in tests/data/ (and examples/) is re-saved with
``onnx.save_model(..., save_as_external_data=True, all_tensors_to_one_file=True, size_threshold=0)``
and its data file deleted, so the Reshape/Slice/Squeeze shape constants are gone too. The
importer must then find the same parameters, the same FLOPs and the same ops, with no op
opaque (the attention ``Q K^T`` MatMul and the second LSTM layer were). The oracle is the same
file imported with its constants: nothing about the model changed but where its tensors live.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import onnx
import pytest

from importers import import_model
from tests.importers.graph_checks import check_graph

ROOT = Path(__file__).resolve().parents[2]


def _entries() -> list[tuple[str, Path, dict]]:
    out = []
    for folder in (ROOT / "tests" / "data", ROOT / "examples"):
        index = folder / "models.json"
        if index.exists():
            for key, info in json.loads(index.read_text()).items():
                if (folder / info["file"]).exists() and info.get("ir_version", 8) >= 7:
                    out.append((key, folder / info["file"], info))
    return out


ENTRIES = _entries()
_MORE_OF_THE_SAME = {"gpt3_13b", "gpt3_175b", "gpt_48l", "gpt_1t"}  # gpt3_1p3b's layers, more of them: skipped for time


def _dims(info: dict) -> dict[str, int]:
    config = info.get("config", {})
    values = {"batch": 2, "seq": config.get("example_seq", 16), "tgt_seq": config.get("example_tgt_seq", 16)}
    return {name: values.get(name, 8) for name in info.get("dims", [])}


def _strip(path: Path, folder: Path) -> Path:
    model = onnx.load(path, load_external_data=False)
    out = folder / path.name
    onnx.save_model(model, out, save_as_external_data=True, all_tensors_to_one_file=True, location="w.bin", size_threshold=0)
    (folder / "w.bin").unlink(missing_ok=True)
    return out


@pytest.mark.parametrize("key,path,info", [e for e in ENTRIES if e[0] not in _MORE_OF_THE_SAME], ids=[e[0] for e in ENTRIES if e[0] not in _MORE_OF_THE_SAME])
def test_every_initializer_stripped_imports_like_the_original(tmp_path, key, path, info):
    stripped = _strip(path, tmp_path)
    model = onnx.load(stripped, load_external_data=False)
    assert all(t.data_location == onnx.TensorProto.EXTERNAL for t in model.graph.initializer)
    assert not (tmp_path / "w.bin").exists()
    original, graph = import_model(path, _dims(info)), import_model(stripped, _dims(info))
    assert check_graph(graph) == []
    assert graph.parameter_count == original.parameter_count
    assert graph.forward_flops() == original.forward_flops()
    assert graph.opaque_ops == original.opaque_ops == ()
    # The same ops: no view left as a data-movement op because its shapes were ambiguous.
    assert Counter(op.kind for op in graph.ops) == Counter(op.kind for op in original.ops)
    assert [op.name for op in graph.ops] == [op.name for op in original.ops]
