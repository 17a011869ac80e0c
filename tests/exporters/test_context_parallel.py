"""Context parallelism (issue 24 item 1): Megatron-LM's ``dp x cp x tp`` families, the K/V exchange
they are priced with, their refusals, their export, and the long-sequence frontier where cp wins."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from exporters._tp import tp_layout
from exporters.megatron.export import _masks, megatron_args
from exporters.megatron.rules import context_degrees, families
from exporters.validate import megatron_violations, parse_megatron_args
from importers import import_model
from importers.transformer import analyze_transformer
from objectives.cluster import make_cluster
from objectives.intra_op import intra_op_terms
from objectives.redistribution import redistribution
from objectives.tables import launcher_options
from planner.core.configs import ConfigOptions, enumerate_configs
from planner.core.settings import TrainingSettings

ROOT = Path(__file__).resolve().parents[2]
SEQ, BATCH, DEVICES = 64, 4, 8


def tiny_llama(seq: int, batch: int = BATCH, devices: int = DEVICES):
    """``(graph, spaces, model)`` of the tiny Llama (2 layers, 8 heads, 4 K/V groups of head size 8) at
    ``seq`` tokens on one node of ``devices``, configurations as the launchable search enumerates them."""
    graph = import_model(ROOT / "tests" / "data" / "llama_tiny.onnx", {"batch": batch, "seq": seq})
    options = launcher_options(ConfigOptions(devices=devices, devices_per_node=devices))
    spaces = [enumerate_configs(op, options) for op in graph.ops]
    return graph, spaces, analyze_transformer(graph)


@pytest.fixture(scope="module")
def llama():
    """The tiny Llama at 64 tokens on one node of 8."""
    return tiny_llama(SEQ)


def _cp_masks(graph, spaces, *, dp, cp, tp, sp=False):
    model = analyze_transformer(graph)
    layout = tp_layout(graph, model, target="megatron")
    return layout, _masks(graph, spaces, layout, dp=dp, tp=tp, cp=cp, sequence_parallel=sp, devices_per_node=DEVICES)


@pytest.mark.parametrize(("dp", "cp", "tp", "sp"), [(2, 4, 1, False), (2, 2, 2, False), (1, 4, 2, True)])
def test_every_op_splits_its_sequence_cp_ways(llama, dp, cp, tp, sp):
    graph, spaces, model = llama
    layout, result = _cp_masks(graph, spaces, dp=dp, cp=cp, tp=tp, sp=sp)
    assert result.masks is not None, result.reason
    checked = 0
    for op, space, rule, mask in zip(graph.ops, spaces, layout.rules, result.masks):
        if rule.context is None:
            continue
        column = space.dim_names.index(rule.context)
        factors = set(space.factors[mask, column].tolist())
        # norms and residual ops under sequence parallelism split the sequence tp ways more
        want = cp * tp if sp and rule.sequence_required else cp
        assert factors == {want}, (op.name, rule.role, factors)
        checked += 1
    assert checked > 10
    # attention splits its query sequence; its key/value sequence stays whole (gathered)
    for index, role in enumerate(model.roles):
        if role in ("attention-score", "attention-value", "softmax"):
            op, space, mask = graph.ops[index], spaces[index], result.masks[index]
            query = layout.rules[index].context
            seq = [d.name for d in op.dims if model.classes.of[index][d.name] == model.seq_class]
            assert query == seq[0] and len(seq) == 2
            kv = space.dim_names.index(seq[1])
            assert set(space.factors[mask, kv].tolist()) == {1}


def test_divisibility_refusals(llama):
    graph, spaces, _ = llama
    # 64 tokens do not cut into 2 x 64 chunks (Megatron's causal load balance)
    _, result = _cp_masks(graph, spaces, dp=1, cp=64, tp=1)
    assert result.masks is None and "2 x cp" in result.reason
    assert context_degrees(32768, 8) == [1, 2, 4, 8]
    assert context_degrees(4096, 8) == [1, 2, 4]  # 1,024 tokens per cp rank at least
    assert context_degrees(3002, 8) == [1]  # 3002 is not a multiple of 2 x 2
    problems = megatron_violations(parse_megatron_args(
        "--num-layers 2 --hidden-size 64 --num-attention-heads 8 --seq-length 100 --max-position-embeddings 100 "
        "--micro-batch-size 1 --context-parallel-size 4"), world_size=8, env={"CUDA_DEVICE_MAX_CONNECTIONS": "1"})
    assert any("2*context_parallel_size" in p for p in problems)


def test_families_list_cp_only_for_long_sequences(llama):
    graph, spaces, _ = llama
    # 64 tokens: below CP_MIN_TOKENS per rank, no cp family is searched
    found = families(graph, spaces, devices=DEVICES, devices_per_node=DEVICES, pp=1)
    assert found and all(f.cp == 1 for f in found)


def _producer(graph, tensor):
    return next(i for i, op in enumerate(graph.ops) if any(a.tensor == tensor for a in op.outputs))


def test_kv_exchange_equals_the_hand_count(llama):
    """Per layer and device, forward: K and V, each (cp - 1) chunks of seq/cp tokens x kv_heads x
    head_dim in bf16; backward twice that (the ring passes K/V again with dK/dV: here an
    all-reduce of the gathered dK, dV over the cp ranks, which moves 2 (cp - 1) / cp of it)."""
    graph, spaces, model = llama
    dp, cp, tp = 2, 4, 1
    layout, result = _cp_masks(graph, spaces, dp=dp, cp=cp, tp=tp)
    cluster = make_cluster("a100-80gb", devices=DEVICES, devices_per_node=DEVICES)
    settings = TrainingSettings()
    samples = BATCH // dp
    hand_forward = 2 * (SEQ // cp) * model.num_query_groups * model.head_dim * 2 * (cp - 1) * samples
    layers = 0
    for index, role in enumerate(model.roles):
        if role != "attention-score":
            continue
        score = graph.ops[index]
        value_index = next(i for i in range(index + 1, len(graph.ops)) if model.roles[i] == "attention-value")
        forward = backward = 0.0
        for consumer_index, which in ((index, 1), (value_index, 1)):  # K of the score product, V of the value product
            consumer = graph.ops[consumer_index]
            access = consumer.inputs[which]
            producer_index = _producer(graph, access.tensor)
            producer = graph.ops[producer_index]
            rows_u = np.flatnonzero(result.masks[producer_index])
            rows_v = np.flatnonzero(result.masks[consumer_index])
            moved = redistribution(
                graph.tensors[access.tensor].shape, 2, producer=producer, producer_space=spaces[producer_index],
                producer_access=next(a for a in producer.outputs if a.tensor == access.tensor),
                consumer=consumer, consumer_space=spaces[consumer_index], consumer_access=access, cluster=cluster,
            )
            forward += 2 * float(moved.forward_elements[rows_u[0], rows_v[0]])
            assert float(moved.backward_elements[rows_u[0], rows_v[0]]) == 0.0  # the gradient's slice is local
            grads = [t for t in intra_op_terms(consumer, spaces[consumer_index], tensors=graph.tensors, settings=settings)
                     if t.kind == "input_grad" and t.tensor == access.tensor]
            assert len(grads) == 1 and grads[0].collective == "all_reduce"
            row = rows_v[0]
            assert int(grads[0].intra_size[row] * grads[0].inter_size[row]) == cp
            backward += 2 * (cp - 1) / cp * float(grads[0].num_bytes[row])
        assert forward == hand_forward, (score.name, forward, hand_forward)
        assert backward == pytest.approx(2 * hand_forward)
        layers += 1
    assert layers == model.num_layers


def test_megatron_args_carry_the_cp_degree(llama):
    _, _, model = llama
    args = megatron_args(model, tp=1, sequence_parallel=False, micro_batch_size=1, global_batch_size=4, zero_stage=1,
                         recompute="none", precision="bf16-mixed", cp=4)
    parsed = parse_megatron_args(args)
    assert parsed["context-parallel-size"] == 4 and parsed["cp-comm-type"] == ["all_gather"]
    assert not megatron_violations(parsed, world_size=8, env={"CUDA_DEVICE_MAX_CONNECTIONS": "1"})


def long_context_frontier(launchers: tuple[str, ...] | None = None):
    """The bundled Llama (8 layers, hidden 1024, 16 heads, 4 K/V groups) at 32k tokens, batch 16, on
    64 H100s (8 nodes of 8): the README's and docs/COST_MODEL.md's long-context table (``launchers``:
    only their rows, as ``--target``)."""
    from planner.launchable import plan_launchable_file
    from planner.plan import PlanRequest

    request = PlanRequest(cluster=make_cluster("h100-sxm", devices=64, devices_per_node=8))
    _, (found,) = plan_launchable_file(ROOT / "examples" / "llama.onnx", {"batch": 16, "seq": 32768}, [request],
                                       launchers=launchers)
    return found


def test_the_32k_frontier_lists_cp_rows_that_beat_tensor_parallelism():
    found = long_context_frontier()
    with_cp = [row for row in found.rows if row.degrees.cp > 1]
    # the fastest plan of every launcher's search, tensor parallelism included, splits the sequence
    assert with_cp and found.rows[0].degrees.cp > 1
    assert all({"megatron", "torchtitan", "deepspeed"} & set(row.targets) for row in with_cp)
    # torchtitan runs the ZeRO-3 (FSDP2) ones: its FlexAttention context parallelism gathers K/V too.
    # Its own rows: in the table of every launcher, Megatron-LM's twins of the same layouts (priced with
    # the sequence shard and fused SwiGLU Megatron-Core keeps, per search) hold less and dominate them
    titan = [row for row in long_context_frontier(("torchtitan",)).rows if row.degrees.cp > 1]
    assert titan and all(row.point.zero_stage == 3 for row in titan)
    assert "cp=" in with_cp[0].layout
    assert with_cp[0].degrees.label().startswith(f"dp={with_cp[0].degrees.dp} x cp=")
    from exporters import export
    from planner.launchable import row_plan_input

    megatron = next(row for row in with_cp if "megatron" in row.targets)
    out = export("megatron", row_plan_input(megatron))
    assert out["degrees"]["cp"] == megatron.degrees.cp
    assert out["world_size"] == 64
    assert "--context-parallel-size" in out["args"]
    out = export("torchtitan", row_plan_input(titan[0]))
    assert out["degrees"]["cp"] == titan[0].degrees.cp and out["world_size"] == 64
    # DeepSpeed-Ulysses' rows (heads over the cp ranks) export with sequence_parallel_size; its own table:
    # beside Megatron-LM's (cuDNN attention on an H100, FlashAttention-2 under DeepSpeed) they are dominated
    ulysses = [row for row in long_context_frontier(("deepspeed",)).rows if "ulysses" in row.layout]
    assert ulysses and all(row.targets == ("deepspeed",) for row in ulysses)
    out = export("deepspeed", row_plan_input(ulysses[0]))
    assert out["ds_config"]["sequence_parallel_size"] == ulysses[0].degrees.cp


def test_torchtitan_runs_context_parallelism_as_megatron_prices_it():
    """torchtitan's FlexAttention context parallelism gathers K/V over the cp ranks
    (``flex_cp_allgather``), so its families are Megatron-LM's ``all_gather`` ones; the export writes
    the degree and the PTRR balancer, keeps ZeRO-3 only (FSDP2 shards over dp_shard x cp) and
    passes torchtitan's own rules."""
    from exporters import export
    from exporters.megatron.rules import families as megatron_families
    from exporters.torchtitan.rules import families as torchtitan_families
    from exporters.torchtitan.validate import parse_torchtitan_overrides
    from planner.core.errors import UnsupportedExport
    from tests.exporters.graphs import first_rows, llama_graph, make_cluster, make_input, spaces_for

    graph = llama_graph(seq=4096, batch=4)
    spaces = spaces_for(graph, 8, 8)
    titan = {f.label: f for f in torchtitan_families(graph, spaces, devices=8, devices_per_node=8, pp=1)}
    mega = {f.label: f for f in megatron_families(graph, spaces, devices=8, devices_per_node=8, pp=1)}
    with_cp = [label for label, f in titan.items() if f.cp > 1]
    # 4,096 tokens on 8 ranks: cp = 2 and 4 keep 2,048 and 1,024 tokens each; cp = 8 would keep 512
    assert {titan[label].cp for label in with_cp} == {2, 4}
    for label in with_cp:
        assert all(np.array_equal(a, b) for a, b in zip(titan[label].masks, mega[label].masks)), label
    family = titan["dp=2 x cp=4 x tp=1"]
    cluster = make_cluster(1, 8)
    choice = first_rows(family.masks)
    out = export("torchtitan", make_input(graph, spaces, choice, cluster=cluster, settings=TrainingSettings(zero_stage=3)))
    args = parse_torchtitan_overrides(out["overrides"])
    assert args["parallelism.context_parallel_degree"] == 4 and args["parallelism.context_parallel_load_balancer"] == "ptrr"
    assert args["parallelism.data_parallel_shard_degree"] == 2 and out["degrees"]["cp"] == 4 and out["world_size"] == 8
    with pytest.raises(UnsupportedExport, match="--zero 3"):
        export("torchtitan", make_input(graph, spaces, choice, cluster=cluster, settings=TrainingSettings(zero_stage=0)))
