r"""How a launcher executes the graph: which kernels run, what each moves, what the host spends.

The coarse op graph says *what* is computed; the same graph costs very different times and memory
depending on *how* a training framework runs it (measured on one H100: GPT-2 at batch 8 steps in
108 ms in PyTorch eager with explicit attention, 80 ms with SDPA, 37 ms under ``torch.compile``;
``../shared/calibration/``). An :class:`ExecutionModel` names the two choices that matter:

``engine``
    ``fused``: Megatron-LM / DeepSpeed / ``torch.compile``-class kernels. A coarse op's elementwise
    chain is fused into one kernel next to its producer (Megatron's bias-GeLU, bias-dropout-add;
    Inductor's pointwise fusion): one launch, one read and one write of the chain's tensor.
    ``eager``: PyTorch eager. Every ONNX node of the coarse op is its own kernel, with its own
    launch and its own memory traffic (read the inputs, write the output at the training
    precision), and its own saved tensors.
``attention``
    ``flash`` / ``cudnn`` / ``flex``: each attention core (:mod:`objectives.attention`) runs as one fused kernel
    (FlashAttention-2 / SDPA; cuDNN's under TransformerEngine; FlexAttention's Triton kernel): its FLOPs at
    the kernel's rate (:mod:`objectives.flash_rates`: measured, FlexAttention's derived from
    FlashAttention-2's by its published ratio on the device's GPU generation), the
    backward recomputing the scores (:data:`FLASH_BACKWARD_FLOPS_FACTOR` x the forward FLOPs), no
    :math:`s \times s` tensor written or saved (memory :math:`O(b h s)`: the output and one fp32
    log-sum-exp per query row). ``explicit``: MatMul, Softmax, MatMul as separate kernels, the
    scores materialised and saved.

Both feed :func:`objectives.compute.op_compute_time_s` and :func:`objectives.memory.op_memory_bytes`.
The fixed costs per kernel and per collective live on :class:`planner.core.cluster.Device`
(``kernel_overhead_s``, ``host_dispatch_s``, ``collective_overhead_s``) and apply only under an
execution model (a :class:`~planner.core.settings.TrainingSettings` without ``engine`` and
``attention`` prices the plain roofline of docs/COST_MODEL.md §1, as before).

Defaults per launch target are data on the target (``Target.execution``, an ``(engine, attention)``
pair in each launcher's package, ``exporters/<launcher>/__init__.py``; the roof reads it and hands
it to :func:`default_execution`): Megatron-LM trains GPTs with fused kernels and TransformerEngine's
attention, cuDNN's on Hopper and newer (``cudnn``, FlashAttention-2 before: :func:`attention_on_device`),
DeepSpeed (Megatron-DeepSpeed) with fused kernels and FlashAttention-2 (``--use-flash-attn-v2``),
torchtitan with compiled blocks and FlexAttention (``flex``, its export's ``attn_backend="flex"``); each
fused kernel at its rate (:mod:`objectives.flash_rates`); DTensor plans run the
model's own PyTorch modules, which are eager, and Hugging Face models use SDPA by default
(``attn_implementation="sdpa"``): ``eager`` + ``flash``; Mesh-TensorFlow compiles with XLA, which
fuses elementwise chains but materialises the scores: ``fused`` + ``explicit``. The generic
(per-op) plan is priced as a fused launcher with flash attention would run it, so its headroom over
the launchable rows compares like with like; ``--engine roofline`` asks for the plain roofline
(:data:`ROOFLINE`), which the library's ``TrainingSettings()`` keeps as its default.

``zero3_gather``
    How the launcher gathers ZeRO-3's sharded parameters, which sets the memory a ZeRO-3 plan holds
    beside its shards: ``None``, one wrapped block at a time with the next prefetched (FSDP2:
    torchtitan, DTensor plans; :func:`objectives.memory.fsdp_unsharded_peak`); a
    :class:`~planner.core.settings.Zero3Gather`, one sub-module (a linear layer) at a time with a
    prefetch bounded in elements (DeepSpeed's ZeRO-3, whose package sets its config's values as
    ``Target.zero3_gather``; :func:`objectives.memory.deepspeed_gathered_peak`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Literal

from planner.core.errors import InputError
from planner.core.cluster import Device
from planner.core.settings import TrainingSettings, Zero3Gather

__all__ = [
    "Engine",
    "AttentionImpl",
    "ENGINES",
    "ATTENTION_IMPLS",
    "FUSED_ATTENTION",
    "ExecutionModel",
    "ROOFLINE",
    "default_execution",
    "execution_of",
    "model_attention",
    "attention_on_device",
    "CUDNN_ATTENTION_CAPABILITY",
    "FLASH_EFFICIENCY",
    "FLASH_BACKWARD_EFFICIENCY",
    "FLASH_BACKWARD_FLOPS_FACTOR",
    "FLASH_BACKWARD_KERNELS",
    "LSE_BYTES",
]

Engine = Literal["fused", "eager"]
AttentionImpl = Literal["flash", "cudnn", "flex", "explicit"]
ENGINES: tuple[str, ...] = ("fused", "eager")
ATTENTION_IMPLS: tuple[str, ...] = ("flash", "cudnn", "flex", "explicit")
FUSED_ATTENTION: tuple[str, ...] = ("flash", "cudnn", "flex")
"""The fused attention kernels (no s x s tensor), with rates by length, head dim and mask
(:mod:`objectives.flash_rates`)."""

FLASH_EFFICIENCY = 0.40
"""[Empirical] Used only where the core's shape is not known (a caller passing a role without
:class:`~objectives.attention.FlashShape`); the tables price measured rates (:mod:`objectives.flash_rates`).
Fraction of the dense bf16 peak the flash-attention forward reaches at head dim 64:
FlashAttention-2 reports 50-73% of an A100's peak forward (Dao 2023, "FlashAttention-2", Fig. 5,
head dims 64/128); on an H100 the FA2 kernels PyTorch's SDPA ships reach 330-400 TFLOP/s, about
0.35-0.40 of 989 TFLOP/s (the Hopper-specific FA3 reaches 0.6-0.75, Shah et al. 2024)."""

FLASH_BACKWARD_EFFICIENCY = 0.30
"""[Empirical] The same for the backward kernel (FA2's backward runs at 0.75-0.8x its forward rate).

Source found (h31f, 2026-12-02), supporting 0.30 at long sequences: transcriptions of the charts
"Attention backward speed, head dim 128 / 64 (H100 80GB SXM5)" (subtext.edge.nugit.net/image/
f60142e2..., /40bf2854...), FlashAttention-2 series: 214-322 TFLOP/s at head dim 128 and 198-291 at
64 over sequences 512-16k, 0.22-0.33 and 0.20-0.29 of 989 TFLOP/s; against the same pages' forward
charts (/e27582d2...: 309-370 at 128; /55f47a10...: 282-324 at 64) the backward runs at 0.69-0.87x
and 0.70-0.90x its forward rate. No A100 backward figure found."""

FLASH_BACKWARD_FLOPS_FACTOR = 2.5
"""Backward FLOPs / forward FLOPs of flash attention: five GEMMs of the forward's size in backward
(recompute S = QK^T, dV = P^T dO, dP = dO V^T, dQ = dS K, dK = dS^T Q) against two in forward
(FlashAttention-2, Algorithm 2)."""

FLASH_BACKWARD_KERNELS = 3
"""Kernels of a flash-attention backward: the ``dot(dO, O)`` pre-processing, the main kernel and the
dQ conversion (FlashAttention-2's ``_bwd_preprocess`` / ``_bwd_kernel`` / ``convert_dq``)."""

LSE_BYTES = 4
"""Bytes per query row of the log-sum-exp flash attention saves for backward (fp32)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ExecutionModel:
    """How a launcher runs the graph (module docstring)."""

    engine: Engine = "fused"
    """``fused`` (Megatron/DeepSpeed/torch.compile-class kernels) or ``eager`` (one kernel per ONNX op)."""
    attention: AttentionImpl = "flash"
    """``flash`` (FlashAttention-2 class: SDPA's default, ``flash-attn``), ``cudnn`` (cuDNN fused
    attention: TransformerEngine on Hopper+), ``flex`` (FlexAttention: torchtitan), all fused with no
    s x s tensor and priced at their rates (:mod:`objectives.flash_rates`), or ``explicit`` (scores
    materialised)."""
    dropout: bool = False
    """Training with dropout (hidden and attention dropout > 0): autograd keeps a one-byte mask per
    dropped element (:data:`objectives.memory.DROPOUT_MASK_BYTES`). ``False``: the fused stacks
    without dropout (torchtitan, ``torch.compile`` Llama recipes, Megatron with ``--hidden-dropout 0
    --attention-dropout 0``); ``True``: Megatron-LM's defaults (``--hidden-dropout 0.1
    --attention-dropout 0.1``) and Hugging Face GPT-2/BERT configs (``resid_pdrop`` /
    ``hidden_dropout_prob`` 0.1) in ``train()`` mode."""
    fused_loss: bool = False
    """The loss is one fused cross-entropy kernel that keeps the logits and one log-sum-exp per row and
    writes their gradient in the logits' dtype: FlashAttention's ``flash_attn.losses.cross_entropy``
    (``ctx.save_for_backward(logits, lse, labels)``; backward ``dlogits = torch.empty_like(logits)``, or
    the logits themselves with ``inplace_backward``), which llm-foundry's MPT trains with (its
    ``loss_fn`` default ``fused_crossentropy``, ``llmfoundry/models/mpt/modeling_mpt.py``). ``False``:
    the logits' gradient is fp32 (:data:`objectives.memory.OUTPUT_GRADIENT_BYTES`: PyTorch's
    ``cross_entropy`` upcasts, Megatron's vocab-parallel cross entropy works on fp32 ``exp_logits``)."""
    torch_loss: bool = False
    """The loss is PyTorch's ``F.cross_entropy`` on an fp32 copy of the logits, as torchtitan runs it
    (``torchtitan/components/loss.py::cross_entropy_loss``: ``cross_entropy(pred.flatten(0, 1).float(), ...)``,
    then ``del pred`` before ``loss.backward()`` in ``trainer.py``): at the loss's backward a rank holds
    three fp32 logit-sized tensors (:data:`objectives.memory.TORCH_LOSS_BYTES`) and not the bf16 logits.
    ``False`` with ``fused_loss`` ``False``: Megatron's vocab-parallel cross entropy (the logits and one
    fp32 tensor, :data:`objectives.memory.OUTPUT_GRADIENT_BYTES`). At most one of the two is set."""
    zero3_gather: Zero3Gather | None = None
    """ZeRO-3's gather granularity (module docstring): per sub-module under these bounds (DeepSpeed);
    ``None``: per wrapped block (FSDP2)."""

    def __post_init__(self) -> None:
        if self.engine not in ENGINES:
            raise InputError(f"unknown --engine '{self.engine}'; use {' or '.join(ENGINES)}")
        if self.attention not in ATTENTION_IMPLS:
            raise InputError(f"unknown --attention '{self.attention}'; use {', '.join(ATTENTION_IMPLS[:-1])} or "
                             f"{ATTENTION_IMPLS[-1]}")
        if not isinstance(self.dropout, bool):
            raise InputError(f"dropout must be true or false (got {self.dropout!r})")
        if not isinstance(self.fused_loss, bool):
            raise InputError(f"fused_loss must be true or false (got {self.fused_loss!r})")
        if not isinstance(self.torch_loss, bool):
            raise InputError(f"torch_loss must be true or false (got {self.torch_loss!r})")
        if self.torch_loss and self.fused_loss:
            raise InputError("a loss is either fused or PyTorch's cross_entropy, not both")
        if self.zero3_gather is not None and not isinstance(self.zero3_gather, Zero3Gather):
            raise InputError(f"zero3_gather must be a Zero3Gather or None (got {self.zero3_gather!r})")

    @property
    def eager(self) -> bool:
        return self.engine == "eager"

    @property
    def flash(self) -> bool:
        return self.attention in FUSED_ATTENTION


ROOFLINE = "roofline"
"""``--engine roofline``: no execution model, the plain roofline of docs/COST_MODEL.md §1 (PaSE-style
comparisons and the figures published before execution models); never a default."""


def default_execution(
    base: ExecutionModel | tuple[str, str] | None = None, *, engine: str | None = None, attention: str | None = None,
    zero3_gather: Zero3Gather | None = None,
) -> ExecutionModel | None:
    """The execution model of a launcher that runs ``base``, with ``--engine`` / ``--attention`` over it.

    ``base`` is the launcher's default, as its launch target states it (``Target.execution``, an
    ``(engine, attention)`` pair, or ``(engine, attention, dropout)``) or an :class:`ExecutionModel`; ``None``: fused kernels and flash
    attention, as the generic plan is priced (like the launchers whose rows it is compared with in
    ``planner plan``'s headroom line). ``zero3_gather``: the launcher's ZeRO-3 gather granularity
    (``Target.zero3_gather``; ``None`` keeps ``base``'s). The result is ``None``, the plain roofline,
    only when asked for (``engine="roofline"``).

    Raises
    ------
    InputError
        An unknown engine or attention implementation (the message lists the valid ones), or
        ``--attention`` with ``--engine roofline``.

    Examples
    --------
    >>> default_execution()
    ExecutionModel(engine='fused', attention='flash', dropout=False, fused_loss=False, torch_loss=False, zero3_gather=None)
    >>> default_execution(engine="roofline") is None
    True
    >>> default_execution(engine="eager")
    ExecutionModel(engine='eager', attention='flash', dropout=False, fused_loss=False, torch_loss=False, zero3_gather=None)
    >>> default_execution(("eager", "flash"), attention="explicit")
    ExecutionModel(engine='eager', attention='explicit', dropout=False, fused_loss=False, torch_loss=False, zero3_gather=None)
    >>> default_execution(("fused", "flash", True)).dropout
    True
    """
    if engine == ROOFLINE:
        if attention is not None:
            raise InputError("--engine roofline prices no kernels and no attention implementation; leave out --attention")
        return None
    if base is None:
        base = ExecutionModel()
    elif not isinstance(base, ExecutionModel):
        base_engine, base_attention, *rest = base
        base = ExecutionModel(engine=base_engine, attention=base_attention,  # type: ignore[arg-type]
                              dropout=bool(rest[0]) if rest else False)
    return ExecutionModel(engine=engine or base.engine, attention=attention or base.attention,  # type: ignore[arg-type]
                          dropout=base.dropout, fused_loss=base.fused_loss, torch_loss=base.torch_loss,
                          zero3_gather=zero3_gather if zero3_gather is not None else base.zero3_gather)


CUDNN_ATTENTION_CAPABILITY = 9.0
"""TransformerEngine runs cuDNN's fused attention from this compute capability on and FlashAttention-2
below it (``get_attention_backend``: "Disabling FlashAttention to give FusedAttention preference on
Hopper+ for performance reasons", ``device_compute_capability >= (9, 0)``)."""


def attention_on_device(attention: str, device: Device | None) -> str:
    """The kernel a launcher that asks for ``attention`` runs on ``device``: ``cudnn`` (TransformerEngine's
    fused attention) is FlashAttention-2 (``flash``) on a GPU before Hopper
    (:data:`CUDNN_ATTENTION_CAPABILITY`); a device of unknown capability keeps what was asked. ``flex``
    stays FlexAttention everywhere (its rate depends on the GPU generation:
    :func:`objectives.flash_rates.flex_share`).

    Examples
    --------
    >>> from objectives.cluster import get_device
    >>> attention_on_device("cudnn", get_device("a100-80gb")), attention_on_device("cudnn", get_device("h100-sxm"))
    ('flash', 'cudnn')
    >>> attention_on_device("explicit", get_device("a100-80gb")), attention_on_device("cudnn", None)
    ('explicit', 'cudnn')
    >>> attention_on_device("flex", get_device("a100-80gb"))
    'flex'
    """
    capability = getattr(device, "compute_capability", None)
    if attention == "cudnn" and capability is not None and capability < CUDNN_ATTENTION_CAPABILITY:
        return "flash"
    return attention


def model_attention(base: tuple[str, ...], biases: Iterable[str]) -> tuple[str, ...]:
    """A launcher's ``(engine, attention, ...)`` default for a model whose attention scores carry the
    position ``biases`` (:attr:`planner.core.graph.OpGraph.attention_biases`' values).

    ALiBi (BLOOM, MPT) is run with its scores materialised: transformers 5.24's ``BloomAttention``
    adds the bias with ``alibi.baddbmm`` and a softmax and has no SDPA path
    (``models/bloom/modeling_bloom.py:271``), ``MptAttention`` multiplies and softmaxes explicitly
    (``models/mpt/modeling_mpt.py:110-132``), and BLOOM was trained with Megatron-DeepSpeed's fused
    scale-mask-softmax over explicit scores (bench/fidelity/README.md, BLOOM-176B). No launcher
    here runs ALiBi in a flash kernel, so such a model's default is ``explicit``; ``--attention
    flash`` still overrides it (Falcon's ALiBi variant under SDPA: the memory-efficient kernel with
    the bias as a mask).

    Examples
    --------
    >>> model_attention(("fused", "flash"), ["alibi"])
    ('fused', 'explicit')
    >>> model_attention(("eager", "flash", True), [])
    ('eager', 'flash', True)
    """
    if "alibi" in set(biases) and len(base) > 1 and base[1] in FUSED_ATTENTION:
        return (base[0], "explicit", *base[2:])
    return tuple(base)


def execution_of(settings: TrainingSettings) -> ExecutionModel | None:
    """The execution model ``settings`` asks for, or ``None`` for the plain roofline.

    ``TrainingSettings.engine`` / ``attention`` left at ``None`` both mean the plain roofline of
    docs/COST_MODEL.md §1 (the numbers published before execution models); one of them set takes
    the other from ``ExecutionModel()``'s defaults.

    Examples
    --------
    >>> execution_of(TrainingSettings()) is None
    True
    >>> execution_of(TrainingSettings(engine="eager"))
    ExecutionModel(engine='eager', attention='flash', dropout=False, fused_loss=False, torch_loss=False, zero3_gather=None)
    """
    engine = getattr(settings, "engine", None)
    attention = getattr(settings, "attention", None)
    if engine is None and attention is None:
        return None
    default = ExecutionModel()
    return ExecutionModel(engine=engine or default.engine, attention=attention or default.attention,
                          dropout=bool(getattr(settings, "dropout", False)),
                          fused_loss=bool(getattr(settings, "fused_loss", False)),
                          torch_loss=bool(getattr(settings, "torch_loss", False)),
                          zero3_gather=getattr(settings, "zero3_gather", None))
