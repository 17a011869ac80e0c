"""Build ``tests/data/hybrid_moe_cases/``, the files of ``tests/exporters/test_megatron_hybrid_experts.py`` (issue 25,
h27e): a hybrid Mamba-2 / attention / MoE / MLP stack in megatron-core's own layer alphabet, as Nemotron-3-Nano's
(``hybrid_override_pattern`` with ``E`` layers), to be exported as ``E`` layers of ``--hybrid-override-pattern``.

The model is transformers 5.24's ``NemotronHForCausalLM`` (NVIDIA's hybrid, each layer one mixer:
``NemotronHConfig.layers_block_type``), pattern :data:`PATTERN`, hidden 64, Mamba-2 with 8 heads of 16 in 2 groups
and a state of 16, 4 attention heads over 2 key-value heads, a squared-ReLU MLP of FFN 128, and MoE layers
(``NemotronHMoE``) of 4 non-gated squared-ReLU experts of FFN 32, top-2 by a sigmoid router with a per-expert score
bias (``e_score_correction_bias``), the top-2 weights divided by their sum (``norm_topk_prob``), scaling factor
1.0, one group, beside a squared-ReLU shared expert of FFN 48; experts as ``batched_mm``. Random weights, seed 0,
``tests/importers/make_param_cases.py``'s writer (both exporters; the ``consts`` files kept: in a ``bare`` file the
scan's ``CumSum`` axes are gone, as ``tests/integration/make_megatron_hybrid.py`` says)::

    .venv-integration/bin/python tests/exporters/make_hybrid_moe_cases.py

``counts.json`` records the config, torch's ``sum(p.numel() for p in model.parameters())`` and the elements of the
routed experts' and the shared experts' parameters (torch's ``named_parameters``).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "tests" / "data" / "hybrid_moe_cases"
sys.path.insert(0, str(ROOT / "tests" / "importers"))
sys.path.insert(0, str(ROOT / "tests" / "zoo"))

PATTERN = "ME*E-"
"""Megatron's ``--hybrid-override-pattern`` of the fixture: mamba, MoE, attention, MoE, MLP."""

_KINDS = {"M": "linear_attention", "*": "full_attention", "-": "mlp", "E": "moe"}  # NemotronHConfig.layers_block_type

CONFIG = dict(
    vocab_size=96, hidden_size=64, layers_block_type=[_KINDS[c] for c in PATTERN], ssm_state_size=16,
    mamba_num_heads=8, mamba_head_dim=16, n_groups=2, expand=2, conv_kernel=4, chunk_size=8,
    num_attention_heads=4, num_key_value_heads=2, head_dim=16, intermediate_size=128,
    n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, moe_shared_expert_intermediate_size=48,
    n_group=1, topk_group=1, norm_topk_prob=True, routed_scaling_factor=1.0,
    max_position_embeddings=64, use_cache=False, tie_word_embeddings=False, experts_implementation="batched_mm",
)
"""``NemotronHConfig`` fields of the fixture."""


def main() -> int:
    import make_param_cases
    import transformers
    from make_param_cases import SEED, _export, _Logits, _randomise

    make_param_cases.OUT = OUT
    OUT.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(SEED)
    model = _randomise(_Logits(transformers.NemotronHForCausalLM(transformers.NemotronHConfig(**CONFIG))))
    params = dict(model.named_parameters())
    record = {"param_count": sum(p.numel() for p in params.values()),
              "expert_param_count": sum(p.numel() for n, p in params.items() if ".mixer.experts." in n),
              "shared_param_count": sum(p.numel() for n, p in params.items() if ".mixer.shared_experts." in n)}
    ids = torch.randint(0, CONFIG["vocab_size"], (2, 16), generator=torch.Generator().manual_seed(SEED))
    files = {}
    for name in _export(model, (ids,), ["input_ids"], ["logits"], "nemotron_h_moe", fold=True):
        if name.endswith("_bare.onnx"):
            (OUT / name).unlink()
        else:
            files[name] = record
    versions = {"torch": torch.__version__, "transformers": transformers.__version__}
    (OUT / "counts.json").write_text(json.dumps({"config": CONFIG, "pattern": PATTERN, "files": files,
                                                 "versions": versions}, indent=1, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
