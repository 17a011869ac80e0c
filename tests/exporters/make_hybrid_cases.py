"""Build ``tests/data/hybrid_cases/``, the Mamba-2 hybrid files of ``tests/exporters/test_megatron_hybrid_moe.py``
(issue 25, h26d) that ``tests/exporters/data`` and ``tests/data/mamba2_cases`` do not hold, with torch.

Run with the integration environment (torch CPU 2.13, transformers 5.24); no downloads, random weights, seed 0,
with ``tests/zoo/make_zoo.py``'s builder (``build_arch``; the ``_consts`` style kept: graph-only, small constants
inline), dynamo exporter::

    .venv-integration/bin/python tests/exporters/make_hybrid_cases.py [NAME ...]

Two are ``GraniteMoeHybridForCausalLM`` without experts (``num_local_experts=0``: Granite-4.0-H-Micro's dense
form, each Mamba-2 or attention layer followed by the SwiGLU ``shared_mlp`` whose gate and up are one fused
``input_linear``), 2 layers ``["mamba", "attention"]``, hidden 64, 4 heads over 2 KV groups, Mamba-2 with 8 heads
of 16 and state 16, FFN 128, no position embeddings (``position_embedding_type="nope"``, Granite-4.0-H's),
``attention_multiplier`` 0.25 = 1/sqrt(16) (the standard scale), untied:

* ``granite_h_scaled``: ``embedding_multiplier`` 2, ``residual_multiplier`` 0.5, ``logits_scaling`` 4 (Granite's
  muP factors, here not 1) and ``rms_norm_eps`` at its default 1e-6;
* ``granite_h_plain``: the three factors at 1 and ``rms_norm_eps`` 1e-5 (megatron-core's), so that nothing but
  the layer kinds and sizes remains to check.

``granite_h_rope`` is ``granite_h_plain`` with rotary embeddings (``position_embedding_type="rope"``, ``rope_theta``
at its default 10,000, every head's 16 channels turned) and 2 Mamba groups (so that tp=2 divides them):
``MambaModel`` with ``--position-embedding-type rope`` (issue 25, h28f).

The fourth, ``falcon_h1_parallel`` (``FalconH1ForCausalLM``, its multipliers at their defaults), runs a Mamba-2 mixer
and attention side by side on one norm's output in each of its 2 layers, their outputs summed before the residual
add, then a SwiGLU MLP: a parallel hybrid layer, which megatron-core's ``MambaStack`` (one mixer per layer) does
not build.

The fifth, ``falcon_h1_mup`` (issue 25, h30g), is ``falcon_h1_parallel`` with round 3's multipliers
(``bench/unseen_archs.py``'s ``falcon_h1``: ``mlp_multipliers`` 0.8 and 1.25, ``embedding_multiplier`` 2,
``lm_head_multiplier`` 0.5, and the mixers' ``*_multiplier`` s): its MLP is ``silu(0.8 * gate_proj(x)) * up_proj(x)``,
a SwiGLU whose gate is scaled before the SiLU.

``counts.json`` records the configs and torch's ``sum(p.numel() for p in model.parameters())``.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "tests" / "data" / "hybrid_cases"
BASE = dict(num_hidden_layers=2, hidden_size=64, num_attention_heads=4, num_key_value_heads=2, intermediate_size=128,
            vocab_size=1000, max_position_embeddings=256, layer_types=["mamba", "attention"], mamba_n_heads=8,
            mamba_d_head=16, mamba_d_state=16, mamba_n_groups=1, mamba_chunk_size=8, mamba_expand=2,
            num_local_experts=0, shared_intermediate_size=128, position_embedding_type="nope",
            attention_multiplier=0.25, tie_word_embeddings=False)
FALCON_H1 = dict(num_hidden_layers=2, hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                 intermediate_size=128, vocab_size=1000, max_position_embeddings=256, mamba_d_ssm=128, mamba_n_heads=8,
                 mamba_d_head=16, mamba_n_groups=1, mamba_d_state=16, mamba_chunk_size=8)
CASES = {
    "granite_h_scaled": ("GraniteMoeHybridForCausalLM", "GraniteMoeHybridConfig",
                         dict(BASE, embedding_multiplier=2.0, residual_multiplier=0.5, logits_scaling=4.0)),
    "granite_h_plain": ("GraniteMoeHybridForCausalLM", "GraniteMoeHybridConfig", dict(BASE, rms_norm_eps=1e-5)),
    "granite_h_rope": ("GraniteMoeHybridForCausalLM", "GraniteMoeHybridConfig",
                       dict(BASE, rms_norm_eps=1e-5, position_embedding_type="rope", mamba_n_groups=2)),
    "falcon_h1_parallel": ("FalconH1ForCausalLM", "FalconH1Config", FALCON_H1),
    # round 3's multipliers (bench/unseen_archs.py falcon_h1): the MLP's gate scaled before its SiLU (h30g)
    "falcon_h1_mup": ("FalconH1ForCausalLM", "FalconH1Config",
                      dict(FALCON_H1, embedding_multiplier=2.0, lm_head_multiplier=0.5, mlp_multipliers=[0.8, 1.25],
                           key_multiplier=0.9, attention_in_multiplier=1.1, attention_out_multiplier=0.7,
                           ssm_multipliers=[1.0, 0.5, 1.5, 1.0, 0.8], ssm_in_multiplier=1.2, ssm_out_multiplier=0.6)),
}
"""name: (model class, config class, config)."""


def main() -> int:
    spec = importlib.util.spec_from_file_location("make_zoo", ROOT / "tests" / "zoo" / "make_zoo.py")
    mz = importlib.util.module_from_spec(spec)
    sys.modules["make_zoo"] = mz
    spec.loader.exec_module(mz)
    OUT.mkdir(parents=True, exist_ok=True)
    only = set(sys.argv[1:])  # names to build (others' files and records kept); none: every case
    record_file = OUT / "counts.json"
    counts: dict = json.loads(record_file.read_text()) if only and record_file.is_file() else {"files": {}}
    for name, (model_class, config_class, config) in CASES.items():
        if only and name not in only:
            continue
        def build(*, realistic: bool, exporter: str, fake: bool, cls=model_class, cfg_cls=config_class,
                  config=config) -> "mz.Built":
            return mz._causal_lm(cls, cfg_cls, dict(config), exporter=exporter, fake=fake, seq=16)

        records, failure = mz.build_arch(mz.Arch(name=name, description=name, build=build), "dynamo", OUT,
                                         realistic=False)
        if failure:
            raise SystemExit(f"{name}: {failure['error']}")
        (OUT / f"{name}_dynamo_bare.onnx").unlink()  # the _consts file is the fixture
        record = records[f"{name}_dynamo_consts.onnx"]
        counts["files"][f"{name}_dynamo_consts.onnx"] = {
            "model_class": model_class, "config": config, "param_count": record["param_count"],
            "versions": record["versions"]}
    (OUT / "counts.json").write_text(json.dumps(counts, indent=1, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
