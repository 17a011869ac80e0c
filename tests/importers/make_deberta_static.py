"""Build ``tests/data/deberta_static``: a DeBERTa-v2 exported by dynamo with static shapes (issue 25).

Run with the integration environment and onnxscript (torch's dynamo exporter needs it); no downloads,
random weights, seed 0::

    .venv-integration/bin/python tests/importers/make_deberta_static.py

The model is the mesh-TF integration test's ``DebertaV2ForMaskedLM`` (``tests/integration/test_mesh_tf_deberta.py``'s
``CONFIG``: 2 layers, hidden 48, 6 heads, ``share_att_key=False``), its weights perturbed by 0.02 x N(0, 1)
as that test's fixture does (a fresh model's equal norm weights would be merged by the exporter's
optimizer). It is exported with no dynamic axes, for ``input_ids`` [2, 16]: the exporter's optimizer
then folds the all-ones attention mask that ``DebertaV2Embeddings`` multiplies the embeddings by
(``embeddings * mask.unsqueeze(2)``) into a float initializer ``unsqueeze`` [2, 16, 1] whose
``pkg.onnxscript.optimizer.folded_from`` record names no parameter (``['ones', 'val_0', ...]``), while
its folded weight copies (``val_N``) name theirs. Saved as the zoo's ``consts`` style (graph-only, small
constants inline, the data file deleted) by ``tests/zoo/make_zoo.py``'s own save; ``counts.json`` holds
torch's parameter count, the config and the versions.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "tests" / "data" / "deberta_static"
NAME = "deberta_static_dynamo_consts.onnx"
BATCH, SEQ = 2, 16


def main() -> int:
    import onnxscript
    import torch
    import transformers

    sys.path.insert(0, str(ROOT))
    sys.path.insert(0, str(ROOT / "tests" / "zoo"))
    import make_zoo  # torch, transformers and onnx: the integration environment
    from tests.integration.test_mesh_tf_deberta import CONFIG

    torch.manual_seed(make_zoo.SEED)
    model = transformers.DebertaV2ForMaskedLM(transformers.DebertaV2Config(**CONFIG)).eval()
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(torch.randn_like(parameter) * 0.02)
    ids = torch.randint(3, CONFIG["vocab_size"], (BATCH, SEQ))
    with torch.no_grad():
        program = torch.onnx.export(model, (ids,), input_names=["input_ids"], output_names=["logits"], dynamo=True)
    path = OUT / NAME
    make_zoo.save_graph_only(program.model_proto, path, threshold_bytes=make_zoo.CONSTS_THRESHOLD_BYTES)
    record = {"config": CONFIG, "input_ids": [BATCH, SEQ],
              "versions": {"torch": torch.__version__, "transformers": transformers.__version__,
                           "onnxscript": onnxscript.__version__},
              "files": {NAME: {"param_count": sum(p.numel() for p in model.parameters()),
                               "size_bytes": path.stat().st_size}}}
    (OUT / "counts.json").write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
