"""torchtitan 0.3.0's own FP8 code converts every exported FP8 row's model as planned (issue 24 "Exports": FP8).

Every torchtitan row of ``--dtype fp8`` plans (H100s: FP8 needs a device with an FP8 peak) is exported and
torchtitan's ``ConfigManager.parse_args`` reads the written registry module, whose config function runs
torchtitan's real ``Float8LinearConverter`` (torchao 0.18.0 float8, rowwise scaling, ``lm_head`` filtered) on
the planned model config; the converted model is then built on the meta device. Held, per row:

* the ``Float8Linear`` modules torchtitan builds are exactly the linears counted by hand from the model's
  config (both dims multiples of 16, the LM head filtered; torchtitan fuses Q, K and V into one ``wqkv``,
  ``n_heads + 2 n_kv_heads`` heads wide), and their weights hold the elements the plan prices in FP8
  (:func:`objectives.precision.is_fp8_linear` over the graph's products, the logits' product excluded);
* their torchao config is the plan's recipe (``Float8LinearConfig.from_recipe_name("rowwise")``) and gathers
  no FP8 under FSDP (``enable_fsdp_float8_all_gather`` off, as ``TrainingSettings.gathers_fp8`` priced);
* ``--compile.enable`` is on, as the converter is told (``model_compile_enabled=True``), and torchtitan's
  ``ParallelDims`` takes the degrees (FSDP, HSDP, ZeRO-0 replication, tp, pp) at the world size.

The cases: ``llama_tiny`` (every linear aligned) on 8 devices and with HSDP (``--fix hsdp=4``) on 16; the
MQA Llama of ``tests/data/reader_cases`` (FFN 200: its three MLP linears stay bf16, tied embeddings); the
qwen3 MoE (its experts are ``GroupedExperts``, which the linear converter leaves bf16, as the plan prices
them; the router's 128 -> 4 gate is unaligned); and the row ``planner plan --export torchtitan`` writes.

What is not run: no FP8 GEMM. ``Float8LinearConverter`` refuses without an NVIDIA SM89+ (or MI300) GPU
(``has_cuda_capability(8, 9)``), so that one function is answered True here and nothing else is changed;
:func:`test_the_converter_needs_sm89` holds the refusal. torchtitan 0.3.0 offers no tensorwise recipe and no
FP8 all-gather (:func:`test_torchtitan_offers_rowwise_only`), so no such rows exist to export.
"""

from __future__ import annotations

import dataclasses
import json
import math
import subprocess
import sys
import typing
from pathlib import Path

import pytest

from exporters import export
from exporters.targets import TARGETS
from objectives.cluster import make_cluster
from objectives.precision import is_fp8_linear
from planner.core.degrees import Pins
from planner.core.settings import TrainingSettings
from planner.launchable import plan_launchable_file, row_plan_input
from planner.plan import PlanRequest
from tests.integration.test_torchtitan_export import _parse  # torchtitan's ConfigManager on the written module

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
ALIGNMENT = 16
"""torchtitan's ``module_filter_fn``: a linear with a dim not divisible by 16 stays bf16."""


@dataclasses.dataclass(frozen=True)
class Case:
    path: Path
    devices: int
    per_node: int
    layers: int
    linears: dict[str, tuple[int, int]]
    """Per transformer layer, each ``Linear`` torchtitan builds as (in, out) features, from the model's config."""
    pins: Pins = Pins()


LLAMA_TINY = dict(  # tests/integration/configs.py: hidden 64, 8 heads of 8, 4 KV heads, FFN 128
    path=ROOT / "tests" / "data" / "llama_tiny.onnx", layers=2,
    linears={"attention.qkv_linear.wqkv": (64, (8 + 2 * 4) * 8), "attention.wo": (64, 64),
             "feed_forward.w1": (64, 128), "feed_forward.w2": (128, 64), "feed_forward.w3": (64, 128)})
CASES = {
    "llama-tiny-8": Case(devices=8, per_node=8, **LLAMA_TINY),
    "llama-tiny-hsdp": Case(devices=16, per_node=4, pins=Pins(hsdp=4, pp=1), **LLAMA_TINY),
    # counts.json: hidden 96, 3 heads of 32, 1 KV head, FFN 200 (200 % 16 = 8: w1, w2, w3 stay bf16)
    "llama-mqa-ffn200": Case(
        path=ROOT / "tests" / "data" / "reader_cases" / "llama_mqa_dynamo_bare.onnx", devices=8, per_node=8, layers=2,
        linears={"attention.qkv_linear.wqkv": (96, (3 + 2 * 1) * 32), "attention.wo": (96, 96),
                 "feed_forward.w1": (96, 200), "feed_forward.w2": (200, 96), "feed_forward.w3": (96, 200)}),
    # make_qk_norm_fixtures.py: hidden 128, 4 heads of 16, 2 KV heads, 4 experts (GroupedExperts, no Linear)
    "qwen3-moe": Case(
        path=ROOT / "tests" / "exporters" / "data" / "qwen3_moe_tiny.onnx", devices=8, per_node=8, layers=2,
        linears={"attention.qkv_linear.wqkv": (128, (4 + 2 * 2) * 16), "attention.wo": (4 * 16, 128),
                 "moe.router.gate": (128, 4)},
        pins=Pins(pp=1)),  # one stage: ep 1 and 4, ZeRO-0 and 3 (the pipelined search would double its 6 s)
}


def _by_hand(case: Case) -> tuple[set[str], int]:
    """The names of the linears torchtitan converts and their weight elements: both dims aligned."""
    aligned = {name: shape for name, shape in case.linears.items() if not any(size % ALIGNMENT for size in shape)}
    names = {f"layers.{layer}.{name}" for layer in range(case.layers) for name in aligned}
    return names, case.layers * sum(math.prod(shape) for shape in aligned.values())


def _planned_fp8_elements(plan_input) -> int:
    """Weight elements of the products the plan prices in FP8 (the logits' product, a graph output, excluded)."""
    graph, total = plan_input.graph, 0
    read = {edge.tensor for edge in graph.edges}
    for op in graph.ops:
        head = any(access.tensor not in read for access in op.outputs)
        if is_fp8_linear(op, graph.tensors, plan_input.settings, graph_output=head):
            shapes = [graph.tensors[a.tensor].shape for a in op.inputs if graph.tensors[a.tensor].role == "parameter"]
            total += math.prod(next(shape for shape in shapes if len(shape) >= 2))
    return total


@pytest.fixture
def sm89(monkeypatch):
    """Answer torchtitan's compute-capability check True, and nothing else: there is no SM89 GPU here, and
    ``Float8LinearConverter.__init__`` refuses without one before it reads its config. The rowwise recipe
    sets ``torch._inductor.config.emulate_precision_casts`` process-wide; it is put back after the test."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("torchtitan")
    pytest.importorskip("torchao")
    import torch._inductor.config
    from torchtitan.components.quantization import float8

    monkeypatch.setattr(float8, "has_cuda_capability", lambda major, minor: True)
    # the config module's own patch restores the flag (monkeypatch's undo would delete, which hides it)
    with torch._inductor.config.patch(emulate_precision_casts=False):
        yield float8


def _check_row(out: dict, settings: TrainingSettings, planned: int, case: Case, folder: Path, float8) -> None:
    """torchtitan's parse and meta build of one exported FP8 row, held to the hand count and the plan."""
    import torch
    from torchao.float8 import Float8LinearConfig
    from torchtitan.distributed import ParallelDims
    from torchtitan.models.common.linear import Linear

    config = _parse(out, folder)  # runs the registry function, Float8LinearConverter included
    ParallelDims.from_config(config.parallelism, out["world_size"])  # torchtitan's own degree checks
    assert config.compile.enable and "model_compile_enabled=True" in out["config_file"]["text"]
    converted = {fqn: linear for fqn, linear, _, _ in config.model_spec.model.traverse(Linear.Config)
                 if isinstance(linear, float8.Float8Linear.Config)}
    names, elements = _by_hand(case)
    assert set(converted) == names and "lm_head" not in converted
    # the plan's recipe, and bf16 FSDP all-gathers as priced (torchao gathers FP8 only when told)
    assert {linear._torchao_config for linear in converted.values()} == {Float8LinearConfig.from_recipe_name(settings.fp8)}
    assert not settings.gathers_fp8 and not Float8LinearConfig.from_recipe_name(settings.fp8).enable_fsdp_float8_all_gather
    assert torch._inductor.config.emulate_precision_casts  # set by the rowwise converter, so it ran
    with torch.device("meta"):
        model = config.model_spec.model.build()
    built = {name: module for name, module in model.named_modules() if isinstance(module, float8.Float8Linear)}
    assert set(built) == names and not isinstance(model.lm_head, float8.Float8Linear)
    assert sum(module.weight.numel() for module in built.values()) == elements == planned


@pytest.mark.parametrize("name", list(CASES))
def test_every_fp8_row_converts_as_planned(name, sm89, tmp_path):
    case = CASES[name]
    request = PlanRequest(cluster=make_cluster("h100-sxm", devices=case.devices, devices_per_node=case.per_node),
                          settings=TrainingSettings(fp8="rowwise"))
    # llama-tiny-8's tp and pp rows asked for too: each holds more NCCL buffers (~308 MB a group or neighbour,
    # objectives.nccl_memory) than this tiny model's tensors, so the free frontier has none of them
    rows = []
    for pins in [case.pins] + ([Pins(tp=2), Pins(pp=2)] if name == "llama-tiny-8" else []):
        _, (found,) = plan_launchable_file(case.path, {"batch": 16, "seq": 128}, [request], launchers=["torchtitan"],
                                           pins=pins, collapse=0.0)
        rows += [row for row in found.rows if "torchtitan" in row.targets]
    assert rows and all(row.cache.settings.precision_label == "fp8" for row in rows)
    seen = set()
    for row in rows:
        plan_input = row_plan_input(row)
        assert plan_input.settings.fp8 == TARGETS["torchtitan"].fp8 == "rowwise"
        _check_row(export("torchtitan", plan_input), plan_input.settings, _planned_fp8_elements(plan_input), case,
                   tmp_path, sm89)
        seen.add((row.point.zero_stage, row.point.pp > 1, row.degrees.tp > 1, row.cache.settings.dp_shard))
    if name == "llama-tiny-8":  # FSDP (ZeRO-3) and replication (ZeRO-0), with tp and pp, all converted
        assert {zero for zero, *_ in seen} == {0, 3} and any(s[1] for s in seen) and any(s[2] for s in seen)
    if name == "llama-tiny-hsdp":
        assert {shard for *_, shard in seen} == {4}


def test_planner_plan_export_converts(sm89, tmp_path):
    """The row ``planner plan --dtype fp8 --export torchtitan`` writes, read back from its JSON."""
    case = CASES["llama-tiny-8"]
    written = tmp_path / "plan.json"
    command = [str(Path(sys.executable).parent / "planner"), "plan", str(case.path), "-n", "8", "--device", "h100-sxm",
               "--dim", "batch=16", "--dim", "seq=128", "--dtype", "fp8", "--target", "torchtitan",
               "--export", "torchtitan", "-o", str(written)]
    done = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    out = json.loads(written.read_text())
    assert any("torchao" in note for note in out["notes"])
    # the same graph priced in FP8 as the plan: 2 layers x (64 x 128 + 64 x 64 + 3 x 64 x 128) weights
    assert _by_hand(case)[1] == 2 * (64 * 128 + 64 * 64 + 3 * 64 * 128) == 73_728
    _check_row(out, TrainingSettings(fp8="rowwise"), 73_728, case, tmp_path, sm89)


def test_the_converter_needs_sm89(tmp_path):
    """Without the answered check torchtitan refuses on this machine, for that reason alone."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("torchtitan")
    pytest.importorskip("torchao")
    if torch.cuda.is_available():
        pytest.skip("an accelerator is present")
    request = PlanRequest(cluster=make_cluster("h100-sxm", devices=2), settings=TrainingSettings(fp8="rowwise"))
    # one FP8 row is all the check needs: the free table's first (dp = 2, ZeRO-0) pinned, 0.7 CPU s against 2.4 (h29c)
    _, (found,) = plan_launchable_file(CASES["llama-tiny-8"].path, {"batch": 4, "seq": 64}, [request],
                                       launchers=["torchtitan"], pins=Pins(dp=2, tp=1, pp=1))
    out = export("torchtitan", row_plan_input(next(row for row in found.rows if "torchtitan" in row.targets)))
    with pytest.raises(ValueError, match="float8 is only supported on NVIDIA SM89 or later"):
        _parse(out, tmp_path)


def test_torchtitan_offers_rowwise_only():
    """torchtitan 0.3.0's converter takes the rowwise recipes and no FP8 all-gather: the torchtitan target's
    one recipe (``Target.fp8``) and its bf16 FSDP gathers (no ``fp8_param_gather``) are all it can run."""
    pytest.importorskip("torchtitan")
    from torchtitan.components.quantization import Float8LinearConverter

    hints = typing.get_type_hints(Float8LinearConverter.Config)
    assert typing.get_args(hints["recipe_name"]) == ("rowwise", "rowwise_with_gw_hp")
    assert "enable_fsdp_float8_all_gather" not in {field.name for field in dataclasses.fields(Float8LinearConverter.Config)}
    assert TARGETS["torchtitan"].fp8 == "rowwise" and not TARGETS["torchtitan"].fp8_param_gather
