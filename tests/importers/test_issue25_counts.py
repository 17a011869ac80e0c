"""Issue 25, item 1c's last fixture counts (h32f): each equals torch's ``counts.json`` count, give or take exactly what
an import warning states or what torch found the exported output never reads (``unread_param_count``, recorded by
``tests/importers/make_unread_counts.py``); and ``bench/issue25_scan.py`` reads only the counts a warning gives,
with their sign."""

from __future__ import annotations

import importlib.util
import json
import re
import sys
from pathlib import Path

import pytest

from importers import import_model

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "tests" / "data"
ZOO = ROOT / "tests" / "zoo"


def _scan():
    if "issue25_scan" not in sys.modules:
        spec = importlib.util.spec_from_file_location("issue25_scan", ROOT / "bench" / "issue25_scan.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules["issue25_scan"] = module
        spec.loader.exec_module(module)
    return sys.modules["issue25_scan"]


def _record(path: Path) -> dict:
    """The file's ``counts.json`` entry (the layouts :func:`issue25_scan.torch_counts` reads)."""
    data = json.loads((path.parent / "counts.json").read_text())
    entries = data["files"] if isinstance(data.get("files"), dict) else data
    return entries.get(path.name) or next(v for k, v in entries.items() if path.stem.startswith(k + "_"))


def _import(path: Path):
    return import_model(path, _scan()._symbolic_dims(path, {"batch": 2, "seq": 16, "samples": 4000}, 16))


def _warned(graph, pattern: str) -> list[int]:
    return [int(m.group(1).replace(",", "")) for w in graph.warnings for m in re.finditer(pattern, w)]


def test_siglip_torchscript_counts_its_logit_bias():
    """TorchScript folds SigLIP's one-element ``logit_bias`` into ``onnx::Add_N``, added to the logits before their
    transpose: counted (torch's 250,114), with the warning that such a constant may be a buffer (one element)."""
    path = DATA / "pooling_cases" / "siglip_ts_bare.onnx"
    graph = _import(path)
    assert graph.parameter_count == _record(path)["param_count"] == 250_114
    assert _warned(graph, r"'onnx::Add_\d+' \[1\], a constant the exporter made and added to the output, may be a "
                          r"non-trainable buffer .* it is counted \(([\d,]+) parameters\)") == [1]


@pytest.mark.parametrize("path", [DATA / "reader_cases" / "segformer_ts_bare.onnx", ZOO / "segformer_ts_bare.onnx",
                                  ZOO / "resnet_ts_bare.onnx", ZOO / "efficientnet_ts_bare.onnx"])
def test_fused_batchnorm_warning_names_the_elements_left_out(path: Path):
    """A Conv fused with an eval-mode BatchNorm: the warning's element count is what the count lacks, torch's count
    less the import's (the fixture's ``counts.json``, or the zoo's ``folded_param_count``, which make_zoo computes
    from the torch model: 64 for SegFormer's decode head, 256 for ResNet, 2,184 for EfficientNet)."""
    graph = _import(path)
    if path.parent == ZOO:
        record = json.loads((ZOO / "zoo.json").read_text())["files"][path.name]
        missing = record["folded_param_count"]
        tied = _warned(graph, r"it is counted \(([\d,]+) parameters\)")
        assert graph.parameter_count - sum(tied) == record["param_count"] - missing or not tied
    else:
        missing = _record(path)["param_count"] - graph.parameter_count
    assert missing > 0
    assert _warned(graph, r"the count is short by ([\d,]+) elements \(C per Conv") == [missing]


def test_detr_counts_torchs_less_the_box_head_its_export_drops():
    """The fixture exports DETR's ``logits`` only: the box predictor (3 linears, 32 -> 32 -> 32 -> 4: 2,244
    elements by hand) is not in the file; the import counts torch's count less that, plus the 120 elements of the
    frozen BatchNorms' folded scale and shift it warns it counts."""
    path = DATA / "importer_sweep_cases" / "detr_ts_bare.onnx"
    record, graph = _record(path), _import(path)
    assert record["unread_param_count"] == (32 * 32 + 32) * 2 + 32 * 4 + 4 == 2_244
    assert all(name.startswith("bbox_predictor.") for name in record["unread_params"])
    assert _warned(graph, r"they are counted \(([\d,]+) parameters\)") == [120]
    assert graph.parameter_count == record["param_count"] - 2_244 + 120


def test_llava15_counts_torchs_less_the_tower_layer_it_never_reads():
    """LLaVA-1.5 reads its CLIP ViT-L/14-336 tower at ``vision_feature_layer=-2``: the 24th layer and the tower's
    ``post_layernorm`` feed nothing, so the file has neither. By hand, width 1024, FFN 4096: four biased 1024 x 1024
    projections, two FFN linears with biases, two LayerNorms, and the post-LayerNorm. The head is untied (Llama's
    default), so the count is exactly torch's less these (the import warns the head may be a tied copy, which it is
    not here)."""
    path = DATA / "vlm_cases" / "llava15_ts_consts.onnx"
    record, graph = _record(path), _import(path)
    d, f = 1024, 4096
    by_hand = 4 * (d * d + d) + (d * f + f) + (f * d + d) + 2 * 2 * d + 2 * d
    assert record["unread_param_count"] == by_hand == 12_598_272
    assert all(".encoder.layers.23." in name or ".post_layernorm." in name for name in record["unread_params"])
    assert graph.parameter_count == record["param_count"] - by_hand


def test_wav2vec2_counts_torchs_less_its_mask_embedding_and_g():
    """Wav2Vec2's ``masked_spec_embed`` (64) is read only where time steps are masked, so not in the file; the
    positional conv's weight-norm g (16 taps at weight_norm(dim=2), transformers' choice) is warned as missing."""
    path = DATA / "sweep_cases" / "wav2vec2_ts_bare.onnx"
    record, graph = _record(path), _import(path)
    assert record["unread_params"] == {"wav2vec2.masked_spec_embed": [64]} and record["unread_param_count"] == 64
    diff = graph.parameter_count - (record["param_count"] - 64)
    assert diff == -16 == -record["shapes"]["wav2vec2.encoder.pos_conv_embed.conv.parametrizations.weight.original0"][-1]
    assert _scan()._said(diff, list(graph.warnings))


def test_scan_reads_signed_counts_only():
    """The scan's rule: a difference is said when one to three of the warnings' signed counts sum to it; a shape's
    numbers (64 + 64 = 128 before h32f) never do."""
    scan = _scan()
    tied = ("'onnx::MatMul_1' [64, 1000] may be a transposed copy ... it is counted (64,000 parameters): if the model "
            "ties them, the true count is that much lower")
    short = "...; the trace lacks 1 expert(s) ...: the parameter count is 16,384 short of the model's, and ..."
    assert scan.corrections([tied, short]) == [(64_000,), (-16_384,)]
    assert scan._said(64_000 - 16_384, [tied, short])  # Switch's +47,616
    assert not scan._said(16_384 - 64_000, [tied, short])  # the wrong sign
    assert not scan._said(-128, [tied])  # LLaVA's post_layernorm: not a warned count
    assert not scan._said(64_000 + 16_384, [tied, short])
    norm = ("... counted as v (48), so the parameter count is short by g's elements, one per slice along the norm's dim, "
            "which the file does not record (4 at dim=0, 4 at dim=1, 3 at dim=2; torch's default is dim=0)")
    assert scan._said(-3, [norm]) and scan._said(-4, [norm])  # one alternative, never two summed
    assert not scan._said(-7, [norm]) and not scan._said(-11, [norm])


@pytest.mark.parametrize("path, diff", [(DATA / "expert_loops" / "switch_ts_consts.onnx", 64_000 - 16_384),
                                        (DATA / "vlm_cases" / "llava_tied_ts_consts.onnx", 64_000),
                                        (DATA / "vlm_cases" / "llava_ts_consts.onnx", 0)])
def test_tied_and_untraced_counts_net_to_the_difference(path: Path, diff: int):
    """Switch: 64,000 counted as a possible tied copy ([64, 1000]), 16,384 of the expert the trace lacks (one of
    4, 2 x 64 x 128); the LLaVAs: CLIP's ``post_layernorm`` (2 x 64), which LLaVA never applies, is outside
    the file, and the tied one's head copy is counted with a warning (the untied one's head is its own weight)."""
    record, graph = _record(path), _import(path)
    assert record.get("unread_param_count", 0) == (128 if "llava" in path.name else 0)
    assert graph.parameter_count - (record["param_count"] - record.get("unread_param_count", 0)) == diff
    assert diff == 0 or _scan()._said(diff, list(graph.warnings))


def test_every_counted_fixture_folder_is_scanned():
    """``fixture_folders`` is every ``tests/data`` folder with ONNX files and a ``counts.json`` (U-Net's and GAT's
    among them, which the hand-kept list lacked)."""
    expected = {p.parent.name for p in DATA.glob("*/counts.json") if any(p.parent.glob("*.onnx"))}
    assert {"unet_cases", "gat_cases"} <= expected
    assert {p.name for p in _scan().fixture_folders()} == expected
    scanned = {f.parent.name for f in _scan()._megatron_files() if f.parent.parent == DATA}
    assert expected <= scanned
    assert _scan()._symbolic_dims(DATA / "gat_cases" / "gat_dynamo_bare.onnx", _scan()._MEGATRON_DIMS, None) == {
        "edges": 13_264, "nodes": 2_708}  # every input dim bound, so the GAT is planned, not refused for a dim
