"""A fused ``Gelu`` node's form is what torch computes (issue 25, :mod:`importers.gelu_form`).

Oracle: torch and onnxruntime. A tiny GPT-2 (``transformers.GPT2LMHeadModel``, 2 layers, hidden 64) with
``activation_function="gelu_pytorch_tanh"`` (``F.gelu(x, approximate="tanh")``) and its twin with ``"gelu"``
(erf) are exported fresh by torch's dynamo exporter at opset 20, the first with ONNX's ``Gelu``. onnxruntime
runs each file and matches torch's logits (so the node's ``approximate`` attribute is the model's GELU), the
other twin's activation moved into the file does not match, and the importer reads ``gelu-tanh`` / ``gelu-erf``.
"""

from __future__ import annotations

import numpy as np
import pytest

from importers.transformer import analyze_transformer
from planner.pricing import load_graph

pytestmark = pytest.mark.integration

_CONFIG = dict(n_layer=2, n_embd=64, n_head=4, n_inner=128, vocab_size=1000, n_positions=128, use_cache=False, bos_token_id=0,
               eos_token_id=0)


def _first_gelu(path, ids) -> np.ndarray:
    """The first ``Gelu`` node's output (the first MLP's activation) as onnxruntime computes the file at ``path``."""
    import onnx
    import onnxruntime

    proto = onnx.load(str(path))
    node = next(n for n in proto.graph.node if n.op_type == "Gelu")
    proto.graph.output.append(onnx.helper.make_tensor_value_info(node.output[0], onnx.TensorProto.FLOAT, None))
    session = onnxruntime.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run([node.output[0]], {session.get_inputs()[0].name: ids})[0]


@pytest.mark.parametrize(("act", "approximate", "expected", "twin"), [
    ("gelu_pytorch_tanh", b"tanh", "gelu-tanh", "gelu-erf"), ("gelu", b"none", "gelu-erf", "gelu-tanh")])
def test_the_read_gelu_is_the_one_torch_runs(tmp_path, act: str, approximate: bytes, expected: str, twin: str) -> None:
    pytest.importorskip("onnxscript", reason="torch.onnx.export(dynamo=True) needs onnxscript")
    pytest.importorskip("onnxruntime")
    transformers = pytest.importorskip("transformers")
    import onnx
    import torch

    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(transformers.GPT2Config(activation_function=act, **_CONFIG)).eval()
    ids = torch.randint(3, 1000, (2, 16))
    seen = []
    model.transformer.h[0].mlp.act.register_forward_hook(lambda module, args, out: seen.append(out.numpy().copy()))
    with torch.no_grad():
        model.transformer.h[0].mlp.c_fc.weight.mul_(50)  # pre-activations of a few units, where the GELUs differ
        program = torch.onnx.export(model, (ids,), dynamo=True, opset_version=20)
        model(ids)
    proto = program.model_proto
    gelus = [n for n in proto.graph.node if n.op_type == "Gelu"]
    assert len(gelus) == 2  # one per MLP
    assert {next((a.s for a in n.attribute if a.name == "approximate"), b"none") for n in gelus} == {approximate}
    path, other = tmp_path / "gpt2.onnx", tmp_path / "other.onnx"
    onnx.save(proto, str(path))
    for node in gelus:  # the same file with the other GELU
        del node.attribute[:]
        node.attribute.append(onnx.helper.make_attribute("approximate", "none" if approximate == b"tanh" else "tanh"))
    onnx.save(proto, str(other))
    torch_act = seen[-1]
    # onnxruntime computes torch's activation from the file as exported, and not from its twin: the two GELUs
    # differ by up to 4.7e-4 (at x = -2.70), float32 rounding by under 1e-5 here (7.6e-6)
    same, moved = (float(np.abs(_first_gelu(p, ids.numpy()) - torch_act).max()) for p in (path, other))
    print(f"{act}: |ORT - torch| {same:.2e} as exported, {moved:.2e} with the other GELU")
    assert same < 1e-5 and moved > 1e-4
    assert analyze_transformer(load_graph(path, {"batch": 2, "seq": 16})).features.mlp_activation == expected
    assert analyze_transformer(load_graph(other, {"batch": 2, "seq": 16})).features.mlp_activation == twin
