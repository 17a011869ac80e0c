"""Tests of exporters.generic: the versioned plan JSON, its schema, and the write -> read round trip."""

from __future__ import annotations

import dataclasses
import json

import jsonschema
import pytest

from exporters.generic import PipelineSpec, PlanInput, StageSpec, plan_schema, read_plan, save_plan, write_plan
from exporters.megatron import megatron_masks
from objectives.cluster import DEVICE_PRESETS
from objectives.cluster import make_cluster as make_preset_cluster
from planner.core.cluster import Device
from planner.core.errors import InputError
from planner.core.settings import TrainingSettings
from tests.exporters.graphs import first_rows, gpt_graph, make_cluster, make_input, pipeline_spec, set_split, spaces_for


@pytest.fixture(scope="module")
def plan():
    graph = gpt_graph()
    spaces = spaces_for(graph, 8, 4)
    choice = first_rows(megatron_masks(graph, spaces, dp=4, tp=2, devices_per_node=4))
    # One op off the pattern, across nodes, so inter-node parts show up in the document.
    choice = set_split(graph, spaces, choice, "fc1_0", {"m_0": 2, "n": 4}, {"m_0": 2})
    return make_input(graph, spaces, choice, cluster=make_cluster(2, 4), settings=TrainingSettings(zero_stage=1, recompute="selective"), global_batch=32)


class TestWritePlan:
    def test_document(self, plan):
        doc = write_plan(plan)
        jsonschema.validate(doc, plan_schema())
        assert (doc["format"], doc["version"], doc["minor_version"]) == ("planner-plan", 1, 3)
        assert doc["pipeline"] is None
        assert doc["model"]["name"] == "gpt" and doc["model"]["dims"] == {"batch": 8, "seq": 16}
        assert doc["model"]["num_ops"] == len(plan.graph.ops)
        assert doc["cluster"]["devices"] == 8 and doc["cluster"]["nodes"] == 2
        assert doc["training"] == {"precision": "bf16-mixed", "optimizer": "adam", "zero_stage": 1, "recompute": "selective"}
        assert doc["batch"] == {"micro_batch": 8, "global_batch": 32, "grad_accum": 4}
        assert doc["objectives"]["time_s"] == 0.125 and doc["objectives"]["memory"]["params_bytes"] == 1e9
        # dp=4 x tp=2 carries the most FLOPs; fc1_0 (2 x 4) is a second layout.
        assert doc["mesh"]["dp"] == 4 and doc["mesh"]["tp"] == 2 and doc["mesh"]["pp"] == 1
        assert doc["mesh"]["devices_used"] == 8 and doc["mesh"]["layouts"] >= 2
        fc1 = doc["ops"][plan.graph.op_index("fc1_0")]
        assert fc1["name"] == "fc1_0" and fc1["kind"] == "matmul" and fc1["module_path"] == "transformer.h.0.mlp.c_fc"
        assert fc1["dims"] == [
            {"name": "m_0", "size": 8, "factor": 2, "inter": 2},
            {"name": "m_1", "size": 16, "factor": 1, "inter": 1},
            {"name": "n", "size": 256, "factor": 4, "inter": 1},
            {"name": "k", "size": 64, "factor": 1, "inter": 1},
        ]

    def test_json_serialisable_and_deterministic(self, plan):
        assert json.dumps(write_plan(plan)) == json.dumps(write_plan(plan))


class TestRoundTrip:
    def test_same_configuration_and_objectives(self, plan, tmp_path):
        path = tmp_path / "plan.json"
        save_plan(plan, path)
        back = read_plan(path)
        assert back.choice == plan.strategy.choice
        assert back.time_s == plan.strategy.time_s and back.memory_bytes == plan.strategy.memory_bytes
        strategy = back.strategy()
        assert strategy.splits == {op.name: s.describe(r) for op, s, r in zip(plan.graph.ops, plan.spaces, plan.strategy.choice) if s.describe(r)}
        assert strategy.inter_splits["fc1_0"] == {"m_0": 2}
        # On 2 nodes x 4, Megatron's order puts tp inside a node: ops on all 8 devices cross nodes
        # with their batch split only; ops on 4 devices (replicated over tp) stay in one node.
        for op, space, row in zip(plan.graph.ops, plan.spaces, plan.strategy.choice):
            used = int(space.devices_used[row])
            inter = strategy.inter_splits.get(op.name, {})
            assert (inter != {}) == (used == 8), op.name
            assert all(op.dim(d).is_batch for d in inter) and sum(inter.values()) in (0, 2)
        assert strategy.time == plan.strategy.time and strategy.memory == plan.strategy.memory
        back.check_graph(plan.graph)

    @pytest.mark.parametrize("preset", [*sorted(DEVICE_PRESETS), "every field set"])
    def test_the_cluster_reads_back_as_priced(self, plan, tmp_path, preset):
        # every Device and Link field a price reads comes back (h100-sxm's matmul_efficiency 0.616 once did
        # not: a saved h100 plan priced 1.8% faster again); only the sources' prose is left out
        if preset == "every field set":  # each optional field away from its default, as a cluster file may set it
            device = dataclasses.replace(
                DEVICE_PRESETS["a100-80gb"], kernel_latency_s=1e-6, kernel_overhead_s=7e-6, host_dispatch_s=4e-5,
                collective_overhead_s=3e-5, layer_host_s=2e-4, microbatch_host_s=3e-4, p2p_overhead_s=4e-6,
                matmul_efficiency=0.5,
            )  # fmt: skip
            defaults = {f.name: f.default for f in dataclasses.fields(Device) if f.default is not dataclasses.MISSING}
            assert all(getattr(device, name) != default for name, default in defaults.items() if name != "source")
        else:
            device = DEVICE_PRESETS[preset]
        cluster = dataclasses.replace(make_preset_cluster(device.name, devices=8, devices_per_node=4), device=device)
        path = tmp_path / "plan.json"
        save_plan(dataclasses.replace(plan, cluster=cluster), path)
        unsourced = lambda link: dataclasses.replace(link, source="")
        assert read_plan(path).cluster() == dataclasses.replace(
            cluster, device=dataclasses.replace(device, source=""), intra_link=unsourced(cluster.intra_link),
            inter_link=unsourced(cluster.inter_link),
        )

    def test_other_graph_is_rejected(self, plan, tmp_path):
        path = tmp_path / "plan.json"
        save_plan(plan, path)
        with pytest.raises(InputError, match="do not match"):
            read_plan(path).check_graph(gpt_graph(layers=1))


class TestReadErrors:
    def _write(self, tmp_path, data) -> str:
        path = tmp_path / "plan.json"
        path.write_text(data if isinstance(data, str) else json.dumps(data))
        return path

    @pytest.mark.parametrize(
        ("mutate", "message"),
        [
            (lambda d: d.update(version=0), "plan version 0, this planner reads version 1; re-export"),
            (lambda d: d.update(version=2), "plan version 2"),
            (lambda d: d.update(format="other"), "not a planner plan"),
            (lambda d: d["model"].pop("sha256"), "not a valid planner plan at model: 'sha256' is a required property"),
            (lambda d: d["ops"][0].update(config=-1), "not a valid planner plan at ops/0/config"),
            (lambda d: d["training"].update(zero_stage=5), "training/zero_stage"),
            (lambda d: d.update(extra=1), "Additional properties"),
        ],
    )
    def test_malformed(self, plan, tmp_path, mutate, message):
        data = write_plan(plan)
        mutate(data)
        with pytest.raises(InputError, match=message) as err:
            read_plan(self._write(tmp_path, data))
        assert "\n" not in str(err.value)

    def test_not_json(self, tmp_path):
        with pytest.raises(InputError, match="is not JSON"):
            read_plan(self._write(tmp_path, "{not json"))

    def test_missing(self, tmp_path):
        with pytest.raises(InputError, match="not found; write one with"):
            read_plan(tmp_path / "absent.json")


class TestPlanInput:
    def test_lengths_must_match(self, plan):
        with pytest.raises(InputError, match="configuration spaces"):
            PlanInput(graph=plan.graph, cluster=plan.cluster, settings=plan.settings, spaces=plan.spaces[:-1], strategy=plan.strategy)

    def test_global_batch_multiple_of_micro(self, plan):
        with pytest.raises(InputError, match="not a multiple of the micro batch 8"):
            make_input(plan.graph, plan.spaces, plan.strategy.choice, global_batch=12)

    def test_row_in_range(self, plan):
        choice = list(plan.strategy.choice)
        choice[0] = plan.spaces[0].size
        strategy = dataclasses.replace(plan.strategy, choice=tuple(choice))
        with pytest.raises(InputError, match="outside its"):
            PlanInput(graph=plan.graph, cluster=plan.cluster, settings=plan.settings, spaces=plan.spaces, strategy=strategy)

    def test_defaults(self, plan):
        plain = make_input(plan.graph, plan.spaces, plan.strategy.choice)
        assert (plain.samples_per_pass, plain.samples_per_step, plain.grad_accum) == (8, 8, 1)


@pytest.fixture(scope="module")
def pipelined():
    """gpt with 4 layers cut [1, 3] over 2 stages of dp=2 x tp=2, ZeRO-1, 4 micro-batches."""
    graph = gpt_graph(layers=4)
    spaces = spaces_for(graph, 4)
    choice = first_rows(megatron_masks(graph, spaces, dp=2, tp=2))
    settings = TrainingSettings(zero_stage=1)
    spec = pipeline_spec(graph, [1, 3], devices_per_stage=4, micro_batch=4, micro_batches=4, settings=settings)
    return make_input(graph, spaces, choice, cluster=make_cluster(1, 8), settings=settings, global_batch=32, pipeline=spec)


class TestPipelineSection:
    def test_document(self, pipelined):
        doc = write_plan(pipelined)
        jsonschema.validate(doc, plan_schema())
        section = doc["pipeline"]
        assert doc["mesh"]["pp"] == 2 and doc["batch"] == {"micro_batch": 8, "global_batch": 32, "grad_accum": 4}
        assert {k: section[k] for k in ("pp", "devices_per_stage", "schedule", "chunks", "micro_batch", "micro_batches", "global_batch", "zero_stage", "recompute", "num_layers", "layers_per_stage")} == {
            "pp": 2, "devices_per_stage": 4, "schedule": "1f1b", "chunks": 1, "micro_batch": 4, "micro_batches": 4,
            "global_batch": 32, "zero_stage": 1, "recompute": "none", "num_layers": 4, "layers_per_stage": [1, 3],
        }
        first, last = section["stages"]
        names = [op.name for op in pipelined.graph.ops]
        # embeddings and layer 0 on the first stage; layers 1-3, the final norm and the head on the last
        assert [names[i] for i in first["ops"][:3]] == ["pos_emb", "tok_emb", "ln1_0"]
        assert [names[i] for i in last["ops"][-2:]] == ["ln_f", "lm_head"]
        assert sorted(first["ops"] + last["ops"]) == list(range(len(names)))
        assert first["layers"] == [0, 1] and last["layers"] == [1, 4]
        assert first["memory_bytes"] == 1e9 + 1e9 + 2e9 + 5e8 + 1e8 and first["memory"]["optimizer_bytes"] == 2e9

    def test_round_trip(self, pipelined, tmp_path):
        path = tmp_path / "plan.json"
        save_plan(pipelined, path)
        back = read_plan(path)
        assert back.pipeline == pipelined.pipeline
        assert back.cluster() == pipelined.cluster and back.settings() == pipelined.settings
        assert back.minor_version == 3

    def test_minor_version_0_plans_still_read(self, plan, tmp_path):
        data = write_plan(plan)
        del data["minor_version"], data["pipeline"]
        path = tmp_path / "old.json"
        path.write_text(json.dumps(data))
        back = read_plan(path)
        assert back.pipeline is None and back.minor_version == 0 and back.choice == plan.strategy.choice

    def test_newer_minor_version_is_refused(self, plan, tmp_path):
        data = write_plan(plan)
        data["minor_version"] = 4
        path = tmp_path / "new.json"
        path.write_text(json.dumps(data))
        with pytest.raises(InputError, match="plan version 1.4, newer than this planner's 1.3"):
            read_plan(path)

    def test_schema_rejects_a_bad_stage(self, pipelined, tmp_path):
        data = write_plan(pipelined)
        data["pipeline"]["stages"][0]["layers"] = [0]
        path = tmp_path / "bad.json"
        path.write_text(json.dumps(data))
        with pytest.raises(InputError, match="pipeline/stages/0/layers"):
            read_plan(path)


class TestPipelineSpec:
    def _stages(self, *bounds):
        return tuple(StageSpec(index=i, layers=(a, b), ops=()) for i, (a, b) in enumerate(zip(bounds, bounds[1:])))

    def test_valid(self):
        spec = PipelineSpec(pp=2, devices_per_stage=4, micro_batch=1, micro_batches=4, global_batch=16, stages=self._stages(0, 3, 8))
        assert spec.layers_per_stage == (3, 5) and spec.num_layers == 8

    @pytest.mark.parametrize(
        ("changes", "message"),
        [
            ({"pp": 3}, "3-stage pipeline needs 3 stages, got 2"),
            ({"chunks": 2}, "need the interleaved, zb-h1 or zbv schedule"),
            ({"schedule": "zb"}, "unknown pipeline schedule 'zb'"),
            ({"micro_batches": 0}, "micro batches must be at least 1"),
            ({"stages": "gap"}, "expected it to start at layer 3"),
        ],
    )
    def test_invalid(self, changes, message):
        kwargs = dict(pp=2, devices_per_stage=4, micro_batch=1, micro_batches=4, global_batch=16, stages=self._stages(0, 3, 8))
        if changes.get("stages") == "gap":
            changes = {"stages": (StageSpec(index=0, layers=(0, 3), ops=()), StageSpec(index=1, layers=(4, 8), ops=()))}
        kwargs.update(changes)
        with pytest.raises(InputError, match=message):
            PipelineSpec(**kwargs)

    def test_plan_input_must_agree(self, pipelined):
        with pytest.raises(InputError, match="pipeline says ZeRO-1 / recompute none but the settings say ZeRO-0"):
            dataclasses.replace(pipelined, settings=TrainingSettings())
        with pytest.raises(InputError, match="runs 4 micro-batches of a 32-sample step but the batch is 2 passes"):
            dataclasses.replace(pipelined, global_batch=16)
        with pytest.raises(InputError, match="2 stages of 4 devices do not fit 4 devices"):
            dataclasses.replace(pipelined, cluster=make_cluster(1, 4))
