"""Record in a fixture's ``counts.json`` the parameters torch counts that its exported output never reads (h32f).

torch's ``sum(p.numel() for p in model.parameters())`` counts every parameter of the module, and an export holds only
what its output is computed from: a head the export does not return (DETR's box predictor, when the fixture exports
``logits`` only) or a layer whose output nothing reads (the last layer of LLaVA-1.5's vision tower, read at
``vision_feature_layer=-2``, and CLIP's ``post_layernorm``, which LLaVA never applies; Wav2Vec2's
``masked_spec_embed``, read only when time steps are masked) is not in the file, and no
importer can count it. This script rebuilds each listed fixture's model with the builder that made the file, runs
the exported forward (the builders' own inputs, the output the file holds), back-propagates the output's sum with
every parameter set to require a gradient, and records as ``unread_param_count`` the elements of the parameters
whose gradient stays ``None`` (``unread_params``: their names and shapes), the key ``make_outside_zoo.py`` writes
for DINOv2's ``mask_token`` from a hand list. ``bench/issue25_scan.py params`` compares the importer's count with
torch's count less these.

Run with torch and transformers 5.24 (about a minute on two loaded cores; name cases to run only those)::

    .venv-integration/bin/python tests/importers/make_unread_counts.py [detr_ts] [wav2vec2_ts] [llava] [llava15] [llava_tied]
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "tests" / "data"


def _load(name: str, path: Path) -> Any:
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def _unseen() -> Any:
    return _load("unseen_archs", ROOT / "bench" / "unseen_archs.py")


def _llava_case(name: str) -> Any:
    unseen, cases = _unseen(), _load("make_llava_cases", ROOT / "tests" / "exporters" / "make_llava_cases.py")
    if name == "llava15":
        return cases._llava(unseen.mz, cases.CLIP_L14_336, dict(unseen.SMALL, model_type="llama"), image=336, seq=600,
                            feature_layer=-2, exporter="ts", fake=False)
    return cases._llava(unseen.mz, cases.TIED_TOWER, cases.TIED_DECODER, image=32, seq=24, feature_layer=-1,
                        exporter="ts", fake=False)


CASES: dict[str, tuple[str, str, Callable[[], Any]]] = {
    "detr_ts": ("importer_sweep_cases", "detr_ts",
                lambda: _load("make_importer_sweep_cases", ROOT / "tests" / "importers" / "make_importer_sweep_cases.py")
                .detr("ts")),
    "wav2vec2_ts": ("sweep_cases", "wav2vec2_ts",
                    lambda: _load("make_sweep_cases", ROOT / "tests" / "importers" / "make_sweep_cases.py")
                    .wav2vec2("ts")),
    "llava": ("vlm_cases", "llava_ts_consts.onnx", lambda: _unseen().llava(realistic=False, exporter="ts", fake=False)),
    "llava15": ("vlm_cases", "llava15_ts_consts.onnx", lambda: _llava_case("llava15")),
    "llava_tied": ("vlm_cases", "llava_tied_ts_consts.onnx", lambda: _llava_case("llava_tied")),
}
"""Case -> (folder under tests/data, its key in that ``counts.json``, the builder that made the file)."""


def unread(built: Any) -> list[tuple[str, list[int]]]:
    """``(name, shape)`` of every parameter of ``built.model`` that no gradient of the exported output reaches."""
    import torch

    model = built.model
    for parameter in model.parameters():
        parameter.requires_grad_(True)
        parameter.grad = None
    with torch.enable_grad():
        output = model(*built.args, **built.kwargs)
        output = output[0] if isinstance(output, (tuple, list)) else output
        output.float().sum().backward()
    return [(name, list(p.shape)) for name, p in model.named_parameters() if p.grad is None]


def main(argv: list[str]) -> int:
    for case in argv or list(CASES):
        folder, key, build = CASES[case]
        found = unread(build())
        path = DATA / folder / "counts.json"
        counts = json.loads(path.read_text())
        entries = counts["files"] if isinstance(counts.get("files"), dict) else counts
        entries[key]["unread_param_count"] = sum(_elements(shape) for _, shape in found)
        entries[key]["unread_params"] = {name: shape for name, shape in found}
        path.write_text(json.dumps(counts, indent=1) + "\n")
        print(case, entries[key]["param_count"], entries[key]["unread_param_count"], flush=True)
    return 0


def _elements(shape: list[int]) -> int:
    total = 1
    for size in shape:
        total *= size
    return total


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
