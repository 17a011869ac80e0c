"""torchrun worker of ``test_deepspeed_autotp_deberta.py``: DeepSpeed AutoTP training on DeBERTa-v2 with
``share_att_key=False``, with a ``partition_config`` the planner exported.

``python -m torch.distributed.run --nproc-per-node 2 worker_deepspeed_autotp_deberta.py jobs.json``; every
job is ``{"partition_config": {...}, "report": path}``. Per job, each rank builds transformers'
``DebertaV2ForMaskedLM`` from ``tests/data/deberta_unshared/counts.json``'s config (seed 0, eval mode),
computes the whole model's logits of one batch, then runs ``deepspeed.initialize`` with
``tensor_parallel: {autotp_size: 2, partition_config}`` (gloo, CPU; ZeRO 0), which applies AutoTP
(deepspeed 0.19.8 ``runtime/engine.py``, ``_apply_autotp_partitioning``: the ``partition_config`` path,
``AutoTP._replace_module``), and one forward of the same batch. Rank 0 writes the report: the class each
linear became, the first attention's ``num_attention_heads`` and ``all_head_size`` after AutoTP, the
largest logit difference from the whole model, or the error the forward raised.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
CONFIG = json.loads((ROOT / "tests" / "data" / "deberta_unshared" / "counts.json").read_text())["config"]


def run_job(partition_config: dict, world: int) -> dict:
    import deepspeed
    import transformers

    torch.manual_seed(0)
    model = transformers.DebertaV2ForMaskedLM(transformers.DebertaV2Config(**CONFIG)).eval()
    ids = torch.randint(3, CONFIG["vocab_size"], (2, 16), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        whole = model(input_ids=ids).logits
    config = {"train_micro_batch_size_per_gpu": 1, "train_batch_size": world, "zero_optimization": {"stage": 0},
              "tensor_parallel": {"autotp_size": world, "partition_config": partition_config}}
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
    attention = engine.module.deberta.encoder.layer[0].attention.self
    report = {
        "kinds": {name: type(module).__name__ for name, module in engine.module.named_modules()
                  if "Linear" in type(module).__name__},
        "heads": attention.num_attention_heads,
        "all_head_size": attention.all_head_size,
    }
    try:
        with torch.no_grad():
            logits = engine.module(input_ids=ids).logits
        report["max_logit_difference"] = float((logits - whole).abs().max())
    except RuntimeError as exc:
        report["error"] = str(exc)
    return report


def main(jobs_path: str) -> int:
    from tests.integration.deepspeed_gloo import init_distributed_on_gloo

    init_distributed_on_gloo()
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    for job in json.loads(Path(jobs_path).read_text()):
        report = run_job(job["partition_config"], world)
        if rank == 0:
            Path(job["report"]).write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
