"""Tests of exporters.onnx_sharding (``--export onnx``): the plan written into a copy of the model as
ONNX IR 11 sharding fields (``ai.onnx.hint.*`` metadata on older IRs) and read back as the same per-op
splits, inter-node parts, copies and pipeline stages; the ONNX checker; the refusals."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from typer.testing import CliRunner

from exporters.generic import plan_from_dict, write_plan
from exporters.onnx_sharding import export_onnx_sharding, onnx_model_bytes, read_onnx_sharding
from exporters.onnx_sharding.rules import op_stages
from exporters.onnx_sharding.rules import NODE_CONFIG_KEY, PLAN_KEY, STAGE_KEY, device_grid
from exporters.onnx_sharding.validate import checkable
from exporters.targets import EXPORT_FORMATS, TARGETS, target
from planner.core.configs import ConfigOptions, enumerate_configs
from planner.core.errors import InputError
from planner.core.settings import TrainingSettings
from planner.pricing import load_graph
from planner.saved_plan import onnx_plan_document
from tests.exporters.graphs import make_cluster, make_input, pipeline_spec

GPT2 = Path(__file__).resolve().parents[2] / "examples" / "gpt2.onnx"
DIMS = {"batch": 8, "seq": 128}


def _graph(path: Path = GPT2):
    return load_graph(path, DIMS)


def _random_choice(graph, devices: int, per_node: int, seed: int):
    """Every op's configuration drawn at random (splits, inter-node parts and copies all vary)."""
    options = ConfigOptions(devices=devices, devices_per_node=per_node, replicate=True)
    spaces = tuple(enumerate_configs(op, options) for op in graph.ops)
    rng = np.random.default_rng(seed)
    return spaces, [int(rng.integers(space.size)) for space in spaces]


def _with_ir(tmp_path: Path, ir_version: int) -> Path:
    """A copy of GPT-2 (graph-only) at another IR version."""
    model = onnx.load(GPT2, load_external_data=False)
    model.ir_version = ir_version
    path = tmp_path / f"gpt2_ir{ir_version}.onnx"
    path.write_bytes(model.SerializeToString())
    return path


def _flat(path: Path, devices: int = 16, per_node: int = 4, seed: int = 0):
    graph = _graph(path)
    spaces, choice = _random_choice(graph, devices, per_node, seed)
    return make_input(graph, spaces, choice, cluster=make_cluster(devices // per_node, per_node))


def _pipelined(path: Path):
    graph = _graph(path)
    spaces, choice = _random_choice(graph, 8, 4, seed=1)
    settings = TrainingSettings(zero_stage=1)
    spec = pipeline_spec(graph, [3, 4, 5], devices_per_stage=8, micro_batch=2, micro_batches=4, settings=settings)
    return make_input(graph, spaces, choice, cluster=make_cluster(6, 4), settings=settings, global_batch=32, pipeline=spec)


def _write(plan_input, output: Path) -> onnx.ModelProto:
    document = export_onnx_sharding(plan_input)
    json.dumps(document)  # what stdout prints without -o
    output.write_bytes(onnx_model_bytes(document, output))
    return onnx.load(output, load_external_data=False)


def _assert_round_trip(plan_input, model: onnx.ModelProto, output: Path) -> None:
    """Every op read back from the written file (imported again) has the plan's splits, parts, copies and stage."""
    graph = _graph(output)
    assert [op.name for op in graph.ops] == [op.name for op in plan_input.graph.ops]
    read = read_onnx_sharding(model, graph)
    stages = op_stages(plan_input)
    copies = 0
    for op, space, row, got, stage in zip(graph.ops, plan_input.spaces, plan_input.strategy.choice, read, stages):
        assert dict(got.factors) == dict(zip(space.dim_names, space.factors[row].tolist())), op.name
        assert dict(got.inter) == dict(zip(space.dim_names, space.inter_factors[row].tolist())), op.name
        assert (got.replicas, got.inter_replicas) == (space.replica_counts[row], space.inter_replica_counts[row]), op.name
        assert got.stage == stage, op.name
        copies += got.replicas > 1
    assert copies > 0  # the random plan has replicated ops
    assert any(any(v > 1 for v in r.inter.values()) for r in read)  # and splits across nodes
    onnx.checker.check_model(checkable(model))


class TestRegistry:
    def test_an_export_format_not_a_launcher(self):
        assert "onnx" in EXPORT_FORMATS and "onnx" not in TARGETS
        assert target("onnx", flag="--export").name == "onnx"
        with pytest.raises(InputError, match="unknown --target 'onnx'"):
            target("onnx")


class TestWithoutPipeline:
    def test_round_trip_on_an_ir10_model_writes_hints(self, tmp_path):
        plan_input = _flat(GPT2)
        output = tmp_path / "gpt2-plan.onnx"
        model = _write(plan_input, output)
        assert model.ir_version == 10  # kept: the IR 11 fields are not written into an older IR
        assert not model.configuration and not any(n.device_configurations for n in model.graph.node)
        keys = {e.key for n in model.graph.node for e in n.metadata_props}
        assert NODE_CONFIG_KEY in keys and STAGE_KEY not in keys  # no pipeline: no stages
        assert json.loads(next(e.value for e in model.metadata_props if e.key == PLAN_KEY))["mode"] == "metadata_props"
        _assert_round_trip(plan_input, model, output)

    def test_graph_only_stays_graph_only(self, tmp_path):
        output = tmp_path / "out.onnx"
        model = _write(_flat(GPT2), output)
        external = [t for t in model.graph.initializer if t.data_location == onnx.TensorProto.EXTERNAL]
        assert external and all(not t.raw_data for t in external)
        assert sorted(p.name for p in tmp_path.iterdir()) == ["out.onnx"]  # no weights written
        assert output.stat().st_size < 2 * GPT2.stat().st_size

    def test_ir11_fields(self, tmp_path):
        source = _with_ir(tmp_path, 11)
        plan_input = _flat(source, devices=8, per_node=8, seed=3)
        output = tmp_path / "out.onnx"
        model = _write(plan_input, output)
        assert model.ir_version == 11
        assert [(c.name, c.num_devices) for c in model.configuration] == [("planner", 8)]
        keys = {e.key for n in model.graph.node for e in n.metadata_props}
        assert NODE_CONFIG_KEY not in keys and STAGE_KEY not in keys
        main = model.graph.node[[n.name for n in model.graph.node].index(plan_input.graph.ops[5].name)]
        (config,) = main.device_configurations
        assert config.configuration_id == "planner" and not config.HasField("pipeline_stage")
        names = set(main.input) | set(main.output)
        assert config.sharding_spec and all(spec.tensor_name in names for spec in config.sharding_spec)
        read = read_onnx_sharding(model, _graph(output))
        for op, space, row, got in zip(plan_input.graph.ops, plan_input.spaces, plan_input.strategy.choice, read):
            assert dict(got.factors) == dict(zip(space.dim_names, space.factors[row].tolist())), op.name
            assert got.replicas == space.replica_counts[row] and got.stage is None

    def test_read_back_as_the_generic_plan(self, tmp_path):
        plan_input = _flat(GPT2)
        output = tmp_path / "out.onnx"
        _write(plan_input, output)
        document = onnx_plan_document(output)
        back = plan_from_dict(document)
        assert back.choice == plan_input.strategy.choice
        assert document["model"]["source_path"] == str(output)
        written = write_plan(plan_input)
        assert [op["dims"] for op in document["ops"]] == [op["dims"] for op in written["ops"]]
        assert [op.get("replicas") for op in document["ops"]] == [op.get("replicas") for op in written["ops"]]


class TestPipelined:
    @pytest.mark.parametrize("ir_version", [10, 11])
    def test_round_trip_with_stages(self, tmp_path, ir_version):
        source = _with_ir(tmp_path, ir_version)
        plan_input = _pipelined(source)
        output = tmp_path / "out.onnx"
        model = _write(plan_input, output)
        _assert_round_trip(plan_input, model, output)
        if ir_version >= 11:
            stages = [n.device_configurations[0].pipeline_stage for n in model.graph.node]
        else:
            stages = [int(next(e.value for e in n.metadata_props if e.key == STAGE_KEY)) for n in model.graph.node]
        assert len(stages) == len(model.graph.node) and set(stages) == {0, 1, 2}  # every node has a stage
        document = onnx_plan_document(output)
        written = write_plan(plan_input)
        assert [s["ops"] for s in document["pipeline"]["stages"]] == [s["ops"] for s in written["pipeline"]["stages"]]

    def test_stage_devices_are_the_stage_s(self, tmp_path):
        grid = device_grid([2, 4], [2, 1], 1, 1, base=16, per_node=4)
        assert grid.min() == 16 and grid.max() == 23 and len(set(grid.ravel().tolist())) == 8
        assert sorted({int(d) // 4 for d in grid[:, 0, 0]}) == [4, 5]  # the inter-node dim crosses nodes


class TestRefusals:
    def test_the_model_itself_is_never_overwritten(self, tmp_path):
        source = _with_ir(tmp_path, 10)
        document = export_onnx_sharding(_flat(source))
        before = source.read_bytes()
        with pytest.raises(InputError, match="the planned model itself"):
            onnx_model_bytes(document, source)
        assert source.read_bytes() == before

    def test_a_changed_model_is_refused(self, tmp_path):
        source = _with_ir(tmp_path, 10)
        document = export_onnx_sharding(_flat(source))
        source.write_bytes(source.read_bytes() + b"\x00")  # a field-0 byte: another file
        with pytest.raises(InputError, match="changed since it was planned"):
            onnx_model_bytes(document, tmp_path / "out.onnx")

    def test_an_existing_output_needs_force(self, tmp_path):
        from planner.cli import app

        plan = tmp_path / "plan.json"
        graph = _graph()
        spaces = tuple(enumerate_configs(op, ConfigOptions(devices=1, devices_per_node=1)) for op in graph.ops)
        plan.write_text(json.dumps(write_plan(make_input(graph, spaces, [0] * len(spaces)))))
        output = tmp_path / "out.onnx"
        output.write_bytes(b"mine")
        runner = CliRunner()
        result = runner.invoke(app, ["export", str(plan), "--format", "onnx", "-o", str(output)])
        assert result.exit_code != 0 and "exists; pass --force" in result.output
        assert output.read_bytes() == b"mine"
        result = runner.invoke(app, ["export", str(plan), "--format", "onnx", "-o", str(output), "--force"])
        assert result.exit_code == 0, result.output
        assert onnx.load(output, load_external_data=False).graph.node
