r"""Multi-latent attention (DeepSeek-V2/V3, :mod:`importers.mla`) in Megatron-LM's flags (issue 25 item 3:
"exact or refused").

Megatron-LM trains MLA with ``--multi-latent-attention`` (``megatron.core.transformer.multi_latent_attention.MLASelfAttention``,
built from ``MLATransformerConfig``, core_v0.16.1). Its flags and the fields they set
(``megatron/training/arguments.py``, core_v0.16.1):

==========================  ========================  ==============================================
flag                        ``MLATransformerConfig``  DeepSeek's name (:class:`importers.mla.LatentAttention`)
==========================  ========================  ==============================================
``--q-lora-rank``           ``q_lora_rank``           ``q_lora_rank`` (absent: one full-rank ``q_proj``)
``--kv-lora-rank``          ``kv_lora_rank``          ``kv_lora_rank``
``--qk-head-dim``           ``qk_head_dim``           ``qk_nope_head_dim``
``--qk-pos-emb-head-dim``   ``qk_pos_emb_head_dim``   ``qk_rope_head_dim``
``--v-head-dim``            ``v_head_dim``            ``v_head_dim``
==========================  ========================  ==============================================

Always written beside them:

* ``--qk-layernorm``: DeepSeek normalises both latents (``q_a_layernorm``, ``kv_a_layernorm``); in
  megatron-core 0.16.1's ``get_gpt_layer_with_transformer_engine_spec`` /
  ``get_gpt_layer_local_spec`` the MLA ``q_layernorm`` and ``kv_layernorm`` are ``IdentityOp``
  unless ``qk_layernorm`` (the TE spec fuses them into the up-projections,
  ``column_parallel_layer_norm_linear``). ``MLASelfAttention`` builds ``q_layernorm`` only with a
  ``q_lora_rank``, so a layer has 2 latent norms (low-rank query) or 1 (full-rank).
* ``--rope-type rope``: ``MLATransformerConfig.rope_type`` defaults to ``"yarn"`` and
  Megatron-LM's ``--rope-type`` help says "MLA takes yarn by default"; the file's frequencies, when it
  has them, are plain geometric RoPE (:func:`exporters.megatron.families.megatron_rotary_args` writes
  their base). ``RotaryEmbedding(qk_pos_emb_head_dim, ...)`` turns the rope channels only, so
  ``--rotary-percent`` is a share of those (:func:`rotary_channels`). A YaRN-scaled file
  (DeepSeek-V3's config: factor 40, ``mscale`` / ``mscale_all_dim`` 1) is refused: its frequencies
  are not geometric, and ``--rotary-scaling-factor``, ``--mscale``, ``--mscale-all-dim``, the beta
  ramp and the original length are not in the graph (:data:`YARN_REFUSAL`).

Which rotary layout the file uses (Hugging Face's ``rope_interleave``: channels de-interleaved
before ``rotate_half``, as Megatron's ``_apply_rotary_pos_emb_bshd(..., multi_latent_attention=True)``
does) is a fixed permutation of the rope channels of ``q_b_proj`` and ``kv_a_proj_with_mqa``: the
same model up to the order of randomly initialised weights, so it is not a flag.

Tensor parallelism (``gpt_layer_specs``, core_v0.16.1): the down-projections are ``backend.linear()``
(replicated: ``TELinear(parallel_mode="duplicated")``), the up-projections (``linear_q_up_proj`` or
``linear_q_proj``, ``linear_kv_up_proj``) column-parallel and ``linear_proj`` row-parallel, so ``tp``
splits the heads and must divide them (``TransformerConfig`` asserts it).
"""

from __future__ import annotations

from importers.transformer import LatentAttention, TransformerModel  # importers.mla's, as the model carries it

__all__ = [
    "YARN_REFUSAL", "UNSEEN_SCALING_NOTE", "model_mla", "mla_refusals", "megatron_mla_args", "rotary_channels",
    "latent_norms",
]

YARN_REFUSAL = (
    "its multi-latent attention's rotary frequencies are not a geometric series (a YaRN-scaled RoPE, as "
    "DeepSeek-V3's); Megatron-LM's --rope-type yarn needs --rotary-scaling-factor, --mscale, --mscale-all-dim, "
    "the beta ramp and the original length, which the graph does not give exactly"
)
"""One clause of :func:`exporters.megatron.families.megatron_family`'s refusal of a scaled-RoPE MLA."""

UNSEEN_SCALING_NOTE = (
    "; nor can the file show whether its multi-latent attention's RoPE is YaRN-scaled (DeepSeek-V3's is: "
    "--rope-type yarn with --rotary-scaling-factor, --mscale, --mscale-all-dim); --rope-type rope assumes not"
)
"""Added to the rotary note of a file without frequencies (a bare graph-only file) whose attention is MLA."""


def model_mla(model: TransformerModel) -> LatentAttention | None:
    """The first layer's multi-latent attention (``None``: the model's attention is not MLA)."""
    return model.attention[0].mla if model.attention else None


def mla_refusals(model: TransformerModel) -> list[str]:
    """Why ``--multi-latent-attention`` cannot train ``model`` as it is, one clause each (empty: it can,
    or the model has no MLA): one ``MLATransformerConfig`` holds one set of sizes for every layer."""
    first = model_mla(model)
    if first is None:
        return [] if all(a.mla is None for a in model.attention) else [
            "some of its layers use multi-latent attention and some do not; --multi-latent-attention applies to all"]
    sizes = {_sizes(a.mla) if a.mla is not None else None for a in model.attention}
    if len(sizes) > 1:
        return ["its multi-latent attention layers differ in their latent or head sizes; Megatron-LM's "
                "MLATransformerConfig holds one set for every layer"]
    return []


def _sizes(mla: LatentAttention) -> tuple[int | None, int, int, int, int]:
    return mla.q_lora_rank, mla.kv_lora_rank, mla.qk_nope_head_dim, mla.qk_rope_head_dim, mla.v_head_dim


def megatron_mla_args(model: TransformerModel) -> list[str]:
    """The MLA flags (module docstring's table, ``--qk-layernorm`` and ``--rope-type rope``); ``[]``
    for a model without MLA.

    Examples
    --------
    >>> from types import SimpleNamespace as N
    >>> mla = LatentAttention(q_down=0, q_up=1, kv_down=2, kv_up=3, hidden_size=7168, heads=128,
    ...                       q_lora_rank=1536, kv_lora_rank=512, qk_nope_head_dim=128, qk_rope_head_dim=64,
    ...                       v_head_dim=128)
    >>> " ".join(megatron_mla_args(N(attention=(N(mla=mla),))))  # DeepSeek-V3's sizes
    '--multi-latent-attention --q-lora-rank 1536 --kv-lora-rank 512 --qk-head-dim 128 --qk-pos-emb-head-dim 64 --v-head-dim 128 --qk-layernorm --rope-type rope'
    """
    mla = model_mla(model)
    if mla is None:
        return []
    args = ["--multi-latent-attention"]
    if mla.q_lora_rank is not None:  # absent: Megatron-LM's default None, one column-parallel linear_q_proj
        args += ["--q-lora-rank", str(mla.q_lora_rank)]
    args += ["--kv-lora-rank", str(mla.kv_lora_rank), "--qk-head-dim", str(mla.qk_nope_head_dim),
             "--qk-pos-emb-head-dim", str(mla.qk_rope_head_dim), "--v-head-dim", str(mla.v_head_dim)]
    return args + ["--qk-layernorm", "--rope-type", "rope"]


def rotary_channels(model: TransformerModel) -> int:
    """The channels per head Megatron's ``RotaryEmbedding`` is built over: MLA's rope part
    (``qk_pos_emb_head_dim``), else the head size (``kv_channels``)."""
    mla = model_mla(model)
    return mla.qk_rope_head_dim if mla is not None else model.head_dim


def latent_norms(model: TransformerModel) -> int:
    """The norms MLA adds to a layer (module docstring): ``kv_layernorm``, and ``q_layernorm`` with a
    low-rank query; 0 without MLA."""
    mla = model_mla(model)
    return 0 if mla is None else 1 + (mla.q_lora_rank is not None)
