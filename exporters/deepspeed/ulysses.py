r"""DeepSpeed-Ulysses context parallelism: what it runs, as per-op masks, and what it needs.

Ulysses (Jacobs et al. 2023, "DeepSpeed Ulysses", arXiv:2309.14509, section 3) splits every sample's
sequence ``cp`` ways over the ranks of a sequence-parallel group; around the attention core an
all-to-all trades that split for a split of the heads, so each rank attends over the whole sequence
for ``heads / cp`` heads, and a second all-to-all trades it back. DeepSpeed 0.19 runs it on Hugging
Face models as Arctic Long Sequence Training (``deepspeed.runtime.sequence_parallel.ulysses_sp``):
``UlyssesSPAttentionHF.register_with_transformers(...)`` registers the attention and returns the
``mpu`` handed to ``deepspeed.initialize``, and ``UlyssesSPDataLoaderAdapter`` shards each batch's
sequence.

Its rules, from that module:

* the heads divide by ``cp`` (``UlyssesSPAttentionHF.__init__``: "Attention head count ... is not
  divisible by SP size"), and the KV heads divide by ``cp`` or ``cp`` by them (fewer KV heads than
  ranks are replicated);
* the sequence divides by ``cp`` (``UlyssesSPDataLoaderAdapter``: "batch's seqlen ... isn't divisible
  by sp-size");
* the model's attention runs through transformers' attention functions, which it wraps
  (``register_with_transformers`` takes ``ALL_ATTENTION_FUNCTIONS[core_attn_implementation]`` and refuses a
  loaded model whose ``_attn_implementation`` differs): disentangled attention (DeBERTa,
  :mod:`importers.attention_terms`) computes its position terms in its own eager module and is refused;
* ZeRO shards parameters, gradients and optimizer states over all ``dp x cp`` ranks (the sequence data
  parallel group of ``parallel_state_sp``), as the planner's ZeRO does over the weights' copies;
* ``DeepSpeedConfig`` checks the batch against ``world / cp`` ranks (``mpu`` without
  ``get_data_parallel_world_size``).

Not combined here with AutoTP (``tp``), pipelines or Mixture-of-Experts layers: ALST documents none
of them.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from exporters._target import CP_MIN_TOKENS
from exporters._tp import MaskResult, layout_masks, tp_layout
from importers.transformer import TransformerModel, analyze_transformer, moe_summary
from planner.core.configs import ConfigSpace
from planner.core.errors import UnsupportedExport
from planner.core.graph import OpGraph

__all__ = ["ulysses_problem", "unwrapped_attention", "ulysses_degrees", "ulysses_masks", "ulysses_setup"]


def ulysses_problem(model: TransformerModel, cp: int) -> str | None:
    """Why DeepSpeed-Ulysses cannot run ``model`` at ``cp`` ranks (``None``: it can).

    >>> from types import SimpleNamespace
    >>> model = SimpleNamespace(num_attention_heads=32, num_query_groups=8, seq_length=8192)
    >>> ulysses_problem(model, 16) is None, ulysses_problem(model, 3)
    (True, 'Ulysses sequence-parallel size 3 must divide the 32 attention heads')
    """
    if model.num_attention_heads % cp:
        return f"Ulysses sequence-parallel size {cp} must divide the {model.num_attention_heads} attention heads"
    kv = model.num_query_groups
    if kv % cp and cp % kv:
        return f"Ulysses sequence-parallel size {cp} and the {kv} KV heads must divide one another"
    if model.seq_length % cp:
        return f"Ulysses sequence-parallel size {cp} must divide the sequence length {model.seq_length}"
    return None


def unwrapped_attention(model: TransformerModel) -> str | None:
    """Why Ulysses cannot wrap ``model``'s attention (``None``: it can): its scores add relative-position
    terms computed from the queries and keys (:mod:`importers.attention_terms`), which the attention
    function Ulysses wraps never sees (module docstring)."""
    if any(a.position_scores for a in model.attention):
        return ("DeepSpeed-Ulysses wraps the attention function (queries, keys, values and a mask) and this attention "
                "adds relative-position terms computed from its queries or keys to the scores (DeBERTa's disentangled "
                "attention, Transformer-XL's relative attention), which Hugging Face's model computes in its own eager module")
    return None


def ulysses_degrees(model: TransformerModel, model_ranks: int) -> list[int]:
    """The Ulysses degrees searched on ``model_ranks`` non-data-parallel ranks: ``cp = model_ranks``
    (no AutoTP beside it) when the model allows it and each rank keeps :data:`CP_MIN_TOKENS` tokens
    (the same heuristic as the other launchers' context parallelism); ``[]`` otherwise."""
    cp = model_ranks
    if cp == 1 or unwrapped_attention(model) or ulysses_problem(model, cp) is not None or model.seq_length // cp < CP_MIN_TOKENS:
        return []
    return [cp]


def ulysses_masks(
    graph: OpGraph, spaces: Sequence[ConfigSpace], *, dp: int, cp: int, devices_per_node: int | None,
) -> MaskResult:
    """Per op, the configurations DeepSpeed-Ulysses runs at ``dp x cp``: every op's sequence split
    ``cp`` ways except the attention core's, whose heads are (:func:`exporters._tp.layout_masks`
    with ``ulysses``); :class:`UnsupportedExport` when the model cannot run it."""
    if moe_summary(graph) is not None:
        raise UnsupportedExport("DeepSpeed-Ulysses (ALST) is not combined with Mixture-of-Experts layers here; plan cp=1")
    model = analyze_transformer(graph)
    problem = unwrapped_attention(model) or ulysses_problem(model, cp)
    if problem:
        raise UnsupportedExport(problem)
    layout = tp_layout(graph, model, target="deepspeed")
    return layout_masks(graph, spaces, layout, dp=dp, tp=1, sequence_parallel=False,
                        devices_per_node=devices_per_node or dp * cp, cp=cp, ulysses=True)


def ulysses_accepts(masks: Sequence[np.ndarray], choice: Sequence[int]) -> bool:
    """Whether every op's chosen row is one Ulysses runs."""
    return all(bool(mask[row]) for mask, row in zip(masks, choice))


def ulysses_setup(model: TransformerModel, *, cp: int, micro_batch: int) -> tuple[str, str]:
    """``(code, note)``: the lines a training script runs before ``deepspeed.initialize`` to train with
    Ulysses at ``cp``, and the note that says where they go."""
    code = (
        "from deepspeed.runtime.sequence_parallel.ulysses_sp import UlyssesSPAttentionHF, UlyssesSPDataLoaderAdapter\n"
        "mpu = UlyssesSPAttentionHF.register_with_transformers(\n"
        f"    model_name_or_path=model, core_attn_implementation='flash_attention_2', sequence_parallel_size={cp},\n"
        f"    micro_batch_size={micro_batch}, seq_length={model.seq_length}, seq_length_is_variable=False)\n"
        "engine, *_ = deepspeed.initialize(model=model, config='ds_config.json', mpu=mpu)\n"
        "train_loader = UlyssesSPDataLoaderAdapter(train_loader, sp_rank=mpu.get_sequence_parallel_rank(),\n"
        "    sp_group=mpu.get_sequence_parallel_group(), sp_world_size=mpu.get_sequence_parallel_world_size(),\n"
        "    device=engine.device)"
    )
    note = (
        f"DeepSpeed-Ulysses over {cp} ranks (ALST): run ulysses.code before training (a Hugging Face model; "
        "flash_attention_2 or sdpa attention); train_batch_size counts the data-parallel ranks (world / cp)"
    )
    return code, note
