"""Why ``planner plan`` has no row under ``--fix`` (issue 22): the one-line error names what the
launcher runs instead, read from its own rules, and the pin to drop or change; without a pin the
message is the general advice, as before.

Oracles: the launcher's registry entry itself (:data:`exporters.targets.TARGETS`: the ``tp`` of
every family Megatron-LM's rules list on the model, the ZeRO stages its pipeline rule accepts),
computed here apart from the code under test, and the Mamba stack's groups read off the ONNX file.
"""

from __future__ import annotations

import json
from pathlib import Path

from exporters.block_chain import chain_break
from exporters.megatron.mamba import hybrid_stack
from exporters.targets import TARGETS
from objectives.cluster import make_cluster
from planner.core.configs import ConfigOptions, enumerate_configs
from planner.core.degrees import Pins
from planner.launch_messages import fit_message, pinned_refusal
from planner.launchable import launch_frontier
from planner.pipeline import PipelineOptions, graph_loader
from planner.plan import PlanRequest
from tests.planner.cli_helpers import error_line, run_cli

ROOT = Path(__file__).resolve().parents[2]
NEMOTRON = ROOT / "tests" / "exporters" / "data" / "nemotron_h_tiny_dynamo_consts.onnx"
GPT2 = ROOT / "tests" / "data" / "gpt2_tiny.onnx"
DIMS = ["--dim", "batch=16", "--dim", "seq=16"]


def _megatron_tps(devices: int, model: Path = NEMOTRON) -> list[int]:
    """The ``tp`` of every family Megatron-LM's rules list on the model, on every stage size
    dividing ``devices`` (the families at ``pp = 1`` span every world size that divides it)."""
    graph = graph_loader(model, {"batch": 16, "seq": 16})(16)
    spaces = [enumerate_configs(op, ConfigOptions(devices=devices, devices_per_node=devices)) for op in graph.ops]
    families = TARGETS["megatron"].pipeline_families(graph, spaces, devices=devices, devices_per_node=devices, pp=1)
    return sorted({f.tp for f in families})


class TestPinnedDegree:
    def test_megatron_names_the_tp_it_runs_and_why_not_four(self):
        result = run_cli(["plan", NEMOTRON, "-n", 8, *DIMS, "--target", "megatron", "--fix", "tp=4"], expected_exit_code=2)
        line = error_line(result)
        tps = _megatron_tps(8)
        assert tps == [1, 2]  # the families' labels: dp=d x tp=1 and dp=d x tp=2 (sp), never tp=4
        groups = hybrid_stack(graph_loader(NEMOTRON, {"batch": 16, "seq": 16})(16)).mamba.num_groups
        assert groups == 2  # the ONNX file's SSM groups: 2 % 4 != 0, so megatron-core's MambaMixer refuses tp=4
        assert line == (
            "error: 8 devices: megatron runs tp 1 or 2 on this model at 8 devices (tp=4: MambaMixer needs "
            f"--mamba-num-groups ({groups}) divisible by tp=4 (ngroups % tp_size == 0)); --fix tp=4 leaves none: "
            f"drop it or use --fix tp={max(tps)}"
        )

    def test_suggested_degree_runs(self):
        # the fix the message names finds a plan: --fix tp=2 is a row of megatron's
        result = run_cli(["plan", NEMOTRON, "-n", 8, *DIMS, "--target", "megatron", "--fix", "tp=2", "--json"])
        rows = json.loads(result.stdout)["rows"]
        assert rows and all(row["tp"] == 2 for row in rows)


class TestTensorPastANode:
    def test_the_families_list_it_but_the_search_keeps_it_in_a_node(self):
        """Megatron-LM's families span every world size, so tp=16 is among the degrees its rules list on 16
        devices; the search keeps tensor parallelism inside a node of 8, and the line says that, not "no plan"."""
        wide = ROOT / "examples" / "llama.onnx"  # 16 heads, 4 K/V groups
        assert 16 in _megatron_tps(16, wide)  # the rules alone would run it
        result = run_cli(["plan", wide, "-n", 16, *DIMS, "--target", "megatron", "--fix", "tp=16"],
                         expected_exit_code=2)
        assert error_line(result) == (
            "error: 16 devices: --fix tp=16 splits each layer 16 ways and the search keeps tensor parallelism inside "
            "a node (8 devices): use --fix tp=8 or less, or --devices-per-node 16 if one NVLink domain joins 16 devices")


class TestContextAcrossNodes:
    LLAMA = ROOT / "tests" / "zoo" / "llama_ts_consts.onnx"
    WIDE = ROOT / "examples" / "llama.onnx"  # 16 heads, 4 K/V groups: DeepSpeed-Ulysses runs cp = 16 in one node
    LONG = ["--dim", "batch=16", "--dim", "seq=32768", "--device", "h100-sxm"]

    def test_cp_past_a_node_is_planned(self):
        """cp=16 on two nodes of 8: Megatron-LM runs context parallelism across nodes (cp outside tp in its
        rank order), so the pinned degree has rows, every one cp=16 on the 16 devices (32,768 / 16 tokens a rank)."""
        rows = json.loads(run_cli(["plan", self.LLAMA, "-n", 16, *self.LONG, "--target", "megatron", "--fix", "cp=16",
                                   "--json"]).stdout)["rows"]
        assert rows and {(row["degrees"]["cp"], row["degrees"]["tp"], row["degrees"]["dp"]) for row in rows} == {(16, 1, 1)}

    def test_a_launcher_that_keeps_it_in_a_node_says_so(self):
        """DeepSpeed-Ulysses' heads split stays inside a node: --fix cp=16 on two nodes of 8 names the node and
        the launchers that run it across nodes (Target.context_across_nodes), not the general advice."""
        result = run_cli(["plan", self.WIDE, "-n", 16, *self.LONG, "--target", "deepspeed", "--fix", "cp=16"],
                         expected_exit_code=2)
        across = [name for name, target in TARGETS.items() if target.context_across_nodes]
        assert across == ["megatron", "torchtitan"]
        assert error_line(result) == (
            "error: 16 devices: --fix cp=16 splits each sample 16 ways, past a node (8 devices), and of the launchers "
            "searched none runs context parallelism across nodes (megatron and torchtitan do): use --target megatron, "
            "--fix cp=8 or less, or --devices-per-node 16 if one NVLink domain joins 16 devices")

    def test_the_advice_runs(self):
        for extra in (["--target", "megatron"], ["--target", "deepspeed", "--devices-per-node", "16"]):
            rows = json.loads(run_cli(["plan", self.WIDE, "-n", 16, *self.LONG, "--fix", "cp=16", "--json",
                                       *extra]).stdout)["rows"]
            assert rows and {row["degrees"]["cp"] for row in rows} == {16}


class TestPinnedSettings:
    def test_zero_three_with_pipelines(self):
        result = run_cli(["plan", NEMOTRON, "-n", 8, *DIMS, "--target", "megatron", "--fix", "pp=2,zero=3"],
                         expected_exit_code=2)
        rule = TARGETS["megatron"].allows_pipeline
        zeros = [z for z in range(4) if any(rule(pp=2, zero_stage=z, recompute=r, schedule="1f1b", tp=None)
                                            for r in TARGETS["megatron"].recompute)]
        assert zeros == [0, 1]  # Megatron-FSDP (ZeRO-2/3) is not run with pipelines
        assert error_line(result).endswith(
            "megatron runs ZeRO 0 or 1 at pp=2 with the 1f1b schedule; --fix zero=3 leaves none: drop it or use --fix zero=1")

    def test_recompute_mode_the_launcher_lacks(self):
        modes = TARGETS["megatron"].recompute
        assert "op" not in modes  # torchtitan's op-level policy, not Megatron-LM's
        pins = Pins(recompute="op")
        graph = graph_loader(NEMOTRON, {"batch": 16, "seq": 16})(16)
        request = PlanRequest(cluster=make_cluster("a100-80gb", devices=8, devices_per_node=8))
        line = pinned_refusal(graph, request, PipelineOptions(global_batch=16, recompute=("op",)), pins, ["megatron"])
        assert line == f"megatron runs recompute {', '.join(modes[:-1])} or {modes[-1]}; --fix recompute=op leaves none: " \
                       f"drop it or use --fix recompute={modes[0]}"


class TestWithoutPins:
    def test_message_stays_the_general_advice(self):
        # two samples a step on 64 devices: no launcher runs a plan on all of them (tests/planner/test_launchable.py)
        request = PlanRequest(cluster=make_cluster("a100-80gb", devices=64, devices_per_node=8))
        frontier = launch_frontier(graph_loader(GPT2, {"seq": 64}), request, options=PipelineOptions(global_batch=2))
        assert not frontier.rows
        named, _, advice = frontier.message.removeprefix("no plan that ").partition(" runs was found on these devices; ")
        assert sorted(named.split(", ")) == sorted(frontier.launchers)  # in the order they were searched
        assert advice == ("plan with --target generic (every per-op plan, exported as the generic plan), or change --fix, "
                          "--global-batch or the device count")

    def test_no_pin_no_reason(self):
        graph = graph_loader(NEMOTRON, {"batch": 16, "seq": 16})(16)
        request = PlanRequest(cluster=make_cluster("a100-80gb", devices=8, devices_per_node=8))
        assert pinned_refusal(graph, request, PipelineOptions(global_batch=16), Pins(), ["megatron"]) == ""
        assert fit_message((), 80e9, ["megatron"], pinned="").startswith("no plan that megatron runs")


class TestPinnedPipeline:
    def test_deepspeed_names_why_it_runs_no_pipeline_on_an_encoder_decoder(self):
        # Marian (tests/data/multi_stack_cases): DeepSpeed's PipelineModule runs one chain of blocks, and the
        # decoder's cross-attention reads the encoder's last output, two layers back (exporters.block_chain)
        marian = ROOT / "tests" / "data" / "multi_stack_cases" / "marian_dynamo_bare.onnx"
        dims = ["--dim", "batch=16", "--dim", "seq=128", "--dim", "tgt_seq=128"]
        result = run_cli(["plan", marian, "-n", 8, *dims, "--target", "deepspeed", "--fix", "pp=2"], expected_exit_code=2)
        line = error_line(result)
        graph = graph_loader(marian, {"seq": 128, "tgt_seq": 128})(16)
        assert line == (f"error: 8 devices: deepspeed runs no pipeline on this model ({chain_break(graph)}); "
                        "--fix pp=2 leaves none: drop it or use --fix pp=1")
        assert "skips a layer" in line


class TestPinnedOverlap:
    """``--fix tp_overlap=on`` where the launcher runs no ``tp > 1``: one device has no tensor-parallel
    collective to overlap."""

    def test_one_device_says_tp_one_and_names_the_pin(self):
        graph = graph_loader(GPT2, {"batch": 16, "seq": 16})(16)
        spaces = [enumerate_configs(op, ConfigOptions(devices=1, devices_per_node=1)) for op in graph.ops]
        families = TARGETS["megatron"].pipeline_families(graph, spaces, devices=1, devices_per_node=1, pp=1)
        assert {f.tp for f in families} == {1}  # the oracle: Megatron-LM's own families on one device
        result = run_cli(["plan", GPT2, "-n", 1, *DIMS, "--target", "megatron", "--fix", "tp_overlap=on"],
                         expected_exit_code=2)
        assert error_line(result) == (
            "error: 1 device: megatron runs tp 1 only on this model at 1 device, and tp_overlap=on overlaps "
            "tensor-parallel communication, which tp 1 does not have; --fix tp_overlap=on leaves none: drop it "
            "or use --fix tp_overlap=off")

    def test_the_advice_runs(self):
        result = run_cli(["plan", GPT2, "-n", 1, *DIMS, "--target", "megatron", "--fix", "tp_overlap=off", "--json"])
        assert json.loads(result.stdout)["rows"]


class TestTightNote:
    """The tight pick's allocator advice (``tight_note``): Megatron-LM's per-layer CUDA graphs assert
    ``expandable_segments:True`` off unless ``NCCL_GRAPH_REGISTER=0`` (its ``validate_args``), so a row priced
    with them is told both; every other row the plain setting."""

    @staticmethod
    def _row(cuda_graphs: bool, scope: str):
        from types import SimpleNamespace

        from planner.core.settings import TrainingSettings

        memory = SimpleNamespace(allocated_bytes=3 * 2**30, other_bytes=2**29)
        settings = TrainingSettings(cuda_graphs=cuda_graphs, cuda_graph_scope=scope)
        return SimpleNamespace(point=SimpleNamespace(memory=memory), cache=SimpleNamespace(settings=settings))

    def test_layer_graphs_are_told_to_turn_off_nccl_graph_registration(self):
        from planner.launch_messages import tight_note

        note = tight_note(self._row(True, "layers"), 3 * 2**30)
        assert "expandable_segments:True with NCCL_GRAPH_REGISTER=0" in note and "3.00 GiB" in note

    def test_other_rows_get_the_plain_setting(self):
        from planner.launch_messages import tight_note

        for graphs, scope in ((False, "step"), (True, "step"), (False, "layers")):
            note = tight_note(self._row(graphs, scope), 3 * 2**30)
            assert "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True cuts" in note and "NCCL_GRAPH" not in note
