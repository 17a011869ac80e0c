r"""Compute time of one op under each configuration: roofline, or measured with roofline fallback.

Roofline, for the per-device shard of a configuration on :math:`P = \prod_d f_d` devices:

.. math::

    t_{fwd} = \max\left(\frac{F / P}{\pi_{dtype}\,\eta_{family}},
                         \frac{B_{fwd}}{bw_{mem}\,\eta_{mem}}\right), \qquad
    t_{bwd} = \max\left(\frac{\rho F / P}{\pi_{dtype}\,\eta_{family}},
                         \frac{2 B_{fwd}}{bw_{mem}\,\eta_{mem}}\right)

plus the device's ``kernel_latency_s`` once per kernel (one forward, :data:`BACKWARD_KERNELS`
backward), with :math:`F` the op's forward FLOPs (``Op.flops``), :math:`\rho` its ``backward_flops_factor``,
:math:`B_{fwd}` the bytes of every operand shard it reads and writes (:func:`forward_bytes`), and
:math:`\pi` the device's dense peak for the training precision (:func:`peak_flops_per_s`).

Measured: a ``measured(op, factors) -> seconds | (forward, backward) | None`` callable (the profile
database of :mod:`objectives.profile`) gives the forward time of the shard, and the backward time
where it was measured too (PyTorch profiles); otherwise backward is :math:`\rho` times the forward.
Where it returns ``None`` the roofline is used and the fallback is counted
(:attr:`ComputeTimes.fallbacks`), so a report can say how much of the model was really measured.

Under an execution model (:class:`objectives.execution.ExecutionModel`, ``--engine`` /
``--attention``), each pass of an op is priced as the kernels the launcher runs for it
(:func:`kernel_counts`):

.. math::

    t_{pass} = \max\Big(\underbrace{t_{roofline}(F_{main}, B_{main}) + \frac{B_{pw}}{bw_{mem}\,\eta_{mem}}
               + n_{kernels}\,\kappa}_{\text{device}},\;
               \underbrace{n_{kernels}\,h}_{\text{host}}\Big)

with :math:`\kappa` the device's ``kernel_overhead_s``, :math:`h` its ``host_dispatch_s`` (a kernel
shorter than the host's time to issue it leaves the GPU waiting: small micro-batches are bound by
the host; :math:`h = 0` inside a captured CUDA graph, ``TrainingSettings.cuda_graphs``) and :math:`B_{pw}` the extra traffic of the op's fused elementwise chain
(:func:`pointwise_bytes`): under ``eager`` every folded ONNX node (a trailing exact GELU or SiLU,
:data:`SINGLE_OP_DECOMPOSITIONS`, as one: :func:`eager_kernel_nodes`) reads and writes the op's output
shard once in forward (:data:`POINTWISE_BACKWARD_BYTES` times that in backward); under ``fused`` the
chain after a product is one epilogue kernel with one read and one write, and a chain that is the
op itself (an elementwise or norm op) costs nothing beyond its operands. An attention core under a
fused kernel (``flash`` or ``cudnn``, :mod:`objectives.attention`) prices its two products at the
kernel's measured rate for the core's length, head dim and mask (:mod:`objectives.flash_rates`;
backward: :data:`~objectives.execution.FLASH_BACKWARD_FLOPS_FACTOR` x the FLOPs at the backward's
rate), reading Q, K, V and writing the output only; its softmax and the elementwise ops between are
inside the kernel (0 s). A causal core's products do only the tiles on and below the diagonal
(``flash_shape``, :attr:`objectives.attention.AttentionCore.flash_work`, about half); ``explicit``
attention pays the whole masked score matrix.
The optimizer step (:func:`optimizer_step_time_s`) is one memory-bound pass over the parameter
states an op owns: :data:`OPTIMIZER_BYTES_PER_PARAMETER` bytes per parameter of the (ZeRO-sharded)
shard (:data:`OPTIMIZER_BYTES_PER_PARAMETER_BF16_STATE` under a bf16 optimizer state), or the host's time to visit each parameter tensor, whichever is longer.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

import numpy as np

from objectives._common import axis_factor_matrix, element_bytes, is_float, shard_elements
from objectives.attention import FlashShape, grid_inputs
from objectives.flash_rates import flash_efficiencies, in_training_share
from objectives.execution import (
    FLASH_BACKWARD_EFFICIENCY,
    FLASH_BACKWARD_FLOPS_FACTOR,
    FLASH_BACKWARD_KERNELS,
    FLASH_EFFICIENCY,
    ExecutionModel,
)
from objectives.fixed_costs import host_dispatch_s
from objectives.precision import cast_bytes, fp8_peak_flops_per_s, is_fp8_linear
from objectives.replication import zero_states_degree
from planner.core.cluster import Device
from planner.core.configs import ConfigSpace
from planner.core.graph import Op, Tensor, TensorAccess
from planner.core.settings import TrainingSettings

__all__ = [
    "FAMILY_EFFICIENCY",
    "DEFAULT_EFFICIENCY",
    "family_efficiency",
    "MEMORY_BANDWIDTH_EFFICIENCY",
    "BACKWARD_BYTES_FACTOR",
    "BACKWARD_KERNELS",
    "MeasuredFn",
    "ComputeTimes",
    "compute_dtype",
    "peak_flops_per_s",
    "forward_bytes",
    "lookup_read_elements",
    "roofline_time_s",
    "op_compute_time_s",
    "VIEW_KINDS",
    "AMP_FP32_KINDS",
    "MISALIGNED_MATMUL_EFFICIENCY",
    "GEMM_ALIGNMENT",
    "POINTWISE_BACKWARD_BYTES",
    "POINTWISE_BACKWARD_KERNELS",
    "EAGER_PARAMETER_KERNELS",
    "casts_parameters",
    "eager_fp32_traffic",
    "OPTIMIZER_BYTES_PER_PARAMETER",
    "OPTIMIZER_BYTES_PER_PARAMETER_BF16_STATE",
    "KernelCounts",
    "folded_nodes",
    "SINGLE_OP_DECOMPOSITIONS",
    "eager_kernel_nodes",
    "kernel_counts",
    "pointwise_bytes",
    "optimizer_step_time_s",
    "updated_parameters",
]

MeasuredFn = Callable[[Op, Mapping[str, int]], "float | tuple[float, float | None] | None"]
"""``(op, {dim: factor}) -> forward seconds of the per-device shard`` (or ``(forward, backward)``
seconds where the backward was measured), ``None`` if unknown."""

FAMILY_EFFICIENCY: dict[str, float] = {
    "matmul": 0.70,
    "conv": 0.60,
    "rnn": 0.40,
    "embedding": 0.50,
    "gather": 0.50,
}
"""[Empirical] Fraction of the dense peak FLOP/s an op family reaches. Large GEMMs reach 70-80% of
peak on recent GPUs (cuBLAS/Megatron MFU reports), convolutions a little less, recurrent cells
(many small GEMMs) much less. Other families are memory-bound, where this barely matters.

Sources found (h31f, 2026-12-02; docs/VALIDATION.md, "Constants without a cited source"): matmul
0.70 is under the best-shape ceiling and not pinned by it. stas00/ml-engineering
``compute/accelerator/README.md`` (commit b9e2972), "Maximum Achievable Matmul FLOPS" BF16 table
(best of a shape search, mean of 100 iterations): A100 SXM 271.2 of 312 TFLOPS (86.9%), H100 SXM
794.5 of 989 (80.3%); pytorch/ao PR #2427 (``bench_matmul.py``, B200, bf16 cubes 3072-8192):
``pct_peak`` 0.627-0.672. Measured on this project's shapes (h32b reading docs/COST_MODEL.md section 5:
``bench/gpu_roofline.py``, one H100 SXM, PyTorch 2.11, bf16): GPT-2 and Llama's compute-bound product
shards of 100 us or more with every dim a multiple of 8 (9 shards) run at **0.68** of the bf16 peak
forward (0.60-0.74), 0.79 backward; shards of 10-100 us at 0.50, under 10 us at 0.35 (the per-kernel
fixed time, priced apart as ``kernel_latency_s`` / ``kernel_overhead_s``).

conv 0.60 and rnn 0.40 (h32b, 2026-12-02): Baidu DeepBench's README, "Training Results" (the fastest
processor per kernel, fp32, cuDNN), forward TFLOPS over the GPU's fp32 peak (boost clock x cores x 2):
convolutions 6.74 / 12.15 (TitanXp), 10.68 / 12.15 (TitanXp), 4.26 / 10.6 (Tesla P100, C = 3), 7.68 / 11.34
(GTX 1080 Ti), 6.45 / 10.97 (TitanX Pascal) = 0.55, 0.88, 0.40, 0.68, 0.59 (median **0.59**); recurrent
layers LSTM 1024 x 128 5.17 / 12.15 (0.43), GRU 2816 x 32 4.05 / 10.97 (0.37), vanilla RNNs 1.86 / 6.60
(0.28) and 1.20 / 10.97 (0.11): 0.40 lies at the LSTM / GRU figures, above the vanilla cells. Pascal-era
CUDA-core figures, not tensor cores; no fit row runs a convolution or a recurrent layer (the one-GPU
ResNet rows are held out in bench/fidelity), so neither value is fitted. embedding / gather 0.50: their
ops carry no FLOPs (or a pooled bag's few): ``bench/efficiency_reach.py`` gives the efficiency under
which their FLOP term would outlast their bytes, at most 6.7e-4 over every configuration of the fit
rows' models, so any value above it prices the same: the figure moves no price (docs/VALIDATION.md)."""

DEFAULT_EFFICIENCY = 0.50
"""[Empirical] FLOP/s efficiency of families not in :data:`FAMILY_EFFICIENCY` (elementwise, norm,
softmax, concat, slice, reduce, pool...). No source found (h31f, 2026-12-02), and none is needed to price
them (h32b, 2026-12-02): these ops stream far more bytes than they compute, and the efficiency under
which their FLOP term would outlast their bytes term is at most 0.0105 (elementwise), 0.0092 (softmax),
0.0065 (norm) over every configuration of every op of the bench/fidelity fit rows' models on their devices
(``bench/efficiency_reach.py``; docs/VALIDATION.md, "Constants' sources and fits"): any value above 0.011
gives every fit row the same price. 0.50 is a placeholder that moves no price, not a measurement."""


def family_efficiency(kind: str, device: Device) -> float:
    """Fraction of the dense peak an op family reaches on ``device``: the device's fitted
    ``matmul_efficiency`` for products where it has one, else :data:`FAMILY_EFFICIENCY` /
    :data:`DEFAULT_EFFICIENCY`.

    Examples
    --------
    >>> from objectives.cluster import get_device
    >>> family_efficiency("matmul", get_device("a100-80gb")), family_efficiency("conv", get_device("a100-80gb"))
    (0.7, 0.6)
    """
    if kind == "matmul" and device.matmul_efficiency is not None:
        return float(device.matmul_efficiency)
    return FAMILY_EFFICIENCY.get(kind, DEFAULT_EFFICIENCY)

MEMORY_BANDWIDTH_EFFICIENCY = 0.80
"""[Empirical] Fraction of the spec-sheet memory bandwidth a streaming kernel reaches (STREAM-like
kernels measure 80-90% on HBM GPUs).

Sources found (h31f, 2026-12-02), a little above 0.80 for pure streams: NVIDIA developer forum,
"Trouble to Reach Peak Bandwidth of A100"
(forums.developer.nvidia.com/t/trouble-to-reach-peak-bandwidth-of-a100/339083): a read kernel
at 1.80 of an A100 80GB SXM's 2.04 TB/s (88%, Nsight Compute agreeing), "the maximum memory
bandwidth achieved by any kernel was around 90%" (a GTC talk, as that post quotes it);
mikamirai.com/blog/gpu-memory-bandwidth (H100 SXM5, Nsight Compute): coalesced matrix load
2.8 TB/s (84%), MLP weight load 2.6 TB/s (78%)."""

BACKWARD_KERNELS: dict[str, int] = {"matmul": 2, "conv": 2, "norm": 2, "rnn": 2}
"""Kernels of an op's backward pass, each paying the device's ``kernel_latency_s`` (the gradients of
both operands of a product, of the input and the parameters of a norm); 1 for other families."""

BACKWARD_BYTES_FACTOR = 2.0
"""[Empirical] Backward bytes / forward bytes: the backward pass reads the output gradient and the
saved operands and writes one gradient per operand, about twice the forward's traffic.

No measurement found (h31f, 2026-12-02). Counting the tensors each gradient kernel of PyTorch's
``tools/autograd/derivatives.yaml`` reads and writes: 2.0 for a product of two tensors (``mm``,
``mul.Tensor``: each operand's gradient reads ``grad`` and the other operand, 6 tensors against the
forward's 3), 1.5 for a unary op (``tanh``: ``tanh_backward(grad, result)``, 3 against 2), none for
``add`` (``grad`` passed on): 2.0 overstates unary elementwise backward by a third (docs/VALIDATION.md).

Measured (h32b, 2026-12-02, reading docs/COST_MODEL.md section 5, the project's own timings:
``bench/gpu_roofline.py`` on one H100 SXM, PyTorch 2.11, bf16, every op shard of GPT-2 and Llama at batch
8 on up to 8 devices, L2 flushed, CUDA events around each call): the memory-bound single-input families
the factor prices take about twice their forward in backward, norm 2.1-2.3x (medians of measured /
roofline 4.51 forward, 4.77 backward with the factor at 2.0) and softmax about 2.3x (1.41 forward, 1.60
backward), so 2.0 holds where the derivatives.yaml count gives 1.5 (PyTorch's norm and softmax backward
kernels read and write more than the count's minimum); it overstates Add and Concat (about free: the
gradient is passed on as a view) and understates embedding (10-30x its roofline: a scatter-add). Value kept."""


MISALIGNED_MATMUL_EFFICIENCY = 0.13
"""[Empirical] FLOP/s efficiency of a product whose per-device ``n`` or ``k`` is not a multiple of
:data:`GEMM_ALIGNMENT` elements (execution models only): tensor-core GEMMs then fall back to
slower kernels. GPT-2's 50,257-row LM head measured 0.11-0.13 of an H100's bf16 peak against
0.69-0.70 with 50,304 rows, both weight layouts (docs/COST_MODEL.md §5); Megatron pads the
vocabulary for this reason (``--make-vocab-size-divisible-by``)."""

GEMM_ALIGNMENT = 8
"""Elements a bf16/fp16 GEMM's ``n`` and ``k`` must be a multiple of for the fast tensor-core
kernels (16 bytes; NVIDIA's "Matrix Multiplication Background" guide, "Tensor Core Requirements")."""

AMP_FP32_KINDS = frozenset({"elementwise", "norm", "softmax"})
"""Families PyTorch eager runs in fp32 under bf16 autocast (``engine="eager"``, ``bf16-mixed``):
autocast casts only products and convolutions to bf16 and runs norms and softmax in fp32 (PyTorch
AMP docs, "CUDA Ops that can autocast to float32"); the residual stream stays fp32 because the
parameters are (an Add of a bf16 product and an fp32 residual promotes). Their traffic is priced at
4 bytes per element instead of 2."""

VIEW_KINDS = frozenset({"slice", "data_movement"})
"""Op families whose main node is a view in PyTorch (Split, Slice, Transpose, Gather of a head):
no forward kernel of their own (their backward writes the gradient: one kernel)."""

POINTWISE_BACKWARD_BYTES = 1.5
"""Backward traffic of one folded elementwise node / its forward traffic: it reads the output
gradient and one saved operand and writes the input gradient (3 passes against the forward's 2)."""

POINTWISE_BACKWARD_KERNELS = 2
"""Backward kernels of one folded elementwise node under ``eager``: autograd runs its backward
function (``MulBackward0`` of two tensors launches one product per operand) and adds the gradients
of a value used twice (GeLU-tanh uses x three times): about 2 per node."""

EAGER_PARAMETER_KERNELS: dict[str, int] = {"forward": 1, "backward": 1}
"""Kernels per parameter tensor under ``eager`` in mixed precision: the forward cast of a product's
fp32 weight or bias to bf16 (autocast: PyTorch AMP docs, "CUDA Ops that can autocast to float16"),
and in backward the gradient's cast back to the fp32 parameter's dtype (every parameter); a
product's bias also takes one reduction kernel for its gradient."""

OPTIMIZER_BYTES_PER_PARAMETER: dict[str, float] = {"adam": 28.0, "sgd": 20.0}
"""Bytes one optimizer step moves per parameter. Adam(W): reads the parameter (or fp32 master
copy), its gradient and both moments (4 x 4 bytes; a bf16 gradient is 2 and the bf16 copy written
back 2 more), writes parameter and moments (3 x 4): 28. SGD with momentum: reads parameter,
gradient, momentum, writes parameter and momentum: 20."""

OPTIMIZER_BYTES_PER_PARAMETER_BF16_STATE: dict[str, float] = {"adam": 14.0, "sgd": 10.0}
""":data:`OPTIMIZER_BYTES_PER_PARAMETER` under a bf16 optimizer state (``TrainingSettings.optimizer_state_dtype``:
Apex ``DistributedFusedAdam(dtype=bf16)``, no master copy, the bf16 parameter updated in place). Adam(W): reads
the bf16 parameter, gradient and both moments (4 x 2 bytes), writes parameter and moments (3 x 2): 14. SGD with
momentum: reads parameter, gradient, momentum, writes parameter and momentum (5 x 2): 10."""


SINGLE_OP_DECOMPOSITIONS: tuple[tuple[str, ...], ...] = (
    ("Sigmoid", "Mul"),
    ("Div", "Erf", "Add", "Mul", "Mul"),
)
"""Node sequences the ONNX exporter writes for *one* PyTorch op that saves only its input
(``torch/onnx/symbolic_opset9.py``: ``silu`` is ``Mul(x, Sigmoid(x))``; exact ``gelu`` is
``Mul(Mul(x, Add(Erf(Div(x, sqrt 2)), 1)), 0.5)``; ``derivatives.yaml``: ``silu_backward(grad, self)``,
``gelu_backward(grad, self)``). At the end of a coarse op under ``engine="eager"`` they run as that one
op (``nn.SiLU``, ``nn.GELU``), whose input is the pre-activation the op already keeps. A SiLU written
out by hand (``x * torch.sigmoid(x)``) exports the same and would keep the sigmoid too: the graph cannot
tell them apart, and the library activations are the common case."""

@dataclass(frozen=True, slots=True, kw_only=True)
class KernelCounts:
    """Kernels one op launches per pass under an execution model."""

    forward: int
    backward: int


def casts_parameters(settings: TrainingSettings) -> bool:
    """Whether eager casts each parameter tensor a product reads and each parameter's gradient
    (:data:`EAGER_PARAMETER_KERNELS`): not for bf16 modules without autocast (``TrainingSettings.autocast``
    off under ``bf16-mixed``), whose parameters the FSDP wrapper gathers in bf16 already, one cast of each
    unit's flat shard before the gather and of its reduced gradient shard after (torch 2.13
    ``distributed/fsdp/_flat_param.py``, ``_use_low_precision_shard`` and ``_flat_param_to``; the shard is
    ``1 / dp`` of the unit, not priced).

    >>> casts_parameters(TrainingSettings()), casts_parameters(TrainingSettings(autocast=False))
    (True, False)
    """
    return settings.autocast or settings.precision != "bf16-mixed"


def eager_fp32_traffic(op: Op, settings: TrainingSettings, execution: ExecutionModel) -> tuple[bool, bool]:
    """``(operands, interior)``: whether an op's operand traffic and its folded nodes' traffic move fp32 (4
    bytes per element) where the training precision says bf16, under ``engine="eager"`` in ``bf16-mixed``.

    Under autocast both for :data:`AMP_FP32_KINDS`. For bf16 modules without autocast
    (``TrainingSettings.autocast`` off) a norm reads and writes bf16 but computes its statistics in fp32 (Hugging
    Face's ``LlamaRMSNorm`` and FMS's ``LayerNormParameterized(use_high_precision_pow=True)`` upcast the
    input, square, average, scale and cast back): its folded nodes move fp32; every other op moves bf16.

    >>> from planner.core.graph import Op
    >>> norm = Op(name="n", kind="norm", op_type="LayerNormalization", dims=(), inputs=(), outputs=(), flops=0.0)
    >>> eager = ExecutionModel(engine="eager", attention="flash")
    >>> eager_fp32_traffic(norm, TrainingSettings(), eager), eager_fp32_traffic(norm, TrainingSettings(autocast=False), eager)
    ((True, True), (False, True))
    """
    if not (execution.eager and settings.precision == "bf16-mixed"):
        return False, False
    if settings.autocast:
        amp = op.kind in AMP_FP32_KINDS
        return amp, amp
    return False, op.kind == "norm"


def folded_nodes(op: Op, tensors: Mapping[str, Tensor] | None = None) -> int:
    """ONNX nodes folded into ``op`` that run as kernels of their own in PyTorch eager.

    Every node of the coarse op but the main one (``Op.onnx_nodes``, at least ``fused_pointwise``),
    less a bias ``Add`` folded after a ``MatMul`` with a 1-D parameter operand: the dynamo exporter
    writes ``nn.Linear`` as MatMul + Add, which PyTorch runs as one ``addmm`` kernel.

    Examples
    --------
    >>> from planner.core.graph import Op
    >>> folded_nodes(Op(name="g", kind="elementwise", op_type="Add", dims=(), inputs=(), outputs=(),
    ...                 flops=0.0, fused_pointwise=7))
    7
    """
    folded = max(len(op.onnx_nodes), 1 + op.fused_pointwise) - 1
    if folded and tensors is not None and op.op_type == "MatMul":
        bias = any(
            (t := tensors.get(a.tensor)) is not None and t.role == "parameter" and len(t.shape) == 1 for a in op.inputs
        )
        folded -= 1 if bias else 0
    return folded


def eager_kernel_nodes(op: Op, tensors: Mapping[str, Tensor] | None = None) -> int:
    """Folded nodes of ``op`` that PyTorch eager runs as kernels of their own.

    :func:`folded_nodes`, less all but one node of a trailing :data:`SINGLE_OP_DECOMPOSITIONS`
    sequence: ``nn.GELU`` / ``nn.SiLU`` run as one kernel forward (``gelu``, ``silu``) and one backward
    (``gelu_backward``, ``silu_backward``), however many ONNX nodes the exporter writes for them.

    Examples
    --------
    >>> from planner.core.graph import Op
    >>> up = Op(name="up", kind="matmul", op_type="MatMul", dims=(), inputs=(), outputs=(), flops=0.0,
    ...         fused_pointwise=5, onnx_nodes=("mm", "d", "e", "a", "m", "m2"),
    ...         node_types=("MatMul", "Div", "Erf", "Add", "Mul", "Mul"))
    >>> folded_nodes(up), eager_kernel_nodes(up)  # the exact GELU: one kernel
    (5, 1)
    """
    folded = folded_nodes(op, tensors)
    types = tuple(op.node_types or ())
    for pattern in SINGLE_OP_DECOMPOSITIONS:
        if len(types) >= len(pattern) and types[-len(pattern):] == pattern:
            return max(folded - (len(pattern) - 1), 0)
    return folded


def kernel_counts(
    op: Op, execution: ExecutionModel, role: str | None = None, *, parameters: int = 0, biases: int = 0,
    folded: int | None = None,
) -> KernelCounts:
    """Forward and backward kernels of ``op`` under ``execution`` (module docstring).

    ``eager``: one kernel per ONNX node of the coarse op (``Op.onnx_nodes``; a view-like main node
    launches none), backward :data:`BACKWARD_KERNELS` for the main node plus
    :data:`POINTWISE_BACKWARD_KERNELS` per folded node. ``fused``: the main kernel, plus one epilogue
    kernel for a product's fused elementwise chain (Megatron's bias-GeLU, Inductor's pointwise
    kernel), the same again in backward. ``folded``: the op's :func:`folded_nodes` (default: without
    the bias rule). Under ``eager``, ``parameters`` float parameter tensors read
by the op (``biases`` of them 1-D operands of a product) add :data:`EAGER_PARAMETER_KERNELS` (the
forward casts only for products and convolutions). ``role`` (:func:`objectives.attention.attention_roles`)
    under ``flash``: the core is one forward and :data:`~objectives.execution.FLASH_BACKWARD_KERNELS`
    backward kernels, counted on its score product.

    Examples
    --------
    >>> from planner.core.graph import Op
    >>> gelu = Op(name="g", kind="elementwise", op_type="Add", dims=(), inputs=(), outputs=(), flops=0.0,
    ...           fused_pointwise=7, onnx_nodes=tuple("abcdefgh"))
    >>> kernel_counts(gelu, ExecutionModel(engine="eager"))  # 1 + 7 folded; 1 + 2 x 7
    KernelCounts(forward=8, backward=15)
    >>> kernel_counts(gelu, ExecutionModel(engine="fused"))
    KernelCounts(forward=1, backward=1)
    """
    if execution.flash and role is not None:
        if role == "score":
            return KernelCounts(forward=1, backward=FLASH_BACKWARD_KERNELS)
        return KernelCounts(forward=0, backward=0)
    main_forward = 0 if op.kind in VIEW_KINDS else 1
    main_backward = BACKWARD_KERNELS.get(op.kind, 1)
    if folded is None:
        folded = folded_nodes(op)
    if execution.eager:
        casts = EAGER_PARAMETER_KERNELS["forward"] * parameters if op.kind in ("matmul", "conv") else 0
        grads = EAGER_PARAMETER_KERNELS["backward"] * parameters + (biases if op.kind in ("matmul", "conv") else 0)
        return KernelCounts(
            forward=main_forward + folded + casts,
            backward=main_backward + POINTWISE_BACKWARD_KERNELS * folded + grads,
        )
    epilogue = 1 if folded and op.kind in ("matmul", "conv") else 0
    return KernelCounts(forward=main_forward + epilogue, backward=main_backward + epilogue)


def _output_bytes(op: Op, space: ConfigSpace, tensors: Mapping[str, Tensor], settings: TrainingSettings) -> np.ndarray:
    total = np.zeros(space.size)
    for access in op.outputs[:1]:
        tensor = tensors.get(access.tensor)
        if tensor is not None:
            total += shard_elements(space, op, access, tensor.shape) * element_bytes(tensor, settings)
    return total


def pointwise_bytes(
    op: Op, space: ConfigSpace, *, tensors: Mapping[str, Tensor], settings: TrainingSettings, execution: ExecutionModel
) -> np.ndarray:
    """``(K,)`` forward bytes the op's folded elementwise nodes move beyond its operands.

    ``eager``: each folded node reads and writes one tensor of the output shard's size (2 passes
    each); ``fused``: a product's epilogue reads and writes its output once (2 passes), a chain
    fused into an elementwise or norm kernel moves nothing more.
    """
    folded = folded_nodes(op, tensors)
    if execution.eager:
        passes = 2.0 * eager_kernel_nodes(op, tensors)
    else:
        passes = 2.0 if folded and op.kind in ("matmul", "conv") else 0.0
    if not passes:
        return np.zeros(space.size)
    return passes * _output_bytes(op, space, tensors, settings)


def updated_parameters(
    op: Op, tensors: Mapping[str, Tensor], owned_inputs: Sequence[int]
) -> list[tuple[TensorAccess, Tensor]]:
    """The float parameter tensors ``op`` owns (its ``owned_inputs`` positions), each of which the
    optimizer steps, and the host dispatches once (:func:`optimizer_step_time_s`)."""
    found = []
    for position in owned_inputs:
        access = op.inputs[position]
        tensor = tensors.get(access.tensor)
        if tensor is not None and is_float(tensor):
            found.append((access, tensor))
    return found


def optimizer_step_time_s(
    op: Op,
    space: ConfigSpace,
    *,
    tensors: Mapping[str, Tensor],
    device: Device,
    settings: TrainingSettings,
    owned_inputs: Sequence[int],
) -> np.ndarray:
    """``(K,)`` seconds of the optimizer step over the parameters ``op`` owns.

    A memory-bound pass: :data:`OPTIMIZER_BYTES_PER_PARAMETER` bytes per element of each owned
    parameter shard (divided by the ZeRO degree from stage 1 on: each rank updates its share), at
    the streaming bandwidth; at least the device's ``host_dispatch_s`` per parameter tensor (PyTorch's
    AdamW visits each tensor on the host: 5.2-7 ms per step for 25-155M parameters in 75-200
    tensors on an H100, whatever the size; ../shared/calibration/).

    Examples
    --------
    >>> from planner.core.graph import IterDim, Op, Tensor, TensorAccess
    >>> from planner.core.configs import ConfigOptions, enumerate_configs
    >>> from objectives.cluster import get_device
    >>> w = Tensor(name="w", shape=(4096, 4096), dtype="float32", role="parameter")
    >>> op = Op(name="mm", kind="matmul", op_type="MatMul", dims=(IterDim(name="k", size=4096, kind="reduction"),
    ...         IterDim(name="n", size=4096)), inputs=(TensorAccess(tensor="w", axes=(("k",), ("n",))),),
    ...         outputs=(), flops=0.0)
    >>> space = enumerate_configs(op, ConfigOptions(devices=1, devices_per_node=1))
    >>> dev = get_device("h100-sxm")
    >>> t = optimizer_step_time_s(op, space, tensors={"w": w}, device=dev, settings=TrainingSettings(),
    ...                           owned_inputs=[0])
    >>> round(float(t[0]) * 1e6, 1)  # 16.8M params x 28 B / (3.35 TB/s x 0.8)
    175.3
    >>> t = optimizer_step_time_s(op, space, tensors={"w": w}, device=dev,
    ...                           settings=TrainingSettings(optimizer_state_dtype="bf16"), owned_inputs=[0])
    >>> round(float(t[0]) * 1e6, 1)  # a bf16 state: 14 B per parameter, half the bytes
    87.6
    """
    table = OPTIMIZER_BYTES_PER_PARAMETER_BF16_STATE if settings.optimizer_state_dtype == "bf16" else OPTIMIZER_BYTES_PER_PARAMETER
    per = table.get(settings.optimizer, table["adam"])
    moved = np.zeros(space.size)
    updated = updated_parameters(op, tensors, owned_inputs)
    count = len(updated)
    for access, tensor in updated:
        shard = shard_elements(space, op, access, tensor.shape).astype(np.float64)
        if settings.zero_stage >= 1:
            shard = shard / zero_states_degree(op, space, access, settings.dp_shard)
        moved += shard * per
    if not count:
        return np.zeros(space.size)
    stream = moved / (device.memory_bandwidth_bytes_per_s * MEMORY_BANDWIDTH_EFFICIENCY)
    return np.maximum(stream, count * device.host_dispatch_s)


def compute_dtype(settings: TrainingSettings) -> str:
    """The peak-FLOP/s key the training precision computes in: ``bf16`` or ``fp32``.

    Examples
    --------
    >>> compute_dtype(TrainingSettings(precision="fp32"))
    'fp32'
    """
    return "bf16" if settings.precision == "bf16-mixed" else "fp32"


def peak_flops_per_s(device: Device, dtype: str) -> float:
    """Dense peak FLOP/s of ``device`` in ``dtype``, with a fallback for dtypes it lacks.

    A half-precision dtype the device cannot run (bf16 on a V100) falls back to the fastest of
    fp16/bf16/fp32 it has, which is what mixed-precision training would use there; a missing fp32
    falls back to tf32, then to the slowest listed figure.

    Examples
    --------
    >>> from objectives.cluster import get_device
    >>> peak_flops_per_s(get_device("v100-32gb"), "bf16")  # no bf16: fp16 tensor cores
    125000000000000.0
    >>> peak_flops_per_s(get_device("gtx-1080ti"), "bf16")  # fp16 at 1/64 rate: fp32 is faster
    11340000000000.0
    """
    peaks = device.peak_flops
    if dtype in peaks:
        return float(peaks[dtype])
    if dtype in ("bf16", "fp16"):
        present = [peaks[k] for k in ("fp16", "bf16", "fp32") if k in peaks]
        if present:
            return float(max(present))
    if dtype == "fp32" and "tf32" in peaks:
        return float(peaks["tf32"])
    return float(min(peaks.values()))


def forward_bytes(op: Op, space: ConfigSpace, *, tensors: Mapping[str, Tensor], settings: TrainingSettings) -> np.ndarray:
    """``(K,)`` bytes of every operand shard the op reads or writes in its forward pass.

    A lookup (embedding, gather) reads only the table rows it gathers, not the whole table shard:
    one row shard per index. For a Gather that is as many elements as it writes (its output is one
    row per index). An embedding bag (``EmbeddingBag*``, :func:`lookup_read_elements`) reads
    ``nnz`` rows and writes one pooled row per bag, so its reads are ``nnz / B`` times its output.
    """
    total = np.zeros(space.size, dtype=np.float64)
    read = lookup_read_elements(op, space, tensors=tensors)
    for access in (*op.inputs, *op.outputs):
        tensor = tensors.get(access.tensor)
        if tensor is None:
            continue
        elements = shard_elements(space, op, access, tensor.shape)
        if read is not None and tensor.role == "parameter":
            elements = np.minimum(elements, read)
        total += elements * element_bytes(tensor, settings)
    return total


def lookup_read_elements(op: Op, space: ConfigSpace, *, tensors: Mapping[str, Tensor]) -> np.ndarray | None:
    """``(K,)`` table elements a lookup reads per device (``None``: not a lookup, or shapes unknown).

    * Gather (``embedding`` / ``gather``): the output shard, one row shard per index;
    * embedding bag (``EmbeddingBagSum/Mean/Max``, inputs ``(table [V, D], indices [nnz], offsets)``,
      :mod:`importers.embedding_bag`): the indices' shard times the table's row-width shard,
      ``nnz/b x D/d`` (``torch.nn.functional.embedding_bag`` gathers every index's row before it pools).

    Under a vocabulary (row) split every rank still issues one row read per index: DTensor's
    ``_MaskPartial`` (torch 2.13, ``distributed/tensor/placement_types.py``) and Megatron-LM's
    ``VocabParallelEmbedding`` replace an index outside the rank's rows by row 0, gather, then zero
    those rows; so the priced reads do not shrink with the vocabulary split (the repeated row 0
    mostly hits the cache: an upper bound).
    """
    if op.kind not in ("embedding", "gather") or not op.outputs:
        return None
    if op.kind == "embedding" and op.op_type.startswith("EmbeddingBag") and len(op.inputs) >= 2:
        table, indices = (tensors.get(a.tensor) for a in op.inputs[:2])
        if table is None or indices is None or len(table.shape) != 2:
            return None
        width = -(-table.shape[1] // axis_factor_matrix(space, op, op.inputs[0])[:, 1])
        return shard_elements(space, op, op.inputs[1], indices.shape) * width
    out_tensor = tensors.get(op.outputs[0].tensor)
    return None if out_tensor is None else shard_elements(space, op, op.outputs[0], out_tensor.shape)


def roofline_time_s(
    flops: np.ndarray | float,
    num_bytes: np.ndarray | float,
    *,
    peak_flops_per_s: float,
    memory_bandwidth_bytes_per_s: float,
    efficiency: float,
) -> np.ndarray:
    """``max(flops / (peak * efficiency), bytes / (bandwidth * MEMORY_BANDWIDTH_EFFICIENCY))`` in s.

    Examples
    --------
    >>> float(roofline_time_s(1e12, 1e9, peak_flops_per_s=1e12, memory_bandwidth_bytes_per_s=1e12,
    ...                       efficiency=0.5))
    2.0
    """
    flop_time = np.asarray(flops, dtype=np.float64) / (peak_flops_per_s * efficiency)
    byte_time = np.asarray(num_bytes, dtype=np.float64) / (memory_bandwidth_bytes_per_s * MEMORY_BANDWIDTH_EFFICIENCY)
    return np.maximum(flop_time, byte_time)


@dataclass(frozen=True, slots=True, kw_only=True)
class ComputeTimes:
    """Compute time of one op under each of its configurations."""

    forward_s: np.ndarray
    """``(K,)`` seconds of the forward pass."""
    backward_s: np.ndarray
    """``(K,)`` seconds of the backward pass."""
    measured: int = 0
    """Configurations whose forward time came from ``measured``."""
    fallbacks: int = 0
    """Configurations where ``measured`` had no entry and the roofline was used."""
    optimizer_s: np.ndarray | None = None
    """``(K,)`` seconds of the optimizer step over the op's parameters (execution models only)."""

    @property
    def total_s(self) -> np.ndarray:
        total = self.forward_s + self.backward_s
        return total if self.optimizer_s is None else total + self.optimizer_s


def op_compute_time_s(
    op: Op,
    space: ConfigSpace,
    *,
    tensors: Mapping[str, Tensor],
    device: Device,
    settings: TrainingSettings,
    measured: MeasuredFn | None = None,
    execution: ExecutionModel | None = None,
    role: str | None = None,
    owned_inputs: Sequence[int] = (),
    graph_output: bool = False,
    flash_shape: FlashShape | None = None,
) -> ComputeTimes:
    """Forward and backward compute time of ``op`` under every configuration of ``space``.

    Parameters
    ----------
    op, space:
        The op and its configurations.
    tensors:
        The graph's tensors (shapes and dtypes of the operands).
    device:
        Peak FLOP/s and memory bandwidth.
    settings:
        Training precision (picks the peak and the element sizes).
    measured:
        Optional measured forward seconds per configuration (see :data:`MeasuredFn`).
    execution:
        The launcher's execution model; ``None``: the plain roofline (module docstring).
    role:
        The op's part in an attention core (``score``, ``softmax``, ``value``, ``between``; see
        :func:`objectives.attention.attention_roles`), ``None`` for other ops.
    owned_inputs:
        Positions of the parameters the op accounts for, whose optimizer step it prices (execution
        models only).
    graph_output:
        The op writes a graph output (the LM head's logits): never an FP8 GEMM (:mod:`objectives.precision`).
    flash_shape:
        The op's attention core as a fused kernel sees it (:attr:`objectives.attention.AttentionCore.flash_shape`):
        under a fused attention kernel the score and value products' FLOPs are the visited tiles'
        (about half for a causal core) at the kernel's measured rate (:mod:`objectives.flash_rates`);
        ``None``: the whole square at :data:`~objectives.execution.FLASH_EFFICIENCY`.

    Returns
    -------
    ComputeTimes
    """
    fp8 = is_fp8_linear(op, tensors, settings, graph_output=graph_output)
    if execution is not None:
        times = _execution_times(op, space, tensors=tensors, device=device, settings=settings, execution=execution,
                                 role=role, fp8=fp8, flash_shape=flash_shape)
        optimizer = optimizer_step_time_s(op, space, tensors=tensors, device=device, settings=settings,
                                          owned_inputs=owned_inputs)
        forward, backward = times
        return _with_measured(op, space, forward, backward, measured, optimizer)
    devices_used = space.devices_used.astype(np.float64)
    flops_fwd = op.flops / devices_used
    bytes_fwd = forward_bytes(op, space, tensors=tensors, settings=settings)
    rates = dict(
        peak_flops_per_s=fp8_peak_flops_per_s(device) if fp8 else peak_flops_per_s(device, compute_dtype(settings)),
        memory_bandwidth_bytes_per_s=device.memory_bandwidth_bytes_per_s,
        efficiency=family_efficiency(op.kind, device),
    )
    # each pass also pays a fixed time per kernel, which dominates shards of a few microseconds
    latency = device.kernel_latency_s
    forward = roofline_time_s(flops_fwd, bytes_fwd, **rates) + latency
    backward = roofline_time_s(op.backward_flops_factor * flops_fwd, BACKWARD_BYTES_FACTOR * bytes_fwd, **rates)
    backward = backward + BACKWARD_KERNELS.get(op.kind, 1) * latency
    if fp8:  # the quantisation kernels stream beside the GEMMs (objectives.precision)
        cast_fwd, cast_bwd = cast_bytes(op, space, tensors=tensors, settings=settings)
        stream = device.memory_bandwidth_bytes_per_s * MEMORY_BANDWIDTH_EFFICIENCY
        forward, backward = forward + cast_fwd / stream, backward + cast_bwd / stream
    return _with_measured(op, space, forward, backward, measured, None)


def _with_measured(
    op: Op, space: ConfigSpace, forward: np.ndarray, backward: np.ndarray, measured: MeasuredFn | None,
    optimizer: np.ndarray | None,
) -> ComputeTimes:
    if measured is None:
        return ComputeTimes(forward_s=forward, backward_s=backward, optimizer_s=optimizer)
    found = 0
    for row in range(space.size):
        factors = {name: int(f) for name, f in zip(space.dim_names, space.factors[row])}
        seconds = measured(op, factors)
        if seconds is None:
            continue
        found += 1
        forward_s, backward_s = seconds if isinstance(seconds, tuple) else (seconds, None)
        forward[row] = float(forward_s)
        backward[row] = op.backward_flops_factor * float(forward_s) if backward_s is None else float(backward_s)
    return ComputeTimes(
        forward_s=forward, backward_s=backward, measured=found, fallbacks=space.size - found, optimizer_s=optimizer
    )


def _misaligned(op: Op, space: ConfigSpace) -> np.ndarray:
    """``(K,)`` bool: a product whose per-device ``n`` (the dims of its output's last axis) or ``k``
    (its reduction dims) is not a multiple of :data:`GEMM_ALIGNMENT`."""
    if op.kind != "matmul" or not op.outputs:
        return np.zeros(space.size, dtype=bool)
    last = set(op.outputs[0].axes[-1]) if op.outputs[0].axes else set()
    position = {name: i for i, name in enumerate(space.dim_names)}
    bad = np.zeros(space.size, dtype=bool)
    # n and k are products of dims (heads x head size of a projection merged by a folded reshape):
    # the GEMM sees their per-device product, not each dim's shard
    for chosen in ([d for d in op.dims if d.name in last], [d for d in op.dims if d.kind == "reduction"]):
        chosen = [d for d in chosen if d.name in position]
        if not chosen:
            continue
        extent = np.ones(space.size, dtype=np.int64)
        padded = np.zeros(space.size, dtype=bool)
        for dim in chosen:
            factor = space.factors[:, position[dim.name]]
            extent = extent * -(-dim.size // factor)
            padded |= dim.size % factor != 0
        # a split the dim does not divide is padded (ConfigOptions.pad), and a launcher pads to an
        # aligned size (Megatron: the vocabulary to a multiple of 128 x tp)
        bad |= (extent % GEMM_ALIGNMENT != 0) & ~padded
    return bad


def _float_bytes(op: Op, space: ConfigSpace, accesses, tensors: Mapping[str, Tensor], settings: TrainingSettings) -> np.ndarray:
    total = np.zeros(space.size)
    for access in accesses:
        tensor = tensors.get(access.tensor)
        if tensor is not None and tensor.role != "parameter":
            total += shard_elements(space, op, access, tensor.shape) * element_bytes(tensor, settings)
    return total


def _execution_times(
    op: Op,
    space: ConfigSpace,
    *,
    tensors: Mapping[str, Tensor],
    device: Device,
    settings: TrainingSettings,
    execution: ExecutionModel,
    role: str | None,
    fp8: bool = False,
    flash_shape: FlashShape | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """``(forward_s, backward_s)`` under an execution model (module docstring); ``fp8``: an FP8 linear
    (:mod:`objectives.precision`), at the FP8 peak plus its casts' traffic; ``flash_shape``: the
    attention core a fused kernel runs (its visited tiles and measured rate, :mod:`objectives.flash_rates`)."""
    devices_used = space.devices_used.astype(np.float64)
    peak = fp8_peak_flops_per_s(device) if fp8 else peak_flops_per_s(device, compute_dtype(settings))
    bandwidth = device.memory_bandwidth_bytes_per_s
    parameters = [t for a in op.inputs if (t := tensors.get(a.tensor)) is not None and t.role == "parameter" and is_float(t)]
    kernels = kernel_counts(op, execution, role if execution.flash else None,
                            parameters=len(parameters) if casts_parameters(settings) else 0,
                            biases=sum(1 for t in parameters if len(t.shape) == 1),
                            folded=eager_kernel_nodes(op, tensors) if execution.eager else folded_nodes(op, tensors))
    if execution.flash and role is not None:
        if role in ("score", "value"):
            # a causal kernel skips the tiles above the diagonal, forward and backward alike, at the
            # rate measured for its kernel, length and head dim
            tiles = 1.0 if flash_shape is None else flash_shape.tiles
            flops = tiles * op.flops / devices_used
            efficiency_fwd, efficiency_bwd = ((FLASH_EFFICIENCY, FLASH_BACKWARD_EFFICIENCY) if flash_shape is None
                                              else flash_efficiencies(execution.attention, flash_shape,
                                                                      capability=device.compute_capability))
            if flash_shape is not None:
                # FlashAttention-2's kernels run slower inside a training step than at their H100 bars
                share = in_training_share(execution.attention, capability=device.compute_capability)
                efficiency_fwd, efficiency_bwd = share * efficiency_fwd, share * efficiency_bwd
            # Q, K (score) or V and the output (value): the scores never leave the chip, and a mask
            # read on the score grid is not read (the kernel masks from indices: objectives.attention)
            if role == "score":
                grid = grid_inputs(op)
                accesses = tuple(a for k, a in enumerate(op.inputs) if k not in grid)
            else:
                accesses = (*op.inputs[1:], *op.outputs)
            moved = _float_bytes(op, space, accesses, tensors, settings)
            main_fwd = roofline_time_s(flops, moved, peak_flops_per_s=peak, memory_bandwidth_bytes_per_s=bandwidth,
                                       efficiency=efficiency_fwd)
            main_bwd = roofline_time_s(FLASH_BACKWARD_FLOPS_FACTOR * flops, BACKWARD_BYTES_FACTOR * moved,
                                       peak_flops_per_s=peak, memory_bandwidth_bytes_per_s=bandwidth,
                                       efficiency=efficiency_bwd)
        else:
            main_fwd = main_bwd = np.zeros(space.size)  # inside the flash kernel
        extra_fwd = extra_bwd = np.zeros(space.size)
    else:
        # the folded chain's FLOPs are in op.flops; in eager mode its traffic is what limits it
        rates = dict(peak_flops_per_s=peak, memory_bandwidth_bytes_per_s=bandwidth,
                     efficiency=family_efficiency(op.kind, device))
        flops = op.flops / devices_used
        moved = forward_bytes(op, space, tensors=tensors, settings=settings)
        main_fwd = roofline_time_s(flops, moved, **rates)
        main_bwd = roofline_time_s(op.backward_flops_factor * flops, BACKWARD_BYTES_FACTOR * moved, **rates)
        slow = _misaligned(op, space)
        if slow.any():
            rates["efficiency"] = MISALIGNED_MATMUL_EFFICIENCY
            main_fwd = np.where(slow, roofline_time_s(flops, moved, **rates), main_fwd)
            main_bwd = np.where(
                slow, roofline_time_s(op.backward_flops_factor * flops, BACKWARD_BYTES_FACTOR * moved, **rates), main_bwd
            )
        stream = bandwidth * MEMORY_BANDWIDTH_EFFICIENCY
        extra = pointwise_bytes(op, space, tensors=tensors, settings=settings, execution=execution)
        operands_fp32, interior_fp32 = eager_fp32_traffic(op, settings, execution)
        # a stand-in for the fp32 bytes only: without FP8 linears or a bf16 optimizer state, which fp32 settings refuse
        fp32 = dataclasses.replace(settings, precision="fp32", fp8=None, optimizer_state_dtype="fp32") \
            if operands_fp32 or interior_fp32 else settings
        if operands_fp32:
            moved = forward_bytes(op, space, tensors=tensors, settings=fp32)
            main_fwd = roofline_time_s(flops, moved, **rates)
            main_bwd = roofline_time_s(op.backward_flops_factor * flops, BACKWARD_BYTES_FACTOR * moved, **rates)
        if interior_fp32:
            extra = pointwise_bytes(op, space, tensors=tensors, settings=fp32, execution=execution)
        extra_fwd = extra / stream
        extra_bwd = POINTWISE_BACKWARD_BYTES * extra / stream
        if fp8:
            cast_fwd, cast_bwd = cast_bytes(op, space, tensors=tensors, settings=settings)
            extra_fwd, extra_bwd = extra_fwd + cast_fwd / stream, extra_bwd + cast_bwd / stream
    host = host_dispatch_s(device, cuda_graphs=settings.cuda_graphs)  # 0 inside a captured CUDA graph
    forward = np.maximum(main_fwd + extra_fwd + kernels.forward * device.kernel_overhead_s, kernels.forward * host)
    backward = np.maximum(main_bwd + extra_bwd + kernels.backward * device.kernel_overhead_s, kernels.backward * host)
    return forward, backward
