"""A TorchScript export of transformers' Mamba-1 computes only at the length it was traced at (issue 25, task H3,
item 1): why ``importers.unrolled_loop`` refuses another ``--dim seq``.

The model is ``tests/importers/make_importer_sweep_cases.py``'s ``mamba1_seq8`` (2 layers, d_model 32, random
weights), exported with its weights at 8 tokens. onnxruntime runs the file at 8 tokens to torch's logits, and
fails at 12: the scan's 8 unrolled steps meet a 12-long tensor. The planner's import of the same file (graph only)
refuses seq=12 naming the 8 steps, and imports seq=8."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

pytestmark = pytest.mark.integration

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
ort = pytest.importorskip("onnxruntime")

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "importers"))
sys.path.insert(0, str(ROOT / "tests" / "zoo"))


def test_the_file_runs_only_at_the_traced_length(tmp_path):
    import make_importer_sweep_cases as cases
    import make_zoo as mz

    from importers import import_model
    from planner.core.errors import ModelError

    built = cases.mamba1_seq8("ts")
    proto = mz._export(built, "ts", fake=False, data_name="mamba1.onnx.data")  # weights inline (small)
    path = tmp_path / "mamba1.onnx"
    path.write_bytes(proto.SerializeToString())
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    ids = built.kwargs["input_ids"]
    with torch.no_grad():
        expected = built.model(input_ids=ids, attention_mask=torch.ones_like(ids))
    # make_zoo restricts the TorchScript forward to the logits (a tensor); a ModelOutput otherwise
    expected = expected if isinstance(expected, torch.Tensor) else expected.logits
    (logits,) = session.run(None, {"input_ids": ids.numpy(), "attention_mask": np.ones_like(ids.numpy())})
    assert np.allclose(logits, expected.numpy(), atol=1e-4)
    longer = np.ones((2, 12), dtype=np.int64)
    with pytest.raises(Exception):  # the 8 unrolled steps are added to 12-long tensors
        session.run(None, {"input_ids": longer, "attention_mask": longer})
    with pytest.raises(ModelError, match=r"unrolled at 8 steps .* --dim seq=8$"):
        import_model(path, {"batch": 2, "seq": 12})
    assert import_model(path, {"batch": 2, "seq": 8}).parameter_count == sum(p.numel() for p in built.model.parameters())
