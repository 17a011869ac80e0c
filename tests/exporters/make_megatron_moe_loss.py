"""Build the Mixtral-style ONNX files exported *with their loss* that ``tests/exporters/test_megatron_moe_span.py``
tests Megatron-Core's MoE token rules on (issue 25, h29g), with torch.

Run with the integration environment (torch CPU, transformers 5); no downloads, random weights, seed 0::

    .venv-integration/bin/python tests/exporters/make_megatron_moe_loss.py

transformers' ``MixtralForCausalLM`` (2 layers, 4 experts, top-2 softmax router, ``batched_mm`` experts: the form both
exporters trace) is called with ``labels`` and returns its loss, so the graph holds, after the last MoE layer's
combine, the LM head, the labels' shift (``pad(labels, (0, 1), value=-100)``, then ``[..., 1:]``) and
``SoftmaxCrossEntropyLoss``. The padded labels are ``[batch, seq + 1]``: no dim of the model's sequence class, nothing
tp splits, as the routing ops' flattened tokens. Each exporter's file is saved graph-only with its small constants
inline (``consts``); ``counts.json`` records the config and torch's parameter count.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
from torch import nn

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "importers"))
sys.path.insert(0, str(ROOT / "tests" / "zoo"))
import make_param_cases  # noqa: E402
from make_param_cases import SEED, _randomise  # noqa: E402

OUT = ROOT / "tests" / "data" / "megatron_moe_loss"
CONFIG = dict(vocab_size=96, hidden_size=64, intermediate_size=32, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2, max_position_embeddings=64,
              use_cache=False, tie_word_embeddings=False)
"""``MixtralConfig`` fields (``experts_implementation="batched_mm"`` besides)."""
STEM = "mixtral_loss"


class _Loss(nn.Module):
    """A transformers causal LM called with ``input_ids`` and ``labels``, returning the mean loss."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids, labels):
        # an all-ones mask, as make_param_cases._Logits (TorchScript cannot export aten::diff)
        mask = torch.ones_like(input_ids)
        return self.model(input_ids=input_ids, attention_mask=mask, labels=labels, use_cache=False).loss


def main() -> int:
    import transformers

    make_param_cases.OUT = OUT  # the shared exporter writes where this script's files go
    OUT.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(SEED)
    config = transformers.MixtralConfig(**CONFIG, experts_implementation="batched_mm")
    model = _randomise(_Loss(transformers.MixtralForCausalLM(config)))
    ids = torch.randint(0, CONFIG["vocab_size"], (2, 16), generator=torch.Generator().manual_seed(SEED))
    files = {}
    for name, count in make_param_cases._export(model, (ids, ids), ["input_ids", "labels"], ["loss"], STEM,
                                                fold=True).items():
        if name.endswith("_consts.onnx"):
            files[name] = {"param_count": count}
        else:
            (OUT / name).unlink()
    (OUT / "counts.json").write_text(json.dumps({"config": CONFIG, "files": files}, indent=1, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
