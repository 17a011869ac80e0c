r"""Fit the cost model's free constants to measured training steps, and score predictions.

A measured step is one row: a model, a cluster, a layout (tp, pp, dp, micro-batch, global batch,
recompute, ...), and the measured seconds per step (and, where known, the peak memory per device).
This module holds the pure parts of calibrating on such rows; pricing a row (importing its ONNX
file, calling :func:`planner.estimate.estimate`) is the caller's, handed in as a function
(``predict``), so nothing here imports the search or the planner (``planner/calibrate.py`` wires it).

Which constants
---------------
The spec-sheet fields of :class:`~planner.core.cluster.Device` and :class:`~planner.core.cluster.Link`
(peak FLOP/s, memory, bandwidth) are data with a source; the fields that are not on any spec sheet
are [Empirical] and are the ones fitted. They are found generically (:func:`calibratable_parameters`):
a float field whose name ends in ``_s`` but not ``_per_s`` (a fixed time, not a rate: ``kernel_latency_s``, ``kernel_overhead_s``,
``host_dispatch_s``, ``collective_overhead_s``, a link's ``latency_s``; spec-sheet fields are rates
(``..._per_s``) and sizes, never seconds) or in ``_efficiency`` (a fraction of a spec-sheet rate, e.g. the part of a
link's bandwidth NCCL reaches). A field added to either class later is fitted without a change here.

The fit
-------
For parameters :math:`\theta` and rows :math:`i` with measured step :math:`m_i`, minimise the sum of
squared relative errors

.. math::  f(\theta) = \sum_i \left(\frac{t_i(\theta) - m_i}{m_i}\right)^2 .

Every :math:`t_i` is a whole ``estimate`` call, so the fit works on a local linear model of it
(:func:`fit_parameters`): the rows are priced at the current point and once per parameter at a
step away (a finite-difference Jacobian; a fixed time enters the step time linearly, an efficiency
through its reciprocal, so the model is linear in the seconds and in ``1/efficiency``), the
bounded linear least-squares problem is solved by pymoo's pattern search (Hooke and Jeeves), the
rows are priced again at the answer and the step is kept only if the true objective fell (else a
half, a quarter, an eighth of it is tried: the step time is piecewise linear where a kernel turns
from host-bound to device-bound); this repeats for a few rounds (a damped Gauss-Newton iteration
with pymoo as the inner solver). A parameter that
moves no row's prediction is not identifiable from the rows and keeps its value.

Scores
------
:func:`error_summary`: median absolute % error, mean absolute % error (MAPE) and bias (median signed
% error, positive = predicted slower than measured) of predictions against measurements.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Literal, Mapping, Sequence

import numpy as np

from planner.core.cluster import Cluster, Device, Link
from planner.core.settings import OPTIMIZER_STATE_DTYPES
from planner.core.errors import InputError

__all__ = [
    "MODES",
    "CONVERSIONS",
    "PRECISIONS",
    "StepRow",
    "Parameter",
    "ErrorSummary",
    "FitResult",
    "parse_step_rows",
    "read_step_rows",
    "holdout_mask",
    "calibratable_parameters",
    "parameter_values",
    "with_parameters",
    "fit_parameters",
    "error_summary",
    "cluster_file_dict",
]

MODES: dict[str, tuple[str, str]] = {
    "eager": ("eager", "explicit"),
    "sdpa": ("eager", "flash"),
    "sdpa-compile": ("fused", "flash"),
    "eager-compile": ("fused", "explicit"),
}
"""A measured run's PyTorch mode (``shared/calibration/README.md``) -> (engine, attention): eager
runs one kernel per op, ``torch.compile`` fuses elementwise kernels (the Megatron class), ``sdpa``
is flash attention (no s x s scores), plain ``eager`` materialises the scores."""


def _narayanan21_eq3(measured: Mapping[str, Any], model: Mapping[str, Any], global_batch: int, devices: int) -> float:
    """Seconds per step from TFLOP/s per GPU, with the FLOP count the source computed it with.

    Narayanan et al. (SC'21, arXiv:2104.04473) equation (3): the FLOPs of one iteration (with full
    activation recomputation) are :math:`F = 96 B s l h^2 (1 + s/6h + V/16lh)`, and the table's
    throughput is :math:`X = F / (n \\cdot t)`, so :math:`t = F / (n X)`.
    """
    b, s, l, h, v = global_batch, model["seq"], model["layers"], model["hidden"], model["vocab"]
    flops = 96.0 * b * s * l * h * h * (1.0 + s / (6.0 * h) + v / (16.0 * l * h))
    return flops / (devices * float(measured["tflops_per_gpu"]) * 1e12)


def _megatron_moe_flops(measured: Mapping[str, Any], model: Mapping[str, Any], global_batch: int, devices: int) -> float:
    r"""Seconds per step from TFLOP/s per GPU under Megatron-LM's own count
    (``megatron/training/training.py``, ``num_floating_point_operations``, MCore 0.8-0.9): with
    :math:`g` query groups, :math:`a` heads, expert width :math:`f`, top-:math:`k` and SwiGLU's
    3/2, :math:`F = 12 B s l h^2 [(1 + g/a + s/h) + (f/h) k \cdot 3/2 + V/(2 l h)]` (forward and
    backward, no recomputation), so :math:`t = F / (n X)`.

    Examples
    --------
    >>> m = {"seq": 4096, "layers": 32, "hidden": 4096, "heads": 32, "kv_heads": 8, "ffn": 14336,
    ...      "top_k": 2, "vocab": 32000}
    >>> round(_megatron_moe_flops({"tflops_per_gpu": 468}, m, 256, 64), 3)  # Mixtral 8x7B, 64 H100
    2.903
    """
    b, s, l, h, v = global_batch, model["seq"], model["layers"], model["hidden"], model["vocab"]
    groups = model.get("kv_heads", model["heads"]) / model["heads"]
    mlp = model["ffn"] / h * model.get("top_k", 1) * 1.5
    flops = 12.0 * b * s * l * h * h * ((1.0 + groups + s / h) + mlp + v / (2.0 * l * h))
    return flops / (devices * float(measured["tflops_per_gpu"]) * 1e12)


def _step_s(measured: Mapping[str, Any], model: Mapping[str, Any], global_batch: int, devices: int) -> float:
    return float(measured["step_s"])


def _tokens_per_s(measured: Mapping[str, Any], model: Mapping[str, Any], global_batch: int, devices: int) -> float:
    """Seconds per step from the whole job's tokens per second: ``global_batch x seq / tokens_per_s``."""
    return global_batch * float(model["seq"]) / float(measured["tokens_per_s"])


def _tokens_per_gpu_s(measured: Mapping[str, Any], model: Mapping[str, Any], global_batch: int, devices: int) -> float:
    """Seconds per step from tokens per second per GPU: ``global_batch x seq / (tokens_per_gpu_s x GPUs)``."""
    return global_batch * float(model["seq"]) / (float(measured["tokens_per_gpu_s"]) * devices)


CONVERSIONS: dict[str, Callable[[Mapping[str, Any], Mapping[str, Any], int, int], float]] = {
    "step_s": _step_s,
    "narayanan21_eq3": _narayanan21_eq3,
    "tokens_per_s": _tokens_per_s,
    "tokens_per_gpu_s": _tokens_per_gpu_s,
    "megatron_moe_flops": _megatron_moe_flops,
}
"""How a row's published figure becomes seconds per step (``measured.conversion``): ``step_s`` is a
measured iteration time; ``narayanan21_eq3`` is TFLOP/s per GPU under that paper's equation (3);
``tokens_per_s`` / ``tokens_per_gpu_s`` are the job's tokens per second (in total / per GPU)."""


PRECISIONS: dict[str, str | None] = {
    "bf16": None,
    "te-delayed": "delayed",
    "te-current": "delayed",
    "torchao-tensorwise": "rowwise",
    "torchao-rowwise": "rowwise",
}
"""A row's training precision (``layout.precision``, the source's FP8 recipe in neutral words) -> the
planner's FP8 recipe (``TrainingSettings.fp8``; ``None``: bf16 mixed precision). The planner prices two
recipes (``objectives.precision``); a source recipe maps to the one whose kernels it runs:

* ``te-delayed``: Transformer Engine's ``DelayedScaling`` (NeMo's and Megatron-LM's default FP8 recipe)
  is the planner's ``delayed``, exactly.
* ``te-current``: Transformer Engine's ``Float8CurrentScaling`` (per-tensor scales from the tensor being
  cast: Megatron-Bridge's ``FP8-CS``) runs the same Transformer Engine modules as delayed scaling (a
  fused cast-transpose, the FP8 weight and its transpose cached between micro-batches), so ``delayed``;
  not priced: its extra amax pass over each cast tensor (2 bytes per element, beside the 4 of
  ``DELAYED_CAST_BYTES``), and delayed scaling's amax history, which it does not keep (reported only).
* ``torchao-tensorwise``: torchao's ``Float8Linear`` with one dynamic scale per tensor (torchtitan's
  Float8 default: "tensor-wise scaling with dynamic scales", torchtitan ``docs/float8.md``) casts the
  same tensors as torchao's rowwise recipe (input and weight forward; output gradient twice, weight
  and input again backward: ``matmul_with_hp_or_float8_args``), each after an amax pass, and caches no
  FP8 weight: the planner's ``rowwise`` (its torchao recipe, ``DYNAMIC_CAST_BYTES``). Not priced:
  the FP8 FSDP all-gather torchtitan's Float8 runs pair with it (``enable_fsdp_float8_all_gather``:
  the gathers are priced in bf16, twice the bytes).
* ``torchao-rowwise``: torchao's ``ROWWISE`` recipe, the planner's ``rowwise``.
"""


def _precision(layout: Mapping[str, Any], where: str) -> str:
    """``layout.precision`` (default ``bf16``), one of :data:`PRECISIONS`."""
    name = str(layout.get("precision", "bf16"))
    if name not in PRECISIONS:
        raise InputError(f"{where}: layout.precision must be one of {', '.join(PRECISIONS)} (got {name!r})")
    return name


@dataclass(frozen=True, slots=True, kw_only=True)
class StepRow:
    """One measured training step: the model, the cluster, the layout and what was measured."""

    id: str
    model: Mapping[str, Any]
    """``{"kind": "onnx", "path": ..., "dims": {...}}`` or ``{"kind": "gpt", "layers", "hidden",
    "heads", "seq", "vocab"}`` (built to an ONNX file by the caller)."""
    device: str
    """Device preset name (``h100-sxm``...)."""
    devices: int
    devices_per_node: int
    device_memory_bytes: float | None = None
    """Memory of the source's GPU (bytes, ``gpus.memory_bytes``) where it differs from the preset's
    (Meta's 96 GB H100s); ``None``: the preset's."""
    intra_link: str | Mapping[str, Any] | None = None
    """Link preset name or ``{name, bandwidth_bytes_per_s, latency_s}``; ``None``: the device's usual."""
    inter_link: str | Mapping[str, Any] | None = None
    tp: int = 1
    pp: int = 1
    dp: int = 1
    ep: int = 1
    """Expert-parallel degree of a mixture-of-experts run (``layout.ep``; Megatron's
    ``--expert-model-parallel-size``, over the data-parallel ranks); 1 for dense models."""
    cp: int = 1
    """Context-parallel degree (``layout.cp``; Megatron's ``--context-parallel-size``): devices =
    ``tp x cp x pp x dp``, each ``cp`` rank holding ``seq / cp`` tokens of its data-parallel rank's samples."""
    hsdp: int | None = None
    """Hybrid sharding (``layout.hsdp``): the data-parallel ranks the ZeRO states are sharded over, replicated
    over the rest (FSDP's ``HYBRID_SHARD``, FSDP2's ``dp_shard`` mesh dim; ``TrainingSettings.dp_shard``);
    ``None``: ZeRO over every data-parallel rank."""
    precision: str = "bf16"
    """The run's training precision (``layout.precision``, a key of :data:`PRECISIONS`)."""
    optimizer_state_dtype: str = "fp32"
    """The dtype of the run's optimizer state (``layout.optimizer_state_dtype``, ``fp32`` or ``bf16``):
    ``TrainingSettings.optimizer_state_dtype``."""
    micro_batch: int
    global_batch: int
    recompute: Literal["none", "selective", "full"] = "none"
    sequence_parallel: bool = False
    tp_comm_overlap: bool = False
    """The launcher overlapped tensor-parallel communication with the GEMMs (``layout.tp_comm_overlap``:
    Megatron-LM's ``--tp-comm-overlap``, NeMo's ``ub_tp_comm_overlap``; ``objectives.tp_overlap``)."""
    overlap_p2p_comm: bool = False
    """The launcher ran the interleaved schedule's sends and receives asynchronously (``layout.overlap_p2p_comm``:
    Megatron-Core's ``overlap_p2p_comm``; ``TrainingSettings.p2p_overlap``)."""
    zero: int = 0
    schedule: Literal["gpipe", "1f1b", "interleaved"] = "1f1b"
    chunks: int = 1
    stage_layers: tuple[int, ...] | None = None
    """Layers per pipeline stage when the run split them unevenly; ``None``: even."""
    engine: str | None = None
    """``fused`` / ``eager`` (execution model) or ``None`` (the plain roofline)."""
    attention: str | None = None
    dropout: bool = False
    """The run trains with dropout (``layout.dropout``; Hugging Face GPT-2/BERT configs in
    ``train()`` mode): priced with its masks (``objectives.execution.ExecutionModel.dropout``)."""
    fused_loss: bool = False
    """The run's loss is a fused cross-entropy kernel (``layout.loss: fused``; llm-foundry's MPT):
    ``objectives.execution.ExecutionModel.fused_loss``."""
    torch_loss: bool = False
    """The run's loss is PyTorch's ``cross_entropy`` on fp32 logits (``layout.loss: torch``; torchtitan's):
    ``objectives.execution.ExecutionModel.torch_loss``."""
    autocast: bool = True
    """An eager run in bf16 under ``torch.autocast`` with fp32 parameters (``layout.autocast``, default true); false:
    bf16 modules without autocast, their parameters cast to bf16 by the FSDP wrapper (FSDP1 ``MixedPrecision`` /
    FSDP2 ``MixedPrecisionPolicy`` with ``param_dtype=torch.bfloat16``): ``TrainingSettings.autocast``."""
    launcher: str | None = None
    """The launcher that ran it (``layout.launcher``, a launch target's name, e.g. ``deepspeed``): its
    ZeRO-3 gather granularity is priced (``Target.zero3_gather``, read by ``planner.calibrate.row_settings``);
    ``None``: ZeRO-3 gathers per wrapped block, as FSDP does."""
    step_s: float
    """Measured seconds per step."""
    memory_bytes: float | None = None
    """Measured peak memory per device (bytes), where the source gives it."""
    memory_allocated: bool = False
    """``memory_bytes`` is the allocator's peak of live tensors (``torch.cuda.max_memory_allocated``),
    to compare with the prediction before its workspace allowance; else what the device holds."""
    reserved_bytes: float | None = None
    """Measured peak the caching allocator reserved (``torch.cuda.max_memory_reserved``), where the
    source gives it: compared with the whole prediction (its allocator reserve included)."""
    mode: str = ""
    """The PyTorch mode of a one-GPU run (``eager``, ``sdpa``...), empty for a cluster run."""
    split: Literal["fit", "holdout"] = "fit"
    source: str = ""
    assumed: tuple[str, ...] = ()

    @property
    def fp8(self) -> str | None:
        """The planner's FP8 recipe for :attr:`precision` (:data:`PRECISIONS`; ``None``: bf16)."""
        return PRECISIONS[self.precision]

    @property
    def group(self) -> str:
        """``one GPU / <mode>``, ``one node`` or ``multi-node``: how errors are broken down."""
        if self.devices == 1:
            return f"one GPU / {self.mode or self.engine or 'roofline'}"
        return "one node" if self.devices <= self.devices_per_node else "multi-node"

    @property
    def job(self) -> str:
        """Rows with the same job key train the same model on the same GPUs at the same global batch
        (their layouts differ): the configurations a user would choose among."""
        spec = ",".join(f"{k}={self.model[k]}" for k in sorted(self.model) if k not in ("params", "params_b"))
        return f"{spec}|{self.device}x{self.devices}|gb={self.global_batch}"


def _int(record: Mapping[str, Any], key: str, where: str, default: int | None = None) -> int:
    value = record.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InputError(f"{where}: '{key}' must be a positive whole number (got {value!r}); fix the row")
    return value


LOSS_KINDS = ("vocab-parallel", "torch", "fused")
"""``layout.loss``: ``vocab-parallel`` (the default: Megatron's vocab-parallel cross entropy, the logits
and one fp32 tensor), ``torch`` (PyTorch's ``cross_entropy`` on fp32 logits, as torchtitan runs it:
``ExecutionModel.torch_loss``) or ``fused`` (one fused kernel: ``ExecutionModel.fused_loss``)."""


def _loss_kind(layout: Mapping[str, Any], where: str) -> str:
    """``layout.loss``, one of :data:`LOSS_KINDS` (``vocab-parallel`` when absent)."""
    kind = str(layout.get("loss", "vocab-parallel"))
    if kind not in LOSS_KINDS:
        raise InputError(f"{where}: layout.loss must be {', '.join(LOSS_KINDS[:-1])} or {LOSS_KINDS[-1]} (got {kind!r})")
    return kind


def _optimizer_state_dtype(layout: Mapping[str, Any], where: str) -> str:
    """``layout.optimizer_state_dtype``, one of ``OPTIMIZER_STATE_DTYPES`` (``fp32`` when absent)."""
    name = str(layout.get("optimizer_state_dtype", "fp32"))
    if name not in OPTIMIZER_STATE_DTYPES:
        raise InputError(f"{where}: layout.optimizer_state_dtype must be {' or '.join(OPTIMIZER_STATE_DTYPES)} "
                         f"(got {name!r}); fix the row")
    return name


def _flag(layout: Mapping[str, Any], key: str, where: str, *, default: bool) -> bool:
    """``layout[key]``, true or false (``default`` when absent); anything else is an input error."""
    value = layout.get(key, default)
    if not isinstance(value, bool):
        raise InputError(f"{where}: layout.{key} must be true or false (got {value!r}); fix the row")
    return value


def _hsdp(layout: Mapping[str, Any], where: str) -> int | None:
    """``layout.hsdp``: the data-parallel ranks each ZeRO state is sharded over, which must divide ``layout.dp`` (its
    replicas being ``dp / hsdp``); ``None`` without it."""
    if layout.get("hsdp") is None:
        return None
    shard, dp = _int(layout, "hsdp", where), _int(layout, "dp", where, 1)
    if dp % shard:
        raise InputError(f"{where}: layout.hsdp {shard} must divide layout.dp {dp} (each state sharded over hsdp "
                         f"ranks, replicated dp / hsdp times); fix the row")
    return shard


def _row_from_runs(record: Mapping[str, Any], where: str) -> StepRow:
    """A row of ``bench/fidelity/runs_*.jsonl`` (source, model, gpus, layout, measured)."""
    for key in ("model", "gpus", "layout", "measured"):
        if not isinstance(record.get(key), Mapping):
            raise InputError(f"{where}: '{key}' must be a mapping; see bench/fidelity/README.md for the row format")
    model, gpus, layout, measured = record["model"], record["gpus"], record["layout"], record["measured"]
    conversion = str(measured.get("conversion", "step_s"))
    if conversion not in CONVERSIONS:
        raise InputError(f"{where}: unknown conversion '{conversion}'; use one of {', '.join(sorted(CONVERSIONS))}")
    devices = _int(gpus, "count", where)
    global_batch = _int(layout, "global_batch", where)
    try:
        step_s = CONVERSIONS[conversion](measured, model, global_batch, devices)
    except KeyError as missing:
        raise InputError(f"{where}: the {conversion} conversion needs {missing}; add it to the row") from None
    source = record.get("source") or {}
    cite = f"{source.get('cite', '')}, {source.get('where', '')}".strip(", ") if isinstance(source, Mapping) else str(source)
    return StepRow(
        id=str(record.get("id", where)),
        model=dict(model),
        device=str(gpus.get("device", "")),
        devices=devices,
        devices_per_node=_int(gpus, "per_node", where, default=min(devices, 8)),
        device_memory_bytes=float(gpus["memory_bytes"]) if gpus.get("memory_bytes") else None,
        intra_link=gpus.get("intra_link"),
        inter_link=gpus.get("inter_link"),
        tp=_int(layout, "tp", where, 1),
        pp=_int(layout, "pp", where, 1),
        dp=_int(layout, "dp", where, 1),
        ep=_int(layout, "ep", where, 1),
        cp=_int(layout, "cp", where, 1),
        hsdp=_hsdp(layout, where),
        precision=_precision(layout, where),
        optimizer_state_dtype=_optimizer_state_dtype(layout, where),
        micro_batch=_int(layout, "micro_batch", where),
        global_batch=global_batch,
        recompute=layout.get("recompute", "none"),
        sequence_parallel=bool(layout.get("sequence_parallel", False)),
        tp_comm_overlap=bool(layout.get("tp_comm_overlap", False)),
        overlap_p2p_comm=bool(layout.get("overlap_p2p_comm", False)),
        zero=int(layout.get("zero", 0)),
        schedule=layout.get("schedule", "1f1b"),
        chunks=int(layout.get("chunks", 1)),
        stage_layers=tuple(int(x) for x in layout["stage_layers"]) if layout.get("stage_layers") else None,
        engine=layout.get("engine"),
        attention=layout.get("attention"),
        dropout=bool(layout.get("dropout", False)),
        fused_loss=_loss_kind(layout, where) == "fused",
        torch_loss=_loss_kind(layout, where) == "torch",
        autocast=_flag(layout, "autocast", where, default=True),
        launcher=str(layout["launcher"]) if layout.get("launcher") else None,
        step_s=step_s,
        memory_bytes=float(measured["memory_bytes"]) if measured.get("memory_bytes") else None,
        reserved_bytes=float(measured["reserved_bytes"]) if measured.get("reserved_bytes") else None,
        memory_allocated="max_memory_allocated" in str(measured.get("memory_note", "")),
        mode=str(record.get("mode", "")),
        split="holdout" if record.get("split") == "holdout" else "fit",
        source=cite,
        assumed=tuple(str(a) for a in record.get("assumed", ())),
    )


def _row_from_steps(record: Mapping[str, Any], where: str, *, models_dir: Path, device: str) -> StepRow:
    """A row of ``shared/calibration/h100_steps_examples.jsonl``: one GPU, ``model`` names
    ``<models_dir>/<model>.onnx``, ``batch``, ``seq`` (optional), ``mode``, ``step_s``."""
    name = str(record.get("model", ""))
    if not name:
        raise InputError(f"{where}: 'model' is missing; give the ONNX file's stem (its file is <models-dir>/<model>.onnx)")
    mode = str(record.get("mode", ""))
    if mode and mode not in MODES:
        raise InputError(f"{where}: unknown mode '{mode}'; use one of {', '.join(MODES)}")
    engine, attention = MODES.get(mode, (None, None))
    batch = _int(record, "batch", where)
    step = record.get("step_s")
    if not isinstance(step, (int, float)) or isinstance(step, bool) or step <= 0:
        raise InputError(f"{where}: 'step_s' must be positive seconds (got {step!r}); fix the row")
    dims = {"seq": int(record["seq"])} if record.get("seq") else {}
    return StepRow(
        id=str(record.get("id", f"{name}-b{batch}-{mode or 'step'}")),
        model={"kind": "onnx", "path": str(models_dir / f"{name}.onnx"), "dims": dims},
        device=device,
        devices=1,
        devices_per_node=1,
        micro_batch=batch,
        global_batch=batch,
        engine=engine,
        attention=attention,
        step_s=float(step),
        memory_bytes=float(record["peak_alloc_bytes"]) if record.get("peak_alloc_bytes") else None,
        reserved_bytes=float(record["peak_reserved_bytes"]) if record.get("peak_reserved_bytes") else None,
        memory_allocated=True,
        mode=mode,
        split="holdout" if record.get("split") == "holdout" else "fit",
    )


def parse_step_rows(
    records: Iterable[Mapping[str, Any]], *, where: str = "steps", models_dir: str | Path = "examples", device: str = ""
) -> list[StepRow]:
    """Rows from JSON records of either format (a runs row has ``layout``, a steps row ``batch``).

    Parameters
    ----------
    records:
        Parsed JSON objects, one per measured step.
    where:
        Named in errors (a file name).
    models_dir:
        Folder of ``<model>.onnx`` for steps rows.
    device:
        Device preset of steps rows (runs rows name their own).

    Raises
    ------
    InputError
        A malformed row (the message names the row and the fix).

    Examples
    --------
    >>> rows = parse_step_rows([{"model": "gpt2", "batch": 8, "seq": 1024, "mode": "sdpa", "step_s": 0.08}],
    ...                        device="h100-sxm")
    >>> rows[0].engine, rows[0].attention, rows[0].model["dims"], rows[0].group
    ('eager', 'flash', {'seq': 1024}, 'one GPU / sdpa')
    """
    rows = []
    for i, record in enumerate(records, 1):
        at = f"{where} row {i}"
        if not isinstance(record, Mapping):
            raise InputError(f"{at} is not a JSON object; write one object per line")
        if "layout" in record:
            row = _row_from_runs(record, at)
        else:
            if not device:
                raise InputError(f"{at} does not name its device; pass the device (--device or --cluster)")
            row = _row_from_steps(record, at, models_dir=Path(models_dir), device=device)
        if not row.device:
            raise InputError(f"{at} does not name its device; add gpus.device (a preset name)")
        rows.append(row)
    if not rows:
        raise InputError(f"{where} has no rows; give a JSONL file with one measured step per line")
    return rows


CSV_DEVICES: dict[str, str] = {"a100": "a100-80gb", "h100": "h100-sxm"}
"""``gpu_type`` of a CSV row -> device preset (an unlisted name is taken as a preset name)."""

CSV_EXECUTION: tuple[str, str] = ("fused", "explicit")
"""(engine, attention) of a CSV row (Megatron-DeepSpeed runs): Megatron's fused kernels (fused
scale-mask-softmax, bias-GeLU, fused LayerNorm/Adam) with the attention scores materialised, as
Megatron-DeepSpeed runs without ``--use-flash-attn`` (the vTrain validation configs name no flash
attention)."""


def _row_from_csv(record: Mapping[str, str], where: str) -> StepRow:
    """A row of a Megatron-DeepSpeed CSV (``shared/calibration/a100_single_node_h1024.csv``: run_id,
    model, hidden, ffn_hidden, layers, heads, seq, vocab, tp, dp, pp, micro_batch, global_batch, gpus,
    gpus_per_node, gpu_type, recompute, precision, measured_time_s, notes; optional ``split``)."""

    def number(key: str) -> int:
        try:
            value = int(str(record.get(key, "")).strip())
        except ValueError:
            raise InputError(f"{where}: '{key}' must be a whole number (got {record.get(key)!r}); fix the row") from None
        if value < 1:
            raise InputError(f"{where}: '{key}' must be positive (got {value}); fix the row")
        return value

    try:
        step = float(record.get("measured_time_s", ""))
    except ValueError:
        step = -1.0
    if not step > 0:
        raise InputError(f"{where}: 'measured_time_s' must be positive seconds (got {record.get('measured_time_s')!r})")
    gpus = number("gpus")
    gpu_type = str(record.get("gpu_type", "")).strip().lower()
    engine, attention = CSV_EXECUTION
    return StepRow(
        id=str(record.get("run_id") or where),
        model={"kind": "gpt", "layers": number("layers"), "hidden": number("hidden"), "heads": number("heads"),
               "seq": number("seq"), "vocab": number("vocab")},
        device=CSV_DEVICES.get(gpu_type, gpu_type),
        devices=gpus,
        devices_per_node=min(gpus, number("gpus_per_node")),
        tp=number("tp"), pp=number("pp"), dp=number("dp"),
        micro_batch=number("micro_batch"), global_batch=number("global_batch"),
        recompute=str(record.get("recompute") or "none").strip(),  # type: ignore[arg-type]
        engine=engine, attention=attention,
        step_s=step,
        split="holdout" if str(record.get("split", "")).strip() == "holdout" else "fit",
        source=str(record.get("notes", "")),
    )


def read_step_rows(path: str | Path, *, models_dir: str | Path | None = None, device: str = "") -> list[StepRow]:
    """:func:`parse_step_rows` of a JSONL file (blank lines and ``#`` lines skipped), or the rows of a
    CSV file (``.csv``: :func:`_row_from_csv`).

    ``models_dir`` defaults to ``examples/`` beside the working directory. An ONNX path in a row is
    taken relative to the working directory.
    """
    file = Path(path)
    if file.suffix.lower() == ".csv":
        import csv

        try:
            with file.open(encoding="utf-8", newline="") as handle:
                records = list(csv.DictReader(handle))
        except FileNotFoundError:
            raise InputError(f"steps file '{file}' does not exist; check the path") from None
        if not records:
            raise InputError(f"{file.name} has no rows; give a CSV with a header and one measured step per line")
        return [_row_from_csv(r, f"{file.name} row {i}") for i, r in enumerate(records, 1)]
    try:
        text = file.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise InputError(f"steps file '{file}' does not exist; check the path") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"cannot read steps file '{file}' ({exc.__class__.__name__}); check the file") from None
    records = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError as exc:
            raise InputError(f"{file.name} line {n} is not JSON ({exc.msg}); write one JSON object per line") from None
    return parse_step_rows(records, where=file.name, models_dir=models_dir or Path("examples"), device=device)


def holdout_mask(rows: Sequence[StepRow], *, every: int = 0, where: Mapping[str, Sequence[str]] | None = None) -> np.ndarray:
    """Which rows are held out of the fit (``True``) and scored.

    Parameters
    ----------
    every:
        Hold out every ``every``-th row in file order (rows ``every-1, 2*every-1, ...``); ``0``: off.
    where:
        Hold out rows whose attribute (``mode``, ``id``...) or model-spec key (``path``...) equals
        one of the listed values; a row's own ``split`` field is always honoured.

    Examples
    --------
    >>> rows = parse_step_rows([{"model": m, "batch": 8, "mode": "eager", "step_s": 0.1} for m in "abcd"],
    ...                        device="h100-sxm")
    >>> holdout_mask(rows, every=2).tolist()
    [False, True, False, True]
    >>> holdout_mask(rows, where={"id": ["c-b8-eager"]}).tolist()
    [False, False, True, False]
    """
    if every < 0:
        raise InputError(f"--holdout-every must be 0 (off) or a positive count (got {every})")
    mask = np.array([row.split == "holdout" for row in rows], dtype=bool)
    if every:
        mask |= (np.arange(len(rows)) % every) == every - 1
    for key, values in (where or {}).items():
        wanted = {str(v) for v in values}
        for i, row in enumerate(rows):
            value = getattr(row, key, None) if hasattr(row, key) else row.model.get(key)
            if str(value) in wanted or (key == "model" and Path(str(row.model.get("path", ""))).stem in wanted):
                mask[i] = True
    return mask


# ------------------------------------------------------------------------------------------------
# Parameters


@dataclass(frozen=True, slots=True, kw_only=True)
class Parameter:
    """One fitted constant: a field of the cluster's device or of one of its links."""

    owner: Literal["device", "intra_link", "inter_link"]
    field: str
    lower: float
    upper: float
    reciprocal: bool = False
    """Step time is linear in ``1/value`` (an efficiency divides a rate), not in the value."""

    @property
    def name(self) -> str:
        """``device.kernel_overhead_s``, ``inter_link.latency_s``..."""
        return f"{self.owner}.{self.field}"


# Bounds: a fixed time per kernel/call/layer far above 10 ms, or a link latency above 1 ms, is not a
# constant of the hardware any more; an efficiency below 5% of the spec-sheet rate is a broken link.
_SECONDS_BOUNDS = {"device": (0.0, 1e-2), "intra_link": (0.0, 1e-3), "inter_link": (0.0, 1e-3)}
_EFFICIENCY_BOUNDS = (0.05, 1.0)


def _is_calibratable(f: dataclasses.Field, value: object) -> bool:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    # "_per_s" is a rate (bytes/s, FLOP/s): spec-sheet data, not a fixed time.
    return (f.name.endswith("_s") and not f.name.endswith("_per_s")) or f.name.endswith("_efficiency")


def calibratable_parameters(cluster: Cluster, names: Sequence[str] | None = None) -> tuple[Parameter, ...]:
    """The [Empirical] fields of the cluster's device and links (module docstring), as parameters.

    Parameters
    ----------
    names:
        Keep only these (``device.kernel_overhead_s``, or a bare field name such as ``latency_s``,
        which selects it on every owner); ``None``: all.

    Raises
    ------
    InputError
        A name that is no calibratable field (the message lists them).

    Examples
    --------
    >>> from objectives.cluster import make_cluster
    >>> [p.name for p in calibratable_parameters(make_cluster("h100-sxm", devices=8), ["latency_s"])]
    ['intra_link.latency_s', 'inter_link.latency_s']
    """
    found: list[Parameter] = []
    for owner, obj in (("device", cluster.device), ("intra_link", cluster.intra_link), ("inter_link", cluster.inter_link)):
        for f in dataclasses.fields(obj):
            value = getattr(obj, f.name)
            if not _is_calibratable(f, value):
                continue
            if f.name.endswith("_efficiency"):
                lower, upper = _EFFICIENCY_BOUNDS
                found.append(Parameter(owner=owner, field=f.name, lower=lower, upper=upper, reciprocal=True))  # type: ignore[arg-type]
            else:
                lower, upper = _SECONDS_BOUNDS[owner]
                found.append(Parameter(owner=owner, field=f.name, lower=lower, upper=upper))  # type: ignore[arg-type]
    if names is None:
        return tuple(found)
    chosen = []
    for name in names:
        matches = [p for p in found if name in (p.name, p.field)]
        if not matches:
            known = ", ".join(p.name for p in found)
            raise InputError(f"'{name}' is not a calibratable field of this cluster; choose among {known}")
        chosen += [p for p in matches if p not in chosen]
    return tuple(chosen)


def parameter_values(cluster: Cluster, params: Sequence[Parameter]) -> np.ndarray:
    """The parameters' current values in ``cluster``."""
    return np.array([float(getattr(getattr(cluster, p.owner), p.field)) for p in params], dtype=float)


def with_parameters(cluster: Cluster, params: Sequence[Parameter], values: Sequence[float]) -> Cluster:
    """``cluster`` with the parameters set to ``values`` (a new cluster; validated by the classes).

    Examples
    --------
    >>> from objectives.cluster import make_cluster
    >>> c = make_cluster("h100-sxm", devices=2)
    >>> p = calibratable_parameters(c, ["intra_link.latency_s"])
    >>> with_parameters(c, p, [7e-6]).intra_link.latency_s
    7e-06
    """
    changes: dict[str, dict[str, float]] = {}
    for p, v in zip(params, values):
        changes.setdefault(p.owner, {})[p.field] = float(v)
    replaced = {owner: dataclasses.replace(getattr(cluster, owner), **fields) for owner, fields in changes.items()}
    return dataclasses.replace(cluster, **replaced)


# ------------------------------------------------------------------------------------------------
# Scores


@dataclass(frozen=True, slots=True, kw_only=True)
class ErrorSummary:
    """Predicted against measured over some rows (rows without a prediction are counted apart)."""

    rows: int
    """Rows with a finite prediction."""
    missing: int = 0
    """Rows without one (the configuration could not be priced)."""
    median_abs_pct: float = math.nan
    mape_pct: float = math.nan
    bias_pct: float = math.nan
    """Median signed error (%): positive = predicted slower (or larger) than measured."""
    mean_signed_pct: float = math.nan

    def as_dict(self) -> dict[str, float | int]:
        return dataclasses.asdict(self)


def error_summary(predicted: Sequence[float], measured: Sequence[float]) -> ErrorSummary:
    """Median |error| %, MAPE % and bias % of ``predicted`` against ``measured`` (same units).

    Examples
    --------
    >>> s = error_summary([1.1, 0.5, 2.0, float("inf")], [1.0, 1.0, 1.0, 1.0])
    >>> (s.rows, s.missing, round(s.median_abs_pct, 6), round(s.mape_pct, 6), round(s.bias_pct, 6))
    (3, 1, 50.0, 53.333333, 10.0)
    """
    p = np.asarray(predicted, dtype=float)
    m = np.asarray(measured, dtype=float)
    ok = np.isfinite(p) & np.isfinite(m) & (m > 0)
    if not ok.any():
        return ErrorSummary(rows=0, missing=int(len(p)))
    signed = (p[ok] / m[ok] - 1.0) * 100.0
    return ErrorSummary(
        rows=int(ok.sum()),
        missing=int(len(p) - ok.sum()),
        median_abs_pct=float(np.median(np.abs(signed))),
        mape_pct=float(np.mean(np.abs(signed))),
        bias_pct=float(np.median(signed)),
        mean_signed_pct=float(np.mean(signed)),
    )


# ------------------------------------------------------------------------------------------------
# The fit


@dataclass(frozen=True, slots=True, kw_only=True)
class FitResult:
    """Fitted values and the fit rows' errors before and after (never a score: see the hold-out)."""

    params: tuple[Parameter, ...]
    before: np.ndarray
    after: np.ndarray
    identifiable: np.ndarray
    """Per parameter: whether any fit row's prediction moves with it (else it kept its value)."""
    fit_before: ErrorSummary
    fit_after: ErrorSummary
    objective_before: float
    """Sum of squared relative errors of the fit rows at the start."""
    objective_after: float
    """The same at the fitted values (never above ``objective_before``: a step is kept only if it lowers it)."""
    evaluations: int
    """Calls of ``predict`` (each prices every fit row)."""
    notes: tuple[str, ...] = field(default_factory=tuple)


def _objective(predicted: np.ndarray, measured: np.ndarray) -> float:
    ok = np.isfinite(predicted)
    if not ok.any():
        return math.inf
    return float(np.sum(((predicted[ok] - measured[ok]) / measured[ok]) ** 2))


def _to_u(p: Parameter, value: float) -> float:
    return 1.0 / value if p.reciprocal else value


def _from_u(p: Parameter, u: float) -> float:
    return 1.0 / u if p.reciprocal else u


def _solve_surrogate(t0: np.ndarray, jac: np.ndarray, measured: np.ndarray, u0: np.ndarray, lo: np.ndarray,
                     hi: np.ndarray) -> np.ndarray:
    """Minimise sum(((t0 + J (u - u0) - m) / m)^2) for ``lo <= u <= hi`` with pymoo's pattern search."""
    from pymoo.algorithms.soo.nonconvex.pattern import PatternSearch
    from pymoo.core.problem import Problem
    from pymoo.optimize import minimize
    from pymoo.termination.default import DefaultSingleObjectiveTermination

    a = jac / measured[:, None]
    b = (measured - t0) / measured + a @ u0
    span = np.where(hi > lo, hi - lo, 1.0)

    class _Surrogate(Problem):
        def __init__(self) -> None:
            super().__init__(n_var=len(u0), n_obj=1, xl=np.zeros(len(u0)), xu=np.ones(len(u0)))

        def _evaluate(self, x, out, *args, **kwargs):  # noqa: ANN001 - pymoo's signature
            u = lo + np.atleast_2d(x) * span
            out["F"] = np.sum((u @ a.T - b) ** 2, axis=1)

    # Start from the unbounded least-squares answer pulled into the box: the pattern search then
    # only has to settle the active bounds.
    start, *_ = np.linalg.lstsq(a, b, rcond=None)
    x0 = np.clip((start - lo) / span, 0.0, 1.0)
    result = minimize(
        _Surrogate(),
        PatternSearch(x0=x0),
        termination=DefaultSingleObjectiveTermination(xtol=1e-10, ftol=1e-14, n_max_evals=20000),
        seed=0,
        verbose=False,
    )
    x = np.asarray(result.X, dtype=float).reshape(-1)
    return lo + np.clip(x, 0.0, 1.0) * span


def _jacobian(
    price: Callable[[np.ndarray], np.ndarray], u: np.ndarray, t: np.ndarray, lo: np.ndarray, hi: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Forward differences of the row predictions ``t`` (at ``u``) in each parameter, and the rows
    priced at every probe. Returns ``(jacobian [rows, params], rows_ok [rows])``; an unpriceable
    entry is 0."""
    rows_ok = np.isfinite(t)
    jac = np.zeros((len(t), len(u)))
    for k in range(len(u)):
        # A step of 5% of the value (at least 1e-4 of the box, toward its inside): large against
        # rounding in the cost model, small enough that few max() switches (a kernel turning
        # from host-bound to device-bound) fall inside it.
        step = max(0.05 * abs(u[k]), 1e-4 * (hi[k] - lo[k])) or 1e-9
        if u[k] + step > hi[k]:
            step = -step
        probe = u.copy()
        probe[k] += step
        tk = price(probe)
        rows_ok &= np.isfinite(tk)
        jac[:, k] = (tk - t) / step
    return np.where(np.isfinite(jac), jac, 0.0), rows_ok


@dataclass(frozen=True, slots=True, kw_only=True)
class _Step:
    """A step of the fit that was taken (:func:`_damped_step`)."""

    u: np.ndarray
    """The parameters after it (fit coordinates)."""
    t: np.ndarray
    """Seconds per step of every row predicted there (``nan``: not priced)."""
    objective: float


def _damped_step(
    price: Callable[[np.ndarray], np.ndarray], u: np.ndarray, target: np.ndarray, t: np.ndarray, m: np.ndarray,
    best: float,
) -> _Step | None:
    """The first of the steps toward ``target`` (all, half, a quarter, an eighth of the way) that
    lowers the objective below ``best`` without losing rows; ``None`` when none does."""
    # The step time is piecewise linear (max() of host and device time, of overlapped streams):
    # when the linear model's answer is worse, go part of the way (halving, three times).
    for fraction in (1.0, 0.5, 0.25, 0.125):
        candidate = u + fraction * (target - u)
        t_new = price(candidate)
        score = _objective(t_new, m)
        # A step that loses rows (they can no longer be priced) would lower the sum by dropping them.
        if score < best and np.isfinite(t_new).sum() >= np.isfinite(t).sum():
            return _Step(u=candidate, t=t_new, objective=score)
    return None


def fit_parameters(
    predict: Callable[[Cluster], Sequence[float]],
    cluster: Cluster,
    params: Sequence[Parameter],
    measured: Sequence[float],
    *,
    rounds: int = 3,
) -> FitResult:
    """Fit ``params`` of ``cluster`` so that ``predict`` matches ``measured`` (module docstring).

    Parameters
    ----------
    predict:
        ``cluster -> seconds per step of every fit row`` (``inf`` or ``nan`` where a row cannot be
        priced; such rows are left out of the objective).
    cluster:
        The starting point; its values of ``params`` are the initial guess.
    params:
        What to fit (:func:`calibratable_parameters`).
    measured:
        Measured seconds per step of the same rows.
    rounds:
        Re-linearisations (each prices the rows ``len(params) + 1`` to ``len(params) + 4`` times).

    Returns
    -------
    FitResult

    Raises
    ------
    InputError
        No row can be priced at the starting point.

    Examples
    --------
    A model whose step is ``0.1 s + 1000 x device.kernel_latency_s`` recovers the latency:

    >>> from objectives.cluster import make_cluster
    >>> c = make_cluster("h100-sxm", devices=1)
    >>> p = calibratable_parameters(c, ["device.kernel_latency_s"])
    >>> fit = fit_parameters(lambda cl: [0.1 + 1000 * cl.device.kernel_latency_s], c, p, [0.105])
    >>> round(float(fit.after[0]) * 1e6, 3)
    5.0
    """
    m = np.asarray(measured, dtype=float)
    if not len(params):
        raise InputError("nothing to fit: the cluster has no calibratable field of those names")
    lo = np.array([_to_u(p, p.upper) if p.reciprocal else p.lower for p in params])
    hi = np.array([_to_u(p, p.lower) if p.reciprocal else p.upper for p in params])
    values = np.clip(parameter_values(cluster, params), [p.lower for p in params], [p.upper for p in params])
    u = np.array([_to_u(p, v) for p, v in zip(params, values)])
    evaluations = 0

    def price(at_u: np.ndarray) -> np.ndarray:
        nonlocal evaluations
        evaluations += 1
        vals = [_from_u(p, x) for p, x in zip(params, at_u)]
        out = np.asarray(predict(with_parameters(cluster, params, vals)), dtype=float)
        return np.where(np.isfinite(out), out, np.nan)

    t = price(u)
    if not np.isfinite(t).any():
        raise InputError("no fit row could be priced at the starting constants; check the rows (planner estimate each)")
    before_t = t.copy()
    best = start_objective = _objective(t, m)
    identifiable = np.zeros(len(params), dtype=bool)
    notes: list[str] = []
    for _ in range(max(1, rounds)):
        jac, rows_ok = _jacobian(price, u, t, lo, hi)
        moved = np.abs(jac[rows_ok]).max(axis=0, initial=0.0) * (hi - lo) > 1e-9 * np.median(m)
        identifiable |= moved
        if not moved.any() or not rows_ok.any():
            break
        target = u.copy()
        target[moved] = _solve_surrogate(t[rows_ok], jac[rows_ok][:, moved], m[rows_ok], u[moved], lo[moved], hi[moved])
        step = _damped_step(price, u, target, t, m, best)
        if step is None:
            break
        improvement = best - step.objective
        u, t, best = step.u, step.t, step.objective
        if improvement <= 1e-9 * max(best, 1e-12):
            break
    for p, ok in zip(params, identifiable):
        if not ok:
            notes.append(f"{p.name}: no fit row's prediction depends on it; kept at its value")
    after = np.array([_from_u(p, x) for p, x in zip(params, u)])
    return FitResult(
        params=tuple(params),
        before=values,
        after=after,
        identifiable=identifiable,
        fit_before=error_summary(before_t, m),
        fit_after=error_summary(t, m),
        objective_before=start_objective,
        objective_after=best,
        evaluations=evaluations,
        notes=tuple(notes),
    )


# ------------------------------------------------------------------------------------------------
# The cluster file


def _link_dict(link: Link) -> dict[str, Any]:
    data: dict[str, Any] = {"name": link.name}
    for f in dataclasses.fields(link):
        if f.name in ("name",):
            continue
        value = getattr(link, f.name)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            data[f.name] = float(value)
        elif f.name == "source" and value:
            data[f.name] = str(value)
    return data


def cluster_file_dict(cluster: Cluster, *, preset: Device | None, note: str = "") -> dict[str, Any]:
    """The cluster as a cluster file (``objectives.cluster.load_cluster``'s format).

    The device is written by preset name when its spec-sheet fields equal ``preset``'s (else in full);
    every calibratable device field goes at the top level (as ``kernel_latency_s`` does), links in full.

    Examples
    --------
    >>> from objectives.cluster import get_device, make_cluster
    >>> d = cluster_file_dict(make_cluster("h100-sxm", devices=16), preset=get_device("h100-sxm"))
    >>> d["device"], d["nodes"], d["devices_per_node"], d["inter_link"]["name"]
    ('h100-sxm', 2, 8, 'ib-ndr')
    """
    device = cluster.device
    empirical = {f.name for f in dataclasses.fields(device) if _is_calibratable(f, getattr(device, f.name))}
    same_spec = preset is not None and all(
        getattr(device, f.name) == getattr(preset, f.name)
        for f in dataclasses.fields(device) if f.name not in empirical and f.name != "source"
    )
    data: dict[str, Any] = {}
    if note:
        data["note"] = note
    if same_spec:
        data["device"] = device.name
    else:
        data["device"] = {
            "name": device.name,
            "peak_flops": {k: float(v) for k, v in device.peak_flops.items()},
            "memory_bytes": int(device.memory_bytes),
            "memory_bandwidth_bytes_per_s": float(device.memory_bandwidth_bytes_per_s),
            "source": device.source or "cluster file",
        }
    for name in sorted(empirical):
        data[name] = float(getattr(device, name))
    data["nodes"] = cluster.nodes
    data["devices_per_node"] = cluster.devices_per_node
    data["intra_link"] = _link_dict(cluster.intra_link)
    data["inter_link"] = _link_dict(cluster.inter_link)
    return data
