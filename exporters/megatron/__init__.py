"""Megatron-LM, one launcher in one package: its registry entry (:data:`TARGET`), what it runs
(:mod:`~exporters.megatron.rules`), its export (:mod:`~exporters.megatron.export`: the torchrun
arguments of a strategy) and Megatron-LM's own checks (:mod:`~exporters.megatron.validate`).

Execution model: Megatron-LM trains GPTs with fused kernels (bias-GeLU, bias-dropout-add,
TransformerEngine) and TransformerEngine's fused attention, which on Hopper and newer is cuDNN's
(TE's ``get_attention_backend`` gives ``FusedAttention`` preference over FlashAttention there):
``("fused", "cudnn")``, priced at cuDNN's measured rates (:mod:`objectives.flash_rates`; on older
GPUs TE runs FlashAttention-2: ``--attention flash`` prices that).

The exporter's and the validator's names are read from here (``from exporters.megatron import
export_megatron, megatron_masks``) and load on first use: reading :data:`TARGET` loads neither.
"""

from __future__ import annotations

from exporters._target import Target, lazy, lazy_attributes
from exporters.megatron import rules
from exporters.megatron.attention import ATTENTION_BACKENDS

__all__ = [
    "TARGET",
    # exporters.megatron.export
    "MEGATRON_CORE_VERSION",
    "megatron_masks",
    "megatron_pipeline_args",
    "megatron_args",
    "megatron_moe_args",
    "export_megatron",
    "feature_refusals",
    # exporters.megatron.validate
    "MEGATRON_FLAGS",
    "parse_megatron_args",
    "parse_pipeline_layout",
    "megatron_violations",
    "validate_megatron",
]

TARGET = Target(
    name="megatron",
    help="Megatron-LM torchrun arguments (dp x tp x pp, sequence parallelism, ZeRO-1 as the distributed optimizer)",
    export=lazy("exporters.megatron.export", "export_megatron"),
    families=rules.families,
    allows=rules.allows,
    settings_allows=rules.settings_allows,
    pipeline_allows=rules.pipeline_allows,
    stage_rule=rules.stage_rule,
    execution=("fused", "cudnn"),
    attention_kernels=tuple(ATTENTION_BACKENDS),  # what --attention-backend (flash|fused|unfused) can name
    # --recompute-modules core_attn (selective's default) or mlp: the modules whose recomputation saves
    # activations under flash attention (objectives.graph_facts._mlp_ops), beside none and full
    recompute=("none", "selective", "mlp", "full"),
    fp8="delayed",
    fp8_param_gather=True,  # --fp8-param-gather: FP8 weights all-gathered in FP8 (objectives.precision)
    offload=("none", "optimizer", "activations"),
    cuda_graph_scope="layers",  # --cuda-graph-impl transformer_engine, per transformer layer (--fix cuda_graphs=on)
    offload_rule=rules.offload_rule,
    tp_comm_overlap=True,
    p2p_overlap=True,  # --no-overlap-p2p-communication is store_false: overlap_p2p_comm on with virtual stages
    sequence_shard_saved=True,  # tensor_parallel/layers.py: save_for_backward(input) before the all-gather
    fused_swiglu=True,  # fusions/fused_bias_swiglu.py: SwiGLUFunction saves fc1's output only
    hsdp=(1,),  # --num-distributed-optimizer-instances: the distributed optimizer sharded within each instance
    context_across_nodes=True,  # --context-parallel-size spans nodes: rank order tp-cp-ep-dp-pp
    autocast_zero=(),  # --bf16: Float16Module holds module.bfloat16() (megatron-core 0.16.1 transformer/module.py:440)
)
"""Megatron-LM's entry in :data:`exporters.targets.TARGETS`."""

__getattr__ = lazy_attributes(globals(), "exporters.megatron.export", "exporters.megatron.validate")
