"""Write ``tests/exporters/data/nemotron_h_tiny.onnx`` (graph only): a hybrid Mamba-2 / attention / MLP
stack as megatron-core 0.16.1's ``MambaModel`` builds it, for the Megatron exporter's
``pretrain_mamba.py`` family (issue 25).

The model is transformers' ``NemotronHForCausalLM`` (NVIDIA's own hybrid, written in Megatron's
layer alphabet): each layer is one of a Mamba-2 mixer (``M``), attention without position
embeddings (``*``) or a squared-ReLU MLP (``-``), each ``x + f(RMSNorm(x))``. Sizes in :data:`CONFIG`:
pattern ``M*M-`` (4 layers), hidden 64, 8 Mamba heads of 16 in 2 groups with a state of 16 (so the
state size and the groups are both told apart from the graph), 4 attention heads with 2 key-value
heads, FFN 128, vocabulary 96, chunks of 8 over 16 tokens. Random weights, seed 0; both exporters'
graph-only files (``tests/importers/make_param_cases.py``'s ``_export``), of which the dynamo and
TorchScript ``consts`` ones (constants under 1 KiB inline) are kept: in a ``bare`` file the scan's
``CumSum`` axes are gone, so the importer cannot split those ops even along the batch and no
data-parallel plan exists (the ``bare`` style is the importer's problem, not the exporter's). Needs ``.venv-integration``::

    .venv-integration/bin/python tests/integration/make_megatron_hybrid.py
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "tests" / "exporters" / "data"
sys.path.insert(0, str(ROOT / "tests" / "importers"))
sys.path.insert(0, str(ROOT / "tests" / "zoo"))
from make_param_cases import SEED, _export, _Logits, _randomise  # noqa: E402

PATTERN = "M*M-"
"""Megatron's ``--hybrid-override-pattern`` of the fixture: mamba, attention, mamba, MLP."""

_KINDS = {"M": "linear_attention", "*": "full_attention", "-": "mlp"}  # NemotronHConfig.layers_block_type

CONFIG = dict(
    vocab_size=96, hidden_size=64, layers_block_type=[_KINDS[c] for c in PATTERN], ssm_state_size=16,
    mamba_num_heads=8, mamba_head_dim=16, n_groups=2, expand=2, conv_kernel=4, chunk_size=8,
    num_attention_heads=4, num_key_value_heads=2, head_dim=16, intermediate_size=128,
    max_position_embeddings=64, use_cache=False, tie_word_embeddings=False,
)
"""``NemotronHConfig`` fields of the fixture (``mamba_num_heads x mamba_head_dim = expand x hidden = 128``)."""


def main() -> int:
    import make_param_cases
    import transformers

    make_param_cases.OUT = OUT
    torch.manual_seed(SEED)
    model = _randomise(_Logits(transformers.NemotronHForCausalLM(transformers.NemotronHConfig(**CONFIG))))
    ids = torch.randint(0, CONFIG["vocab_size"], (2, 16), generator=torch.Generator().manual_seed(SEED))
    counts = _export(model, (ids,), ["input_ids"], ["logits"], "nemotron_h_tiny", fold=True)
    for name in counts:
        if name.endswith("_bare.onnx"):
            (OUT / name).unlink()
    print(json.dumps({"pattern": PATTERN, "params": next(iter(counts.values()))}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
