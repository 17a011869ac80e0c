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
  A looped schedule's rank holds ``chunks`` stages, each with its own buffers (the first and last rank one
  fewer receiving or sending stage).
* ``deepspeed`` (DeepSpeed's ``PipelineEngine``, 0.19.8 ``runtime/pipe/engine.py``): ``_exec_forward_pass`` keeps
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

__all__ = ["PIPELINE_BUFFERS", "stage_buffer_bytes"]

PIPELINE_BUFFERS = ("none", "torch", "deepspeed")
"""The pipeline runtimes whose boundary buffers are priced (module docstring)."""


def stage_buffer_bytes(kind: str, *, cut_in, cut_out, in_flight, micro_batches: int, chunks: int = 1,
                       tensor_parallel: bool = True) -> np.ndarray:
    r"""``(S,)`` bytes per device each stage's pipeline runtime holds at its stage boundaries (module docstring).

    ``cut_in`` / ``cut_out``: ``(S,)`` bytes per device of the activation entering / leaving each stage per
    micro-batch (the first stage's input and the last stage's output are not sent: their entries are not read);
    ``in_flight``: ``(S,)`` micro-batches each stage holds at its peak; ``micro_batches``: per step;
    ``chunks``: model chunks per rank (looped schedules); ``tensor_parallel``: the stage's layers are split over
    more than one device (DeepSpeed's partitioned boundary). ``in_flight`` may have more axes after the stages'
    (the search's segments), the cuts broadcast against it. The bytes are linear in the two cuts.

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
    a_in, a_out = np.asarray(cut_in, dtype=np.float64), np.asarray(cut_out, dtype=np.float64)
    sends = np.full(stages, float(chunks))  # stages on each rank that send forward (all but the model's last)
    receives = np.full(stages, float(chunks))  # ... that receive (all but the model's first)
    sends[-1] -= 1.0
    receives[0] -= 1.0
    sends, receives = (v.reshape((stages,) + (1,) * (f.ndim - 1)) for v in (sends, receives))  # stages first
    if kind == "torch":
        held_chunks = f * chunks  # in-flight micro-batch chunks; their inputs are the layers' saved inputs
        idle = np.maximum(receives * micro_batches - held_chunks * (receives / chunks), 0.0)
        return f * sends * a_out + sends * micro_batches * a_out + idle * a_in
    if kind == "deepspeed":
        clones = 0.0 if tensor_parallel else 1.0
        return sends * (f + 1.0) * a_out + receives * (1.0 + clones * f) * a_in
    raise ValueError(f"pipeline buffers must be one of {', '.join(PIPELINE_BUFFERS)} (got {kind!r})")
