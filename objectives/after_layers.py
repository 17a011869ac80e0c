r"""The ops after a model's last layer (its final norm, output layer and loss) in a pipeline under a looped schedule.

A stage's activations are priced as one micro-batch's times the micro-batches it holds at its peak
(:func:`objectives.schedules.in_flight_micro_batches`, :func:`objectives.memory.pipelined_activation_bytes`). Under a
looped schedule (``chunks`` :math:`v > 1`) a rank's count is its in-flight chunk passes over :math:`v`: exact for the
layers, which every chunk holds alike (:func:`planner.core.chunks.chunk_pad` for unequal ones), not for the ops after
the last layer, which only the model's last chunk runs. That chunk is the last virtual stage, whose backward follows
each micro-batch's forward at once, so at its rank's peak it holds **one** micro-batch of them, where the rank's count
is :math:`((v-1)S + 1)/v` (interleaved: 4.5 at :math:`S = 8, v = 2`). Read in the runtimes' orders:

* torch 2.13 ``torch/distributed/pipelining/schedules.py``, ``ScheduleInterleaved1F1B`` and
  ``ScheduleInterleavedZeroBubble`` (``_get_warmup_ops``, ``_get_1f1b_rank_ops``): the last rank's warm-up is
  :math:`(v-1)R` forwards of its first :math:`v - 1` chunks (:math:`R` micro-batches a round); each steady step then
  runs one forward and one backward (or input backward), and the backward order starts at the last chunk, so in the
  first :math:`R` steps both are the last chunk's, of the same micro-batch; afterwards its forwards wait for the next
  round. ``ScheduleZBVZeroBubble``: rank 0's second chunk, the last virtual stage, runs each forward's input backward
  next.
* Megatron-Core 0.16.1 ``pipeline_parallel/schedules.py``, ``forward_backward_pipelining_with_interleaving``: warm-up
  :math:`2(S - r - 1) + (v - 1)G` forwards (:math:`G` = ``microbatch_group_size_per_vp_stage``, default :math:`S`) in
  ``get_schedule_table``'s order, each backward's chunk ``num_model_chunks - 1`` less the same table's: the order
  above.

Replaying the three orders (``tests/integration/test_looped_orders.py``) gives one micro-batch of the last chunk at
every peak of the last rank (and of rank 0 under ZB-V) for :math:`S \le 8`, :math:`v \le 4`, :math:`m \le 4S`. Not
priced: ZB's weight-gradient passes keep part of a micro-batch's tensors past its input backward (torch's
``stage_backward_input`` keeps the weights' inputs for ``stage_backward_weight``), as :mod:`objectives.schedules`
prices ZB's activations as 1F1B's.
"""

from __future__ import annotations

import numpy as np

__all__ = ["TAIL_IN_FLIGHT_LOOPED", "tail_activation_bytes", "tail_in_flight"]

TAIL_IN_FLIGHT_LOOPED = 1.0
"""Micro-batches of the ops after the last layer the model's last chunk holds at its rank's peak under a looped
schedule (module docstring)."""


def tail_in_flight(in_flight, chunks: int):
    """Micro-batches of the ops after the last layer the last stage holds at its peak: one under a looped schedule
    (``chunks > 1``), else the stage's own ``in_flight`` (1F1B: 1; GPipe: all). ``in_flight``: the last stage's count,
    any shape (a search's per segment); the result broadcasts against it.

    >>> tail_in_flight(4.5, 2), tail_in_flight(1.0, 1), tail_in_flight(8.0, 1)
    (1.0, 1.0, 8.0)
    """
    return TAIL_IN_FLIGHT_LOOPED if chunks > 1 else in_flight


def tail_activation_bytes(activations: np.ndarray, position: np.ndarray, num_layers: int,
                          pairs: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None,
                          credit: np.ndarray | None = None) -> float:
    """Bytes per micro-batch of the ops after the last layer, as a stage's per-micro-batch activations charge them.

    ``activations``: ``(n_ops,)`` each op's at its configuration; ``position``: ``LayerStructure.position`` (``L``
    after the last layer); ``pairs``: the sequence-shard credit's ``(producers, readers, bytes)``
    (``objectives.pipeline_price._shard_pairs``), of which the pairs with both ops after the last layer come off (a
    stage's own pairs come off its activations); ``credit``: ``(n_ops,)`` a per-op credit taken off likewise (the
    fused SwiGLU's, ``objectives.pipeline_price._credit_at``).

    >>> tail_activation_bytes(np.array([5.0, 7.0, 3.0, 2.0]), np.array([-1, 0, 1, 1]), 1,
    ...                       (np.array([2, 1]), np.array([3, 3]), np.array([0.5, 4.0])))
    4.5
    """
    after = np.asarray(position) >= num_layers
    total = float(np.asarray(activations, dtype=np.float64)[after].sum())
    if credit is not None:
        total -= float(np.asarray(credit, dtype=np.float64)[after].sum())
    if pairs is not None and pairs[0].size:
        both = after[pairs[0]] & after[pairs[1]]
        total -= float(np.asarray(pairs[2], dtype=np.float64)[both].sum())
    return total
