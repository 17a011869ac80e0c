"""DeepSpeed pipelines only models whose repeated blocks are one chain (issue 25, task H4).

deepspeed 0.19.8's ``PipelineModule.forward`` (``runtime/pipe/module.py``) runs a stage's layers as
``inputs = layer(inputs)``: each block gets what the one before it returned. Helper H3's sweep
(finding 5) found the fastest DeepSpeed row of Marian, MBart and CLIP to be ``pp=2 x dp=4`` with
``layers_per_stage [1, 3]``, exported as ``BlockPipe(i) for i in range(4)`` "(model.encoder.layers.i in
the ONNX graph)", although blocks 2-3 are decoder layers (their cross-attention reads the encoder's
output) or the other tower.

Fixtures: ``tests/data/multi_stack_cases/`` (``tests/importers/make_multi_stack_cases.py``), 2 layers a
stack. Each expected skip is read independently from the ONNX file's own ``namespace`` metadata (the
torch module path the dynamo exporter records on every node): the reading node sits in the later stack,
the writing node in the earlier one.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import onnx
import pytest

from exporters.block_chain import chain_break, stacks
from exporters.deepspeed import deepspeed_masks, export_deepspeed
from exporters.deepspeed.rules import families
from planner.core.errors import UnsupportedExport
from planner.core.graph import BlockGroup
from planner.core.settings import TrainingSettings
from planner.plan import load_graph
from tests.exporters.graphs import first_rows, gpt_graph, make_cluster, make_input, pipeline_spec, spaces_for
from tests.exporters.test_deepspeed import _pipeline_input
from tests.planner.cli_helpers import run_cli

DATA = Path(__file__).resolve().parents[1] / "data"
CASES = DATA / "multi_stack_cases"
DIMS = {"batch": 16, "seq": 16, "tgt_seq": 12}

# (file, stacks, the reading op and its place, the tensor it reads, the writing layer (0-based, of 4),
#  the module path the reader's ONNX node records, the writer's)
SKIPS = [
    ("marian_dynamo_bare.onnx", "model.encoder.layers (2 blocks), model.decoder.layers (2 blocks)",
     "node_MatMul_379 (layer 3 of 4, in model.decoder.layers.1)", "layer_norm_3", "1 (model.encoder.layers.1)",
     # Marian is post-LN without a final encoder norm: the encoder's output is its last layer's final_layer_norm
     "model.decoder.layers.1.encoder_attn.k_proj", "model.encoder.layers.1.final_layer_norm"),
    ("mbart_dynamo_bare.onnx", "model.encoder.layers (2 blocks), model.decoder.layers (2 blocks)",
     "node_MatMul_402 (layer 3 of 4, in model.decoder.layers.1)", "layer_norm_5", "1",
     # MBart is pre-LN with a final encoder LayerNorm, an op after the encoder's last block (its layer 1)
     "model.decoder.layers.1.encoder_attn.k_proj", "model.encoder.layer_norm"),
    ("clip_dynamo_bare.onnx", "vision_model.encoder.layers (2 blocks), text_model.encoder.layers (2 blocks)",
     "node_pow_1 (the head)", "linear_12", "1",
     # the contrastive head normalises the image embeddings, projected after the vision tower (layers 0-1)
     "", "visual_projection"),  # "": CLIPModel.forward itself, in no tower
]


def _module(path: Path, *, node: str | None = None, output: str | None = None) -> str:
    """The torch module path of the ONNX node named ``node`` or writing ``output`` (``""``: the root module),
    from its ``namespace`` metadata ``": Root/path.a: ClassA/path.a.b: ClassB/op: aten..."``."""
    model = onnx.load(str(path), load_external_data=False)
    found = next(n for n in model.graph.node if n.name == node or output in n.output)
    namespace = next(p.value for p in found.metadata_props if p.key == "namespace")
    return namespace.split("/")[-2].split(":")[0]


class TestChain:
    @pytest.mark.parametrize(("name", "groups", "reader", "tensor", "writer", "reader_module", "writer_module"), SKIPS,
                             ids=[s[0].split("_")[0] for s in SKIPS])
    def test_multi_stack_is_no_chain(self, name, groups, reader, tensor, writer, reader_module, writer_module):
        graph = load_graph(CASES / name, DIMS)
        assert stacks(graph) == groups
        skipped = "it skips 2 layers" if name.startswith("clip") else "it skips a layer"
        assert chain_break(graph) == f"op {reader} reads {tensor}, written by layer {writer}: {skipped}"
        # the witness: the ONNX file's module paths of the reading and the writing node
        assert _module(CASES / name, node=reader.split()[0]) == reader_module
        assert _module(CASES / name, output=tensor) == writer_module

    @pytest.mark.parametrize("layers", [2, 4])
    def test_one_decoder_stack_is_a_chain(self, layers):
        # the embeddings' outputs (positions, masks) may reach every layer: each stage hands them on
        assert chain_break(gpt_graph(layers=layers)) is None
        assert chain_break(load_graph(DATA / "gpt2_tiny.onnx", {"batch": 16, "seq": 16})) is None

    def test_no_blocks(self):
        assert chain_break(load_graph(DATA / "gru_tiny.onnx", {"batch": 4, "seq": 8})) == "the graph has no repeated blocks"


class TestRules:
    @pytest.mark.parametrize("name", [s[0] for s in SKIPS])
    def test_no_pipeline_family_on_multi_stack(self, name):
        graph = load_graph(CASES / name, DIMS)
        spaces = spaces_for(graph, 4)
        assert families(graph, spaces, devices=4, devices_per_node=8, pp=2) == []
        # pp = 1 keeps its families: dp=4 x tp=1 at least (ZeRO data parallelism runs any model)
        assert "dp=4 x tp=1" in [f.label for f in families(graph, spaces, devices=4, devices_per_node=8, pp=1)]

    def test_a_gpt_keeps_its_pipeline(self):
        graph = load_graph(DATA / "gpt2_tiny.onnx", {"batch": 16, "seq": 16})
        labels = [f.label for f in families(graph, spaces_for(graph, 4), devices=4, devices_per_node=8, pp=2)]
        assert "dp=4 x tp=1" in labels


class TestExport:
    def test_saved_pipeline_plan_refused(self):
        # H3's fastest Marian row: pp=2 x dp=4, 4 samples a rank, 1 micro-batch, ZeRO-1, layers [1, 3]
        graph = load_graph(CASES / "marian_dynamo_bare.onnx", DIMS)
        spaces = spaces_for(graph, 4)
        settings = TrainingSettings(zero_stage=1)
        spec = pipeline_spec(graph, [1, 3], devices_per_stage=4, micro_batch=4, micro_batches=1, settings=settings)
        choice = first_rows(deepspeed_masks(graph, spaces, dp=4, tp=1))
        plan_input = make_input(graph, spaces, choice, cluster=make_cluster(1, 8), settings=settings,
                                global_batch=spec.global_batch, pipeline=spec)
        with pytest.raises(UnsupportedExport) as info:
            export_deepspeed(plan_input)
        message = str(info.value)
        assert message == (
            "DeepSpeed's PipelineModule runs its layers as one chain, each taking the previous one's output, and this "
            "model's blocks are not one chain (model.encoder.layers (2 blocks), model.decoder.layers (2 blocks)): op "
            "node_MatMul_379 (layer 3 of 4, in model.decoder.layers.1) reads layer_norm_3, written by layer 1 "
            "(model.encoder.layers.1): it skips a layer; plan with --fix pp=1"
        )
        assert "\n" not in message

    def test_the_same_plan_without_stages_exports(self):
        graph = load_graph(CASES / "marian_dynamo_bare.onnx", DIMS)
        spaces = spaces_for(graph, 8)
        out = export_deepspeed(make_input(graph, spaces, first_rows(deepspeed_masks(graph, spaces, dp=8, tp=1)),
                                          cluster=make_cluster(1, 8), settings=TrainingSettings(zero_stage=1)))
        assert out["degrees"] == {"dp": 8, "cp": 1, "tp": 1, "pp": 1} and out["pipeline"] is None


    def test_a_chain_of_two_groups_names_both(self):
        # a chain whose blocks fall in two groups (e.g. dense then MoE layers) still pipelines; the code's
        # comment names both groups, not the first one for every block
        graph = gpt_graph(layers=4)
        (group,) = graph.blocks
        halves = (BlockGroup(name="a", instances=group.instances[:2]), BlockGroup(name="b", instances=group.instances[2:]))
        graph = dataclasses.replace(graph, blocks=halves)
        assert chain_break(graph) is None
        code = export_deepspeed(_pipeline_input(graph, 2, [2, 2]))["pipeline"]["code"]
        assert "# (the i-th of a (2 blocks), b (2 blocks) in the ONNX graph); HeadPipe" in code


def test_cli_lists_no_deepspeed_pipeline_of_marian():
    # before: rows 1-2 were pp=2 x dp=4 (layers [1, 3] and [2, 2]); each row here runs on DeepSpeed, so pp = 1
    result = run_cli(["plan", CASES / "marian_dynamo_bare.onnx", "-n", "8", "--dim", "batch=16", "--dim", "seq=128",
                      "--dim", "tgt_seq=128", "--target", "deepspeed", "--json", "-q"])
    rows = json.loads(result.stdout)["rows"]
    assert rows and {row["pp"] for row in rows} == {1}
