"""Issue 25 with megatron-core itself: the Mamba family's exports (exporters/megatron/mamba.py) are what
megatron-core 0.16.1 builds.

Checked with megatron-core's own code: ``TransformerConfig`` accepts each export's sizes and mamba
fields; ``mamba_hybrid_layer_allocation.allocate_layers`` turns the exported
``--hybrid-override-pattern`` into the graph's layer kinds; ``--spec`` names a real ``ModuleSpec``;
``MambaModel`` takes the pattern. ``MambaMixer``'s ``__init__`` raises without ``mamba_ssm`` (CUDA
kernels, absent from the CPU integration venv), so its sizes are checked against its source (the
``in_proj`` width, ``d_conv=4``), and at tp=2 it is built with stand-ins for the CUDA parts
(``_BUILD_MIXER``) to count one rank's parameters against the exported tp=2 row's; ``MambaStack``'s
source is checked against the recompute/offload refusals.
"""

from __future__ import annotations

import importlib
import inspect
import math
from pathlib import Path

import pytest

from exporters.megatron.mamba import MAMBA_CONV_KERNEL, MAMBA_SPEC
from exporters.validate import parse_megatron_args
from tests.exporters.test_megatron import _transformer_config_kwargs
from tests.exporters.test_megatron_mamba import DATA, DIMS, HYBRID, MAMBA2, _export
from planner.core.settings import TrainingSettings
from planner.plan import load_graph
from tests.integration.forked_python import run_python  # the build's python -c, torch and megatron-core imported once

pytestmark = pytest.mark.integration

CASES = [DATA / name for name in HYBRID] + [MAMBA2 / "mamba2_dynamo_consts.onnx", MAMBA2 / "mamba2_ts_consts.onnx"]


def _args(path: Path, settings: TrainingSettings | None = None) -> dict:
    return parse_megatron_args(_export(load_graph(path, DIMS), 2, settings)["args"])


@pytest.mark.parametrize("path", CASES, ids=lambda p: p.stem)
def test_transformer_config_accepts_the_exports(path):
    pytest.importorskip("torch")
    pytest.importorskip("megatron.core")
    from megatron.core.activations import squared_relu
    from megatron.core.transformer.transformer_config import TransformerConfig

    args = _args(path, TrainingSettings(zero_stage=1))
    kwargs = _transformer_config_kwargs(args)
    # core_transformer_config_from_args: every TransformerConfig field of the same name, and
    # activation_func = squared_relu under --squared-relu
    kwargs.update(mamba_num_heads=args["mamba-num-heads"], mamba_head_dim=args["mamba-head-dim"],
                  mamba_num_groups=args["mamba-num-groups"], mamba_state_dim=args["mamba-state-dim"])
    if args.get("squared-relu"):
        kwargs["activation_func"] = squared_relu
    config = TransformerConfig(**kwargs)
    assert config.mamba_num_heads * config.mamba_head_dim == 128  # d_inner = 2 x hidden in both fixtures
    assert config.num_layers == len(args["hybrid-override-pattern"])
    assert not config.add_bias_linear and config.normalization == "RMSNorm"


@pytest.mark.parametrize("path", CASES, ids=lambda p: p.stem)
def test_megatron_allocates_the_pattern(path):
    pytest.importorskip("megatron.core")
    from megatron.core.ssm.mamba_hybrid_layer_allocation import allocate_layers

    args = _args(path)
    pattern = args["hybrid-override-pattern"]
    layers = allocate_layers(args["num-layers"], 0.0, 0.0, pattern)
    assert "".join(layers) == pattern == ("M*M-" if "nemotron" in path.name else "M")


def test_spec_and_model_class():
    pytest.importorskip("megatron.core")
    from megatron.core.models.mamba import MambaModel
    from megatron.core.transformer.spec_utils import ModuleSpec

    spec = getattr(importlib.import_module(MAMBA_SPEC[0]), MAMBA_SPEC[1])
    assert isinstance(spec, ModuleSpec)
    params = inspect.signature(MambaModel.__init__).parameters
    assert {"mamba_stack_spec", "hybrid_override_pattern", "position_embedding_type"} <= set(params)


def test_mixer_sizes_are_megatrons():
    """importers.hybrid.layer_parameters and the conv width, against MambaMixer's source (not built:
    mamba_ssm is missing on CPU)."""
    pytest.importorskip("megatron.core")
    from megatron.core.ssm import mamba_mixer

    assert not mamba_mixer.HAVE_MAMBA_SSM  # the CPU venv: MambaMixer(...) raises ImportError
    assert inspect.signature(mamba_mixer.MambaMixer.__init__).parameters["d_conv"].default == MAMBA_CONV_KERNEL
    source = inspect.getsource(mamba_mixer.MambaMixer.__init__)
    assert "self.d_inner * 2 + 2 * self.ngroups * self.d_state + self.nheads" in source  # in_proj: z x B C dt
    assert "conv_dim = self.d_inner_local_tp + 2 * self.ngroups_local_tp * self.d_state" in source
    assert "assert not bias" in source  # no linear biases in the mixer


def test_mamba_stack_has_no_recompute_or_offload():
    pytest.importorskip("megatron.core")
    from megatron.core.ssm import mamba_block

    text = Path(mamba_block.__file__).read_text()
    assert "recompute" not in text and "offload" not in text


# megatron-core's own MambaMixer at tp=2, built on CPU in a subprocess: a fake process group of 2 ranks
# (rank 0; torch's testing backend, no collectives run), a CPU "current device", no CUDA RNG tracker
# (it only seeds initialisation, which is off), HAVE_MAMBA_SSM forced (the kernels run only in forward;
# the gated norm is then mamba_ssm's stand-in, so its weight, d_inner_local_tp values, is counted apart),
# megatron-core's own ColumnParallelLinear / RowParallelLinear as in_proj / out_proj (TE's in the spec).
_BUILD_MIXER = r"""
import contextlib, json, sys
import torch
import torch.distributed as dist
from torch.testing._internal.distributed import fake_pg
torch.cuda.current_device = lambda: "cpu"
dist.init_process_group("fake", store=fake_pg.FakeStore(), rank=0, world_size=2)
from megatron.core import parallel_state
parallel_state.initialize_model_parallel(2, 1, create_gloo_process_groups=False)
from megatron.core.ssm import mamba_mixer
mamba_mixer.HAVE_MAMBA_SSM = True
class _NoCudaRng:
    def fork(self, *args, **kwargs):
        return contextlib.nullcontext()
mamba_mixer.get_cuda_rng_tracker = _NoCudaRng
from megatron.core.process_groups_config import ProcessGroupCollection
from megatron.core.tensor_parallel import ColumnParallelLinear, RowParallelLinear
from megatron.core.transformer.transformer_config import TransformerConfig
config = TransformerConfig(**json.loads(sys.argv[1]), use_cpu_initialization=True, perform_initialization=False,
                           params_dtype=torch.float32)
mixer = mamba_mixer.MambaMixer(config, mamba_mixer.MambaMixerSubmodules(in_proj=ColumnParallelLinear,
                               out_proj=RowParallelLinear), d_model=config.hidden_size,
                               pg_collection=ProcessGroupCollection.use_mpu_process_groups())
print(json.dumps({"shapes": {n: list(p.shape) for n, p in mixer.named_parameters()},
                  "norm": mixer.d_inner_local_tp}))
"""


def _planned_mixer_parameters(graph, spaces, choice, ops) -> dict[str, float]:
    """Per parameter of ``ops``, its elements on one rank under ``choice``: its size over the split of
    the dims indexing it, in the first op that reads it."""
    from importers.transformer import is_parameter

    found: dict[str, float] = {}
    for index in ops:
        op, space = graph.ops[index], spaces[index]
        factors = dict(zip(space.dim_names, space.factors[choice[index]]))
        for access in op.inputs:
            name = graph.parameter_aliases.get(access.tensor, access.tensor)
            if is_parameter(graph, access.tensor) and name not in found:
                split = math.prod(int(factors.get(d, 1)) for axis in access.axes for d in axis)
                found[name] = math.prod(graph.tensors[access.tensor].shape) / split
    return found


def test_tp2_mixer_parameters_per_rank_are_megatron_cores():
    """The exported tp=2 row of the hybrid fixture holds, per rank, the Mamba mixer megatron-core builds
    at tp=2 (15,148 parameters), but for dt_bias: the Split that adds it to dt is priced whole on every
    rank (exporters.megatron.mamba_tp's module docstring), so the plan counts its 8 values, not 4."""
    pytest.importorskip("megatron.core")
    import json

    from exporters.megatron import megatron_masks
    from tests.exporters.graphs import first_rows, spaces_for

    graph = load_graph(DATA / HYBRID[0], DIMS)
    spaces = spaces_for(graph, 4)
    masks = megatron_masks(graph, spaces, dp=2, tp=2, devices_per_node=4)
    args = parse_megatron_args(_export(graph, 2)["args"])  # the sizes; tp from the row below
    kwargs = dict(num_layers=1, hidden_size=args["hidden-size"], num_attention_heads=args["num-attention-heads"],
                  tensor_model_parallel_size=2, mamba_num_heads=args["mamba-num-heads"],
                  mamba_head_dim=args["mamba-head-dim"], mamba_num_groups=args["mamba-num-groups"],
                  mamba_state_dim=args["mamba-state-dim"])
    out = run_python(_BUILD_MIXER, json.dumps(kwargs), timeout=300, cwd=Path(__file__).resolve().parents[2])
    assert out.returncode == 0, out.stderr[-3000:]
    built = json.loads(out.stdout.strip().splitlines()[-1])
    megatron = sum(math.prod(s) for s in built["shapes"].values()) + built["norm"]
    # by hand: in_proj 164 x 64, conv 96 x 4 + 96, dt_bias, A_log, D 4 each, norm 64, out_proj 64 x 64
    assert megatron == 164 * 64 + 96 * 5 + 3 * 4 + 64 + 64 * 64 == 15_148
    residual = next(i for i, op in enumerate(graph.ops) if op.node_types == ("Add",) and op.dims[-1].size == 64)
    mixer_ops = range(2, residual)  # after the embedding and the layer's input norm, up to its residual add
    planned = _planned_mixer_parameters(graph, spaces, first_rows(masks), mixer_ops)
    dt_bias = [name for name in planned if name.endswith("dt_bias")]
    assert len(dt_bias) == 1 and planned[dt_bias[0]] == 8  # whole, where megatron-core holds 4
    assert sum(planned.values()) == megatron + 4


@pytest.mark.parametrize("sp", [False, True])
def test_transformer_config_accepts_the_tp2_exports(sp):
    """The tp=2 rows (with and without --sequence-parallel) pass TransformerConfig's own checks."""
    pytest.importorskip("torch")
    pytest.importorskip("megatron.core")
    from megatron.core.activations import squared_relu
    from megatron.core.transformer.transformer_config import TransformerConfig

    from tests.exporters.test_megatron_mamba import _export_tp

    args = parse_megatron_args(_export_tp(load_graph(DATA / HYBRID[0], DIMS), sp=sp)["args"])
    kwargs = _transformer_config_kwargs(args)
    kwargs.update(mamba_num_heads=args["mamba-num-heads"], mamba_head_dim=args["mamba-head-dim"],
                  mamba_num_groups=args["mamba-num-groups"], mamba_state_dim=args["mamba-state-dim"],
                  activation_func=squared_relu)
    config = TransformerConfig(**kwargs)
    assert (config.tensor_model_parallel_size, config.sequence_parallel) == (2, sp)
    assert config.mamba_num_groups % config.tensor_model_parallel_size == 0  # MambaMixer's assert


@pytest.mark.parametrize("layers", [[2, 2], [1, 3]])
def test_mamba_stack_places_the_exported_stages(layers):
    """megatron-core's own MambaStack._select_layers_for_pipeline_parallel, run on the TransformerConfig of
    each pp=2 export (as core_transformer_config_from_args builds it) for each pipeline rank, selects the
    layers of the export's stages: "M*" | "M-" for [2, 2], "M" | "*M-" for [1, 3]."""
    pytest.importorskip("torch")
    pytest.importorskip("megatron.core")
    from types import SimpleNamespace

    from megatron.core.activations import squared_relu
    from megatron.core.ssm.mamba_block import MambaStack
    from megatron.core.ssm.mamba_hybrid_layer_allocation import allocate_layers
    from megatron.core.transformer.transformer_config import TransformerConfig

    from tests.exporters.test_megatron_mamba import _pipeline_input
    from exporters.megatron import export_megatron

    out = export_megatron(_pipeline_input(load_graph(DATA / HYBRID[0], DIMS), layers))
    args = parse_megatron_args(out["args"])
    kwargs = _transformer_config_kwargs(args)
    kwargs.update(mamba_num_heads=args["mamba-num-heads"], mamba_head_dim=args["mamba-head-dim"],
                  mamba_num_groups=args["mamba-num-groups"], mamba_state_dim=args["mamba-state-dim"],
                  activation_func=squared_relu)
    config = TransformerConfig(**kwargs)
    pattern = args["hybrid-override-pattern"]
    types = allocate_layers(args["num-layers"], 0.0, 0.0, pattern)
    placed = []
    for rank in range(args["pipeline-model-parallel-size"]):
        stack = SimpleNamespace(config=config, pp_group=SimpleNamespace(rank=lambda r=rank: r, size=lambda: len(layers)))
        offset, selected = MambaStack._select_layers_for_pipeline_parallel(stack, types)
        placed.append("".join(selected))
        assert offset == sum(layers[:rank])
    assert [len(p) for p in placed] == out["pipeline"]["layers_per_stage"] == layers
    assert "".join(placed) == pattern
