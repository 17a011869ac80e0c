"""What an export says about a contrastive loss, a loss coupled across the batch (issue 25, task H2).

The importer records a batch x batch similarity (CLIP's ``image_emb @ text_emb^T``) as coupling the
samples (:attr:`OpGraph.batch_coupled`, kind ``similarity``). Two facts of a plan change what such a
model trains, and the table's note (``planner.coupling``) says them under the table only; every
export of the plan carries them too (:func:`exporters.export` adds :func:`contrastive_note` to a
launcher's ``notes``; the generic plan writes it as ``batch.coupling``), whichever launcher it is for:

* **micro-batches** (``--allow-batch-split``): ``m`` micro-batches of a ``B``-sample step contrast each
  sample with the ``B / m - 1`` others of its micro-batch, not ``B - 1``, and accumulating their
  gradients does not give the full batch's (GradCache, Gao et al. 2021, recomputes the embeddings to
  get it; no launcher here runs it);
* **data parallelism**: the plan prices the micro-batch's whole similarity with its operands gathered
  across the data-parallel ranks, which the training script must do (open_clip's
  ``--gather-with-grad --local-loss``); without the gather each rank contrasts its own samples only.
"""

from __future__ import annotations

from typing import Any

from exporters._common import strategy_degrees

__all__ = ["contrastive_note"]


def contrastive_note(plan_input: Any) -> str:
    """One note on what ``plan_input`` (an :class:`exporters.generic.PlanInput`, not imported: the generic
    plan writes this note too) does to the model's contrastive loss (``""``: the model has none, or the
    plan runs the whole step's batch in one pass on one data-parallel rank).

    The counts are samples: a pass holds ``samples_per_pass`` over all data-parallel ranks, a step
    ``samples_per_step``."""
    similar = [c.op for c in plan_input.graph.batch_coupled if c.kind == "similarity"]
    if not similar:
        return ""
    where = ", ".join(similar[:2]) + (f" and {len(similar) - 2} more" if len(similar) > 2 else "")
    passes, per_pass, per_step = plan_input.grad_accum, plan_input.samples_per_pass, plan_input.samples_per_step
    dp = strategy_degrees(plan_input.graph, plan_input.spaces, plan_input.strategy.choice).dp
    parts = []
    if passes > 1:
        parts.append(
            f"this plan runs {passes} micro-batches per step, so the contrastive loss ({where}) trains a different "
            f"objective than one batch of {per_step}: each sample is contrasted with the {per_pass - 1} others of its "
            f"micro-batch, not {per_step - 1}, and the accumulated gradient is not the batch's (GradCache would keep "
            "it; plan without --allow-batch-split for one micro-batch per step)"
        )
    if dp > 1:
        parts.append(
            f"the plan prices the whole {per_pass}-sample similarity ({where}) with its operands gathered across the "
            f"{dp} data-parallel ranks: the training script must all-gather the embeddings before it (open_clip: "
            f"--gather-with-grad --local-loss), or each rank contrasts only its own {per_pass // dp} samples"
        )
    return "batch-coupled: " + "; ".join(parts) if parts else ""
