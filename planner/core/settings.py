"""Training settings that change what a strategy costs: precision, optimizer, ZeRO, recomputation."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from planner.core.errors import InputError

__all__ = ["Precision", "Fp8Recipe", "Optimizer", "OptimizerStateDtype", "OPTIMIZER_STATE_DTYPES", "Recompute", "Offload", "ReshardPolicy", "RESHARD_POLICIES",
           "TpOverlapMethod", "TP_OVERLAP_METHODS", "CostModelName", "Zero3Gather",
           "ZeroSync", "ZERO_SYNC_STAGES", "TrainingSettings"]

Precision = Literal["fp32", "bf16-mixed"]
Fp8Recipe = Literal["delayed", "rowwise"]
"""How FP8 linear layers scale their tensors (``objectives.precision``): ``delayed`` per-tensor scales from an
amax history (Transformer Engine's ``DelayedScaling``, Megatron-LM's default ``--fp8-recipe``), ``rowwise``
dynamic per-row scales (torchao float8, torchtitan 0.3's ``Float8LinearConverter`` default)."""
Optimizer = Literal["adam", "sgd"]
OptimizerStateDtype = Literal["fp32", "bf16"]
"""The dtype the optimizer keeps its state in (``TrainingSettings.optimizer_state_dtype``): ``fp32``, Adam's moments
(SGD's momentum) in fp32 beside an fp32 master copy of each bf16 parameter; ``bf16``, the moments in bf16 and no
master copy, the bf16 parameter updated in place (Apex's ``DistributedFusedAdam`` with ``dtype=torch.bfloat16`` on a
bf16 model, as NeMo's ``optim.dtype: bf16`` builds it: ``objectives.memory.state_bytes_per_parameter``)."""
OPTIMIZER_STATE_DTYPES: tuple[str, ...] = ("fp32", "bf16")
Recompute = Literal["none", "selective", "mlp", "full", "op"]
Offload = Literal["none", "optimizer", "activations", "parameters"]
"""What lives in host memory (``objectives.offload``): nothing, the optimizer state and step (DeepSpeed
ZeRO-Offload, Megatron-LM's ``--optimizer-cpu-offload``), the layers' saved activations
(Megatron-LM's ``--cpu-offloading-num-layers``), or the sharded parameters, gradients and optimizer
state with the step (FSDP2's ``CPUOffloadPolicy``, DeepSpeed ZeRO-3's ``offload_param``)."""
OFFLOAD_MODES: tuple[str, ...] = ("none", "optimizer", "activations", "parameters")
ReshardPolicy = Literal["default", "always", "never"]
"""FSDP2's ``reshard_after_forward`` policy, torchtitan 0.3.0's names (``parallelism.fsdp_reshard_after_forward``,
``distributed/fsdp.py::get_fsdp_reshard_after_forward_policy``)."""
RESHARD_POLICIES: tuple[str, ...] = ("default", "always", "never")
TpOverlapMethod = Literal["userbuffers", "micro-pipeline"]
"""How a launcher hides tensor-parallel collectives under the GEMMs (``objectives.tp_overlap``): Transformer Engine's
userbuffers (Megatron-LM's ``--tp-comm-overlap``) or torch's micro-pipelined async TP (torchtitan's
``--compile.enable_async_tensor_parallel``: inductor's ``micro_pipeline_tp`` pass)."""
TP_OVERLAP_METHODS: tuple[str, ...] = ("userbuffers", "micro-pipeline")
"""``Offload``'s values, in the order messages list them."""
OFFLOAD_MIN_ZERO: dict[str, int] = {"parameters": 3}
"""The least ZeRO stage an offload mode needs, where it needs one: ``parameters`` keeps each rank's
*shard* on the host, which only ZeRO-3 / FSDP has (DeepSpeed 0.19.8 ``runtime/zero/config.py``:
``offload_param`` "only valid with stage 3"; FSDP2's ``CPUOffloadPolicy`` exists only on ``fully_shard``)."""
CostModelName = Literal["roofline", "measured", "pase"]
"""How op and edge costs are priced (``--cost``): analytic roofline, profiled timings, or PaSE's
FLOP-equivalents (``objectives.tables``)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Zero3Gather:
    """How a launcher gathers ZeRO-3's sharded parameters *per sub-module* (DeepSpeed's ZeRO-3): each
    module with parameters (one linear layer) all-gathered before it runs, with a prefetch bounded in
    elements, priced by ``objectives.memory.deepspeed_gathered_peak``. A launcher without one gathers
    per wrapped block (FSDP2: ``objectives.memory.fsdp_unsharded_peak``). Every field is in elements
    (parameters), as DeepSpeed's ``zero_optimization`` keys of the same names count them; the exports
    write them (``exporters/deepspeed``)."""

    prefetch_bucket: int
    """``stage3_prefetch_bucket_size``: elements fetched ahead of use."""
    max_live: int
    """``stage3_max_live_parameters``: no prefetch once this many elements are gathered."""
    max_reuse_distance: int
    """``stage3_max_reuse_distance``: a parameter used again within this many elements of the trace is
    not released."""
    persistence_threshold: int
    """``stage3_param_persistence_threshold``: parameters smaller than this are never partitioned."""
    reduce_bucket: int
    """``reduce_bucket_size``: elements of the contiguous gradient buffer reduce-scattered at once."""

    def __post_init__(self) -> None:
        for name in ("prefetch_bucket", "max_live", "max_reuse_distance", "persistence_threshold", "reduce_bucket"):
            value = getattr(self, name)
            if not (isinstance(value, int) and not isinstance(value, bool) and value >= 0):
                raise InputError(f"ZeRO-3 {name} must be a whole number of elements >= 0 (got {value!r})")


@dataclass(frozen=True, slots=True, kw_only=True)
class ZeroSync:
    """How a launcher synchronises its gradients at ZeRO 0-2 (:data:`ZERO_SYNC_STAGES`), where it differs from
    Megatron-LM's (the pricing's own: at ZeRO-0 the gradients all-reduced in 25 MiB buckets beside backward; at
    ZeRO-1/2 the distributed optimizer's buckets of ``max(4e7, 1e6 x dp)`` parameters, the gradients
    reduce-scattered beside backward, the updated parameters all-gathered beside the next step's forward:
    ``objectives.intra_op.overlapped_zero_sync_s``). A launcher's rule (``Target.zero_sync``: DeepSpeed's),
    handed to the pricing per plan; read by ``objectives.intra_op`` (``grad_sync_terms``,
    ``grad_bucket_bytes``, ``overlapped_zero_sync_s``) and, at ZeRO-0, ``objectives.tables`` and
    ``objectives.pipeline_arrays`` (the all-reduce exposed where ``reduction_overlaps_backward`` is false)."""

    bucket_elements: int
    """Gradient elements per bucket of the reduction (and of the parameter gather): its latency is paid per
    bucket (DeepSpeed's ``reduce_bucket_size``, default 5e8)."""
    reduction: Literal["reduce_scatter", "all_reduce"] = "reduce_scatter"
    """The collective that reduces the gradients over the data-parallel group: ``all_reduce`` where the
    launcher all-reduces each bucket and keeps its own partition (DeepSpeed 0.19.8)."""
    reduction_overlaps_backward: bool = True
    """The reduction runs beside backward (under ``TrainingSettings.overlap``); ``False``: after the
    backward, on the critical path."""
    gather_overlaps_forward: bool = True
    """The updated parameters' all-gather runs beside the next step's forward (under
    ``TrainingSettings.overlap``); ``False``: after the optimizer step, on the critical path."""
    pipeline_partitions_optimizer: bool = False
    """At ZeRO-0 under a pipeline (more than one stage) the launcher's optimizer still partitions the fp32 master
    weights and optimizer state over the data-parallel ranks and all-gathers the updated parameters after the
    step, as at ZeRO-1: DeepSpeed 0.19.8's ``BF16_Optimizer``, which wraps a bf16 ``PipelineModule`` at ZeRO-0
    (``exporters.deepspeed.zero_sync``). Such a plan is priced at ZeRO-1's states and synchronisation under
    this rule (:meth:`partition_stage`), and stays a ZeRO-0 plan (its export, its gradient accumulator)."""

    def __post_init__(self) -> None:
        if not (isinstance(self.bucket_elements, int) and not isinstance(self.bucket_elements, bool)
                and self.bucket_elements > 0):
            raise InputError(f"ZeRO bucket_elements must be a whole number of elements > 0 (got {self.bucket_elements!r})")
        if self.reduction not in ("reduce_scatter", "all_reduce"):
            raise InputError(f"ZeRO reduction must be reduce_scatter or all_reduce (got {self.reduction!r})")

    def partition_stage(self, zero_stage: int, *, pipelined: bool) -> int:
        """The ZeRO stage whose state partitioning and synchronisation a plan at ``zero_stage`` runs under this
        rule: 1 for ZeRO-0 on a stage of a pipeline where :attr:`pipeline_partitions_optimizer`, else ``zero_stage``.

        >>> rule = ZeroSync(bucket_elements=500_000_000, reduction="all_reduce", pipeline_partitions_optimizer=True)
        >>> rule.partition_stage(0, pipelined=True), rule.partition_stage(0, pipelined=False), rule.partition_stage(2, pipelined=True)
        (1, 0, 2)
        """
        return 1 if zero_stage == 0 and pipelined and self.pipeline_partitions_optimizer else zero_stage


ZERO_SYNC_STAGES = frozenset({0, 1, 2})
"""The ZeRO stages a launcher's :class:`ZeroSync` rule prices: ZeRO-0's gradient all-reduce (DeepSpeed's engine
all-reduces after the backward) and ZeRO-1/2's sharded optimizer; ZeRO-3's traffic has its own rule
(:class:`Zero3Gather`)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class TrainingSettings:
    """How the model is trained; the memory side of a strategy."""

    precision: Precision = "bf16-mixed"
    """``bf16-mixed``: bf16 weights/activations/grads with fp32 master weights and Adam moments."""
    optimizer: Optimizer = "adam"
    optimizer_state_dtype: OptimizerStateDtype = "fp32"
    """The optimizer state's dtype (:data:`OptimizerStateDtype`): ``fp32`` (fp32 master weights and moments, every
    launcher's default) or ``bf16`` (bf16 moments, no master copy: Apex ``DistributedFusedAdam(dtype=bf16)``, NeMo's
    ``optim.dtype: bf16`` with ``distributed_fused_adam``); ``bf16`` needs ``bf16-mixed`` and FP8 weights gathered in
    bf16 (NeMo's ``fp8_params`` makes Apex store a parameter copy, not priced)."""
    zero_stage: int = 0
    """0: none; 1: optimizer state sharded over data-parallel replicas; 2: + gradients; 3: + params."""
    recompute: Recompute = "none"
    """Activation recomputation: ``none``, ``selective`` (attention core), ``mlp`` (each dense MLP, its
    input kept: Megatron-LM's ``--recompute-modules mlp``), ``full`` (per layer), ``op``
    (torchtitan's op-level selective checkpointing: every other linear layer's output and the attention
    kernel's saved, the rest of each layer recomputed; priced by ``planner estimate``, not searched)."""
    engine: Literal["fused", "eager"] | None = None
    """Kernels the launcher runs (``objectives.execution``): ``fused`` (Megatron/torch.compile class)
    or ``eager`` (one per ONNX op); ``None`` with ``attention`` ``None``: the plain roofline."""
    attention: Literal["flash", "cudnn", "flex", "explicit"] | None = None
    """Attention cores run as a fused kernel, ``flash`` (FlashAttention-2), ``cudnn`` or ``flex``
    (FlexAttention) (no s x s tensor), or ``explicit`` kernels (``objectives.execution``)."""
    dropout: bool = False
    """Hidden and attention dropout on: a one-byte mask per dropped element is kept for backward
    (``objectives.execution.ExecutionModel.dropout``); used only under an execution model."""
    fused_loss: bool = False
    """The loss runs as one fused cross-entropy kernel whose logits' gradient is in the logits' dtype
    (``objectives.execution.ExecutionModel.fused_loss``: FlashAttention's, as llm-foundry's MPT trains);
    used only under an execution model."""
    torch_loss: bool = False
    """The loss is PyTorch's ``cross_entropy`` on fp32 logits (torchtitan's): three fp32 logit-sized
    tensors at its backward (``objectives.execution.ExecutionModel.torch_loss``); used only under an
    execution model."""
    overlap: bool = True
    """Communication overlapped with compute as launchers overlap it (execution models only): bucketed
    gradient reductions beside backward, ZeRO-3 / FSDP gathers prefetched beside the compute that
    needs them (``objectives.intra_op.exposed_under``), with the exports setting the launchers' overlap
    flags. ``False`` (``--no-overlap``): every collective on the critical path, and the flags off."""
    expert_parallel: int = 1
    """Mixture-of-Experts: experts split this many ways over the data-parallel ranks (``ep``,
    ``objectives.moe``); 1 for dense models."""
    capacity_factor: float = 1.0
    """Mixture-of-Experts: expert capacity / (tokens x top-k / experts); 1.0 is dropless routing."""
    fp8: Fp8Recipe | None = None
    """FP8 training (``--dtype fp8``): the linear layers' GEMMs in FP8 with this scaling recipe, everything
    else as ``bf16-mixed`` (bf16 weights, activations and gradients, fp32 master weights and moments),
    which ``precision`` must then be; ``None``: no FP8 (``objectives.precision``)."""
    offload: Offload = "none"
    """CPU offload (``--fix offload=...``, ``objectives.offload``): ``optimizer`` keeps the optimizer state
    in host memory and steps on the CPU; ``activations`` copies the layers' saved activations to the
    host in forward and back in backward; ``parameters`` (ZeRO-3 only) keeps the parameter, gradient and
    optimizer shards on the host, copied to the device before each all-gather; each priced by the host
    link and the compute it overlaps."""
    tp_comm_overlap: bool = False
    """Tensor-parallel communication overlapped with the linear layers' GEMMs (``--fix tp_overlap=on``,
    ``objectives.tp_overlap``): Megatron-LM's ``--tp-comm-overlap`` (Transformer Engine userbuffers), which
    needs sequence parallelism and ``tp > 1``; off by default, as Megatron-LM leaves it. Execution models only."""
    tp_overlap_method: TpOverlapMethod = "userbuffers"
    """With ``tp_comm_overlap``, how the launcher runs it (:data:`TpOverlapMethod`, its ``Target.tp_overlap_method``):
    ``userbuffers`` (Megatron-LM) or ``micro-pipeline`` (torchtitan's async TP under ``torch.compile``)."""
    p2p_overlap: bool | None = None
    """The interleaved schedule's steady-state sends and receives run asynchronously beside the other chunk's pass
    (Megatron-Core's ``overlap_p2p_comm``: Megatron-LM's default with virtual stages, ``--no-overlap-p2p-communication``
    turns it off; NeMo's ``overlap_p2p_comm``; Megatron-Bridge's ``CommOverlapConfig`` sets it with ``pp > 1`` and
    ``vp > 1``), so only what a transfer takes beyond that pass is on the critical path
    (:func:`objectives.schedules.pipeline_time_s`; a plan without model chunks prices the same either way). ``None``:
    as the launcher runs it (``Target.p2p_overlap``, resolved by ``Target.priced_settings``: on for Megatron-LM's
    interleaved plans), priced waited where no launcher resolves it (the generic plan); ``False``
    (``--fix p2p_overlap=off``): every transfer waited, Megatron-LM's export then writes
    ``--no-overlap-p2p-communication``; ``True``: overlapped."""
    dp_shard: int | None = None
    """Hybrid sharding (HSDP; ``--fix hsdp=N``): the ranks one copy of the ZeRO-sharded states spans,
    the data-parallel group being ``replicate x shard`` with the shard group innermost (on a node's
    devices first). ZeRO-z divides its states by ``gcd(replicas, dp_shard)`` instead of all the
    data-parallel replicas, reduce-scatters and gathers over that group and all-reduces the reduced
    shard over the replicas (``objectives.intra_op.grad_sync_terms``): FSDP2's ``fully_shard`` on a
    2-D ``("dp_replicate", "dp_shard")`` mesh (torchtitan's ``data_parallel_replicate_degree``).
    ``None``: every data-parallel rank (plain ZeRO / FSDP)."""
    hpz_partition: int | None = None
    """ZeRO++'s hierarchical partitioning (hpZ; Wang et al. 2023, arXiv 2306.10209; DeepSpeed's
    ``zero_optimization.zero_hpz_partition_size``, ``--fix hsdp=N`` under ``--target deepspeed``): at ZeRO-3 the
    parameters, gradients and optimizer states stay sharded over every data-parallel rank, and each rank also keeps
    a secondary copy of its parameters sharded over ``gcd(replicas, hpz_partition)`` consecutive ranks (a node's
    devices first), in the parameters' dtype. The all-gathers read the secondary copy wherever it exists: every
    gather of a step but the first micro-batch's forward (built at the first release after forward, dropped after
    the optimizer step: DeepSpeed 0.19.8 ``runtime/zero/partition_parameters.py`` ``_partition_param_sec``,
    ``stage3.py`` ``invalidate_secondary_tensor``). Priced by ``objectives.intra_op.grad_sync_terms`` and
    ``objectives.deepspeed_zero3``; ``None``: none (plain ZeRO-3)."""
    sequence_shard_saved: bool = False
    """A linear layer whose input is all-gathered from a sequence split keeps its own shard of that input
    for backward and all-gathers it again there (``objectives.memory.sequence_shard_credit``): Megatron-Core's
    ``LinearWithGradAccumulationAndAsyncCommunication`` and Transformer Engine's ``Linear`` under sequence
    parallelism (the launcher's ``Target.sequence_shard_saved``). ``False``: it keeps the gathered input,
    as PyTorch DTensor's ``ColwiseParallel`` after a ``Shard -> Replicate`` redistribution does (torchtitan)."""
    fused_swiglu: bool = False
    """A gated MLP's product runs as Megatron-Core's fused SwiGLU, which keeps fc1's output only and
    recomputes the SiLU in backward (``objectives.graph_facts._gated_products``; the launcher's
    ``Target.fused_swiglu``). ``False``: the product also keeps the activation's output (PyTorch autograd;
    torch.compile on one H100 measures as much, ``bench/fidelity/runs_h100.jsonl``)."""
    grad_accumulator_bytes: float = 0.0
    """Bytes per parameter element a launcher's bf16 optimizer keeps in a gradient accumulator beside the
    bf16 gradients, for every parameter the rank holds (DeepSpeed's ``BF16_Optimizer``: 4 under fp32
    accumulation, 2 under bf16; the launcher's ``Target.grad_accumulator``, priced at ZeRO 0-1 under
    ``bf16-mixed`` by ``objectives.pipeline_price``). 0: none (the gradients accumulate in place)."""
    pipeline_buffers: str = "none"
    """What the launcher's pipeline runtime holds at the stage boundaries beyond the layers' saved tensors
    (``objectives.pipeline_buffers``, the launcher's ``Target.pipeline_buffers``): ``torch``
    (``torch.distributed.pipelining``, torchtitan: each in-flight micro-batch's stage output, one gradient and one
    activation receive buffer per micro-batch), ``deepspeed`` (``PipelineEngine``: the in-flight outputs, partitioned
    under tensor parallelism, one receive buffer each way); ``none``: nothing (Megatron-LM frees each sent output)."""
    zero_sync: ZeroSync | None = None
    """How the gradients are synchronised at ZeRO 0-2 (:data:`ZERO_SYNC_STAGES`): a launcher's rule (:class:`ZeroSync`,
    its ``Target.zero_sync``: DeepSpeed's); ``None``: as Megatron-LM runs it (DDP-style overlapped buckets at ZeRO-0,
    its distributed optimizer at ZeRO-1/2)."""
    zero3_gather: Zero3Gather | None = None
    """ZeRO-3's gather granularity, from the launcher's execution model
    (``objectives.execution.ExecutionModel.zero3_gather``): per sub-module under these bounds
    (DeepSpeed); ``None``: one wrapped block at a time, the next prefetched (FSDP2, torchtitan)."""
    reshard_after_forward: ReshardPolicy = "default"
    """FSDP2's ``reshard_after_forward`` per ``fully_shard`` unit at ZeRO-3 (``--fix reshard=...``, torchtitan's
    ``parallelism.fsdp_reshard_after_forward``, torch 2.13 ``fully_shard``): ``always`` frees every unit's
    gathered parameters after its forward and gathers them again in backward; ``never`` keeps every unit whole
    from its forward to its backward (memory up by the units, one all-gather per unit and micro-batch saved,
    recomputation included); ``default`` is torchtitan's policy, each unit resharded but the final norm + head
    (and, under a pipeline, none). Priced by ``objectives.memory.fsdp_unsharded_peak``'s kept units and
    ``objectives.intra_op``'s gather count; FSDP2 launchers only (``Target.fsdp_reshard``)."""
    fsdp_units: bool = False
    """ZeRO-3 priced per ``fully_shard`` unit when a plan is priced (``objectives.pipeline_price.price_plan``,
    ``objectives.fsdp_units``): one flat all-gather and reduce-scatter per unit and pass, one latency each, the next
    unit prefetched beside this one's compute; FSDP's rule only (``zero3_gather`` unset), under an execution model
    with ``overlap``. A diagnostic for pinned plans (``bench/fidelity.py --fsdp-units``): the search's per-op arrays
    and bounds keep the per-op pricing. ``False``: per op (``objectives.pipeline_arrays._prefetched_sync_s``)."""
    cuda_graphs: bool = False
    """The forward and backward of each micro-batch run as one captured CUDA graph replayed whole (torchtitan 0.3.0's
    default at ``pp = 1``: ``training.disable_cuda_graphs`` off, ``trainer.py``'s ``wrap_with_cuda_graph``; ``--fix
    cuda_graphs=on|off``): inside it each kernel costs its work and ``Device.kernel_overhead_s``, with no per-kernel
    host dispatch, no per-layer host floor and no collective call's host setup; the optimizer step stays outside
    (``objectives.fixed_costs``). Execution models only; ``False``: launched kernel by kernel."""
    cuda_graph_scope: Literal["step", "layers"] = "step"
    """What ``cuda_graphs`` captures: ``step``, each micro-batch's whole forward and backward (torchtitan's);
    ``layers``, each repeated block's forward and backward apart (``OpGraph.blocks``: Megatron-LM's
    ``--cuda-graph-impl transformer_engine``, Transformer Engine's ``make_graphed_callables`` per transformer layer), the
    embedding, final norm, head and loss launched kernel by kernel (``objectives.graph_facts.captured_ops``)."""
    autocast: bool = True
    """How PyTorch eager (``engine="eager"``) runs ``bf16-mixed``: ``True``, under ``torch.autocast`` with fp32
    parameters (products cast to bf16, norms, softmax and elementwise ops in fp32, the residual stream fp32:
    ``objectives.autocast``); ``False``, as bf16 modules without autocast, the parameters cast to bf16 by the
    FSDP wrapper (FSDP1's ``MixedPrecision(param_dtype=torch.bfloat16)``, fms-fsdp's ``bfSixteen``; FSDP2's
    ``MixedPrecisionPolicy(param_dtype=torch.bfloat16)``, torchtitan's ``mixed_precision_param`` "via fully_shard"):
    every activation bf16, no per-parameter cast kernels, norms' statistics in fp32 inside the norm
    (docs/COST_MODEL.md "bf16 modules without autocast"). Used only under ``engine="eager"`` and ``bf16-mixed``."""
    fp8_param_gather: bool = False
    """The launcher keeps its FP8 linear layers' weights in FP8 and all-gathers them so, 1 byte per element
    (Megatron-LM's ``--fp8-param-gather``; the launcher's ``Target.fp8_param_gather``); it applies only to
    FP8 rows whose parameters ZeRO gathers (:attr:`gathers_fp8`). ``False``: gathered in bf16."""

    @property
    def gathers_fp8(self) -> bool:
        """Whether ZeRO's parameter all-gathers move the FP8 linear layers' weights in FP8: FP8 on,
        :attr:`fp8_param_gather` on and ZeRO 1-3 (Megatron-LM asserts ``--fp8-param-gather`` only with the
        distributed optimizer or an FSDP).

        >>> TrainingSettings(fp8="delayed", fp8_param_gather=True, zero_stage=1).gathers_fp8
        True
        >>> TrainingSettings(fp8="delayed", fp8_param_gather=True).gathers_fp8  # ZeRO 0 gathers nothing
        False
        """
        return self.fp8 is not None and self.fp8_param_gather and self.zero_stage >= 1

    def keeps_grad_accumulator(self, zero_stage: int) -> bool:
        """Whether a launcher's bf16 gradient accumulator (:attr:`grad_accumulator_bytes`) is held at
        ``zero_stage``: under ``bf16-mixed`` at ZeRO 0-1 (ZeRO 2-3 reduce the gradients into partitions;
        fp32 training accumulates in place). The pricing and the launchers' listing ask the same.

        >>> TrainingSettings().keeps_grad_accumulator(1), TrainingSettings().keeps_grad_accumulator(2)
        (True, False)
        """
        return self.precision == "bf16-mixed" and zero_stage <= 1

    def _check_optimizer_state(self) -> None:
        if self.optimizer_state_dtype not in OPTIMIZER_STATE_DTYPES:
            raise InputError(f"optimizer_state_dtype must be {' or '.join(OPTIMIZER_STATE_DTYPES)} "
                             f"(got {self.optimizer_state_dtype!r})")
        if self.optimizer_state_dtype == "bf16" and self.precision != "bf16-mixed":
            raise InputError("a bf16 optimizer state is priced for bf16-mixed training only (its bf16 parameters are "
                             "the updated copy); use --dtype bf16-mixed or an fp32 optimizer state")
        if self.optimizer_state_dtype == "bf16" and self.gathers_fp8:
            raise InputError("a bf16 optimizer state with FP8 weights gathered in FP8 is not priced (Apex stores a "
                             "parameter copy then); gather them in bf16 or keep an fp32 optimizer state")

    @property
    def precision_label(self) -> str:
        """``fp8`` when the linear layers run in FP8, else :attr:`precision` (``--dtype``'s words).

        >>> TrainingSettings(fp8="delayed").precision_label, TrainingSettings().precision_label
        ('fp8', 'bf16-mixed')
        """
        return "fp8" if self.fp8 is not None else self.precision

    def __post_init__(self) -> None:
        if self.zero_stage not in (0, 1, 2, 3):
            raise InputError(f"--zero must be 0, 1, 2 or 3 (got {self.zero_stage})")
        if self.precision not in ("fp32", "bf16-mixed"):
            raise InputError(f"--dtype must be fp32 or bf16-mixed (got {self.precision})")
        if self.optimizer not in ("adam", "sgd"):
            raise InputError(f"--optimizer must be adam or sgd (got {self.optimizer})")
        self._check_optimizer_state()
        if self.recompute not in ("none", "selective", "mlp", "full", "op"):
            raise InputError(f"--recompute must be none, selective, mlp, full or op (got {self.recompute})")
        if self.engine not in (None, "fused", "eager"):
            raise InputError(f"--engine must be fused or eager (got {self.engine})")
        if self.attention not in (None, "flash", "cudnn", "flex", "explicit"):
            raise InputError(f"--attention must be flash, cudnn, flex or explicit (got {self.attention})")
        if not isinstance(self.dropout, bool):
            raise InputError(f"dropout must be true or false (got {self.dropout!r})")
        if not isinstance(self.fused_loss, bool):
            raise InputError(f"fused_loss must be true or false (got {self.fused_loss!r})")
        if not isinstance(self.torch_loss, bool):
            raise InputError(f"torch_loss must be true or false (got {self.torch_loss!r})")
        if not isinstance(self.overlap, bool):
            raise InputError(f"overlap must be true or false (got {self.overlap!r})")
        if not isinstance(self.tp_comm_overlap, bool):
            raise InputError(f"tp_comm_overlap must be true or false (got {self.tp_comm_overlap!r})")
        if self.p2p_overlap is not None and not isinstance(self.p2p_overlap, bool):
            raise InputError(f"p2p_overlap must be true or false (got {self.p2p_overlap!r}), e.g. --fix p2p_overlap=off")
        if self.tp_overlap_method not in TP_OVERLAP_METHODS:
            raise InputError(f"tp_overlap_method must be {' or '.join(TP_OVERLAP_METHODS)} (got {self.tp_overlap_method!r})")
        if not isinstance(self.cuda_graphs, bool):
            raise InputError(f"cuda_graphs must be true or false (got {self.cuda_graphs!r}), e.g. --fix cuda_graphs=on")
        if self.cuda_graph_scope not in ("step", "layers"):
            raise InputError(f"cuda_graph_scope must be step or layers (got {self.cuda_graph_scope!r})")
        if not isinstance(self.autocast, bool):
            raise InputError(f"autocast must be true or false (got {self.autocast!r})")
        if not isinstance(self.fp8_param_gather, bool):
            raise InputError(f"fp8_param_gather must be true or false (got {self.fp8_param_gather!r})")
        if not (isinstance(self.expert_parallel, int) and self.expert_parallel >= 1):
            raise InputError(f"the expert-parallel degree must be a positive integer (got {self.expert_parallel})")
        if not (self.capacity_factor > 0 and self.capacity_factor != float("inf")):
            raise InputError(f"--capacity-factor must be a positive number (got {self.capacity_factor}), e.g. --capacity-factor 1.25")
        if self.fp8 not in (None, "delayed", "rowwise"):
            raise InputError(f"the FP8 recipe must be delayed or rowwise (got {self.fp8!r})")
        if self.offload not in OFFLOAD_MODES:
            raise InputError(f"offload must be {', '.join(OFFLOAD_MODES[:-1])} or {OFFLOAD_MODES[-1]} (got {self.offload!r}), "
                             "e.g. --fix offload=optimizer")
        if self.dp_shard is not None and not (isinstance(self.dp_shard, int) and self.dp_shard >= 1):
            raise InputError(f"hsdp must be a positive number of ranks (got {self.dp_shard!r}), e.g. --fix hsdp=8")
        if self.hpz_partition is not None and not (isinstance(self.hpz_partition, int) and self.hpz_partition >= 1):
            raise InputError(f"hpz must be a positive number of ranks (got {self.hpz_partition!r}), e.g. --fix hsdp=8 "
                             "--target deepspeed")
        if self.reshard_after_forward not in RESHARD_POLICIES:
            raise InputError(f"reshard must be default, always or never (got {self.reshard_after_forward!r}), e.g. --fix reshard=never")
        if not isinstance(self.fsdp_units, bool):
            raise InputError(f"fsdp_units must be true or false (got {self.fsdp_units!r})")
        if self.zero_sync is not None and not isinstance(self.zero_sync, ZeroSync):
            raise InputError(f"zero_sync must be a ZeroSync or None (got {self.zero_sync!r})")
        if self.zero3_gather is not None and not isinstance(self.zero3_gather, Zero3Gather):
            raise InputError(f"zero3_gather must be a Zero3Gather or None (got {self.zero3_gather!r})")
        if self.pipeline_buffers not in ("none", "torch", "deepspeed"):
            raise InputError(f"pipeline_buffers must be none, torch or deepspeed (got {self.pipeline_buffers!r})")
        if not (isinstance(self.grad_accumulator_bytes, (int, float)) and 0 <= self.grad_accumulator_bytes < 1e9):
            raise InputError(f"grad_accumulator_bytes must be bytes per parameter >= 0 (got {self.grad_accumulator_bytes!r})")
        if self.fp8 is not None and self.precision != "bf16-mixed":
            raise InputError("FP8 linear layers train with bf16 elsewhere; use --dtype fp8 alone, not with fp32")
