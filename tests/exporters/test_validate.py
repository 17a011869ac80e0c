"""Tests of exporters.validate: every rule of every target, each with a passing and a failing case.

The expected verdicts are the libraries' own, as recorded in /work/shared/reference/export_targets.md
(Megatron-LM §1.2 and §1.5's table, DeepSpeed §2, Mesh-TF §3.2); the integration tests in
test_megatron.py / test_deepspeed.py re-check some of them against the installed libraries.
"""

from __future__ import annotations

import pytest

from exporters.validate import (
    MeshTensor,
    deepspeed_violations,
    megatron_violations,
    mesh_tf_violations,
    parse_megatron_args,
    validate_deepspeed,
    validate_megatron,
    validate_mesh_tf,
)
from planner.core.errors import InputError, UnsupportedExport

# Reference §1.5's base: 8 layers, hidden 512, 8 heads, seq 1024, mbs 2, gbs 64.
BASE = "--num-layers 8 --hidden-size 512 --num-attention-heads 8 --seq-length 1024 --max-position-embeddings 1024 --micro-batch-size 2 --global-batch-size 64"
CUDA = {"CUDA_DEVICE_MAX_CONNECTIONS": "1"}

# (case, extra flags, world size, env, expected violation substring or None for valid)
MEGATRON_CASES = [
    ("positive sizes", "--tensor-model-parallel-size 0", 16, CUDA, "at least 1"),
    ("world divisible ok", "--tensor-model-parallel-size 2 --pipeline-model-parallel-size 2", 16, CUDA, None),
    ("world divisible", "--tensor-model-parallel-size 2 --pipeline-model-parallel-size 4", 12, CUDA, "not divisible by tp*pp*cp (8)"),
    ("expert grid", "--expert-model-parallel-size 3 --num-experts 6", 16, CUDA, "etp*ep*pp"),
    ("experts ok", "--expert-model-parallel-size 2 --num-experts 8", 16, CUDA, None),
    ("experts missing", "--expert-model-parallel-size 2", 16, CUDA, "needs --num-experts"),
    ("experts divisible", "--expert-model-parallel-size 4 --num-experts 6", 16, CUDA, "multiple of --expert-model-parallel-size"),
    ("sp needs tp", "--sequence-parallel", 16, CUDA, "needs --tensor-model-parallel-size > 1"),
    ("sp ok", "--sequence-parallel --tensor-model-parallel-size 2", 16, CUDA, None),
    ("layers by pp", "--pipeline-model-parallel-size 3", 6, {}, "divisible by the pipeline"),
    ("layers by pp with embedding counted", "--pipeline-model-parallel-size 3 --account-for-embedding-in-pipeline-split", 6, {}, None),
    ("one vpp option", "--pipeline-model-parallel-size 2 --num-layers-per-virtual-pipeline-stage 2 --num-virtual-stages-per-pipeline-rank 2", 16, {}, "at most one"),
    ("vpp needs pp", "--num-layers-per-virtual-pipeline-stage 2", 16, {}, "--pipeline-model-parallel-size > 1"),
    ("vpp divides stage", "--tensor-model-parallel-size 2 --pipeline-model-parallel-size 2 --num-layers-per-virtual-pipeline-stage 3", 16, CUDA, "layers per virtual stage"),
    ("vpp ok", "--tensor-model-parallel-size 2 --pipeline-model-parallel-size 2 --num-layers-per-virtual-pipeline-stage 2", 16, CUDA, None),
    ("vpp without overlap needs pp > 2", "--pipeline-model-parallel-size 2 --num-layers-per-virtual-pipeline-stage 2 --no-overlap-p2p-communication", 16, {}, "> 2"),
    ("uneven first/last ok (reference §1.5)", "--tensor-model-parallel-size 2 --pipeline-model-parallel-size 2 --decoder-first-pipeline-num-layers 3 --decoder-last-pipeline-num-layers 5", 16, CUDA, None),
    ("uneven first only", "--pipeline-model-parallel-size 3 --decoder-first-pipeline-num-layers 2", 12, {}, None),
    ("uneven middle not divisible", "--pipeline-model-parallel-size 4 --decoder-first-pipeline-num-layers 1 --decoder-last-pipeline-num-layers 2", 16, {}, "middle stages (2)"),
    ("uneven positive", "--pipeline-model-parallel-size 2 --decoder-first-pipeline-num-layers 0", 16, {}, "must be larger than 0"),
    ("uneven no middle layers left", "--pipeline-model-parallel-size 3 --decoder-first-pipeline-num-layers 4 --decoder-last-pipeline-num-layers 4", 12, {}, "0 middle layers remain for 1"),
    ("uneven vs account", "--pipeline-model-parallel-size 2 --decoder-first-pipeline-num-layers 3 --account-for-loss-in-pipeline-split", 16, {}, "cannot be combined"),
    ("uneven vpp by chunks", "--pipeline-model-parallel-size 3 --decoder-last-pipeline-num-layers 2 --num-virtual-stages-per-pipeline-rank 2", 12, {}, "layers of each middle stage (3)"),
    ("uneven last by chunks", "--pipeline-model-parallel-size 2 --decoder-last-pipeline-num-layers 3 --num-virtual-stages-per-pipeline-rank 2", 16, {}, "last pipeline stage (3) must be divisible"),
    ("uneven vpp ok", "--pipeline-model-parallel-size 2 --decoder-first-pipeline-num-layers 2 --decoder-last-pipeline-num-layers 6 --num-virtual-stages-per-pipeline-rank 2", 16, {}, None),
    ("uneven needs vpp stages flag", "--pipeline-model-parallel-size 2 --decoder-first-pipeline-num-layers 2 --decoder-last-pipeline-num-layers 6 --num-layers-per-virtual-pipeline-stage 2", 16, {}, "need --num-virtual-stages-per-pipeline-rank"),
    ("layout ok (reference §1.5)", "--pipeline-model-parallel-size 4 --pipeline-model-parallel-layout Et*2|t*2|t*2|t*2L", 16, {}, None),
    ("layout stages by pp", "--pipeline-model-parallel-size 3 --pipeline-model-parallel-layout Et*2|t*2|t*2|t*2L", 12, {}, "not a multiple of --pipeline-model-parallel-size (3)"),
    ("layout counts layers", "--pipeline-model-parallel-size 2 --pipeline-model-parallel-layout Et*3|t*4L", 16, {}, "7 transformer layers (t) but --num-layers is 8"),
    ("layout needs E and L", "--pipeline-model-parallel-size 2 --pipeline-model-parallel-layout t*4|t*4", 16, {}, "start with the embedding"),
    ("layout once", "--pipeline-model-parallel-size 2 --pipeline-model-parallel-layout Et*4L|Et*4L", 16, {}, "exactly once"),
    ("layout alone", "--pipeline-model-parallel-size 2 --pipeline-model-parallel-layout Et*3|t*5L --decoder-first-pipeline-num-layers 3", 16, {}, "cannot be set with other"),
    ("layout with vpp", "--pipeline-model-parallel-size 2 --pipeline-model-parallel-layout Et|t*3|t*2|t*2L", 16, {}, None),
    ("layout vpp needs micro-batch groups", "--pipeline-model-parallel-size 2 --pipeline-model-parallel-layout Et|t*3|t*2|t*2L --global-batch-size 24 --micro-batch-size 1", 16, {}, "micro-batches per step (3) to be a multiple"),
    ("vpp micro-batches", "--pipeline-model-parallel-size 4 --num-layers-per-virtual-pipeline-stage 1 --global-batch-size 12 --micro-batch-size 1", 16, {}, "micro-batches per step (3)"),
    ("heads by tp", "--tensor-model-parallel-size 3 --pipeline-model-parallel-size 2", 12, CUDA, "must be a multiple of tensor_model_parallel_size (3)"),
    ("groups multiple or divisor", "--tensor-model-parallel-size 2 --group-query-attention --num-query-groups 3", 16, CUDA, "multiple or divisor"),
    ("groups divisor of tp ok", "--tensor-model-parallel-size 4 --group-query-attention --num-query-groups 2", 16, CUDA, None),
    ("heads by groups", "--group-query-attention --num-query-groups 3", 16, {}, "multiple of num_query_groups"),
    ("groups need gqa flag", "--num-query-groups 2", 16, {}, "only with --group-query-attention"),
    ("gqa needs groups", "--group-query-attention", 16, {}, "needs --num-query-groups"),
    ("hidden by heads", "--hidden-size 500", 16, {}, "divisible by num_attention_heads"),
    ("kv channels lift it", "--hidden-size 500 --kv-channels 64", 16, {}, None),
    ("ffn by tp", "--tensor-model-parallel-size 2 --ffn-hidden-size 1001", 16, CUDA, "ffn_hidden_size"),
    ("cp seq", "--context-parallel-size 3", 12, CUDA, "2*context_parallel_size"),
    ("cp ok", "--context-parallel-size 2", 16, CUDA, None),
    ("hierarchical cp", "--context-parallel-size 4 --cp-comm-type a2a+p2p --hierarchical-context-parallel-sizes 2 3", 16, CUDA, "multiply to"),
    ("hierarchical cp ok", "--context-parallel-size 4 --cp-comm-type a2a+p2p --hierarchical-context-parallel-sizes 2 2", 16, CUDA, None),
    ("positions cover seq", "--max-position-embeddings 512", 16, {}, "max_position_embeddings (512)"),
    ("base is valid", "--tensor-model-parallel-size 1", 16, {}, None),
    ("global batch", "--tensor-model-parallel-size 2 --global-batch-size 60", 16, CUDA, "global batch size (60) is not divisible by micro batch size (2) times data parallel size (8)"),
    ("full needs method", "--recompute-granularity full --recompute-num-layers 1", 16, {}, "needs --recompute-method"),
    ("full needs layers", "--recompute-granularity full --recompute-method uniform", 16, {}, "needs --recompute-num-layers"),
    ("full ok", "--recompute-granularity full --recompute-method uniform --recompute-num-layers 1", 16, {}, None),
    ("selective no method", "--recompute-granularity selective --recompute-method uniform", 16, {}, "not supported with selective"),
    ("selective no layers", "--recompute-granularity selective --recompute-num-layers 1", 16, {}, "not supported with selective"),
    ("selective ok", "--recompute-granularity selective --recompute-modules core_attn mlp", 16, {}, None),
    ("method needs full", "--recompute-method block", 16, {}, "need --recompute-granularity full"),
    ("alias vs full", "--recompute-activations --recompute-granularity full --recompute-method uniform --recompute-num-layers 1", 16, {}, "--recompute-activations"),
    ("offload vs recompute", "--cpu-offloading-num-layers 2 --recompute-granularity selective", 16, {}, "CPU offloading"),
    ("offload alone ok", "--cpu-offloading-num-layers 2", 16, {}, None),
    ("distribute needs tp", "--distribute-saved-activations --recompute-granularity full --recompute-method uniform --recompute-num-layers 1", 16, {}, "needs --tensor-model-parallel-size > 1"),
    ("distribute needs full", "--tensor-model-parallel-size 2 --distribute-saved-activations --recompute-granularity selective", 16, CUDA, "needs full recompute"),
    ("distribute not with sp", "--tensor-model-parallel-size 2 --sequence-parallel --distribute-saved-activations --recompute-granularity full --recompute-method uniform --recompute-num-layers 1", 16, CUDA, "not allowed with --sequence-parallel"),
    ("distribute ok", "--tensor-model-parallel-size 2 --distribute-saved-activations --recompute-granularity full --recompute-method uniform --recompute-num-layers 1", 16, CUDA, None),
    ("fp16 and bf16", "--fp16 --bf16", 16, {}, "mutually exclusive"),
    ("overlap param gather", "--overlap-param-gather --overlap-grad-reduce", 16, {}, "--overlap-param-gather needs"),
    ("overlap param gather ok", "--overlap-param-gather --overlap-grad-reduce --use-distributed-optimizer", 16, {}, None),
    ("fsdp2 pp", "--use-torch-fsdp2 --untie-embeddings-and-output-weights --pipeline-model-parallel-size 2", 16, {}, "pipeline and expert parallel sizes of 1"),
    ("fsdp2 dist opt", "--use-torch-fsdp2 --untie-embeddings-and-output-weights --use-distributed-optimizer", 16, {}, "not compatible with --use-distributed-optimizer"),
    ("fsdp2 fp16", "--use-torch-fsdp2 --untie-embeddings-and-output-weights --fp16", 16, {}, "not compatible with --fp16"),
    ("fsdp2 untie", "--use-torch-fsdp2", 16, {}, "needs --untie-embeddings-and-output-weights"),
    ("fsdp2 ckpt", "--use-torch-fsdp2 --untie-embeddings-and-output-weights --ckpt-format torch", 16, {}, "--ckpt-format torch_dist or torch_dcp"),
    ("fsdp2 ok", "--use-torch-fsdp2 --untie-embeddings-and-output-weights --ckpt-format torch_dcp", 16, {}, None),
    ("megatron fsdp ckpt", "--use-megatron-fsdp --data-parallel-sharding-strategy optim_grads_params", 16, {}, "fsdp_dtensor"),
    ("megatron fsdp env", "--use-megatron-fsdp --ckpt-format fsdp_dtensor", 16, CUDA, "larger than 1"),
    ("megatron fsdp mapping", "--use-megatron-fsdp --ckpt-format fsdp_dtensor --use-tp-pp-dp-mapping", 16, {}, "--use-tp-pp-dp-mapping"),
    ("both fsdp", "--use-megatron-fsdp --ckpt-format fsdp_dtensor --use-torch-fsdp2 --untie-embeddings-and-output-weights", 16, {}, "mutually exclusive"),
    ("megatron fsdp ok with tp", "--tensor-model-parallel-size 2 --use-megatron-fsdp --ckpt-format fsdp_dtensor --data-parallel-sharding-strategy optim_grads", 16, {}, None),
    ("sharding needs fsdp", "--data-parallel-sharding-strategy optim", 16, {}, "only with --use-megatron-fsdp"),
    ("tp needs env", "--tensor-model-parallel-size 2", 16, {}, "CUDA_DEVICE_MAX_CONNECTIONS=1"),
    ("tp with env ok", "--tensor-model-parallel-size 2", 16, CUDA, None),
    # TransformerConfig.__post_init__ (megatron-core 0.16.1): whole-layer graphs refuse recomputing a module with
    # dropout (default 0.1) inside them; layernorm has none
    ("graphs vs selective default", "--cuda-graph-impl transformer_engine --recompute-granularity selective", 16, {}, "graphed attention recomputation"),
    ("graphs vs selective mlp", "--cuda-graph-impl transformer_engine --recompute-granularity selective --recompute-modules mlp", 16, {}, "graphed MLP/MoE recomputation"),
    ("graphs with layernorm recompute ok", "--cuda-graph-impl transformer_engine --recompute-granularity selective --recompute-modules layernorm", 16, {}, None),
]


class TestMegatron:
    @pytest.mark.parametrize(("case", "extra", "world", "env", "expected"), MEGATRON_CASES, ids=[c[0] for c in MEGATRON_CASES])
    def test_rule(self, case, extra, world, env, expected):
        problems = megatron_violations(f"{BASE} {extra}", world_size=world, env=env)
        if expected is None:
            assert problems == []
        else:
            assert any(expected in p for p in problems), problems

    def test_required_flags(self):
        problems = megatron_violations("--micro-batch-size 1", world_size=1)
        assert {"--num-layers is required", "--hidden-size is required", "--num-attention-heads is required", "--max-position-embeddings is required"} <= set(problems)

    def test_blackwell_needs_no_connection_limit(self):
        assert megatron_violations(f"{BASE} --tensor-model-parallel-size 2", world_size=16, env={}, device_arch=10) == []

    def test_validate_raises_with_every_problem(self):
        with pytest.raises(UnsupportedExport, match="heads.*tensor_model_parallel_size.*CUDA_DEVICE_MAX_CONNECTIONS"):
            validate_megatron(f"{BASE} --tensor-model-parallel-size 3", world_size=12, env={})

    def test_layout_parse(self):
        from exporters.validate import parse_pipeline_layout

        assert parse_pipeline_layout("Et*3|(tt|)*2,t*2L") == ["Ettt", "tt", "tt", "ttL"]
        assert parse_pipeline_layout("E|t*10|L") == ["E", "t" * 10, "L"]
        with pytest.raises(InputError, match="has the letter 'x'"):
            parse_pipeline_layout("Ex|tL")

    def test_parse(self):
        parsed = parse_megatron_args(["--tensor-model-parallel-size=2", "--bf16", "--recompute-modules", "core_attn", "mlp", "--num-layers", "4"])
        assert parsed == {"tensor-model-parallel-size": 2, "bf16": True, "recompute-modules": ["core_attn", "mlp"], "num-layers": 4}

    @pytest.mark.parametrize(
        ("text", "message"),
        [
            ("--no-such-flag 1", "unknown Megatron flag"),
            ("--num-layers x", "needs an integer"),
            ("--recompute-granularity sometimes", "not one of"),
            ("--bf16=1", "takes no value"),
            ("--num-layers", "needs a value"),
            ("num-layers 2", "not a --flag"),
        ],
    )
    def test_parse_errors(self, text, message):
        with pytest.raises(InputError, match=message):
            parse_megatron_args(text)


def _ds(**changes):
    config = {
        "train_batch_size": 32,
        "train_micro_batch_size_per_gpu": 2,
        "gradient_accumulation_steps": 2,
        "zero_optimization": {"stage": 1},
        "bf16": {"enabled": True},
    }
    for key, value in changes.items():
        if value is None:
            config.pop(key, None)
        else:
            config[key] = value
    return config


_TP = {"autotp_size": 2}
_SPEC = {"patterns": [r".*\.q_proj\.weight$"], "partition_type": "column"}

# (case, config, world, pipeline stages, heads, kv heads, expected substring or None)
DEEPSPEED_CASES = [
    ("valid", _ds(), 8, 1, None, None, None),
    ("batch product", _ds(train_batch_size=30), 8, 1, None, None, "train_batch_size (30) !="),
    ("batch is an int", _ds(train_batch_size="32"), 8, 1, None, None, "positive integer"),
    ("accumulation positive", _ds(gradient_accumulation_steps=0), 8, 1, None, None, "positive integer"),
    ("infer accumulation", _ds(gradient_accumulation_steps=None), 8, 1, None, None, None),
    ("inferred accumulation zero", _ds(train_batch_size=8, train_micro_batch_size_per_gpu=4, gradient_accumulation_steps=None), 8, 1, None, None, "has to be greater than 0"),
    ("micro only", _ds(train_batch_size=None, gradient_accumulation_steps=None), 8, 1, None, None, None),
    ("neither batch", _ds(train_batch_size=None, train_micro_batch_size_per_gpu=None), 8, 1, None, None, "set train_batch_size"),
    ("zero stage", _ds(zero_optimization={"stage": 4}), 8, 1, None, None, "must be 0, 1, 2 or 3"),
    ("zero stage string coerced", _ds(zero_optimization={"stage": "2"}), 8, 1, None, None, None),
    ("zero key", _ds(zero_optimization={"stage": 2, "overlap_comms": True}), 8, 1, None, None, "unknown key 'overlap_comms'"),
    ("zero stage3 alias", _ds(zero_optimization={"stage": 3, "stage3_prefetch_bucket_size": 5e7}), 8, 1, None, None, None),
    ("offload device", _ds(zero_optimization={"stage": 2, "offload_optimizer": {"device": "gpu"}}), 8, 1, None, None, "none, cpu or nvme"),
    ("offload key", _ds(zero_optimization={"stage": 2, "offload_optimizer": {"device": "cpu", "pinned": True}}), 8, 1, None, None, "unknown key 'pinned'"),
    ("offload param stage", _ds(zero_optimization={"stage": 2, "offload_param": {"device": "cpu"}}), 8, 1, None, None, "needs ZeRO stage 3"),
    ("offload param ok", _ds(zero_optimization={"stage": 3, "offload_param": {"device": "cpu"}}), 8, 1, None, None, None),
    ("offload optimizer stage", _ds(zero_optimization={"stage": 0, "offload_optimizer": {"device": "cpu"}}), 8, 1, None, None, "needs ZeRO stage 1, 2 or 3"),
    ("fp16 and bf16", _ds(fp16={"enabled": True}), 8, 1, None, None, "cannot both be enabled"),
    ("fp16 disabled ok", _ds(fp16={"enabled": False}), 8, 1, None, None, None),
    ("bf16 key", _ds(bf16={"enabled": True, "loss_scale": 0}), 8, 1, None, None, "bf16 has unknown key"),
    ("tp key", _ds(tensor_parallel={"autotp_size": 2, "size": 2}, train_batch_size=32), 8, 1, None, None, "tensor_parallel has unknown key 'size'"),
    ("tp divides world", _ds(tensor_parallel={"autotp_size": 3}), 8, 1, None, None, "not divisible by tensor_parallel.autotp_size"),
    ("tp zero 3", _ds(tensor_parallel=_TP, zero_optimization={"stage": 3}), 8, 1, None, None, "ZeRO stages 0, 1 and 2"),
    ("tp heads", _ds(tensor_parallel=_TP), 8, 1, 9, None, "divide the attention heads"),
    ("tp kv heads", _ds(tensor_parallel=_TP), 8, 1, 8, 1, "key/value heads"),
    ("tp ok", _ds(tensor_parallel={"autotp_size": 2, "partition_config": {"use_default_specs": False, "layer_specs": [_SPEC]}}), 8, 1, 8, 2, None),
    ("tp preset", _ds(tensor_parallel={"autotp_size": 2, "preset_model": "gpt2"}), 8, 1, None, None, "preset_model"),
    ("partition key", _ds(tensor_parallel={"autotp_size": 2, "partition_config": {"specs": []}}), 8, 1, None, None, "partition_config has unknown key"),
    ("spec regex", _ds(tensor_parallel={"autotp_size": 2, "partition_config": {"layer_specs": [{"patterns": ["(unclosed"]}]}}), 8, 1, None, None, "not a regular expression"),
    ("spec patterns", _ds(tensor_parallel={"autotp_size": 2, "partition_config": {"layer_specs": [{"patterns": []}]}}), 8, 1, None, None, "non-empty list"),
    ("spec type", _ds(tensor_parallel={"autotp_size": 2, "partition_config": {"layer_specs": [{**_SPEC, "partition_type": "diagonal"}]}}), 8, 1, None, None, "row, column or skip"),
    ("spec nested shape", _ds(tensor_parallel={"autotp_size": 2, "partition_config": {"layer_specs": [{**_SPEC, "shape": [-1, [64, 16, 16]], "partition_dim": 0}]}}), 8, 1, None, None, "nested list is allowed only at partition_dim"),
    ("spec shape entries", _ds(tensor_parallel={"autotp_size": 2, "partition_config": {"layer_specs": [{**_SPEC, "shape": [0, -1]}]}}), 8, 1, None, None, "positive integers or -1"),
    ("spec partition dim", _ds(tensor_parallel={"autotp_size": 2, "partition_config": {"layer_specs": [{**_SPEC, "shape": [3, -1], "partition_dim": 2}]}}), 8, 1, None, None, "out of range"),
    ("spec gqa shape ok", _ds(tensor_parallel={"autotp_size": 2, "partition_config": {"layer_specs": [{**_SPEC, "shape": [[64, 16, 16], -1], "partition_dim": 0}]}}), 8, 1, None, None, None),
    ("autotp counts the whole world", _ds(tensor_parallel=_TP, train_batch_size=2, train_micro_batch_size_per_gpu=1, gradient_accumulation_steps=None), 4, 1, None, None, "greater than 0"),
    ("autotp whole world ok", _ds(tensor_parallel=_TP, train_batch_size=4, train_micro_batch_size_per_gpu=1, gradient_accumulation_steps=None), 4, 1, None, None, None),
    ("zero 2 with pipeline", _ds(zero_optimization={"stage": 2}, train_batch_size=16), 8, 2, None, None, "incompatible with pipeline"),
    ("zero 1 with pipeline", _ds(zero_optimization={"stage": 1}, train_batch_size=16), 8, 2, None, None, None),
]


class TestDeepSpeed:
    @pytest.mark.parametrize(("case", "config", "world", "stages", "heads", "kv", "expected"), DEEPSPEED_CASES, ids=[c[0] for c in DEEPSPEED_CASES])
    def test_rule(self, case, config, world, stages, heads, kv, expected):
        problems = deepspeed_violations(config, world_size=world, pipeline_stages=stages, num_attention_heads=heads, num_kv_heads=kv)
        if expected is None:
            assert problems == []
        else:
            assert any(expected in p for p in problems), problems

    def test_validate_raises(self):
        with pytest.raises(UnsupportedExport, match="DeepSpeed would reject"):
            validate_deepspeed(_ds(train_batch_size=30), world_size=8)


class TestMeshTf:
    @pytest.mark.parametrize(
        ("mesh", "layout", "devices", "tensors", "expected"),
        [
            ("b:4;m:2", "batch:b;d_ff:m", 8, [], None),
            ("batch:2,model:4", "batch:batch,d_ff:model,heads:model", 8, [], None),
            ("b:4;b:2", "batch:b", 8, [], "appears twice"),
            ("b:0", "batch:b", None, [], "sizes must be at least 1"),
            ("b:x", "batch:b", None, [], "non-integer size"),
            ("2b:4", "", 4, [], "not an identifier"),
            ("b:4;m:2", "batch:b", 16, [], "the plan needs 16"),
            ("b:4", "batch:b;d_ff:nonexistent", 4, [], "names no mesh dim"),
            ("b:4;m:2", "batch:b;batch:m", 8, [], "maps to multiple mesh dims"),
            ("b:4;m:2", "batch:b;d_ff:b", 8, [MeshTensor(name="x", dims=("batch", "d_ff"), shape=(8, 64))], "both map to mesh dim b"),
            ("b:4;m:2", "batch:b;d_ff:m", 8, [MeshTensor(name="x", dims=("batch", "length", "d_ff"), shape=(8, 16, 64))], None),
            ("b:4;m:2", "batch:b;d_ff:m", 8, [MeshTensor(name="x", dims=("batch", "d_ff"), shape=(6, 64))], "not divisible by mesh dim b (4)"),
            ("b:4", "batch:b", 4, [MeshTensor(name="s", dims=("batch", "length", "length"), shape=(8, 16, 16))], "repeats dimension name(s) length"),
            ("b:4", "batch:b", 4, [MeshTensor(name="s", dims=("batch", "length", "memory_length"), shape=(8, 16, 16))], None),
        ],
    )
    def test_rule(self, mesh, layout, devices, tensors, expected):
        problems = mesh_tf_violations(mesh, layout, devices=devices, tensors=tensors)
        if expected is None:
            assert problems == []
        else:
            assert any(expected in p for p in problems), problems

    def test_token_without_colon(self):
        with pytest.raises(InputError, match="bad Mesh-TF mesh shape token 'b4'"):
            mesh_tf_violations("b4", "", devices=4)

    def test_validate_returns_parsed(self):
        assert validate_mesh_tf("b:2,m:2", "batch:b;heads:m", devices=4) == ({"b": 2, "m": 2}, {"batch": "b", "heads": "m"})
        with pytest.raises(UnsupportedExport, match="Mesh-TensorFlow would reject"):
            validate_mesh_tf("b:2", "batch:m", devices=2)
