r"""Memory per device of one op under each configuration: parameter states, saved activations, other.

Parameter states (:func:`parameter_state_bytes`). A parameter shard of :math:`N_s` elements costs
:math:`N_s (b_p + b_g + b_o)` bytes, the bytes per parameter of the precision and optimizer
(:func:`state_bytes_per_parameter`):

=================  =========  ========  =================================================  =====
precision          param      grad      optimizer                                          total
=================  =========  ========  =================================================  =====
bf16-mixed + adam  2 (bf16)   2 (bf16)  12: fp32 master copy + 2 fp32 Adam moments          16
fp32 + adam        4          4         8: 2 fp32 Adam moments                               16
bf16-mixed + sgd   2          2         8: fp32 master copy + fp32 momentum                  12
fp32 + sgd         4          4         4: fp32 momentum                                     12
fp8 (delayed)      2 + 2      2         as bf16-mixed                                      18 / 14
bf16 state + adam  2          2         4: 2 bf16 Adam moments, no master copy              8
bf16 state + sgd   2          2         2: bf16 momentum, no master copy                    6
=================  =========  ========  =================================================  =====

A bf16 state (``TrainingSettings.optimizer_state_dtype``) is Apex's ``DistributedFusedAdam(dtype=bf16)`` on a bf16
model: moments in bf16, no ``params_shard`` (NeMo's ``store_params`` false when the optimizer's dtype is the model's);
sources in docs/COST_MODEL.md "Optimizer state in bf16".

``fp8`` with delayed scaling (Transformer Engine, Megatron-LM) adds the cached FP8 weight and its
transpose, 1 + 1 bytes, to every parameter (:func:`objectives.precision.fp8_weight_copy_bytes`: an
upper bound, since only the linear layers' weights have one); rowwise FP8 (torchao) keeps none. Where the
launcher keeps FP8 weights in FP8 (``TrainingSettings.gathers_fp8``, Megatron-LM's ``--fp8-param-gather``)
an FP8 linear's weight holds :func:`objectives.precision.fp8_primary_bytes` in place of 2 + 2: data and
transpose, 2, at ZeRO 1-2; its shard's data, 1, at ZeRO-3, which gathers it at 1 byte
(:func:`fp8_weight_elements` keeps its elements apart for the bytes-to-elements steps).

(``sgd`` means SGD with momentum, the usual training setting; plain SGD would keep no momentum.)

Replication degree and ZeRO sharding (:mod:`objectives.replication`): the :math:`R` devices that
hold identical copies of each parameter shard (:func:`~objectives.replication.replication_degree`).
ZeRO stage 1 divides the optimizer state by the data-parallel part of :math:`R`
(:func:`~objectives.replication.zero_shard_degree`), stage 2 also the gradients, stage 3 also the
parameters (checked against FSDP2 in docs/VALIDATION.md).

FSDP2 / ZeRO-3 unsharded units (:func:`fsdp_unsharded_peak`). Sharded states are not all a ZeRO-3
device holds: each wrapped unit (a repeated transformer block, the embedding, the final norm + output
head, as the exporters wrap them) is all-gathered into an unsharded buffer in the parameter dtype
while it runs, and the next unit's gather is prefetched, so two units are whole at once; in backward
the unit's unsharded gradients and the reduce-scatter input in the reduce dtype (fp32) are live too;
a unit not resharded after forward stays whole until its backward (torchtitan's head; every unit
under a pipeline, where the gradients also accumulate unsharded in fp32 across micro-batches).
Sources are at the function. The stage's term is added to its parameters and gradients by
:mod:`objectives.pipeline_price`; the per-op tables (``objectives.tables``) cannot hold a
per-model maximum and price the sharded states only.

Saved activations (:func:`saved_operands`), at the per-device shard shape, in the dtype each is
saved in (the training precision, except under bf16 autocast in eager mode: :mod:`objectives.autocast`),
per family:

* matmul, conv: the non-parameter inputs; plus the output when pointwise ops are fused after it
  (the pre-activation their backward needs);
* elementwise: the non-parameter inputs, except for Add/Sub/Neg/Identity/Cast (gradients need no
  operand; with a chain fused after them, a residual sum's ReLU, one tensor of the output's size,
  as after a product);
* norm: the non-parameter inputs (the per-row statistics are 1/row-length of that, left out);
* softmax: the output; a softmax cross-entropy loss (``SoftmaxCrossEntropyLoss``, whose output is
  the loss) keeps its probabilities instead: one fp32 value per score element of its shard
  (:data:`PROBABILITY_BYTES`; Megatron's vocab-parallel cross entropy saves ``exp_logits`` after
  ``.float()``, PyTorch's ``log_softmax`` runs in fp32 under autocast), the op's own;
* reduce: the input for ReduceMax/ReduceMin/ReduceProd/ArgMax/ArgMin, nothing for sums and means;
* gather, embedding: the integer indices;
* pool: the input for max pooling (and under ``engine="eager"`` its int64 argmax indices,
  :data:`POOL_INDEX_BYTES` per output element), nothing for average pooling;
* rnn: the inputs and the states of every step: :data:`RNN_SAVED_STATES` copies of the output;
* concat, slice, data_movement: nothing; opaque: inputs and outputs (conservative);
* any op whose last node keeps its result (:func:`saves_result`, :data:`SAVES_RESULT`: a ReLU folded
  after a BatchNorm, a residual Add or a product; a lone ReLU) keeps its output, the tensor itself
  (in place of a fused chain's pre-activation; a lone ReLU in place of its input).

Each saved tensor once (:func:`shared_saved_operands`). Autograd holds a saved tensor once however
many backward functions keep it: a ReLU's result is also the next convolution's saved input, the
block input of a ResNet stage is saved by its first convolution and by the downsample. A saved
operand is identified by :func:`saved_tensor_keys`: the stored tensor and the dtype it is saved in
(:mod:`objectives.autocast`), shared by every op that saves it as it is (an op's output is shared
when it is a softmax's probabilities or a ReLU's result); a cast copy (an autocast product reading an
fp32 tensor: each of q, k, v saves its own bf16 copy), a fused chain's pre-activation and an RNN's
states are the op's own. Its bytes, in the saved dtype
(:data:`objectives.autocast.DTYPE_SIZE`), go to the *first* op in op order that keeps it after
recomputation (:func:`kept_operands`; a recomputed owner that drops it passes it on), as a
parameter's states go to its first reader, so the per-op tables stay additive; the others are
charged 0 (``shared``). Under sharding the charge is per configuration: the owner pays its own
shard in each of its configurations and every other reader 0 in all of its. When two readers
choose different layouts (or sit on different pipeline stages) the second holds a redistributed
copy in reality; that copy is left to the allowance below, as redistribution buffers are, because
a per-op table cannot see its neighbour's layout. ``objectives.tables`` computes the sharing per
build (recomputation and execution model) and keeps ops with different sharing apart.

Recomputation: an op that is recomputed keeps only the saved inputs produced *outside* the
recomputed region (its checkpoints) and drops the rest; it runs its forward once more
(added in :mod:`objectives.tables`).

Under an execution model (:class:`objectives.execution.ExecutionModel`):

* ``attention="flash"``: an attention core (:mod:`objectives.attention`) keeps Q and K (its score
  product's inputs), V and one fp32 log-sum-exp per query row
  (:data:`~objectives.execution.LSE_BYTES`, on its value product): :math:`O(b h s)`, no
  :math:`s \times s` tensor; its softmax and the elementwise ops between keep nothing.
* ``engine="eager"``: each ONNX node folded into a coarse op runs on its own and autograd keeps its
  operands (:func:`eager_folded_tensors`). By rule, from the op's node types (:attr:`Op.node_types`):
  a last node that keeps its result keeps the op's output (above: shared, no more); a trailing
  :data:`SINGLE_OP_DECOMPOSITIONS` sequence (``nn.SiLU``, ``nn.GELU`` as the exporter writes them)
  is one op keeping its input, the pre-activation already kept; a norm written out of elementwise
  nodes (an RMSNorm) keeps, besides its input, the normalised tensor its weight's gradient reads
  (and ``x - mean`` if it centres), in its output's stored dtype. Every other folded node is charged
  :data:`EAGER_SAVED_PER_NODE` tensors of the op's output shard at the training precision (a
  hand-written GeLU-tanh of 7 nodes keeps x, x^3, the tanh and 0.5x: about half of them); these are
  anonymous and never shared.
* ``dropout`` (:attr:`~objectives.execution.ExecutionModel.dropout`): autograd keeps each dropout's
  mask, :data:`DROPOUT_MASK_BYTES` per element (the dropped tensor itself replaces its input as what
  the next op saves, so the mask is the only addition). Hidden dropout sits on every residual branch
  before its sum (GPT-2 ``resid_dropout`` / ``mlp.dropout``, BERT ``*Output.dropout``, Megatron's
  bias-dropout-add): one mask of the sum's size on each residual add (:func:`is_residual_add`); the
  one embedding dropout per model is left out. Attention dropout: on the probabilities under
  ``attention="explicit"`` (one mask of the scores' size on the softmax); none under ``flash``, whose
  kernel regenerates its mask from the saved RNG state (FlashAttention-2 keeps only the seed and
  offset). A recomputed op keeps no mask (Megatron's and PyTorch's checkpointing restore the RNG
  state and draw the same mask again).
* ``fp8="delayed"`` (Transformer Engine): an FP8 linear keeps its input's FP8 cast, and flash attention its
  bf16 output (:func:`fp8_saved_input`); torchao's ``rowwise`` keeps the bf16 input.
* The graph's outputs (the logits) and their fp32 gradients are live when backward starts
  (:data:`OUTPUT_GRADIENT_BYTES`); for a language model's head that is the largest transient. Under
  a fused cross-entropy kernel (:attr:`~objectives.execution.ExecutionModel.fused_loss`) the gradient
  is in the logits' dtype instead; under PyTorch's ``cross_entropy`` on fp32 logits
  (:attr:`~objectives.execution.ExecutionModel.torch_loss`, torchtitan's) three fp32 logit-sized
  tensors are live at the loss's backward, :data:`TORCH_LOSS_BYTES` per logit in place of both
  (:func:`loss_bytes_per_logit`; a ``SoftmaxCrossEntropyLoss`` in the graph holds them in place of
  its probabilities, a ``LogSoftmax`` in place of its output: the loss written out). A transient at
  the loss, charged once: it is not held across micro-batches.
* Recomputation keeps a working set: while one recomputed region (a layer under ``full``) runs its
  forward again in backward, all of its activations are live. ``objectives.tables`` charges the ops
  of the first instance of each repeated block as not recomputed (their activations are that
  working set; the other instances keep checkpoints only). A pipeline stage holds its in-flight
  micro-batches' checkpoints but re-runs one region at a time, so the working set is live once per
  stage, not once per in-flight micro-batch, and on every stage that recomputes, not only the one
  holding the first instance (:func:`pipelined_activation_bytes`).
* A linear layer fed by an all-gather (sequence parallelism's gather before a column-parallel layer)
  keeps, under a launcher that says so (``TrainingSettings.sequence_shard_saved``: Megatron-Core,
  Transformer Engine), its producer's shard of the input, not the gathered tensor, and gathers it
  again in backward (:func:`sequence_shard_credit`, per plan: a per-op table cannot see its producer's
  layout).

Other (:data:`OTHER_FRACTION`): what the CUDA caching allocator reserves beyond the live tensors
(``torch.cuda.max_memory_reserved`` over ``max_memory_allocated``: fragmentation of its cached
segments, plus workspaces and transient buffers, redistribution buffers included, which edges do not
carry), as a fraction of the rest; fitted on measured runs (the constant says which). Everything but
``other`` is the allocator's *allocated* peak; the whole is its *reserved* peak. A run runs out of
memory only when the allocated peak does not fit: on a failed ``cudaMalloc`` the allocator frees its
unused cached segments and retries (``c10/cuda/CUDACachingAllocator.cpp``, the header comment: "If
the cudaMalloc fails, the allocator will free all cached blocks that are not split and retry").
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Collection, Mapping, Sequence

import numpy as np

from objectives._common import CROSS_ENTROPY_LOSSES, element_bytes, is_float, shard_elements
from objectives.attention import grid_inputs
from objectives.autocast import DTYPE_SIZE, autocast_applies, saved_dtype
from objectives.compute import SINGLE_OP_DECOMPOSITIONS, folded_nodes
from objectives.execution import LSE_BYTES, ExecutionModel
from objectives.precision import fp8_primary_bytes, fp8_weight_copy_bytes, is_fp8_linear, keeps_fp8
from objectives.replication import replication_degree, zero_shard_degree, zero_states_degree
from objectives.saved_credits import sequence_shard_credit  # re-exported: its home since the per-search rule
from planner.core.configs import ConfigSpace
from planner.core.graph import Op, OpGraph, Tensor, TensorAccess
from planner.core.settings import TrainingSettings, Zero3Gather

__all__ = [
    "OTHER_FRACTION",
    "RNN_SAVED_STATES",
    "StateBytes",
    "MemoryArrays",
    "state_bytes_per_parameter",
    "replication_degree",
    "zero_shard_degree",
    "parameter_state_bytes",
    "fp8_weight_elements",
    "REDUCE_BYTES",
    "UnshardedPeak",
    "fsdp_unsharded_peak",
    "fsdp_kept_ranges",
    "deepspeed_gathered_peak",
    "saved_operands",
    "kept_operands",
    "saved_tensor_keys",
    "shared_saved_operands",
    "saved_activation_bytes",
    "op_memory_bytes",
    "pipelined_activation_bytes",
    "sequence_shard_credit",
    "EAGER_SAVED_PER_NODE",
    "SAVES_RESULT",
    "SINGLE_OP_DECOMPOSITIONS",
    "saves_result",
    "eager_folded_tensors",
    "OUTPUT_GRADIENT_BYTES",
    "POOL_INDEX_BYTES",
    "PROBABILITY_BYTES",
    "TORCH_LOSS_BYTES",
    "loss_bytes_per_logit",
    "DROPOUT_MASK_BYTES",
    "FP8_SAVED_INPUT_BYTES",
    "fp8_saved_input",
    "is_residual_add",
    "op_sac_saved",
    "SAC_ATTENTION_ROLES",
]

OUTPUT_GRADIENT_BYTES = 4
"""Bytes per element of a graph output's gradient when backward starts: a loss computes in fp32
(cross-entropy and mean reductions upcast bf16 logits), so dL/dlogits is an fp32 tensor of the
logits' size, live together with the logits themselves at the peak."""

EAGER_SAVED_PER_NODE = 0.5
"""[Empirical] Tensors of the output shard's size autograd keeps per ONNX node folded into a coarse op under
``engine="eager"`` (nodes by a scalar or a broadcast constant keep nothing, nonlinear ones keep their input or
output: about half of a hand-written GeLU chain's nodes; a count, no fit: 4 of the tanh GeLU's 8 by PyTorch's
derivatives.yaml, h31f, docs/VALIDATION.md). Chains with a physical rule (a trailing ReLU, SiLU or GeLU, a
written-out norm: :func:`eager_folded_tensors`) do not use it."""

TORCH_LOSS_BYTES = 12
"""Bytes per logit element of a shard live at the backward of PyTorch's ``F.cross_entropy`` on fp32
logits (``ExecutionModel.torch_loss``: torchtitan's ``cross_entropy_loss`` runs it on
``pred.flatten(0, 1).float()`` and deletes ``pred`` before ``loss.backward()``), three fp32 tensors of
the logits' size: ``log_softmax``'s result, which its backward reads (``tools/autograd/derivatives.yaml``:
``_log_softmax: self: _log_softmax_backward_data(grad, result, dim, self.scalar_type())``), the
gradient ``nll_loss_backward`` writes into a zero-filled tensor of its input's size
(``aten/src/ATen/native/LossNLL.cpp``), and ``_log_softmax_backward_data``'s output, 3 x 4 bytes.
The bf16 logits are gone by then (``ToCopyBackward`` saves nothing) and the fp32 copy is freed
when ``cross_entropy`` returns (``log_softmax`` keeps its result, not its input); the forward holds
at most 2 + 4 + 4 bytes (the bf16 logits, the copy, the log-probabilities), less. Megatron's
vocab-parallel cross entropy holds 6 at its peak, the default rule (:data:`OUTPUT_GRADIENT_BYTES`):
``megatron/core/tensor_parallel/cross_entropy.py`` upcasts the logits shard once (``.float()``
beside the bf16 logits in forward), exponentiates and normalises it in place (``exp_logits``, saved)
and builds the gradient in place of the saved softmax, which autograd casts back to bf16."""

PROBABILITY_BYTES = 4
"""Bytes per score element a softmax cross-entropy loss keeps for backward: its probabilities in
fp32 (module docstring), at every precision and engine."""

POOL_INDEX_BYTES = 8
"""Bytes per output element of the argmax indices a max pooling keeps under ``engine="eager"``:
PyTorch's ``max_pool2d`` runs ``max_pool2d_with_indices``, which returns int64 indices and saves them
with its input (``derivatives.yaml``: ``max_pool2d_with_indices_backward(grad, self, ..., result1)``).
Compiled or fused kernels may keep smaller offsets; the model leaves them out there."""

OTHER_FRACTION = 0.10
"""[Empirical] The caching allocator's reserve over the live tensors (reserved / allocated - 1),
as a fraction of states + activations. Fitted on the fit rows of ``bench/fidelity/runs_h100.jsonl``
(one H100, PyTorch 2.11, GPT-2 / BERT / MLP in every mode: ``peak_reserved_bytes /
peak_alloc_bytes`` of ``../shared/calibration/h100_steps_examples.jsonl``, 22 rows): median 1.099,
range 1.037-1.233; the held-out Llama and ResNet rows measure a median of 1.093 (1.024-1.235).
Fragmentation grows with the batch (GPT-2 SDPA 1.08 / 1.12 / 1.16 at batch 8 / 16 / 32), so a
single fraction is a median, not a bound: docs/VALIDATION.md scores it on the held-out rows."""

FP8_SAVED_INPUT_BYTES = 1
"""Bytes per element of the input an FP8 linear layer keeps for its weight gradient under delayed scaling
(Transformer Engine): its FP8 cast (``transformer_engine/pytorch/module/linear.py``, ``_Linear.forward``:
``saved_inputmat = inputmat`` after ``cast_to_fp8``, or its FP8 transpose ``inputmat_t``, 1 byte either
way), not the bf16 tensor. torchao's float8 (the ``rowwise`` recipe) keeps the high-precision input and
casts it again in backward: 2 bytes there, the training precision's."""

DROPOUT_MASK_BYTES = 1
"""Bytes per element of a dropout mask: ``native_dropout`` returns a ``bool`` mask, the one tensor its
backward reads (``tools/autograd/derivatives.yaml``: ``native_dropout_backward(grad, result1,
scale)``); Megatron's fused bias-dropout-add calls the same dropout."""

RNN_SAVED_STATES: dict[str, float] = {"LSTM": 6.0, "GRU": 4.0, "RNN": 1.0}
"""Copies of the output an RNN saves for backward: LSTM 4 gates + cell + hidden per step, GRU
3 gates + hidden, a plain RNN its hidden state."""

SAVES_RESULT = frozenset({"Relu", "Sigmoid", "Tanh", "Exp", "Sqrt", "Reciprocal"})
"""ONNX ops whose PyTorch backward reads the op's *result*, not its input (``tools/autograd/
derivatives.yaml``: ``relu`` -> ``threshold_backward(grad, result, 0)``, ``sigmoid`` ->
``sigmoid_backward(grad, result)``, ``tanh`` -> ``tanh_backward(grad, result)``, ``exp`` ->
``grad * result``, ``sqrt`` -> ``grad / (2 * result)``, ``reciprocal`` -> ``-grad * result * result``).
``gelu``, ``silu``, ``elu``, ``leaky_relu``, ``erf`` and ``pow`` read their input (``self``) instead.
When such a node is the last of a coarse op, the tensor it keeps is the op's output itself."""

_NO_SAVE_ELEMENTWISE = frozenset({"Add", "Sub", "Neg", "Identity", "Cast"})
_SAVE_INPUT_REDUCE = frozenset({"ReduceMax", "ReduceMin", "ReduceProd", "ArgMax", "ArgMin"})


@dataclass(frozen=True, slots=True, kw_only=True)
class StateBytes:
    """Bytes per parameter element of each training state."""

    param: float
    """The parameter in its training dtype, plus :attr:`weight_copy`."""
    grad: float
    optimizer: float
    weight_copy: float = 0.0
    """FP8 weight copies kept beside the parameter (delayed-scaling FP8: :mod:`objectives.precision`)."""

    @property
    def total(self) -> float:
        return self.param + self.grad + self.optimizer

    @property
    def gathered(self) -> float:
        """Bytes per element a ZeRO-3 / FSDP all-gather moves: the parameter, not its FP8 copies."""
        return self.param - self.weight_copy


def state_bytes_per_parameter(settings: TrainingSettings) -> StateBytes:
    """Bytes per parameter for the precision and optimizer (table in the module docstring).

    Examples
    --------
    >>> state_bytes_per_parameter(TrainingSettings(precision="bf16-mixed", optimizer="adam")).total
    16.0
    >>> state_bytes_per_parameter(TrainingSettings(precision="fp32", optimizer="sgd"))
    StateBytes(param=4.0, grad=4.0, optimizer=4.0, weight_copy=0.0)
    >>> state_bytes_per_parameter(TrainingSettings(fp8="delayed")).total
    18.0
    >>> state_bytes_per_parameter(TrainingSettings(optimizer_state_dtype="bf16"))  # Apex DistributedFusedAdam(dtype=bf16)
    StateBytes(param=2.0, grad=2.0, optimizer=4.0, weight_copy=0.0)
    """
    mixed = settings.precision == "bf16-mixed"
    low = 2.0 if mixed else 4.0
    bf16_state = settings.optimizer_state_dtype == "bf16"  # bf16 moments, the bf16 parameter updated in place
    master = 4.0 if mixed and not bf16_state else 0.0
    moments = (2.0 if settings.optimizer == "adam" else 1.0) * (2.0 if bf16_state else 4.0)
    copy = fp8_weight_copy_bytes(settings)
    return StateBytes(param=low + copy, grad=low, optimizer=master + moments, weight_copy=copy)


def _owned(op: Op, tensors: Mapping[str, Tensor], owned_inputs: Collection[int] | None) -> list[int]:
    if owned_inputs is not None:
        return sorted(owned_inputs)
    return [
        i
        for i, access in enumerate(op.inputs)
        if (t := tensors.get(access.tensor)) is not None and t.role == "parameter"
    ]


def parameter_state_bytes(
    op: Op,
    space: ConfigSpace,
    *,
    tensors: Mapping[str, Tensor],
    settings: TrainingSettings,
    owned_inputs: Collection[int] | None = None,
    graph_output: bool = False,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per-device ``(params, grads, optimizer)`` bytes, each ``(K,)``, of the op's parameters.

    Parameters
    ----------
    owned_inputs:
        Positions in ``op.inputs`` of the parameters this op accounts for (a tied weight is
        accounted once, by one op). ``None``: every input whose tensor role is ``parameter``.
    graph_output:
        The op writes a graph output (the LM head, no FP8 linear): its weight is not kept in FP8.
    """
    per = state_bytes_per_parameter(settings)
    params = np.zeros(space.size)
    grads = np.zeros(space.size)
    optimizer = np.zeros(space.size)
    for shard, replicas, fp8 in _state_shards(op, space, tensors, settings, owned_inputs, graph_output):
        stage = settings.zero_stage
        param = fp8_primary_bytes(settings) if fp8 else per.param  # an FP8 weight kept in FP8: no bf16 copy
        params += shard * param / (replicas if stage >= 3 else 1.0)
        grads += shard * per.grad / (replicas if stage >= 2 else 1.0)
        optimizer += shard * per.optimizer / (replicas if stage >= 1 else 1.0)
    return params, grads, optimizer


def _state_shards(op: Op, space: ConfigSpace, tensors: Mapping[str, Tensor], settings: TrainingSettings,
                  owned_inputs: Collection[int] | None, graph_output: bool):
    """Per owned parameter: its ``(K,)`` shard elements, the ``(K,)`` replicas ZeRO divides its states by
    (HSDP: the shard group only, ``objectives.replication``) and whether it is kept in FP8
    (``settings.gathers_fp8`` and :func:`objectives.precision.keeps_fp8`)."""
    for position in _owned(op, tensors, owned_inputs):
        access = op.inputs[position]
        tensor = tensors[access.tensor]
        shard = shard_elements(space, op, access, tensor.shape)
        replicas = zero_states_degree(op, space, access, settings.dp_shard).astype(np.float64)
        yield shard, replicas, settings.gathers_fp8 and keeps_fp8(op, tensors, settings, tensor, graph_output=graph_output)


def fp8_weight_elements(op: Op, space: ConfigSpace, *, tensors: Mapping[str, Tensor], settings: TrainingSettings,
                        owned_inputs: Collection[int] | None = None,
                        graph_output: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """``(whole, sharded)``, each ``(K,)``: the elements per device of the op's parameters that
    ``settings.gathers_fp8`` keeps in FP8 (``settings`` at any ZeRO stage from 1), the tensor-parallel shard
    and that over ZeRO's replicas. Zeros where the rule is off or the op is no FP8 linear."""
    whole, sharded = np.zeros(space.size), np.zeros(space.size)
    for shard, replicas, fp8 in _state_shards(op, space, tensors, settings, owned_inputs, graph_output):
        if fp8:
            whole, sharded = whole + shard, sharded + shard / replicas
    return whole, sharded


REDUCE_BYTES = 4.0
"""Bytes per element of the gradient FSDP2 reduce-scatters: ``MixedPrecisionPolicy(reduce_dtype=
torch.float32)`` in both FSDP2 launchers the planner exports (torchtitan's ``training.
mixed_precision_reduce``, whose only allowed value is ``"float32"``, ``torchtitan/config/configs.py``;
``planner/run.py``'s policy). ``foreach_reduce`` allocates the reduce-scatter input of the unit's
padded unsharded size in that dtype (``torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py``:
``reduce_scatter_input = reduce_scatter_comm.allocate((reduce_scatter_input_numel,), dtype=reduce_dtype)``);
this is the communication buffer the allocator sees (NCCL's own ``NCCL_BUFFSIZE`` channels are
outside it and outside the measured peaks)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class UnshardedPeak:
    """What a ZeRO-3 / FSDP2 stage holds beyond its sharded states at its peak (bytes per device)."""

    params_bytes: float
    """Unsharded (all-gathered) parameters, in the parameter dtype."""
    grads_bytes: float
    """Unsharded gradients of the unit in backward plus its reduce-scatter input (and, under a pipeline's
    accumulation, every unit's accumulated unsharded gradient)."""

    @property
    def total_bytes(self) -> float:
        return self.params_bytes + self.grads_bytes


def fsdp_unsharded_peak(units, *, kept, per: StateBytes, accumulate: bool = False, elements=None) -> UnshardedPeak:
    r"""The unsharded parameters and gradients a ZeRO-3 / FSDP2 stage holds at its peak.

    ``units``: each FSDP unit's parameters in the gathered dtype, bytes per device (the tensor-parallel
    shard, before ZeRO's division), in forward order; ``kept``: per unit, whether it is *not*
    resharded after forward; ``per``: the bytes per element (:func:`state_bytes_per_parameter`);
    ``accumulate``: gradient sync is off for all micro-batches but the last (a pipeline stage);
    ``elements``: each unit's elements, where its bytes are not elements x :math:`b_p` (FP8 weights gathered
    at 1 byte, ``TrainingSettings.gathers_fp8``); ``None``: ``units`` / :math:`b_p`.

    Backward runs the units last to first. While unit :math:`i` runs backward (the activations' peak
    is at backward's start, so every step is a candidate) the stage holds

    .. math:: P_i = u_i + u_{i-1} + \sum_{w < i-1,\ 	ext{kept}_w} u_w, \qquad
              G_i = e_i (b_g + b_r), \quad e_i = u_i / b_p

    with :math:`b_p` the gathered bytes per element, :math:`b_g` the gradient's and :math:`b_r`
    :data:`REDUCE_BYTES`. Sources, term by term:

    * :math:`u_i + u_{i-1}`: the running unit and the next one's prefetched all-gather. FSDP2
      all-gathers a unit's parameters before its forward and backward and reshards them after
      (``fully_shard``'s docstring, torch 2.13), and by default prefetches "the next FSDP module based
      on the reverse post-forward order" in backward (``FSDPModule.set_modules_to_backward_prefetch``'s
      docstring). Zhao et al., "PyTorch FSDP: Experiences on Scaling Fully Sharded Data Parallel",
      VLDB 2023 (arXiv:2304.11277), section 3.2.1: the parameters' peak is
      :math:`O(\sum_i \psi_i / F + \max_i \psi_i)`, the sharded units plus the largest unit whole;
      backward prefetching (section 3.3.2) adds the next unit's.
    * kept units: ``reshard_after_forward=False`` keeps the unsharded parameters from forward to
      backward (``fully_shard``'s docstring); torchtitan sets it for the final norm + head unit (and,
      under a pipeline, every unit: ``get_fsdp_reshard_after_forward_policy`` returns ``not
      pp_enabled``), ``torchtitan/distributed/fsdp.py``, ``apply_fsdp_to_decoder``.
    * :math:`G_i`: the unit's unsharded gradients (the parameter dtype) and the reduce-scatter input
      in the reduce dtype, live together while ``foreach_reduce`` copies one into the other.
    * ``accumulate``: ``torch.distributed.pipelining``'s stage calls ``set_reshard_after_backward(False)``
      and ``set_requires_gradient_sync(False)`` for all micro-batches but the last
      (``stage.py``, ``backward_maybe_with_nosync``), so every unit stays whole (:math:`P = \sum u`)
      and keeps an unsharded gradient accumulated in the reduce dtype (``FSDPParam.
      to_accumulated_grad_if_needed``): :math:`G_i` adds :math:`\sum_{w \ge i} u_w b_r / b_p`.

    Returns the split at the step with the largest :math:`P_i + G_i`; zeros for no units.

    Examples
    --------
    Three equal bf16 units of 100 bytes, the last kept: at the last unit's backward, it and the
    prefetched middle one (200) with 100 x (2 + 4) / 2 bytes of gradient buffers:

    >>> per = StateBytes(param=2.0, grad=2.0, optimizer=12.0)
    >>> fsdp_unsharded_peak([100.0, 100.0, 100.0], kept=[False, False, True], per=per)
    UnshardedPeak(params_bytes=200.0, grads_bytes=300.0)
    """
    u = np.asarray(units, dtype=np.float64)
    if u.size == 0 or per.gathered <= 0.0:
        return UnshardedPeak(params_bytes=0.0, grads_bytes=0.0)
    e = u / per.gathered if elements is None else np.asarray(elements, dtype=np.float64)
    grads = e * (per.grad + REDUCE_BYTES)
    if accumulate:
        params = np.full(u.size, u.sum())
        grads = grads + np.cumsum(e[::-1])[::-1] * REDUCE_BYTES
    else:
        previous = np.concatenate(([0.0], u[:-1]))
        held = np.cumsum(np.where(np.asarray(kept, dtype=bool), u, 0.0))
        earlier = np.concatenate(([0.0, 0.0], held[:-2]))[: u.size]  # kept units before i - 1
        params = u + previous + earlier
    peak = int(np.argmax(params + grads))
    return UnshardedPeak(params_bytes=float(params[peak]), grads_bytes=float(grads[peak]))


def fsdp_kept_ranges(units, *, per: StateBytes, accumulate: bool, elements=None) -> np.ndarray:
    r"""``(n, n)``: ``[lo, hi]`` the peak :func:`fsdp_unsharded_peak` gives (parameters + gradient
    buffers) for the contiguous units ``lo..hi`` when every unit is kept (a pipeline stage); 0 where
    ``hi < lo``. All ranges at once, for the pipeline search's cuts (``planner.search.stage_costs``).
    ``elements``: as :func:`fsdp_unsharded_peak`'s.

    With :math:`C_i` the bytes of the units before :math:`i`, :math:`c = (b_g + b_r) / b_p` and
    :math:`r = b_r / b_p`, every unit kept makes :math:`P_i = C_{i+1} - C_{lo}` without accumulation,
    and :math:`P_i = C_{hi+1} - C_{lo}` with :math:`G_i` adding :math:`(C_{hi+1} - C_i) r`; either way
    the peak is a constant plus a running maximum over :math:`i` in the range.

    >>> per = StateBytes(param=2.0, grad=2.0, optimizer=12.0)
    >>> float(fsdp_kept_ranges([10.0, 20.0, 30.0], per=per, accumulate=True)[0, 2])  # 60 + 160
    220.0
    """
    u = np.asarray(units, dtype=np.float64)
    n = u.size
    if n == 0 or per.gathered <= 0.0:
        return np.zeros((n, n))
    e = u / per.gathered if elements is None else np.asarray(elements, dtype=np.float64)
    c, r = per.grad + REDUCE_BYTES, REDUCE_BYTES  # per element
    prefix, counted = np.concatenate(([0.0], np.cumsum(u))), np.concatenate(([0.0], np.cumsum(e)))
    if accumulate:
        value, tail = e * c - counted[:-1] * r, prefix[1:] + counted[1:] * r  # + C_{hi+1} + E_{hi+1} b_r
    else:
        value, tail = prefix[1:] + e * c, np.zeros(n)
    lo, hi = np.arange(n)[:, None], np.arange(n)[None, :]
    running = np.maximum.accumulate(np.where(hi >= lo, value[None, :], -np.inf), axis=1)
    return np.where(hi >= lo, running + tail[None, :] - prefix[:-1][:, None], 0.0)


def _prefetched(elements: np.ndarray, limit: np.ndarray) -> np.ndarray:
    """Per position ``k``, the elements DeepSpeed's prefetch gathers after ``k``: the parameters that
    follow, whole, until their sum reaches ``limit[k]`` (nothing where ``limit[k] <= 0``; all that
    follow when they do not reach it). ``PartitionedParameterCoordinator.fetch_sub_module`` adds whole
    parameters ``while numel_prefetching < max_params_to_prefetch``, so the last one overshoots."""
    total = np.cumsum(elements)
    last = np.minimum(np.searchsorted(total, total + limit, side="left"), elements.size - 1)
    return np.where(limit > 0.0, total[last] - total, 0.0)


def deepspeed_gathered_peak(units, *, gather: Zero3Gather, per: StateBytes) -> UnshardedPeak:
    r"""The gathered parameters and gradient buffers DeepSpeed's ZeRO-3 holds at its peak, per device.

    ``units``: each sub-module's parameters (an op with parameters: one linear layer, one norm) in the
    gathered dtype, bytes per device (the tensor-parallel shard, before ZeRO's division), in forward
    order; ``gather``: the launcher's bounds, in elements; ``per``: the bytes per element.

    DeepSpeed gathers per sub-module, not per block (:func:`fsdp_unsharded_peak`). With :math:`e_k` a
    sub-module's elements, :math:`B` the prefetch bucket, :math:`M` the live maximum, :math:`D` the
    reuse distance, :math:`T` the persistence threshold and :math:`R` the reduce bucket:

    * sub-modules under :math:`T` are never partitioned (``stage3_param_persistence_threshold``:
      "Do not partition parameters smaller than this threshold"): always whole, and never prefetched;
    * running :math:`k` (forward, or backward in reverse order) holds :math:`e_k` plus the prefetch
      :math:`f_k`: the next sub-modules in that order, whole, until they reach
      :math:`\min(B, M - e_k)` (``fetch_sub_module``: ``max_params_to_prefetch = min(max_live -
      n_available, prefetch_bucket_sz)``; none once :math:`e_k \ge M`), so :math:`P_k = e_k + f_k`;
    * at backward's first step the forward's last sub-modules whose next use is within :math:`D`
      traversed elements are still whole (``__params_to_release`` keeps a parameter seen again within
      ``max_reuse_distance``): sub-module :math:`k` is used again after the rest of the forward and
      the backward down to it, :math:`2 S_k` elements with :math:`S_k` the elements after it, so the
      suffix with :math:`2 S_k < D` is kept, and the prefetch skips it;
    * gradients: the running sub-module's unsharded gradient (:math:`e_k b_g` in backward) and the
      contiguous reduce bucket, :math:`R` elements in the communication dtype (the parameter dtype:
      ``DeepSpeedEngine.communication_data_type``), allocated once (``DeepSpeedZeroOptimizer_Stage3``:
      ``bucket.buffer = torch.empty(self.reduce_bucket_size, ...)`` with ``contiguous_gradients``).

    Sources: ``deepspeed/runtime/zero/partitioned_param_coordinator.py`` and ``stage3.py``, DeepSpeed
    0.19.8. Returns the split at the step with the largest parameters + gradients; zeros for no units.
    Left out: an op stands for one module (a linear layer's bias, under :math:`T`, is counted with its
    weight), and the recomputed forward's reuse (full recomputation) is taken as the plain backward's.

    Examples
    --------
    bf16; sub-modules of 4 (persistent, under 5), 30, 60 and 20 elements; B = 10, M = 100, D = 50,
    R = 50. Backward starts at the 20 with the 60 kept (2 x 20 < 50) and the 30 prefetched past it
    (110 elements, gradient 20: 260 bytes); its next step runs the 60 and prefetches the 30 (90
    elements, gradient 60: 300 bytes), the peak: 180 + 8 persistent bytes, 120 + 50 x 2 bucket bytes.

    >>> per = StateBytes(param=2.0, grad=2.0, optimizer=12.0)
    >>> ds = Zero3Gather(prefetch_bucket=10, max_live=100, max_reuse_distance=50, persistence_threshold=5,
    ...                  reduce_bucket=50)
    >>> deepspeed_gathered_peak([8.0, 60.0, 120.0, 40.0], gather=ds, per=per)
    UnshardedPeak(params_bytes=188.0, grads_bytes=220.0)
    """
    u = np.asarray(units, dtype=np.float64)
    if u.size == 0 or per.gathered <= 0.0:
        return UnshardedPeak(params_bytes=0.0, grads_bytes=0.0)
    elements = u / per.gathered
    persistent = elements < gather.persistence_threshold
    always = float(u[persistent].sum())
    bucket = gather.reduce_bucket * per.gathered
    e = elements[~persistent]
    if e.size == 0:
        return UnshardedPeak(params_bytes=always, grads_bytes=bucket)
    room = np.minimum(float(gather.prefetch_bucket), gather.max_live - e)
    forward = e + _prefetched(e, room)
    backward = e + _prefetched(e[::-1], room[::-1])[::-1]
    after = e.sum() - np.cumsum(e)  # S_k
    kept = 2.0 * after < gather.max_reuse_distance
    if kept[:-1].any():  # backward's first step: the kept suffix whole, the prefetch past it
        start = int(np.argmax(kept))
        held = float(e[start:].sum())
        before = e[:start][::-1]
        reach = np.array([min(float(gather.prefetch_bucket), gather.max_live - held)])
        head = float(_prefetched(np.concatenate(([held], before)), reach)[0]) if before.size else 0.0
        backward[-1] = held + head
    params = np.concatenate((forward, backward)) * per.gathered
    grads = np.concatenate((np.zeros(e.size), e * per.grad))
    peak = int(np.argmax(params + grads))
    return UnshardedPeak(params_bytes=float(params[peak]) + always, grads_bytes=float(grads[peak]) + bucket)


def saves_result(op: Op) -> bool:
    """True when the last node of ``op`` (:attr:`Op.node_types`; the main node when none is recorded
    and nothing is fused) keeps its result for backward (:data:`SAVES_RESULT`): the op's output.

    Examples
    --------
    >>> from planner.core.graph import Op
    >>> bn_relu = Op(name="bn", kind="norm", op_type="BatchNormalization", dims=(), inputs=(), outputs=(),
    ...              flops=0.0, fused_pointwise=1, node_types=("BatchNormalization", "Relu"))
    >>> saves_result(bn_relu), saves_result(Op(name="g", kind="elementwise", op_type="Relu", dims=(),
    ...                                          inputs=(), outputs=(), flops=0.0))
    (True, True)
    """
    if op.node_types:
        return op.node_types[-1] in SAVES_RESULT
    return op.fused_pointwise == 0 and op.op_type in SAVES_RESULT


def _written_out_norm(op: Op) -> bool:
    """A norm no single ONNX node computes: a region of elementwise nodes (an RMSNorm written out)."""
    return op.kind == "norm" and bool(op.node_types) and op.op_type not in op.node_types


def eager_folded_tensors(op: Op, tensors: Mapping[str, Tensor]) -> tuple[float, float]:
    """Under ``engine="eager"``, the tensors of the output's size that ``op``'s folded nodes keep
    beyond :func:`saved_operands`: ``(by rule, by allowance)``.

    *By rule*, in the output's stored dtype: a norm written out of elementwise nodes
    (:func:`_written_out_norm`; HF's ``LlamaRMSNorm``: ``pow``, ``mean``, ``add``, ``rsqrt``, ``mul``,
    ``mul`` by the weight) keeps the normalised tensor its weight's gradient reads (with a weight), and
    the centred ``x - mean`` when it subtracts a mean (``Sub``); its input is kept already and the
    per-row statistics are 1/row-length of that, left out. *By allowance*: :data:`EAGER_SAVED_PER_NODE`
    per other folded node, at the training precision, less a last node that keeps its result (the
    op's output, kept by :func:`saved_operands`) or a trailing :data:`SINGLE_OP_DECOMPOSITIONS`
    sequence (one op keeping the pre-activation, kept already).

    Examples
    --------
    >>> from planner.core.graph import Op
    >>> silu = Op(name="up", kind="matmul", op_type="MatMul", dims=(), inputs=(), outputs=(), flops=0.0,
    ...           fused_pointwise=2, onnx_nodes=("mm", "sig", "mul"), node_types=("MatMul", "Sigmoid", "Mul"))
    >>> eager_folded_tensors(silu, {})
    (0.0, 0.0)
    """
    folded = folded_nodes(op, tensors)
    if _written_out_norm(op):
        weighted = any((t := tensors.get(a.tensor)) is not None and t.role == "parameter" for a in op.inputs)
        return float(weighted) + float("Sub" in op.node_types), 0.0
    types = op.node_types
    if saves_result(op) and folded:
        folded -= 1
    else:
        for pattern in SINGLE_OP_DECOMPOSITIONS:
            if len(types) > len(pattern) and types[-len(pattern):] == pattern:
                folded -= len(pattern)
                break
    return 0.0, EAGER_SAVED_PER_NODE * max(folded, 0)


def is_residual_add(op: Op, tensors: Mapping[str, Tensor]) -> bool:
    """Whether ``op`` is a lone ``Add`` of two float activations of its output's shape: a residual
    sum, where hidden dropout leaves its mask (module docstring)."""
    if op.kind != "elementwise" or tuple(op.node_types or ()) != ("Add",) or len(op.inputs) != 2 or not op.outputs:
        return False
    out = tensors.get(op.outputs[0].tensor)
    operands = [tensors.get(a.tensor) for a in op.inputs]
    # sizes, not shapes: an exporter may flatten one addend (GPT-2's Gemm output is (b*s, h))
    return out is not None and is_float(out) and all(
        t is not None and t.role in ("activation", "input") and is_float(t)
        and math.prod(t.shape) == math.prod(out.shape) for t in operands
    )


def _dropout_mask_elements(op: Op, space: ConfigSpace, tensors: Mapping[str, Tensor], *,
                           execution: ExecutionModel | None, role: str | None, recomputed: bool) -> np.ndarray | None:
    """``(K,)`` elements of the dropout masks ``op`` keeps (module docstring), ``None`` for none."""
    if execution is None or not execution.dropout or recomputed or not op.outputs:
        return None
    attention_mask = role == "softmax" and not execution.flash
    if not (attention_mask or is_residual_add(op, tensors)):
        return None
    out = tensors[op.outputs[0].tensor]
    return shard_elements(space, op, op.outputs[0], out.shape)


def saved_operands(op: Op, tensors: Mapping[str, Tensor]) -> tuple[list[int], list[int], float]:
    """What ``op`` saves for backward: ``(input positions, output positions, output copies)``.

    Output copies multiply the saved outputs' size (RNN step states). Rules per family in the module
    docstring; an op whose last node keeps its result (:func:`saves_result`) keeps its output too.
    """
    inputs, outputs, copies = _family_saved(op, tensors)
    if not outputs and saves_result(op) and op.kind not in ("slice", "data_movement", "concat"):
        outputs = [i for i, a in enumerate(op.outputs) if (t := tensors.get(a.tensor)) is not None and is_float(t)][:1]
        if op.kind == "elementwise" and op.fused_pointwise == 0:
            inputs = []  # a lone ReLU keeps its result in place of its input
    return inputs, outputs, copies


def _family_saved(op: Op, tensors: Mapping[str, Tensor]) -> tuple[list[int], list[int], float]:
    """:func:`saved_operands` by the op's family alone (module docstring)."""

    def role(access: TensorAccess) -> str:
        tensor = tensors.get(access.tensor)
        return "missing" if tensor is None else tensor.role

    def floats(access: TensorAccess) -> bool:
        tensor = tensors.get(access.tensor)
        return tensor is not None and is_float(tensor)

    activation_inputs = [
        i for i, a in enumerate(op.inputs) if role(a) in ("activation", "input") and floats(a)
    ]
    float_outputs = [i for i, a in enumerate(op.outputs) if floats(a)]
    kind = op.kind
    if kind in ("matmul", "conv"):
        return activation_inputs, (float_outputs[:1] if op.fused_pointwise > 0 else []), 1.0
    if kind == "elementwise":
        if op.op_type in _NO_SAVE_ELEMENTWISE:
            # the sum needs no operand; a chain fused after it (a residual add's ReLU) keeps one
            # tensor of the sum's size, as after a product
            return [], (float_outputs[:1] if op.fused_pointwise > 0 else []), 1.0
        return activation_inputs, [], 1.0
    if kind == "norm":
        return activation_inputs, [], 1.0
    if kind == "softmax" and op.op_type in CROSS_ENTROPY_LOSSES:
        return [], [], 1.0  # its probabilities: ``_kept``'s "probs"
    if kind == "softmax":
        return [], float_outputs[:1], 1.0
    if kind == "reduce":
        return (activation_inputs if op.op_type in _SAVE_INPUT_REDUCE else []), [], 1.0
    if kind in ("gather", "embedding"):
        indices = [
            i for i, a in enumerate(op.inputs) if role(a) in ("activation", "input") and not floats(a)
        ]
        return indices, [], 1.0
    if kind == "pool":
        return (activation_inputs if "Max" in op.op_type else []), [], 1.0
    if kind == "rnn":
        return activation_inputs, float_outputs[:1], RNN_SAVED_STATES.get(op.op_type, 1.0)
    if kind == "opaque":
        return activation_inputs, float_outputs, 1.0
    return [], [], 1.0  # concat, slice, data_movement


def kept_operands(
    op: Op,
    tensors: Mapping[str, Tensor],
    *,
    settings: TrainingSettings,
    recomputed: bool = False,
    external_inputs: Collection[int] = (),
    execution: ExecutionModel | None = None,
    role: str | None = None,
    sac_saved: bool = False,
) -> tuple[list[int], list[int], float]:
    """What ``op`` keeps for backward once the execution model and recomputation have had their say:
    ``(input positions, output positions, output copies)`` (:func:`saved_operands`, then the rules
    of the module docstring; the parameters are those of :func:`saved_activation_bytes`)."""
    return _kept(op, tensors, settings=settings, recomputed=recomputed, external_inputs=external_inputs,
                 execution=execution, role=role, sac_saved=sac_saved)[:3]


def _kept(
    op: Op,
    tensors: Mapping[str, Tensor],
    *,
    settings: TrainingSettings,
    recomputed: bool,
    external_inputs: Collection[int],
    execution: ExecutionModel | None,
    role: str | None,
    sac_saved: bool = False,
) -> tuple[list[int], list[int], float, str | None]:
    """:func:`kept_operands` and which extra tensor the op keeps: ``"lse"`` (flash attention's
    log-sum-exp), ``"eager"`` (the folded nodes' tensors), ``"probs"`` (a softmax cross entropy's
    fp32 probabilities) or ``None``."""
    if sac_saved:
        return _sac_kept(op, tensors, role)
    inputs, outputs, copies = saved_operands(op, tensors)
    extra = None
    if execution is not None and op.kind in ("matmul", "conv") and not folded_nodes(op, tensors):
        outputs = []  # only a bias was folded in: its gradient needs no saved pre-activation
    if execution is not None and execution.flash and role is not None:
        outputs = []
        if role == "score":  # Q and K: the product's activation inputs, as the plain rule says; no mask
            inputs = [i for i in inputs if i not in grid_inputs(op)]
        elif role == "value" and op.outputs and not recomputed:
            inputs = [i for i in inputs if i != 0]  # V, not the probabilities
            extra = "lse"
            if settings.fp8 == "delayed":
                # its output in bf16 for the kernel's backward: the projection after it keeps an FP8
                # copy (FP8_SAVED_INPUT_BYTES), not this tensor, which it kept otherwise (shared)
                outputs = [0]
        else:
            inputs = []
    elif execution is not None and role in ("score", "between"):
        outputs = []  # scale and mask are linear: an explicit core keeps the probabilities and V only
        if execution.eager and op.kind == "elementwise":
            inputs = []
    elif (execution is not None and execution.eager and role == "softmax" and settings.precision == "bf16-mixed"
          and settings.autocast):
        # autocast runs softmax in fp32: the saved probabilities are fp32 (the bf16 copy the
        # value product reads is counted there)
        copies = 2.0
    elif execution is not None and execution.eager and not recomputed and op.outputs:
        folded = folded_nodes(op, tensors)
        if folded and op.kind not in ("slice", "data_movement", "concat"):
            out = tensors.get(op.outputs[0].tensor)
            if out is not None and is_float(out):
                extra = "eager"
    if op.kind == "softmax" and op.op_type in CROSS_ENTROPY_LOSSES and op.inputs:
        extra = None if recomputed else "probs"
        if recomputed and 0 in external_inputs:
            inputs = [0]  # re-run from its scores
    elif (op.op_type == "LogSoftmax" and op.inputs and not recomputed and execution is not None
          and execution.torch_loss):
        # PyTorch's cross_entropy written out (LogSoftmax -> NLL loss or gather): its log-probabilities
        # and the two fp32 gradients of the loss's backward, TORCH_LOSS_BYTES per score
        outputs, extra = [], "probs"
    if recomputed:
        inputs = [i for i in inputs if i in external_inputs]
        outputs = []
    return inputs, outputs, copies, extra


SAC_ATTENTION_ROLES = frozenset({"score", "softmax", "between", "value"})
"""Attention-core roles (:mod:`objectives.attention`) that op-level selective checkpointing runs as
one saved kernel: torchtitan's save list holds ``aten._scaled_dot_product_flash_attention`` (and the
efficient / cuDNN variants), whose outputs are the attention output and its log-sum-exp."""


def op_sac_saved(linear: Sequence[bool], roles: Sequence[str | None]) -> list[bool]:
    """Per op of one repeated-block instance (in op order), whether torchtitan's op-level selective
    activation checkpointing (``activation_checkpoint.mode = "selective"``,
    ``selective_ac_option = "op"``) caches its output instead of recomputing it.

    torchtitan wraps each transformer block in ``checkpoint_wrapper`` with a policy
    (``torchtitan/distributed/activation_checkpoint.py``, ``_apply_op_sac``; the same rule since
    ``torchtitan/parallelisms/parallelize_llama.py`` of 2024): a fresh ``meta`` counter per block
    call, ``MUST_SAVE`` for the ops of its save list (``aten.mm``, the SDPA kernels,
    ``reduce_scatter_tensor``) "except every second mm" (``meta[mm_count] % 2 == 0``), everything
    else ``PREFER_RECOMPUTE``. So the 1st, 3rd, 5th... linear layer of a block and its attention
    kernel are saved. ``linear``: per op, a product with a parameter (torchtitan's models have no
    biases, so each is one ``aten.mm``); ``roles``: per op, its attention role (``None`` outside one).

    A Llama block's products (wq, wk, wv, the attention core's two, wo, w1, w3, w2):

    >>> op_sac_saved([True, True, True, False, False, True, True, True, True],
    ...              [None, None, None, "score", "value", None, None, None, None])
    [True, False, True, True, True, False, True, False, True]
    """
    saved, count = [], 0
    for is_linear, role in zip(linear, roles):
        if role in SAC_ATTENTION_ROLES:
            saved.append(True)
        elif is_linear:
            count += 1
            saved.append(count % 2 == 1)
        else:
            saved.append(False)
    return saved


def _sac_kept(op: Op, tensors: Mapping[str, Tensor], role: str | None) -> tuple[list[int], list[int], float, str | None]:
    """What an op whose output op-level selective checkpointing caches keeps (:func:`op_sac_saved`):
    the output the policy saved (a fused chain's product keeps its product's result, the
    pre-activation, of the output's size), never its inputs, which the block's recomputation
    produces again in backward. An attention core keeps its kernel's outputs: the attention output
    (on its value product) and one fp32 log-sum-exp per query row (``"lse"``); its other ops nothing."""
    if role in SAC_ATTENTION_ROLES and role != "value":
        return [], [], 1.0, None
    first = [i for i, a in enumerate(op.outputs[:1]) if (t := tensors.get(a.tensor)) is not None and is_float(t)]
    return [], first, 1.0, ("lse" if role == "value" and first else None)


def saved_tensor_keys(
    op: Op,
    index: int,
    *,
    inputs: Sequence[int],
    outputs: Sequence[int],
    dtypes: tuple[Sequence[str | None], Sequence[str | None]],
    autocast: bool,
    sac_saved: bool = False,
    fp8_input: bool = False,
) -> dict[tuple[str, int], tuple]:
    """The identity of each tensor ``op`` (at ``index`` in op order) saves, by operand.

    ``(tensor name, dtype)`` for a stored tensor saved as it is, which every op saving it shares;
    ``(tensor name, dtype, index)`` for a copy the op makes (a cast: :func:`objectives.autocast.saved_dtype`)
    or a tensor of the output's size that is not the output itself (a fused chain's pre-activation,
    an RNN's states), which is the op's own. Keys are ``("in" | "out", position)``. ``sac_saved``: the
    op's output is cached by op-level selective checkpointing (:func:`op_sac_saved`), the tensor the
    recomputed ops after it read as their checkpoint: shared. ``fp8_input``: the op is an FP8 linear
    layer under delayed scaling (:func:`fp8_saved_input`): its inputs are saved as their FP8 cast,
    ``(tensor name, "fp8")``, which the other FP8 linear layers reading the tensor share (Megatron-Core
    runs q, k and v as one fused linear layer, and gate and up as one).
    """
    keys: dict[tuple[str, int], tuple] = {}
    for position in inputs:
        name, stored = op.inputs[position].tensor, dtypes[0][position]
        if fp8_input:
            keys[("in", position)] = (name, "fp8")
            continue
        saved = saved_dtype(op, stored, autocast=autocast) if stored is not None else None
        keys[("in", position)] = (name, saved) if saved == stored else (name, saved, index)
    # the op's output itself (a softmax's probabilities, a ReLU's result) is shared with the next op
    # that saves it; a fused chain's pre-activation is the op's own
    # (and a product's output when it keeps it: flash attention's output under FP8, _kept)
    named = (op.kind in ("softmax", "opaque", "matmul") and op.fused_pointwise == 0) or saves_result(op) or sac_saved
    for position in outputs:
        name, stored = op.outputs[position].tensor, dtypes[1][position]
        keys[("out", position)] = (name, stored) if named else (name, stored, index)
    return keys


def shared_saved_operands(
    ops: Sequence[Op],
    *,
    kept: Sequence[tuple[Sequence[int], Sequence[int]]],
    dtypes: Sequence[tuple[Sequence[str | None], Sequence[str | None]]],
    autocast: bool,
    sac_saved: Sequence[bool] | None = None,
    fp8_inputs: Sequence[bool] | None = None,
) -> list[tuple[tuple[str, int], ...]]:
    """Per op, the saved operands another op charges: ``("in" | "out", position)`` pairs.

    Autograd holds a saved tensor once however many backward functions keep it; its bytes go to the
    first op in op order that keeps it (:func:`saved_tensor_keys`), as a parameter's states go to its
    first reader (:func:`objectives.parameters.parameter_ownership`), so the per-op tables stay
    additive. ``kept``: per op, the input and output positions it keeps (:func:`kept_operands`,
    under the build's recomputation); ``dtypes``: per op, the stored dtype of each input and output
    (:func:`objectives.autocast.operand_dtypes`); ``sac_saved``: per op, whether op-level selective
    checkpointing caches its output (:func:`op_sac_saved`; ``None``: none); ``fp8_inputs``: per op,
    whether it saves its inputs as FP8 casts (:func:`fp8_saved_input`; ``None``: none).

    Examples
    --------
    Two products reading one bf16 tensor: the second shares the first's saved input.

    >>> from planner.core.graph import Op, TensorAccess
    >>> x = (TensorAccess(tensor="x", axes=(("b",),)),)
    >>> ops = [Op(name=n, kind="matmul", op_type="MatMul", dims=(), inputs=x, outputs=(), flops=0.0) for n in "qk"]
    >>> shared_saved_operands(ops, kept=[([0], []), ([0], [])], dtypes=[(("bf16",), ())] * 2, autocast=True)
    [(), (('in', 0),)]
    """
    seen: set[tuple] = set()
    shared: list[tuple[tuple[str, int], ...]] = []
    for index, (op, (inputs, outputs), operand) in enumerate(zip(ops, kept, dtypes)):
        keys = saved_tensor_keys(op, index, inputs=inputs, outputs=outputs, dtypes=operand, autocast=autocast,
                                 sac_saved=bool(sac_saved[index]) if sac_saved is not None else False,
                                 fp8_input=bool(fp8_inputs[index]) if fp8_inputs is not None else False)
        mine = tuple(item for item, key in keys.items() if key in seen)
        seen.update(keys.values())
        shared.append(mine)
    return shared


def _kind_bytes(op: Op, space: ConfigSpace, tensors: Mapping[str, Tensor], settings: TrainingSettings, kind: str | None,
                execution: ExecutionModel | None, dtypes) -> np.ndarray:
    """``(K,)`` bytes per device an op keeps by its kind of saving (:func:`_kept`'s ``kind``) beyond its
    saved operands: a flash kernel's log-sum-exp, a loss's probabilities, an eager fused op's folded tensors."""
    if kind == "lse":
        # one log-sum-exp per query row: the probabilities' shard over its key length (the
        # product's reduction dims), whatever layout the output has
        probs = tensors[op.inputs[0].tensor]
        keys = np.ones(space.size)
        for dim in op.dims:
            if dim.kind == "reduction":
                keys = keys * np.ceil(dim.size / space.factors[:, space.dim_names.index(dim.name)])
        return shard_elements(space, op, op.inputs[0], probs.shape) / keys * LSE_BYTES
    if kind == "probs":
        scores = tensors[op.inputs[0].tensor]
        torch_loss = execution is not None and execution.torch_loss
        return shard_elements(space, op, op.inputs[0], scores.shape) * (
            TORCH_LOSS_BYTES if torch_loss else PROBABILITY_BYTES)
    if kind == "eager":
        out = tensors[op.outputs[0].tensor]
        ruled, allowed = eager_folded_tensors(op, tensors)
        stored = dtypes[1][0] if dtypes is not None else None
        ruled_bytes = element_bytes(out, settings) if stored is None else DTYPE_SIZE[stored]
        return shard_elements(space, op, op.outputs[0], out.shape) * (
            ruled * ruled_bytes + allowed * element_bytes(out, settings))
    return np.zeros(space.size)


def saved_activation_bytes(
    op: Op,
    space: ConfigSpace,
    *,
    tensors: Mapping[str, Tensor],
    settings: TrainingSettings,
    recomputed: bool = False,
    external_inputs: Collection[int] = (),
    execution: ExecutionModel | None = None,
    role: str | None = None,
    graph_output: bool = False,
    dtypes: tuple[Sequence[str | None], Sequence[str | None]] | None = None,
    shared: Collection[tuple[str, int]] = (),
    sac_saved: bool = False,
) -> np.ndarray:
    """``(K,)`` bytes per device the op keeps for its backward pass.

    Parameters
    ----------
    execution, role:
        The execution model and the op's part in an attention core (module docstring); ``None``:
        the plain rules.
    graph_output:
        The op writes a graph output (the logits): under an execution model that output and its
        gradient are live when backward starts (:data:`OUTPUT_GRADIENT_BYTES`).
    recomputed:
        The op is recomputed in backward: only saved inputs listed in ``external_inputs`` (produced
        outside the recomputed region: checkpoints) are kept.
    external_inputs:
        Positions in ``op.inputs`` of tensors produced outside the recomputed region.
    dtypes:
        The stored dtype of each input and output (:func:`objectives.autocast.operand_dtypes`): each
        saved operand is charged in the dtype the op saves it in
        (:func:`objectives.autocast.saved_dtype`). ``None``: every float at the training precision.
    shared:
        ``("in" | "out", position)`` of the saved operands another op charges
        (:func:`shared_saved_operands`); charged 0 here, under every configuration.
    sac_saved:
        Op-level selective checkpointing (``recompute="op"``) caches this op's output
        (:func:`op_sac_saved`): it keeps that output (and an attention kernel its log-sum-exp), not
        its inputs.
    """
    inputs, outputs, copies, kind = _kept(op, tensors, settings=settings, recomputed=recomputed,
                                          external_inputs=external_inputs, execution=execution, role=role,
                                          sac_saved=sac_saved)
    autocast = autocast_applies(settings, execution)
    if dtypes is not None and autocast and copies == 2.0 and role == "softmax":
        copies = 1.0  # the probabilities are stored fp32: their dtype says it
    extra = _kind_bytes(op, space, tensors, settings, kind, execution, dtypes)
    if execution is not None and execution.eager and op.kind == "pool" and inputs and op.outputs:
        if "Max" in op.op_type:  # the int64 argmax indices, saved with the input
            out = tensors[op.outputs[0].tensor]
            extra = extra + shard_elements(space, op, op.outputs[0], out.shape) * POOL_INDEX_BYTES
    masks = _dropout_mask_elements(op, space, tensors, execution=execution, role=role, recomputed=recomputed)
    if masks is not None:
        extra = extra + masks * DROPOUT_MASK_BYTES
    if execution is not None and graph_output and op.outputs:
        out = tensors.get(op.outputs[0].tensor)
        if out is not None and is_float(out):
            extra = extra + shard_elements(space, op, op.outputs[0], out.shape) * loss_bytes_per_logit(
                execution, element_bytes(out, settings))

    def size(tensor: Tensor, stored: str | None) -> float:
        if dtypes is None or stored is None:
            return element_bytes(tensor, settings)
        return DTYPE_SIZE[saved_dtype(op, stored, autocast=autocast)]

    fp8 = fp8_saved_input(op, tensors, settings, graph_output=graph_output)
    total = extra.astype(np.float64)
    for position in inputs:
        if ("in", position) in shared:
            continue
        access = op.inputs[position]
        tensor = tensors[access.tensor]
        nbytes = FP8_SAVED_INPUT_BYTES if fp8 and is_float(tensor) else size(
            tensor, dtypes[0][position] if dtypes is not None else None)
        total += shard_elements(space, op, access, tensor.shape) * nbytes
    for position in outputs:
        if ("out", position) in shared:
            continue
        access = op.outputs[position]
        tensor = tensors[access.tensor]
        stored = dtypes[1][position] if dtypes is not None else None
        nbytes = element_bytes(tensor, settings) if stored is None else DTYPE_SIZE[stored]
        total += copies * shard_elements(space, op, access, tensor.shape) * nbytes
    return total


def loss_bytes_per_logit(execution: ExecutionModel, logit_bytes: float) -> float:
    """Bytes per element of the logits (a graph output whose loss is outside the graph) live at the
    loss's peak, by the loss kernel the launcher runs; ``logit_bytes``: the logits' stored dtype.

    * Megatron's vocab-parallel cross entropy (the default): the logits and one fp32 tensor
      (:data:`OUTPUT_GRADIENT_BYTES`), ``logit_bytes + 4``;
    * a fused kernel (``fused_loss``: FlashAttention's ``cross_entropy``) keeps the logits and writes
      their gradient in their dtype, ``2 x logit_bytes``;
    * PyTorch's ``cross_entropy`` on fp32 logits (``torch_loss``): :data:`TORCH_LOSS_BYTES`.

    >>> loss_bytes_per_logit(ExecutionModel(), 2), loss_bytes_per_logit(ExecutionModel(fused_loss=True), 2)
    (6, 4)
    >>> loss_bytes_per_logit(ExecutionModel(torch_loss=True), 2)
    12
    """
    if execution.torch_loss:
        return TORCH_LOSS_BYTES
    return logit_bytes + (logit_bytes if execution.fused_loss else OUTPUT_GRADIENT_BYTES)


@dataclass(frozen=True, slots=True, kw_only=True)
class MemoryArrays:
    """Per-device memory of one op under each configuration (bytes, each ``(K,)``)."""

    params_bytes: np.ndarray
    grads_bytes: np.ndarray
    optimizer_bytes: np.ndarray
    activations_bytes: np.ndarray
    other_bytes: np.ndarray

    @property
    def total_bytes(self) -> np.ndarray:
        return self.params_bytes + self.grads_bytes + self.optimizer_bytes + self.activations_bytes + self.other_bytes


def op_memory_bytes(
    op: Op,
    space: ConfigSpace,
    *,
    tensors: Mapping[str, Tensor],
    settings: TrainingSettings,
    owned_inputs: Collection[int] | None = None,
    recomputed: bool = False,
    external_inputs: Sequence[int] = (),
    execution: ExecutionModel | None = None,
    role: str | None = None,
    graph_output: bool = False,
    dtypes: tuple[Sequence[str | None], Sequence[str | None]] | None = None,
    shared: Collection[tuple[str, int]] = (),
    sac_saved: bool = False,
) -> MemoryArrays:
    """Memory breakdown of ``op`` under every configuration (see the module docstring).

    Parameters
    ----------
    op, space:
        The op and its configurations.
    tensors:
        The graph's tensors.
    settings:
        Precision, optimizer, ZeRO stage.
    owned_inputs, recomputed, external_inputs, execution, role, graph_output, dtypes, shared, sac_saved:
        See :func:`parameter_state_bytes` and :func:`saved_activation_bytes`.

    Returns
    -------
    MemoryArrays
    """
    params, grads, optimizer = parameter_state_bytes(
        op, space, tensors=tensors, settings=settings, owned_inputs=owned_inputs, graph_output=graph_output
    )
    activations = saved_activation_bytes(
        op, space, tensors=tensors, settings=settings, recomputed=recomputed, external_inputs=external_inputs,
        execution=execution, role=role, graph_output=graph_output, dtypes=dtypes, shared=shared, sac_saved=sac_saved,
    )
    other = OTHER_FRACTION * (params + grads + optimizer + activations)
    return MemoryArrays(
        params_bytes=params,
        grads_bytes=grads,
        optimizer_bytes=optimizer,
        activations_bytes=activations,
        other_bytes=other,
    )


def pipelined_activation_bytes(per_micro_batch: np.ndarray, in_flight: np.ndarray, working_inside: np.ndarray,
                               working_set: float, tail_bytes: np.ndarray | float = 0.0,
                               tail_in_flight: np.ndarray | float | None = None) -> np.ndarray:
    r"""``(S,)`` activation bytes each pipeline stage holds at its peak.

    ``per_micro_batch``: each stage's activations of one micro-batch as the per-op tables charge them,
    ``working_inside`` of which is the recomputation working set the first block instance stands for
    (module docstring); ``working_set``: that working set (one region re-run, bytes). The checkpoints
    are held for every in-flight micro-batch, the working set once, on every stage, while it
    re-runs one region in backward (Korthikanti et al., MLSys 2023, section 4.3: the first stage keeps
    ``p`` micro-batches' layer inputs, and full recomputation adds one layer's activations at a time;
    Megatron-Core's ``tensor_parallel.random.CheckpointFunction.backward`` re-runs one checkpointed layer
    per call). ``tail_bytes`` of it, the output layer's and the loss's, for ``tail_in_flight`` micro-batches
    (default ``in_flight``; a looped schedule's last chunk holds one: :mod:`objectives.after_layers`):

    .. math:: A_s = (a_s - w_s - t_s)\,n_s + t_s\,n^t_s + w \quad (\text{no pipeline, } n = 1:\ a_s\text{, the tables' charge})

    >>> pipelined_activation_bytes(np.array([10.0, 4.0]), np.array([3.0, 2.0]), np.array([6.0, 0.0]), 6.0).tolist()
    [18.0, 14.0]
    >>> pipelined_activation_bytes(np.array([10.0]), np.array([4.5]), np.array([0.0]), 0.0, 4.0, 1.0).tolist()
    [31.0]
    """
    tail_held = tail_bytes * (in_flight if tail_in_flight is None else tail_in_flight)
    return (per_micro_batch - working_inside - tail_bytes) * in_flight + tail_held + working_set


def fp8_saved_input(op: Op, tensors: Mapping[str, Tensor], settings: TrainingSettings, *, graph_output: bool = False) -> bool:
    """Whether ``op`` keeps its inputs as their FP8 cast (:data:`FP8_SAVED_INPUT_BYTES`): an FP8 linear
    layer (:func:`objectives.precision.is_fp8_linear`) under delayed scaling, Transformer Engine's."""
    return settings.fp8 == "delayed" and is_fp8_linear(op, tensors, settings, graph_output=graph_output)
