"""The config registry module the torchtitan export writes, ``planner_torchtitan.py``.

torchtitan 0.3.0 takes no model size on the command line (``Trainer.Config.model_spec`` is suppressed
for tyro), so the planned model is a module: ``planner_model()`` returns the family's preset trainer
settings (:attr:`~exporters.torchtitan.families.FamilySpec.preset`) with a model config of the
planned sizes, built by the family's own layer helper (``llama3._build_llama3_layers``,
``qwen3._build_qwen3_layers``, ``deepseek_v3._build_dsv3_layers``, with DeepSeek-V3's MoE arguments where
the file routes (:mod:`exporters.torchtitan.moe`): private in 0.3.0, hence the
pinned version; ``tests/integration/test_torchtitan_export.py`` and ``test_torchtitan_families_export.py``
build it), then every RMSNorm's epsilon set to the file's (the helpers fix it: 1e-5 in llama3 and
deepseek_v3, 1e-6 in qwen3).
"""

from __future__ import annotations

from exporters.torchtitan.families import TorchtitanArch, mla_sizes
from exporters.torchtitan.moe import DeepSeekRouting

__all__ = ["CONFIG_MODULE", "CONFIG_FUNCTION", "TORCHTITAN_VERSION", "torchtitan_config_module"]

TORCHTITAN_VERSION = "0.3.0"
"""The torchtitan release whose config registry, overrides and rules the export follows."""

CONFIG_MODULE = "planner_torchtitan"
"""The written registry module (``--module``; the file is ``planner_torchtitan.py``)."""

CONFIG_FUNCTION = "planner_model"
"""Its config function (``--config``)."""


def _dense_mla_moe(arch: TorchtitanArch) -> str:
    """The MoE arguments of a dense MLA model: ``n_dense_layers`` = the layer count, so the MoE arguments,
    which the helper requires, build nothing."""
    model = arch.model
    return (
        f"        n_dense_layers={model.num_layers},  # every layer a dense SwiGLU, as planned: no MoE layer\n"
        f"        dense_hidden_dim={model.ffn_hidden_size},\n"
        f"        moe_hidden_dim={model.ffn_hidden_size},\n"
        "        num_experts=1,\n"
        "        num_shared_experts=0,\n"
        "        router_top_k=1,\n"
        '        router_score_func="softmax",\n'
    )


def _routed_mla_moe(routing: DeepSeekRouting) -> str:
    """The MoE arguments of a routed MLA model, as :mod:`exporters.torchtitan.moe` read them."""
    router = routing.router
    groups = (f"        router_num_expert_groups={router.groups},\n"
              f"        router_num_limited_groups={router.topk_groups},  # each group scored by its top 2, summed\n"
              if router.groups > 1 else "")
    return (
        f"        n_dense_layers={routing.n_dense_layers},  # the leading dense layers; every later one routes\n"
        f"        dense_hidden_dim={routing.dense_ffn},\n"
        f"        moe_hidden_dim={routing.expert_ffn},\n"
        f"        num_experts={router.num_experts},\n"
        f"        num_shared_experts={routing.num_shared_experts},  # one shared SwiGLU of moe_hidden_dim x this\n"
        f"        router_top_k={router.top_k},\n"
        f"        router_score_func={router.score_function!r},\n"
        f"{groups}"
        f"        router_route_norm={routing.route_norm},\n"
        f"        router_route_scale={router.scaling!r},\n"
    )


def _routed_mla_fixes(routing: DeepSeekRouting | None) -> str:
    """After the helper: the score bias (``load_balance_coeff``; ``None``: no bias) and, without shared
    experts, no shared MLP (the helper builds one of ``moe_hidden_dim x 0``)."""
    if routing is None:
        return ""
    bias = ("the router's score bias, updated after each step" if routing.load_balance_coeff is not None
            else "no score bias")
    lines = (f"    for layer in layers[{routing.n_dense_layers}:]:  # {bias}\n"
             f"        layer.moe.load_balance_coeff = {routing.load_balance_coeff!r}\n")
    if not routing.num_shared_experts:
        lines += "        layer.moe.shared_experts = None  # no shared expert\n"
    return lines


def _mla_layers(arch: TorchtitanArch) -> str:
    """deepseek_v3's layer helper: dense (:func:`_dense_mla_moe`) or with the file's MoE layers
    (:func:`_routed_mla_moe`)."""
    model = arch.model
    q_rank, kv_rank, nope, rope, v = mla_sizes(model.attention[0].mla)
    moe = _dense_mla_moe(arch) if arch.routing is None else _routed_mla_moe(arch.routing)
    return (
        "    layers = deepseek_v3._build_dsv3_layers(\n"
        f"        n_layers={model.num_layers},\n"
        "        dim=dim,\n"
        f"        n_heads={model.num_attention_heads},\n"
        f"        q_lora_rank={q_rank},\n"
        f"        kv_lora_rank={kv_rank},\n"
        f"        qk_nope_head_dim={nope},\n"
        f"        qk_rope_head_dim={rope},\n"
        f"        v_head_dim={v},\n"
        "        mscale=1.0,  # read by YaRN only\n"
        f"{moe}"
        f"        rope=ComplexRoPE.Config(dim={rope}, max_seq_len={model.seq_length}, theta={arch.theta!r}),\n"
        '        attn_backend="flex",\n'
        '        moe_comm_backend="standard",\n'
        "        non_blocking_capacity_factor=None,\n"
        "    )\n"
        f"{_routed_mla_fixes(arch.routing)}"
    )


def _moe_layers(arch: TorchtitanArch) -> str:
    """qwen3's MoE layer helper, then the router as the file has it (``route_norm``: the top-k scores
    renormalised, Qwen3-MoE's ``norm_topk_prob``) and no auxiliary-loss-free routing bias
    (``make_moe_config``'s ``load_balance_coeff=1e-3`` adds one to the expert choice; Hugging Face's
    Qwen3-MoE has none)."""
    model, moe = arch.model, arch.moe
    assert moe is not None
    return (
        "    layers = qwen3._build_qwen3_moe_layers(\n"
        f"        n_layers={model.num_layers},\n"
        "        dim=dim,\n"
        f"        n_heads={model.num_attention_heads},\n"
        f"        n_kv_heads={model.num_query_groups},\n"
        f"        head_dim={model.head_dim},\n"
        f"        moe_hidden_dim={model.ffn_hidden_size},\n"
        f"        num_experts={moe.num_experts},\n"
        f"        top_k={moe.top_k},\n"
        f"        rope=CosSinRoPE.Config(dim={model.head_dim}, max_seq_len={model.seq_length}, theta={arch.theta!r}),\n"
        '        attn_backend="flex",\n'
        '        moe_comm_backend="standard",  # dropless; all-to-all over the ep ranks with expert parallelism\n'
        "    )\n"
        "    for layer in layers:  # the file's router, and no routing bias\n"
        f"        layer.moe.router.route_norm = {moe.renormalized}\n"
        "        layer.moe.load_balance_coeff = None\n"
    )


def _layers(arch: TorchtitanArch) -> str:
    """The family helper's call building the layers (the model's lines of :func:`torchtitan_config_module`)."""
    model, name = arch.model, arch.family.name
    if name == "deepseek_v3":
        return _mla_layers(arch)
    if arch.moe is not None:
        return _moe_layers(arch)
    head = f"        head_dim={model.head_dim},\n" if name == "qwen3" else ""  # llama3: dim // n_heads
    return (
        f"    layers = {name}._build_{name}_layers(\n"
        f"        n_layers={model.num_layers},\n"
        "        dim=dim,\n"
        f"        n_heads={model.num_attention_heads},\n"
        f"        n_kv_heads={model.num_query_groups},\n"
        f"{head}"
        f"        hidden_dim={model.ffn_hidden_size},\n"
        f"        rope={arch.family.rope}.Config(dim={model.head_dim}, max_seq_len={model.seq_length}, "
        f"theta={arch.theta!r}{_scaling(arch)}),\n"
        '        attn_backend="flex",\n'
        "    )\n"
    )


def _scaling(arch: TorchtitanArch) -> str:
    """llama3's ``ComplexRoPE.Config`` arguments for Llama 3.1's scaled frequencies (``""`` without scaling)."""
    scaling = arch.scaling
    if scaling is None:
        return ""
    return (f',\n            scaling="llama", scaling_factor={scaling.factor!r}, low_freq_factor={scaling.low_freq_factor!r}, '
            f"high_freq_factor={scaling.high_freq_factor!r},\n            "
            f"original_max_position_embeddings={scaling.original_max_position_embeddings}")


def _norms(arch: TorchtitanArch) -> str:
    """The lines setting every layer norm's epsilon (qwen3: its per-head Q/K norms too)."""
    qk = {"qwen3": "        layer.attention.qk_norm.eps = eps\n",
          "deepseek_v3": "        layer.attention.q_norm.eps = layer.attention.kv_norm.eps = eps\n"}.get(arch.family.name, "")
    source = "read from the model file" if arch.eps_read else "not in the model file: the family's"
    return (f"    for layer in layers:  # the norms' epsilon, {source}\n"
            "        layer.attention_norm.eps = layer.ffn_norm.eps = eps\n" + qk)


def _latents(arch: TorchtitanArch) -> str:
    sizes = mla_sizes(arch.model.attention[0].mla) if arch.model.attention else None
    if sizes is None:
        return ""
    return (f" through latents (q {sizes[0] or 'full rank'}, kv {sizes[1]}; qk {sizes[2]} + rope {sizes[3]}, "
            f"v {sizes[4]} per head)")


def _experts(arch: TorchtitanArch) -> str:
    moe, routing = arch.moe, arch.routing
    if routing is not None:
        return (f" dense in the first {routing.n_dense_layers} layers, {routing.expert_ffn} per expert in the others "
                f"({moe.num_experts} experts, top {moe.top_k}, {routing.num_shared_experts} shared)")
    return "" if moe is None else f" per expert ({moe.num_experts} experts, top {moe.top_k})"


def torchtitan_config_module(arch: TorchtitanArch, *, fp8: str | None = None) -> str:
    """The text of ``planner_torchtitan.py`` (module docstring). ``fp8="rowwise"``: the model config goes
    through torchtitan's ``Float8LinearConverter`` (torchao float8, rowwise; ``lm_head`` filtered, as
    torchtitan's ``llama3_405b`` preset does and as priced), the 0.3 form of FP8: a converter in the
    registry, not an override."""
    model, family = arch.model, arch.family
    name, vocab, dim = family.name, model.vocab_size, model.hidden_size
    # the presets skip the embedding's init when it is the LM head's weight (qwen3's _0_6b); llama3's
    # _output_linear_init scales the head by 1/sqrt(dim), qwen3's _LINEAR_INIT is normal(0.02)
    embedding_init = "_EMBEDDING_SKIP_INIT" if model.tied_embeddings and name == "qwen3" else "_EMBEDDING_INIT"
    head_init = f"{name}._LINEAR_INIT" if name == "qwen3" else f"{name}._output_linear_init(dim)"
    return f'''"""torchtitan {TORCHTITAN_VERSION} config registry written by the planner: the {family.preset} trainer settings
with the planned {name} model ({model.num_layers} layers, hidden {dim}, {model.num_attention_heads} heads of {model.head_dim},
{model.num_query_groups} KV heads{_latents(arch)}, FFN {model.ffn_hidden_size}{_experts(arch)}, vocabulary {vocab}, rope theta {arch.theta:g}, norm eps {arch.eps:g}).
Run: PYTHONPATH=. torchrun ... -m torchtitan.train --module {CONFIG_MODULE} --config {CONFIG_FUNCTION} <overrides>."""

import dataclasses

from torchtitan.components.loss import ChunkedLossWrapper, CrossEntropyLoss
from torchtitan.models import {name}
from torchtitan.models.common import {family.rope}, Embedding, Linear, RMSNorm
from torchtitan.models.{name} import config_registry
from torchtitan.models.{name}.model import {family.model_class}


def {CONFIG_FUNCTION}():
    config = config_registry.{family.preset}()
    dim, vocab, eps = {dim}, {vocab}, {arch.eps!r}
{_layers(arch)}{_norms(arch)}    model = {family.model_class}.Config(
        dim=dim,
        vocab_size=vocab,
        enable_weight_tying={model.tied_embeddings},
        tok_embeddings=Embedding.Config(num_embeddings=vocab, embedding_dim=dim, param_init={name}.{embedding_init}),
        norm=RMSNorm.Config(normalized_shape=dim, eps=eps, param_init={name}._NORM_INIT),
        lm_head=Linear.Config(in_features=dim, out_features=vocab, param_init={head_init}),
        layers=layers,
    )
{_fp8_lines(fp8)}    config.model_spec = dataclasses.replace(config.model_spec, flavor="planner", model=model)
    config.loss = ChunkedLossWrapper.Config(loss_fn=CrossEntropyLoss.Config(global_vocab_size=vocab))
    return config
'''


def _fp8_lines(fp8: str | None) -> str:
    """The registry function's lines converting the model's linears to FP8 (none without FP8): torchtitan
    0.3's ``Float8LinearConverter`` as its llama3 presets apply it, needing torchao and ``--compile.enable``
    for speed (the fused execution model sets it)."""
    if fp8 is None:
        return ""
    return (
        "    from torchtitan.components.quantization import Float8LinearConverter\n\n"
        "    # FP8 linear layers (torchao float8, rowwise scaling), the LM head kept in bf16, as planned\n"
        f"    converter = Float8LinearConverter.Config(recipe_name={fp8!r}, filter_fqns=[\"lm_head\"],\n"
        "                                             model_compile_enabled=True)  # the launch passes --compile.enable\n"
        "    model = converter.build().convert(model)\n"
    )
