r"""Model chunks of a looped pipeline schedule (interleaved 1F1B, looped ZB-H1, ZB-V): how a stage's
layers are cut into its ``v`` chunks (virtual stages), the one split the pricing
(``objectives.schedules``, ``planner.search.stages``) and the exports (Megatron-LM's
``--pipeline-model-parallel-layout``, torchtitan's ``module_fqns_per_model_part``) share, and the
factor the looped schedules' closed forms price an uneven split with.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from planner.core.errors import InputError

__all__ = ["chunk_layers", "chunk_pad"]


def chunk_layers(layers: int, chunks: int, *, first_stage: bool = False) -> tuple[int, ...]:
    """A stage's ``layers`` cut into ``chunks`` model chunks as evenly as whole layers allow, in model
    order: the larger chunks first, on the first stage last (its first chunk holds the embedding, a
    later stage's last chunk the output layer and loss: each the lighter).

    >>> chunk_layers(8, 2), chunk_layers(7, 2), chunk_layers(7, 2, first_stage=True), chunk_layers(10, 4)
    ((4, 4), (4, 3), (3, 4), (3, 3, 2, 2))
    """
    if chunks < 1 or layers < 0:
        raise InputError(f"a stage's {layers} layers cannot be cut into {chunks} model chunks")
    q, r = divmod(int(layers), int(chunks))
    sizes = (q + 1,) * r + (q,) * (chunks - r)
    return sizes[::-1] if first_stage else sizes


def chunk_pad(stage_layers: np.ndarray | Sequence[float], chunks: int) -> np.ndarray:
    r"""Per stage of :math:`n` layers cut into :math:`v` chunks (:func:`chunk_layers`), its largest
    chunk's share of its passes times :math:`v`: :math:`v \lceil n/v \rceil / n` (1 where :math:`v`
    divides :math:`n`, and for no layers). The looped schedules price a stage as if every chunk took its
    largest chunk's time and held its activations: its passes times this factor
    (``objectives.schedules.pipeline_time_s``, ``in_flight_micro_batches``).

    >>> chunk_pad([8, 7, 3, 0], 2).tolist()
    [1.0, 1.1428571428571428, 1.3333333333333333, 1.0]
    """
    n = np.asarray(stage_layers, dtype=np.float64)
    safe = np.maximum(n, 1.0)
    return np.where(n > 0, chunks * np.ceil(safe / chunks) / safe, 1.0)
