r"""Bytes a pipeline runtime holds at its stage boundaries beyond the layers' saved activations.

The layers' own saved tensors (:func:`objectives.memory.pipelined_activation_bytes`) are not all a pipeline
stage holds: the runtime that moves activations between stages keeps its own references and buffers. What it
keeps depends on the launcher (``TrainingSettings.pipeline_buffers``, the launcher's ``Target.pipeline_buffers``),
read in each one's source. With :math:`a_\mathrm{in}`, :math:`a_\mathrm{out}` the bytes per device of the
activation crossing the stage's input and output cut per micro-batch (the boundary's whole tensor over the
stage's devices: ``LayerStructure.cut_bytes`` / devices, as ``objectives.pipeline_price`` prices its transfer),
:math:`f` the micro-batches the stage has in flight at its peak (``objectives.schedules.in_flight_micro_batches``)
and :math:`M` the micro-batches per step:

* ``torch`` (``torch.distributed.pipelining``, torchtitan's pipelines; torch 2.13 ``stage.py``):
  ``forward_one_chunk`` keeps each micro-batch's stage output in ``fwd_cache`` until ``backward_one_chunk`` pops it
  (:math:`f\,a_\mathrm{out}` on every stage but the last, whose output is the loss's input, already counted);
  ``_prepare_backward_infra`` allocates one gradient receive buffer per micro-batch, kept for the whole run
  (``_create_grad_recv_info``: :math:`M\,a_\mathrm{out}`, every stage but the last); ``_prepare_forward_infra``
  one activation receive buffer per micro-batch (``_setup_forward_recv_info``, every stage but the first), of
  which the in-flight ones are the stage's input, saved by its first layer: :math:`(M - f)\,a_\mathrm{in}` more.
  A looped schedule's rank holds ``chunks`` stage objects (torchtitan's ``pipeline_module_split``, under
  ``pipeline_llm``, builds one ``PipelineStage`` per model chunk, virtual stages :math:`cS + r` on rank :math:`r` for
  ``Interleaved1F1B`` and ``InterleavedZeroBubble``), each with the buffers above for its own micro-batches: with
  :math:`P` the chunk passes the rank holds at its peak (``in_flight`` times ``chunks``) and :math:`v` its chunks,
  every stage but the model's last keeps its in-flight outputs, :math:`(P - [r = S-1]\,h)\,a_\mathrm{out}`, and :math:`M` gradient buffers,
  :math:`(v - [r = S-1])\,M\,a_\mathrm{out}`; every stage but the model's first its idle receive buffers,
  :math:`((v - [r = 0])\,M - P + [r = 0]\,g)\,a_\mathrm{in}`, where the model's last chunk holds :math:`h = 1`
  micro-batch at the last rank's peak (:mod:`objectives.after_layers`) and its first chunk :math:`g = \min(2S, M)` at
  rank 0's (the warm-up's :math:`2S - 1` forwards of chunk 0 and one more in the steady state: the largest count at
  any of rank 0's peaks in torch 2.13's ``ScheduleInterleaved1F1B`` and ``ScheduleInterleavedZeroBubble`` orders and
  Megatron-Core's, ``tests/integration/test_looped_orders.py``). Without chunks both are the stage's own count, and
  the forms are the ones above. ZB-V: not modelled, so not priced (:func:`looped_buffers_priced`); only the V's turn
  passes tensors between same-rank stages without buffers (``set_local_fwd_input``), torch allocates the other
  stage objects' receive and gradient buffers as above, so ZB-V plans are under-priced by them (review h33r, F2).
* ``deepspeed`` (DeepSpeed's ``PipelineEngine``, 0.19.8 ``runtime/pipe/engine.py``; no model chunks: its
  ``TrainSchedule`` is 1F1B, ``runtime/pipe/schedule.py``): ``_exec_forward_pass`` keeps
  each in-flight micro-batch's output in ``pipe_buffers['outputs']`` until its backward; with tensor parallelism
  (``pipe_partitioned``, true by default, ``runtime/config.py``) it keeps the rank's partition only, the
  whole output's storage replaced by one element, which is the same :math:`a_\mathrm{out}`: :math:`f\,a_\mathrm{out}`
  on every stage but the last; one gradient receive buffer (``grad_layer``, :math:`a_\mathrm{out}`, partitioned
  alike under ``grad_partitioned``) and one activation receive buffer (``pipe_recv_buf``, :math:`a_\mathrm{in}`)
  reused across micro-batches. Without tensor parallelism the forward runs on a clone of the received input
  (``inputs = self.pipe_buffers['inputs'][buffer_id].clone()``): the received tensor stays in ``pipe_buffers``
  beside the clone the first layer saves, :math:`f\,a_\mathrm{in}` more on every stage but the first.
* ``none``: nothing beyond the layers' tensors: Megatron-LM frees each sent output's storage
  (``deallocate_output_tensor`` under ``deallocate_pipeline_outputs``) and receives into a fresh tensor that is the
  next layer's input.
"""

from __future__ import annotations

import numpy as np

from objectives.after_layers import TAIL_IN_FLIGHT_LOOPED

__all__ = ["PIPELINE_BUFFERS", "first_chunk_in_flight", "looped_buffers_priced", "stage_buffer_bytes"]

PIPELINE_BUFFERS = ("none", "torch", "deepspeed")
"""The pipeline runtimes whose boundary buffers are priced (module docstring)."""


def looped_buffers_priced(kind: str, schedule: str | None) -> bool:
    """Whether the runtime ``kind``'s buffers are priced under a looped ``schedule`` (``chunks > 1``): torch's, under
    the schedules whose rank ``r`` holds virtual stages ``cS + r`` (``interleaved``, looped ``zb-h1``); not DeepSpeed's
    (``PipelineEngine`` has no model chunks) nor ZB-V's (module docstring).

    >>> looped_buffers_priced("torch", "interleaved"), looped_buffers_priced("torch", "zbv"), looped_buffers_priced("deepspeed", "interleaved")
    (True, False, False)
    """
    return kind == "torch" and schedule in ("interleaved", "zb-h1")


def first_chunk_in_flight(stages: int, micro_batches: int) -> float:
    """Micro-batches the model's first chunk holds at rank 0's peak under a looped schedule of ``stages`` ranks:
    ``min(2 S, M)`` (module docstring).

    >>> first_chunk_in_flight(8, 64), first_chunk_in_flight(4, 4)
    (16.0, 4.0)
    """
    return float(min(2 * stages, micro_batches))


def stage_buffer_bytes(kind: str, *, cut_in, cut_out, in_flight, micro_batches: int, chunks: int = 1,
                       tensor_parallel: bool = True) -> np.ndarray:
    r"""``(S,)`` bytes per device each stage's pipeline runtime holds at its stage boundaries (module docstring).

    ``cut_in`` / ``cut_out``: ``(S,)`` bytes per device of the activation entering / leaving each stage per
    micro-batch (the first stage's input and the last stage's output are not sent: their entries are not read);
    ``in_flight``: ``(S,)`` micro-batches each stage holds at its peak (a looped schedule's chunk passes over
    ``chunks``, not padded for unequal chunks: the buffers are per chunk, whatever its layers); ``micro_batches``: per
    step; ``chunks``: model chunks per rank (looped schedules: torch's only); ``tensor_parallel``: the stage's layers
    are split over more than one device (DeepSpeed's partitioned boundary). ``in_flight`` may have more axes after the
    stages' (the search's segments), the cuts broadcast against it. The bytes are linear in the two cuts.

    Examples
    --------
    Four 1F1B stages, 8 micro-batches, 10 bytes per boundary: torch keeps on stage 0 its 4 in-flight outputs and 8
    gradient buffers (120); on stage 1 also the 8 - 3 receive buffers not in flight (3 x 10 + 80 + 5 x 10 = 160), on stage 2 (2 x 10 + 80 + 6 x 10);
    the last stage only its 8 - 1 idle receive buffers (70):

    >>> stage_buffer_bytes("torch", cut_in=[10.0] * 4, cut_out=[10.0] * 4, in_flight=[4, 3, 2, 1], micro_batches=8).tolist()
    [120.0, 160.0, 160.0, 70.0]

    DeepSpeed under tensor parallelism: the in-flight partitioned outputs, one gradient and one receive buffer:

    >>> stage_buffer_bytes("deepspeed", cut_in=[10.0] * 4, cut_out=[10.0] * 4, in_flight=[4, 3, 2, 1], micro_batches=8).tolist()
    [50.0, 50.0, 40.0, 10.0]
    """
    f = np.asarray(in_flight, dtype=np.float64)
    stages = f.shape[0]
    if kind == "none" or stages <= 1:
        return np.zeros(np.broadcast_shapes(f.shape, np.shape(cut_in), np.shape(cut_out)))
    if kind == "deepspeed" and chunks > 1:
        raise ValueError("DeepSpeed's PipelineEngine runs no model chunks (its TrainSchedule is 1F1B)")
    a_in, a_out = np.asarray(cut_in, dtype=np.float64), np.asarray(cut_out, dtype=np.float64)
    axes = (stages,) + (1,) * (f.ndim - 1)  # stages first
    last, first = np.zeros(axes), np.zeros(axes)
    last[-1], first[0] = 1.0, 1.0
    sends, receives = chunks - last, chunks - first  # stage objects on each rank that send / receive
    if kind == "torch":
        passes = f * chunks  # in-flight chunk passes; each keeps its output, its input is its first layer's
        # the model's last chunk (last rank) and first (rank 0) hold their own counts (module docstring)
        last_chunk = f[-1] if chunks == 1 else TAIL_IN_FLIGHT_LOOPED
        first_chunk = f[0] if chunks == 1 else first_chunk_in_flight(stages, micro_batches)
        outputs = passes - last * last_chunk
        idle = np.maximum(receives * micro_batches - (passes - first * first_chunk), 0.0)
        return outputs * a_out + sends * micro_batches * a_out + idle * a_in
    if kind == "deepspeed":
        clones = 0.0 if tensor_parallel else 1.0
        return sends * (f + 1.0) * a_out + receives * (1.0 + clones * f) * a_in
    raise ValueError(f"pipeline buffers must be one of {', '.join(PIPELINE_BUFFERS)} (got {kind!r})")
