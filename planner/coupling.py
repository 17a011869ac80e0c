r"""Models whose batch is coupled across samples, in the search: what launchers run, said in one note.

The importer records the ops that read across the batch (:attr:`OpGraph.batch_coupled`,
:mod:`importers.batch_coupling`); this module decides what the search does with each kind, from
what the launchers and the training scripts people run really do:

* **A contrastive loss** (``similarity``: CLIP's batch x batch logits). Micro-batches change the
  objective: ``m`` micro-batches of ``B / m`` samples contrast each sample with ``B / m - 1``
  negatives instead of ``B - 1``, and accumulating their gradients does not give the full batch's
  gradient (GradCache, Gao et al. 2021, recomputes the embeddings to get it; no launcher here runs
  it). So the pipeline / micro-batch search keeps **one micro-batch per step**
  (:attr:`PipelineOptions.max_micro_batches` = 1: each data-parallel rank runs its share of the
  global batch at once) unless ``--allow-batch-split``. Data parallelism keeps the objective when the
  ranks all-gather the embeddings before the similarity, as open_clip's ``gather_features``
  (``--gather-with-grad --local-loss``) does: the planner prices the graph's full similarity matrix
  with its operands redistributed across the data-parallel ranks (the all-gather an edge costs), so a
  data-parallel row is that training script, and the note says the script must gather.
* **BatchNorm** (``batch_norm``): launchers compute its statistics per data-parallel rank and per
  micro-batch (DDP; ``nn.SyncBatchNorm`` reduces them across ranks, and nothing reduces them across
  micro-batches), and the op rule prices exactly that (no collective). Nothing is restricted; the
  note says so, since rows with few samples per rank and micro-batch normalise over few samples.
* **A batch dim that is not a sample dim** (``indexed``: a GNN's nodes, gathered and scattered by
  ``edge_index``). Scaling it by ``--global-batch``, micro-batching it or splitting it as data
  parallelism would cut one graph into pieces that lose their edges, so those are refused
  (:class:`NotSamples`, exit 2); ``planner plan`` without them lists the launchable table with the
  whole graph as one sample per step (:class:`planner.pipeline.WholeGraphLoader`: dp 1, one
  micro-batch, the node dim split inside ops as a sequence is).
"""

from __future__ import annotations

import dataclasses

from planner.core.errors import InputError
from planner.core.graph import BatchCoupling, OpGraph
from planner.search.pipeline import PipelineOptions

__all__ = ["NotSamples", "require_samples", "coupled_options", "coupling_note"]


class NotSamples(InputError):
    """The dim the planner would scale as the batch is not a sample dim (a GNN's nodes)."""

    def __init__(self, reason: str, fix: str) -> None:
        super().__init__(f"{reason}; {fix}")
        self.reason = reason
        """Why, without the fix (the CLI's fallback warns with it)."""


def _listed(couplings: list[BatchCoupling], most: int = 2) -> str:
    names = ", ".join(c.op for c in couplings[:most])
    return names + (f" and {len(couplings) - most} more" if len(couplings) > most else "")


def require_samples(graph: OpGraph, batch_dim: str) -> OpGraph:
    """``graph`` when its batch dim is a sample dim, else :class:`NotSamples` with the reason and the fix.

    Examples
    --------
    >>> from planner.core.graph import BatchCoupling
    >>> why = "Gather reads across 'nodes' by indices from edge_index[2, edges]"
    >>> g = OpGraph(name="gnn", ops=(), tensors={}, edges=(), batch_coupled=(BatchCoupling(op="src", kind="indexed", reason=why),))
    >>> require_samples(g, "nodes")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    planner.coupling.NotSamples: gnn's batch dim 'nodes' is not a sample dim: src: Gather reads across ...
    """
    indexed = [c for c in graph.batch_coupled if c.kind == "indexed"]
    if not indexed:
        return graph
    reason = (
        f"{graph.name}'s batch dim '{batch_dim}' is not a sample dim: {indexed[0].op}: {indexed[0].reason}"
        + (f" (and {len(indexed) - 1} more)" if len(indexed) > 1 else "")
        + ", as a graph neural network indexes its nodes, so micro-batches and data parallelism would cut the graph"
    )
    fix = ("plan the whole graph as one sample per step: `planner plan` without --global-batch, --micro-batch or "
           f"--fix mb/dp plans the graph at its --dim {batch_dim}")  # fmt: skip
    raise NotSamples(reason, fix)


def coupled_options(graph: OpGraph, options: PipelineOptions, *, allow_batch_split: bool) -> PipelineOptions:
    """``options`` kept to one micro-batch per step when ``graph`` has a contrastive loss, unless
    ``allow_batch_split`` (module docstring)."""
    if allow_batch_split or not any(c.kind == "similarity" for c in graph.batch_coupled):
        return options
    return dataclasses.replace(options, max_micro_batches=1)


def coupling_note(graph: OpGraph, options: PipelineOptions) -> str | None:
    """One line under the table: which ops couple the batch and what the search did (``None``: none).

    Examples
    --------
    >>> from planner.core.graph import BatchCoupling
    >>> bn = BatchCoupling(op="bn1", kind="batch_norm", reason="BatchNorm statistics over the batch")
    >>> coupling_note(OpGraph(name="cnn", ops=(), tensors={}, edges=(), batch_coupled=(bn,)), PipelineOptions(global_batch=8))
    'batch-coupled: 1 BatchNorm (bn1): statistics per data-parallel rank and micro-batch, as DDP runs them (SyncBatchNorm not priced)'
    """
    similar = [c for c in graph.batch_coupled if c.kind == "similarity"]
    norms = [c for c in graph.batch_coupled if c.kind == "batch_norm"]
    parts = []
    if similar:
        kept = options.max_micro_batches == 1
        split = ("one micro-batch per step, as micro-batches would train a different objective (--allow-batch-split "
                 "lifts it)" if kept else
                 "micro-batched as --allow-batch-split asks: a row with more than one micro-batch trains a different "
                 "objective (fewer negatives per loss) unless the script uses GradCache")  # fmt: skip
        parts.append(
            f"{_listed(similar)} ({similar[0].reason}): {split}; data-parallel rows priced with the whole batch's "
            "similarity, its operands gathered across ranks, which the script must do (open_clip: --gather-with-grad "
            "--local-loss)"
        )
    if norms:
        parts.append(f"{len(norms)} BatchNorm ({_listed(norms)}): statistics per data-parallel rank and micro-batch, "
                     "as DDP runs them (SyncBatchNorm not priced)")  # fmt: skip
    return "batch-coupled: " + "; ".join(parts) if parts else None
