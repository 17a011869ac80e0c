"""A launcher's refusal of the model names only launchers that run the same plan (issue 25, task H1).

Megatron-LM's family refusals used to end "; export with --target dtensor or as the generic plan" whatever
the reason, so a GPT-2 whose sequence runs past its learned position table, which DTensor refuses as well,
was sent to DTensor. :func:`exporters.export` now ends such a refusal with the launchers that run the plan
(:mod:`exporters.elsewhere`, from the rules). The oracle here is each launcher's exporter run on the same
plan (:func:`exporters.runnable_targets`): every launcher a suffix names exports the plan, and every
other one refuses it. The table's rows are read from the ONNX initializer itself.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import onnx
import pytest

from exporters import export, runnable_targets
from exporters.deepspeed.zero_sync import zero_sync as deepspeed_zero_sync
from exporters.elsewhere import ELSEWHERE
from planner.core.errors import UnsupportedExport
from planner.core.settings import TrainingSettings
from planner.pricing import load_graph
from tests.exporters.graphs import make_input, spaces_for

ROOT = Path(__file__).resolve().parents[2]
GPT2 = ROOT / "tests" / "data" / "gpt2_tiny.onnx"
ZOO = ROOT / "tests" / "zoo"
FRAMEWORKS = ("megatron", "deepspeed", "meshtf", "dtensor", "torchtitan")
SUFFIX = re.compile(r"; export (?:with --target (.+?),? or )?as the generic plan$")


def wpe_rows(path: Path) -> int:
    """Rows of GPT-2's ``wpe`` initializer, read from the file."""
    model = onnx.load(str(path), load_external_data=False)
    return next(int(t.dims[0]) for t in model.graph.initializer if "wpe" in t.name and len(t.dims) == 2)


def named(reason: str) -> set[str] | None:
    """The launchers a refusal's suffix names (``None``: it has no such suffix)."""
    found = SUFFIX.search(reason)
    if found is None:
        return None
    return set(re.split(r", | or ", found.group(1))) if found.group(1) else set()


def _plans(path: Path, seq: int, zero: int = 0):
    """The replicated plan on 1 device and data parallelism on 2 (the batch split 2 ways), at ZeRO ``zero``."""
    graph = load_graph(path, {"batch": 4, "seq": seq})
    one = spaces_for(graph, 1)
    two = spaces_for(graph, 2)
    dp = [space.index_of({batch[0].name: 2}) if (batch := [d for d in op.dims if d.is_batch]) else 0
          for op, space in zip(graph.ops, two)]
    # ZeRO-1 priced as DeepSpeed runs it: its BF16_Optimizer's accumulator and its synchronisation (Target.zero_sync)
    settings = TrainingSettings(zero_stage=zero, grad_accumulator_bytes=4.0 if zero == 1 else 0.0)
    if zero == 1:
        settings = dataclasses.replace(settings, zero_sync=deepspeed_zero_sync(zero_stage=1, precision=settings.precision))
    return [make_input(graph, one, [0] * len(graph.ops), settings=settings), make_input(graph, two, dp, settings=settings)]


def _refusals(plan) -> dict[str, str]:
    out = {}
    for name in FRAMEWORKS:
        try:
            export(name, plan)
        except UnsupportedExport as refusal:
            out[name] = refusal.reason
    return out


DEBERTA = ZOO / "deberta_v2_dynamo_consts.onnx"
CASES = [  # (model, seq, ZeRO stage): the reasons the suffix is written for
    (GPT2, 256, 0),  # past its 128-row table: Megatron-LM, Mesh-TF (and DeepSpeed, DTensor, torchtitan) refuse
    (GPT2, 64, 0),  # fits: torchtitan refuses GPT-2's layers (LayerNorm, GELU, a learned table)
    (DEBERTA, 16, 0),  # Megatron-LM: disentangled attention; DeepSpeed, Mesh-TF and DTensor run it
    (DEBERTA, 16, 1),  # the same at ZeRO-1, which Mesh-TF and DTensor (FSDP2: ZeRO 0 or 3) have not
]


@pytest.mark.parametrize("path, seq, zero", CASES, ids=["gpt2-past-table", "gpt2-fits", "deberta-v2", "deberta-v2-zero1"])
def test_a_suffix_names_exactly_the_launchers_whose_exporter_runs_the_plan(path, seq, zero):
    suffixed = 0
    for plan in _plans(path, seq, zero):
        runs = set(runnable_targets(plan)) - {"generic"}  # the oracle: every exporter run on the plan
        for name, reason in _refusals(plan).items():
            assert "\n" not in reason
            names = named(reason)
            if names is not None:
                suffixed += 1
                assert names == runs - {name}, (name, reason)
    assert suffixed  # each case has a refusal of the model with the suffix


def test_past_the_table_megatron_and_mesh_tf_refuse_verbatim_and_name_no_launcher():
    rows = wpe_rows(GPT2)  # 128
    seq = 2 * rows
    table = (f"its learned position table has {rows} rows and the sequence is {seq} tokens, so the model cannot run "
             "that long (its position lookup reads past the table)")
    fix = f"; plan with --dim seq={rows} or less, or re-export the model with a longer table"
    for plan in _plans(GPT2, seq):
        refused = _refusals(plan)
        assert set(refused) == set(FRAMEWORKS)  # nobody runs it: the suffix names the generic plan alone
        assert refused["megatron"] == ("Megatron-LM would train a different model: " + table + ", and Megatron-LM's GPT "
                                       f"model would learn a {seq}-row table (--max-position-embeddings)" + fix + ELSEWHERE)
        assert refused["meshtf"] == ("Mesh-TensorFlow would train a different model: " + table + ", and "
                                     f"Mesh-TensorFlow's Unitransformer would learn a {seq}-row table (max_length)"
                                     + fix + ELSEWHERE)
        assert refused["dtensor"] == "A DTensor plan trains the model as exported, and " + table + fix


def test_the_suffix_follows_the_plan_not_the_model():
    # DeBERTa-v2 at ZeRO-1 on 2 devices: Mesh-TF has no ZeRO, FSDP2 no ZeRO-1 (their own refusals name their fix)
    plan = _plans(DEBERTA, 16, zero=1)[1]
    refused = _refusals(plan)
    assert refused["meshtf"] == "Mesh-TensorFlow has no ZeRO sharding (the plan uses ZeRO-1); plan with --zero 0"
    assert refused["megatron"].endswith("; export with --target deepspeed or as the generic plan")
