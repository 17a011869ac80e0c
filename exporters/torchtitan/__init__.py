"""torchtitan, one launcher in one package: its registry entry (:data:`TARGET`), what it runs
(:mod:`~exporters.torchtitan.rules`), the model families it builds (:mod:`~exporters.torchtitan.families`:
llama3, qwen3, deepseek_v3), its export (:mod:`~exporters.torchtitan.export`: the ``torchrun -m torchtitan.train``
command, its dotted overrides, and the config registry module of the planned model,
:mod:`~exporters.torchtitan.config_module`) and torchtitan's own checks (:mod:`~exporters.torchtitan.validate`).

Execution model: torchtitan compiles each transformer block (``--compile.enable``, which the export
sets) and runs FlexAttention's Triton kernel (the export's ``attn_backend="flex"``, with context
parallelism too: 0.3.0 gathers K/V, ``flex_cp_allgather``, and calls the same kernel), priced as
``flex``: FlashAttention-2's measured rates times FlexAttention's published share of them on the same
GPU generation (PyTorch's announcement, A100: 90% of the forward, 85% of the backward; its GTC 2025
figures, H100: ~1.25x the forward, ~1.03x the backward; :mod:`objectives.flash_rates`):
``("fused", "flex")``.

The exporter's and the validator's names are read from here (``from exporters.torchtitan import
export_torchtitan``) and load on first use: reading :data:`TARGET` loads neither.
"""

from __future__ import annotations

from exporters._target import Target, lazy, lazy_attributes
from exporters.torchtitan import rules

__all__ = [
    "TARGET",
    # exporters.torchtitan.export
    "TORCHTITAN_VERSION",
    "CONFIG_MODULE",
    "CONFIG_FUNCTION",
    "SCHEDULES",
    "llama_refusals",
    "torchtitan_masks",
    "torchtitan_overrides",
    "torchtitan_config_module",
    "export_torchtitan",
    # exporters.torchtitan.validate
    "TORCHTITAN_FLAGS",
    "TorchtitanModel",
    "parse_torchtitan_overrides",
    "torchtitan_violations",
    "validate_torchtitan",
]

TARGET = Target(
    name="torchtitan",
    help="torchtitan 0.3 launch of llama3, qwen3 (dense or MoE) or dense-MLA deepseek_v3 (torchrun -m "
         "torchtitan.train, dotted overrides: FSDP2, tp + sp, pp schedules, AC)",
    export=lazy("exporters.torchtitan.export", "export_torchtitan"),
    families=rules.families,
    allows=rules.allows,
    settings_allows=rules.settings_allows,
    pipeline_allows=rules.pipeline_allows,
    stage_rule=rules.stage_rule,
    execution=("fused", "flex"),
    fp8="rowwise",  # no fp8_param_gather: 0.3.0's Float8LinearConverter.Config has no enable_fsdp_float8_all_gather
    recompute=("none", "op", "full"),
    hsdp=(3,),  # data_parallel_replicate_degree x data_parallel_shard_degree: FSDP2 on a 2-D mesh
    fsdp_reshard=True,  # parallelism.fsdp_reshard_after_forward: default, always or never
    tp_comm_overlap=True,  # --compile.enable_async_tensor_parallel: inductor's micro_pipeline_tp (objectives.tp_overlap)
    tp_overlap_method="micro-pipeline",
    cuda_graphs=True,  # trainer.py wrap_with_cuda_graph(fwd_bwd_fn) unless --training.disable_cuda_graphs (pp = 1, ep = 1)
    cuda_graph_scope="step",
    autocast_zero=(),  # eager bf16 modules under fully_shard's MixedPrecisionPolicy at every stage, never torch.autocast
    offload=("none", "parameters"),  # training.enable_cpu_offload (rules.offload_rule)
    offload_rule=rules.offload_rule,
    context_zero=rules.CONTEXT_ZERO,  # FSDP2 over dp_shard x cp
    context_across_nodes=True,  # parallelism.context_parallel_degree spans nodes: mesh ... cp, tp
    pipeline_buffers="torch",  # torch.distributed.pipelining's stage: fwd_cache outputs, per-micro-batch receive buffers
)
"""torchtitan's entry in :data:`exporters.targets.TARGETS`."""

__getattr__ = lazy_attributes(globals(), "exporters.torchtitan.export", "exporters.torchtitan.validate")
