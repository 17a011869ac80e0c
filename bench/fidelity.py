r"""Fidelity benchmark: the planner's predicted step time (and memory) against published measured runs.

One command prices every measured run of ``bench/fidelity/runs_*.jsonl`` with the planner's own
``planner.estimate.estimate`` (through :func:`planner.calibrate.price_rows`: the run's tp/pp/dp,
micro-batch, global batch, recompute, sequence parallelism, ZeRO stage, schedule; a one-GPU run is
the one-device configuration at its batch, in its engine mode) and scores the predictions::

    .venv/bin/python bench/fidelity.py                 # table of the held-out rows
    .venv/bin/python bench/fidelity.py --json          # the same as JSON
    .venv/bin/python bench/fidelity.py --calibration fitted.yaml   # constants from `planner calibrate`

Rows, sources and the split are described in ``bench/fidelity/README.md``. Scores:

* step time: median absolute % error, MAPE, bias (median signed %; + = predicted too slow), overall
  and per group (one GPU per engine mode, one node, multi-node); rows the planner cannot price are
  counted as missing (coverage), never dropped silently;
* within a job (same model, GPUs and global batch, different layouts): whether the predicted
  fastest is the measured fastest (top-1), the regret of running the predicted fastest
  (``measured(predicted best) / measured best - 1``), and the share of layout pairs whose order the
  prediction gets right (pair accuracy);
* memory: the same error summary against the peak memory the source gives.

Scores are computed on the held-out rows only (``split: holdout`` in the data): the fit rows are
for ``planner calibrate``; ``--split fit`` shows them, labelled as in-sample.

GPT runs need a graph-only ONNX file of each model. They are built once, with the recipe of
``examples/make_examples.py`` (``GPT2LMHeadModel`` under FakeTensorMode, no weights) in the
integration venv (torch), and cached under ``.cache/fidelity/`` (gitignored).
"""

from __future__ import annotations

import argparse
import dataclasses
import heapq
import re
from collections import defaultdict
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Mapping, Sequence

REPO = Path(__file__).resolve().parent.parent
DATA = REPO / "bench" / "fidelity"
CACHE = REPO / ".cache" / "fidelity"
TORCH_PYTHON = REPO / ".venv-integration" / "bin" / "python"

if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))


# ------------------------------------------------------------------------------------------------
# Scores (pure)


def _predicted_memory(priced) -> float:
    """The prediction to hold against a row's measured memory: live tensors (no workspace allowance)
    against an allocator peak (``max_memory_allocated``), the whole prediction against device memory."""
    return priced.allocated_bytes if priced.row.memory_allocated else priced.memory_bytes


def ranking_scores(jobs: Mapping[str, Sequence[tuple[float, float]]]) -> dict[str, Any]:
    """Within-job ranking scores.

    Parameters
    ----------
    jobs:
        Per job, ``(predicted_s, measured_s)`` of each of its layouts; a non-finite prediction is a
        layout the planner could not price (the job is then ranked over the priced ones and counted
        in ``incomplete_jobs``).

    Returns
    -------
    dict
        ``jobs`` (jobs with at least two priced layouts), ``top1`` (share whose predicted fastest is
        the measured fastest), ``mean_regret_pct`` (mean of ``measured(predicted best) / min
        measured - 1`` in %), ``pairs`` and ``pair_accuracy`` (pairs of different measured time
        ordered alike; a predicted tie is not an order), ``incomplete_jobs``.

    Examples
    --------
    >>> s = ranking_scores({"a": [(1.0, 2.0), (2.0, 1.0)], "b": [(1.0, 1.0), (3.0, 2.0), (2.0, 3.0)]})
    >>> s["jobs"], s["top1"], s["mean_regret_pct"], s["pairs"], round(s["pair_accuracy"], 4)
    (2, 0.5, 50.0, 4, 0.5)
    """
    ranked = top1 = pairs = ordered = incomplete = 0
    regrets: list[float] = []
    for rows in jobs.values():
        priced = [(p, m) for p, m in rows if math.isfinite(p)]
        if len(priced) < len(rows):
            incomplete += 1
        if len(priced) < 2:
            continue
        ranked += 1
        best_measured = min(m for _, m in priced)
        picked = min(priced, key=lambda pm: pm[0])[1]
        top1 += picked == best_measured
        regrets.append((picked / best_measured - 1.0) * 100.0)
        for i in range(len(priced)):
            for j in range(i + 1, len(priced)):
                (pi, mi), (pj, mj) = priced[i], priced[j]
                if mi == mj:
                    continue
                pairs += 1
                ordered += (pi - pj) * (mi - mj) > 0
    return {
        "jobs": ranked,
        "top1": top1 / ranked if ranked else math.nan,
        "mean_regret_pct": sum(regrets) / len(regrets) if regrets else math.nan,
        "pairs": pairs,
        "pair_accuracy": ordered / pairs if pairs else math.nan,
        "incomplete_jobs": incomplete,
    }


def group_summaries(groups: Sequence[str], predicted: Sequence[float], measured: Sequence[float]) -> dict[str, Any]:
    """:func:`objectives.calibration.error_summary` overall (``all``) and per group, as dicts."""
    from objectives.calibration import error_summary

    out = {"all": error_summary(predicted, measured).as_dict()}
    for name in sorted(set(groups)):
        pick = [i for i, g in enumerate(groups) if g == name]
        out[name] = error_summary([predicted[i] for i in pick], [measured[i] for i in pick]).as_dict()
    return out


REGIMES: tuple[tuple[int, str], ...] = ((1, "one GPU"), (8, "one node"), (64, "9-64 GPUs"), (512, "65-512 GPUs"))
"""GPU-count regimes (upper bound, name) of :func:`regime`; above the last: ``>512 GPUs``. "one node" is
up to 8 GPUs (every cluster row here has 8 GPUs per node)."""


def regime(row: Any) -> str:
    """The row's GPU-count regime (:data:`REGIMES`).

    >>> from types import SimpleNamespace as R
    >>> [regime(R(devices=n)) for n in (1, 8, 9, 64, 65, 512, 513)]
    ['one GPU', 'one node', '9-64 GPUs', '9-64 GPUs', '65-512 GPUs', '65-512 GPUs', '>512 GPUs']
    """
    for bound, name in REGIMES:
        if row.devices <= bound:
            return name
    return f">{REGIMES[-1][0]} GPUs"


def style(row: Any) -> str:
    """How the row's job is parallelised: ``FSDP`` (ZeRO-3 / FSDP, no tp or pp), ``FSDP + TP/PP``,
    ``Megatron TP/PP`` (tensor or pipeline parallel without ZeRO-3), ``DDP``, ``one GPU``.

    >>> from types import SimpleNamespace as R
    >>> [style(R(devices=d, zero=z, tp=t, pp=p)) for d, z, t, p in ((8, 3, 1, 1), (16, 3, 8, 1), (16, 1, 8, 2), (8, 0, 1, 1))]
    ['FSDP', 'FSDP + TP/PP', 'Megatron TP/PP', 'DDP']
    """
    if row.devices == 1:
        return "one GPU"
    if row.zero >= 3:
        return "FSDP" if row.tp == row.pp == 1 else "FSDP + TP/PP"
    return "Megatron TP/PP" if row.tp > 1 or row.pp > 1 else "DDP"


def era(row: Any) -> str:
    """``H100`` for Hopper rows (``h100-*``, ``h200``), else ``A100`` (the older clusters here)."""
    return "H100" if row.device.startswith(("h100", "h200")) else "A100"


DIMS_2026: tuple[str, ...] = ("CP", "FP8", "FSDP2", "HSDP")
"""Issue 24's dims a row can run (its fidelity bar: time median <= 15%, memory <= 10% on the held-out
rows that use any of them): :func:`dims_2026`."""


def dims_2026(row: Any) -> tuple[str, ...]:
    """Which of :data:`DIMS_2026` the row runs: ``CP`` (context parallel, ``cp > 1``), ``FP8`` (an FP8
    recipe), ``HSDP`` (a shard group, ``hsdp``), ``FSDP2`` (ZeRO-3 run by torchtitan, which shards with
    FSDP2's ``fully_shard``: the row's launcher or its source names torchtitan).

    >>> from types import SimpleNamespace as R
    >>> dims_2026(R(cp=2, precision="te-delayed", hsdp=None, zero=3, launcher=None, source="torchtitan, docs"))
    ('CP', 'FP8', 'FSDP2')
    >>> dims_2026(R(cp=1, precision="bf16", hsdp=8, zero=3, launcher=None, source="fms-fsdp"))
    ('HSDP',)
    """
    torchtitan = row.launcher == "torchtitan" or "torchtitan" in row.source.lower()
    found = {"CP": row.cp > 1, "FP8": row.precision != "bf16", "FSDP2": row.zero >= 3 and torchtitan,
             "HSDP": bool(row.hsdp)}
    return tuple(name for name in DIMS_2026 if found[name])


def dims_scores(priced: Sequence[Any]) -> dict[str, Any]:
    """Step-time and memory error (:func:`group_summaries`' fields) of the rows running each of
    :data:`DIMS_2026`, and of those running any (``any``); memory over the rows that publish it."""
    out: dict[str, Any] = {}
    for name in (*DIMS_2026, "any"):
        chosen = [p for p in priced if (name in dims_2026(p.row) if name != "any" else dims_2026(p.row))]
        with_memory = [p for p in chosen if p.row.memory_bytes]
        out[name] = {
            "step_time": group_summaries([], [p.time_s for p in chosen], [p.row.step_s for p in chosen])["all"],
            "memory": group_summaries([], [_predicted_memory(p) for p in with_memory],
                                      [p.row.memory_bytes for p in with_memory])["all"],
        }
    return out


def scale_trend(priced: Sequence[Any]) -> dict[str, Any]:
    """Issue 23's "no trend with GPU count" on H100-era multi-node rows (more than 8 GPUs, Hopper, any
    style but ``DDP``): the least-squares slope of the signed step-time error (%) on log2(GPUs), in
    percentage points per doubling, over the priced rows, and the GPU counts it spans.

    >>> from types import SimpleNamespace as R
    >>> rows = [R(row=R(devices=n, device="h100-sxm", zero=3, tp=1, pp=1, step_s=1.0), time_s=t, valid=True)
    ...         for n, t in ((16, 1.0), (64, 1.1), (256, 1.2))]
    >>> s = scale_trend(rows)
    >>> s["rows"], round(s["slope_pct_per_doubling"], 6), s["devices"]
    (3, 5.0, [16, 256])
    """
    import numpy as np

    chosen = [p for p in priced if p.valid and p.row.devices > 8 and era(p.row) == "H100" and style(p.row) != "DDP"]
    if len(chosen) < 2:
        return {"rows": len(chosen), "slope_pct_per_doubling": math.nan, "devices": []}
    x = np.log2([p.row.devices for p in chosen])
    y = np.array([(p.time_s / p.row.step_s - 1.0) * 100.0 for p in chosen])
    slope = float(np.polyfit(x, y, 1)[0]) if np.ptp(x) > 0 else math.nan
    devices = [p.row.devices for p in chosen]
    return {"rows": len(chosen), "slope_pct_per_doubling": slope, "devices": [min(devices), max(devices)]}


def device_memory(row: Any) -> float:
    """Bytes of memory of the row's GPU: the source's (``gpus.memory_bytes``) or the preset's."""
    from objectives.cluster import DEVICE_PRESETS

    return row.device_memory_bytes or DEVICE_PRESETS[row.device].memory_bytes


def _does_not_fit(p: Any) -> bool:
    """The planner's verdict "does not fit" on a priced row: its live tensors (the allocated peak) and
    NCCL's buffers (``Priced.nccl_bytes``, outside the allocator) exceed the GPU's memory
    (:func:`device_memory`); over it only with the allocator's reserve is "tight", which the planner still
    picks (``planner.launch_messages.tight_pick``)."""
    return p.valid and p.allocated_bytes + p.nccl_bytes > device_memory(p.row)


def _does_not_fit_without_nccl(p: Any) -> bool:
    """:func:`_does_not_fit` on the live tensors alone: the verdict before NCCL's buffers joined the plan's
    memory (2026-12-02), reported beside it."""
    return p.valid and p.allocated_bytes > device_memory(p.row)


def regime_scores(priced: Sequence[Any]) -> dict[str, Any]:
    """Step-time error (median |err|, bias = median signed error, + = predicted too slow) of the
    cluster rows (more than one GPU) per ``era | regime`` and per ``era | style``, and the false
    "does not fit" count of each key (rows that ran but whose predicted peak exceeds their GPU's memory,
    :func:`device_memory`)."""
    cluster = [p for p in priced if p.row.devices > 1]
    out: dict[str, Any] = {}
    for label, key in (("regime", regime), ("style", style)):
        groups = [f"{era(p.row)} | {key(p.row)}" for p in cluster]
        scores = group_summaries(groups, [p.time_s for p in cluster], [p.row.step_s for p in cluster])
        scores.pop("all", None)
        for name, summary in scores.items():
            members = [p for p, g in zip(cluster, groups) if g == name]
            summary["false_does_not_fit"] = sum(_does_not_fit(p) for p in members)
        out[label] = scores
    return out


def flop_baseline(fit_rows: Sequence[Any], rows: Sequence[Any]) -> dict[str, Any]:
    """A reference the planner should beat: step = FLOPs / (GPUs x peak x u), one utilisation ``u``.

    FLOPs = 6 x parameters x tokens (8 with full recomputation: the forward runs twice), parameters
    by Narayanan et al.'s equation (2), ``12 l h^2 (1 + 13/12h + (V + s)/12lh)``; ``u`` is the median
    of the fit rows' ``FLOPs / (GPUs x peak x measured step)``, and the error is scored on ``rows``.
    GPT rows only (``model.kind == "gpt"``).

    Examples
    --------
    >>> from objectives.calibration import StepRow
    >>> m = {"kind": "gpt", "layers": 2, "hidden": 1024, "heads": 8, "seq": 1024, "vocab": 1000}
    >>> fit = [StepRow(id="f", model=m, device="a100-80gb", devices=8, devices_per_node=8, dp=8, micro_batch=1,
    ...                global_batch=8, step_s=1.0)]
    >>> held = [StepRow(id="h", model=m, device="a100-80gb", devices=8, devices_per_node=8, dp=8, micro_batch=1,
    ...                 global_batch=16, step_s=2.5)]
    >>> round(flop_baseline(fit, held)["all"]["median_abs_pct"], 6)   # predicted 2.0 s (twice the tokens)
    20.0
    """
    from objectives.calibration import error_summary
    from objectives.cluster import DEVICE_PRESETS

    def raw_s(r: Any) -> float:
        m = r.model
        l, h, v, seq = m["layers"], m["hidden"], m["vocab"], m["seq"]
        params = 12 * l * h * h * (1 + 13 / (12 * h) + (v + seq) / (12 * l * h))
        flops = (8 if r.recompute == "full" else 6) * params * r.global_batch * seq
        peak = max(DEVICE_PRESETS[r.device].peak_flops.get(k, 0.0) for k in ("bf16", "fp16"))
        return flops / (r.devices * peak)

    fit = [r for r in fit_rows if r.model.get("kind") == "gpt"]
    held = [r for r in rows if r.model.get("kind") == "gpt"]
    if not fit or not held:
        return {}
    import statistics

    utilisation = statistics.median(raw_s(r) / r.step_s for r in fit)
    predicted = [raw_s(r) / utilisation for r in held]
    out: dict[str, Any] = {"utilisation": utilisation}
    out.update(group_summaries([r.group for r in held], predicted, [r.step_s for r in held]))
    return out


# ------------------------------------------------------------------------------------------------
# Graph-only GPT models
#
# Exporting a GPT of L layers takes seconds per layer (a 24-layer export: 50-200 s on this machine),
# so each shape (hidden, heads, vocabulary, positions) is exported once with 2 layers, in the torch
# venv, and its last layer is copied up to L layers here (onnx only): the copies get the layer's
# nodes, its initializers renamed transformer.h.<k>.*, its value infos and name scopes, and read the
# previous copy's output. A 24-layer GPT made so prices exactly as the 24-layer export does (every
# estimate equal to the last digit, same node and initializer counts: bench/fidelity/README.md).


BASE_LAYERS = 2

BUILT_KINDS = ("gpt", "llama", "mixtral", "nemotron")
"""Model kinds this script builds: ``gpt`` (``GPT2LMHeadModel``), ``llama`` (``LlamaForCausalLM``:
RMSNorm, rotary positions, grouped-query attention, SwiGLU, untied head), ``mixtral``
(``MixtralForCausalLM``) and ``nemotron`` (``NemotronForCausalLM``: LayerNorm1P ``x * (w + 1)``,
squared-ReLU MLP without a gate or biases, rotary on half of each head, untied head)."""

LAYER_PREFIX = {"gpt": "transformer.h.", "llama": "model.layers.", "mixtral": "model.layers.",
                "nemotron": "model.layers."}
"""Where each kind's transformer layers live (their ONNX name scopes)."""


def gpt_file(model: Mapping[str, Any], layers: int | None = None) -> Path:
    """The cached ONNX file of a ``kind: gpt`` or ``kind: llama`` model spec (at ``layers``, default
    the spec's)."""
    layers = model["layers"] if layers is None else layers
    folder = CACHE / "base" if layers == BASE_LAYERS and layers != model["layers"] else CACHE
    if model.get("kind") == "mixtral":
        return folder / (f"mixtral_l{layers}_h{model['hidden']}_a{model['heads']}_kv{model['kv_heads']}"
                         f"_f{model['ffn']}_e{model['experts']}_k{model['top_k']}_v{model['vocab']}_p{model['seq']}.onnx")
    if model.get("kind") == "nemotron":
        return folder / (f"nemotron_l{layers}_h{model['hidden']}_a{model['heads']}_kv{model['kv_heads']}"
                         f"_f{model['ffn']}_v{model['vocab']}_p{model['seq']}.onnx")
    if model.get("kind") == "llama":
        return folder / (f"llama_l{layers}_h{model['hidden']}_a{model['heads']}_kv{model['kv_heads']}"
                         f"_f{model['ffn']}_v{model['vocab']}_p{model['seq']}.onnx")
    activation = model.get("activation", GPT_ACTIVATION)
    suffix = "" if activation == GPT_ACTIVATION else f"_{activation}"
    return folder / (f"gpt_l{layers}_h{model['hidden']}_a{model['heads']}_v{model['vocab']}_p{model['seq']}{suffix}.onnx")


GPT_ACTIVATION = "gelu_new"
"""``GPT2Config.activation_function`` of a ``kind: gpt`` spec without ``activation``: GPT-2's own
``gelu_new`` (the tanh approximation written out in Python: eight eager kernels). A spec may name
another (``gelu``: ``nn.functional.gelu``, the exact GELU in one eager kernel, llm-foundry MPT's
default ``_FFN_ACT_FN_DEFAULT = {'name': 'gelu', 'approximate': 'none'}`` in
``llmfoundry/models/layers/ffn.py``)."""


def _built_gpt(me: Any, spec: Mapping[str, Any]) -> Any:
    """In the torch venv: a ``GPT2LMHeadModel`` of ``spec``'s shape on FakeTensors, with its
    ``activation`` (:data:`GPT_ACTIVATION` by default: ``examples/make_examples.py``'s
    ``build_large_gpt``)."""
    activation = spec.get("activation", GPT_ACTIVATION)
    if activation == GPT_ACTIVATION:
        return me.build_large_gpt(n_layer=spec["layers"], n_embd=spec["hidden"], n_head=spec["heads"],
                                  n_positions=spec["seq"], vocab=spec["vocab"], fake=True)
    import transformers

    special = {} if spec["vocab"] > 50256 else {"bos_token_id": None, "eos_token_id": None}
    cfg = transformers.GPT2Config(n_layer=spec["layers"], n_embd=spec["hidden"], n_head=spec["heads"],
                                  vocab_size=spec["vocab"], n_positions=spec["seq"], use_cache=False,
                                  activation_function=activation, **special)
    built = _fake_built(me, transformers.GPT2LMHeadModel, cfg, spec, kv_heads=spec["heads"],
                        intermediate=4 * spec["hidden"])
    expected = me.gpt2_param_count(n_layer=spec["layers"], n_embd=spec["hidden"], vocab=spec["vocab"],
                                   n_positions=spec["seq"])
    return dataclasses.replace(built, expected_param_count=expected)


def _fake_built(
    me: Any, model_class: Any, cfg: Any, spec: Mapping[str, Any], *, kv_heads: int, intermediate: int
) -> Any:
    """In the torch venv: ``model_class(cfg)`` on FakeTensors, exported graph-only by torch.export at
    ``spec``'s shape (``examples/make_examples.py``'s helpers; a batch of 2 x 128 example tokens)."""
    import torch

    model = me._fake_hf(model_class, cfg)
    input_ids = me._fake_like(model, me._ids(torch.Generator().manual_seed(0), spec["vocab"], 2, 128))
    config = {"architecture": model_class.__name__, "layers": spec["layers"], "hidden": spec["hidden"],
              "heads": spec["heads"], "kv_heads": kv_heads, "intermediate": intermediate,
              "vocab": spec["vocab"], "max_positions": spec["seq"], "example_batch": 2, "example_seq": 128}
    built = me._hf_built(model, input_ids, config, exporter="dynamo", max_seq=spec["seq"])
    return dataclasses.replace(built, fake_weights=True)


def _built_llama(me: Any, spec: Mapping[str, Any]) -> Any:
    """In the torch venv: a ``LlamaForCausalLM`` of ``spec``'s shape on FakeTensors (no weights), with
    ``examples/make_examples.py``'s helpers; rotary base ``rope_theta`` (Llama 3: 500,000)."""
    import transformers

    cfg = transformers.LlamaConfig(
        num_hidden_layers=spec["layers"], hidden_size=spec["hidden"], num_attention_heads=spec["heads"],
        num_key_value_heads=spec["kv_heads"], intermediate_size=spec["ffn"], vocab_size=spec["vocab"],
        max_position_embeddings=spec["seq"], rope_theta=float(spec.get("rope_theta", 500000.0)), use_cache=False,
        tie_word_embeddings=False)
    return _fake_built(me, transformers.LlamaForCausalLM, cfg, spec, kv_heads=spec["kv_heads"], intermediate=spec["ffn"])


def _built_mixtral(me: Any, spec: Mapping[str, Any]) -> Any:
    """In the torch venv: a ``MixtralForCausalLM`` of ``spec``'s shape on FakeTensors, its experts
    exported as ``batched_mm`` (the default ``grouped_mm`` does not export; ``objectives.moe``
    prices the gathered weights as the grouped GEMM a launcher runs)."""
    import transformers

    cfg = transformers.MixtralConfig(
        num_hidden_layers=spec["layers"], hidden_size=spec["hidden"], num_attention_heads=spec["heads"],
        num_key_value_heads=spec["kv_heads"], intermediate_size=spec["ffn"], vocab_size=spec["vocab"],
        max_position_embeddings=spec["seq"], num_local_experts=spec["experts"], num_experts_per_tok=spec["top_k"],
        rope_theta=float(spec.get("rope_theta", 1e6)), use_cache=False, tie_word_embeddings=False,
        experts_implementation="batched_mm")
    return _fake_built(me, transformers.MixtralForCausalLM, cfg, spec, kv_heads=spec["kv_heads"], intermediate=spec["ffn"])


NEMOTRON_ROTARY_PERCENT = 0.5
"""The share of each head that gets rotary positions in every Nemotron size: NeMo's ``NemotronConfig``
(``nemo/collections/llm/gpt/model/nemotron.py``: ``rotary_percent: float = 0.5``) and the
NeMo-Framework-Launcher confs (``conf/training/nemotron/nemotron_*.yaml``: ``rotary_percentage: 0.5``)."""


def _built_nemotron(me: Any, spec: Mapping[str, Any]) -> Any:
    """In the torch venv: a ``NemotronForCausalLM`` of ``spec``'s shape on FakeTensors (no weights):
    NeMo's Nemotron layer (LayerNorm1P, squared ReLU, rotary on :data:`NEMOTRON_ROTARY_PERCENT` of
    each head, base ``rope_theta``: NeMo's GPTConfig default 10,000), no biases, untied head."""
    import transformers

    cfg = transformers.NemotronConfig(
        num_hidden_layers=spec["layers"], hidden_size=spec["hidden"], num_attention_heads=spec["heads"],
        num_key_value_heads=spec["kv_heads"], intermediate_size=spec["ffn"], vocab_size=spec["vocab"],
        max_position_embeddings=spec["seq"], hidden_act="relu2", partial_rotary_factor=NEMOTRON_ROTARY_PERCENT,
        rope_theta=float(spec.get("rope_theta", 10000.0)), attention_bias=False, mlp_bias=False,
        use_cache=False, tie_word_embeddings=False)
    return _fake_built(me, transformers.NemotronForCausalLM, cfg, spec, kv_heads=spec["kv_heads"], intermediate=spec["ffn"])


def _build_worker(specs: list[dict[str, Any]]) -> None:
    """In the torch venv: export each spec's GPT2LMHeadModel on FakeTensors, graph-only, to its file."""
    sys.path.insert(0, str(REPO / "examples"))
    import make_examples as me  # noqa: PLC0415 - the torch venv only

    for spec in specs:
        out = Path(spec["out"])
        out.parent.mkdir(parents=True, exist_ok=True)
        started = time.perf_counter()
        if spec.get("kind") == "mixtral":
            built = _built_mixtral(me, spec)
        elif spec.get("kind") == "nemotron":
            built = _built_nemotron(me, spec)
        elif spec.get("kind") == "llama":
            built = _built_llama(me, spec)
        else:
            built = _built_gpt(me, spec)
        proto = me._export_fake(built, data_location=f"{out.name}.data")
        partial = out.with_name(out.name + ".partial")
        me.save(proto, partial, inline_weights=False)
        os.replace(partial, out)
        print(f"exported {out.name} in {time.perf_counter() - started:.0f} s", file=sys.stderr, flush=True)


_SCOPE_KEY = "pkg.torch.onnx.name_scopes"


def _layer_index(node, prefix):
    for p in node.metadata_props:
        if p.key == _SCOPE_KEY:
            found = re.search(re.escape(prefix) + r"(\d+)(?!\d)", p.value)
            return int(found.group(1)) if found else None
    return None


def replicate_layers(model, layers: int, prefix: str = "transformer.h."):
    """Copy the last transformer layer of ``model`` (an ``onnx.ModelProto``, changed in place) until
    it has ``layers`` layers; layers are found by their ``pkg.torch.onnx.name_scopes`` (``<prefix><k>``).

    Each copy reads the previous layer's output where the template read its own input (the output of
    the last node of the layer before it); values computed once and shared by every layer (the causal
    mask, shape constants) stay shared; whatever read the template's output reads the last copy's.
    """
    import onnx

    g = model.graph
    nodes = list(g.node)
    layer = [_layer_index(n, prefix) for n in nodes]
    producer = {o: i for i, n in enumerate(nodes) for o in n.output}
    consumers = defaultdict(list)
    for i, n in enumerate(nodes):
        for x in n.input:
            consumers[x].append(i)
    # Nodes the exporter's optimiser left without a scope (the fused QKV Split) belong to the layer
    # they sit inside: fed by it and feeding it.
    changed = True
    while changed:
        changed = False
        for i, n in enumerate(nodes):
            if layer[i] is not None:
                continue
            ins = {layer[producer[x]] for x in n.input if x in producer and layer[producer[x]] is not None}
            outs = {layer[c] for o in n.output for c in consumers[o] if layer[c] is not None}
            if len(ins) == 1 and ins == outs:
                layer[i] = ins.pop()
                changed = True
    have = max(l for l in layer if l is not None) + 1
    if layers < have:
        raise ValueError(f"the model has {have} layers, more than {layers}")
    last = have - 1
    template = [i for i in range(len(nodes)) if layer[i] == last]
    before = [i for i in range(len(nodes)) if layer[i] == last - 1]
    residual_in = nodes[before[-1]].output[0]
    template_out = {o for i in template for o in nodes[i].output}
    residual_out = nodes[template[-1]].output[0]
    inits = {t.name: t for t in g.initializer}
    infos = {v.name: v for v in g.value_info}
    own = f"{prefix}{last}."
    # Weights the exporter renamed (a Linear's weight folded with its Transpose: ``val_<n>``) are the
    # layer's own when only its nodes read them: each copy gets its own (Llama; GPT-2's Conv1D keeps names).
    floats = {onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16, onnx.TensorProto.DOUBLE}
    renamed_own = {x for x, t in inits.items() if not x.startswith(own) and t.data_type in floats
                   and consumers[x] and all(layer[c] == last for c in consumers[x])}
    scope_re = re.compile(re.escape(prefix) + str(last) + r"(?!\d)")
    new_nodes, new_inits, new_infos = [], [], []
    previous_out = residual_out
    for k in range(last + 1, layers):
        def rename(x, k=k, previous_out=previous_out):
            if x in template_out:
                return f"{x}__{prefix}{k}"
            if x == residual_in:
                return previous_out
            if x.startswith(own):
                return f"{prefix}{k}." + x[len(own):]
            if x in renamed_own:
                return f"{x}__{prefix}{k}"
            return x
        for i in template:
            n = onnx.NodeProto()
            n.CopyFrom(nodes[i])
            n.name = f"{n.name}__{prefix}{k}"
            for j, x in enumerate(n.input):
                n.input[j] = rename(x)
            for j, x in enumerate(n.output):
                n.output[j] = rename(x)
            for p in n.metadata_props:
                p.value = scope_re.sub(f"{prefix}{k}", p.value)
            new_nodes.append(n)
            for x in list(nodes[i].input) + list(nodes[i].output):
                if (x.startswith(own) or x in renamed_own) and x in inits and rename(x) not in {t.name for t in new_inits}:
                    t = onnx.TensorProto()
                    t.CopyFrom(inits[x])
                    t.name = rename(x)
                    new_inits.append(t)
                if x in infos and (x in template_out or x.startswith(own)):
                    v = onnx.ValueInfoProto()
                    v.CopyFrom(infos[x])
                    v.name = rename(x)
                    new_infos.append(v)
        previous_out = rename(residual_out)
    # Whatever read the last layer's output now reads the last copy's.
    for i, n in enumerate(nodes):
        if layer[i] != last:
            for j, x in enumerate(n.input):
                if x == residual_out:
                    n.input[j] = previous_out
    for o in g.output:
        if o.name == residual_out:
            o.name = previous_out
    ordered = _topological(nodes + new_nodes)
    del g.node[:]
    g.node.extend(ordered)
    g.initializer.extend(new_inits)
    seen = {v.name for v in g.value_info}
    g.value_info.extend(v for v in new_infos if v.name not in seen)
    return model


def _topological(nodes):
    """``nodes`` in an order where every value is produced before it is read (ties: original order)."""
    producer = {o: i for i, n in enumerate(nodes) for o in n.output}
    need = [sum(1 for x in set(n.input) if x in producer) for n in nodes]
    users = defaultdict(list)
    for i, n in enumerate(nodes):
        for x in set(n.input):
            if x in producer:
                users[producer[x]].append(i)
    heap = [i for i in range(len(nodes)) if need[i] == 0]
    heapq.heapify(heap)
    out = []
    while heap:
        i = heapq.heappop(heap)
        out.append(nodes[i])
        for u in users[i]:
            need[u] -= 1
            if need[u] == 0:
                heapq.heappush(heap, u)
    if len(out) != len(nodes):
        raise ValueError("the replicated graph has a cycle")
    return out


def build_missing(models: Sequence[Mapping[str, Any]], *, timeout_s: float = 3600.0) -> list[str]:
    """Build the GPT files not in the cache; returns the files built.

    The 2-layer base of every missing shape is exported by one torch process; the layers are then
    copied here (:func:`replicate_layers`).
    """
    import onnx

    todo = {gpt_file(m): m for m in models if not gpt_file(m).exists()}
    if not todo:
        return []
    bases = {gpt_file(m, BASE_LAYERS): m for m in todo.values()}
    missing = {p: m for p, m in bases.items() if not p.exists()}
    if missing:
        if not TORCH_PYTHON.exists():
            raise SystemExit(f"{len(missing)} GPT shapes are not exported and {TORCH_PYTHON} is missing; run "
                             "`make setup-integration` (torch, transformers) and `pip install onnxscript` in it, "
                             "or pass --no-build to skip those rows")
        keys = ("kind", "hidden", "heads", "kv_heads", "ffn", "rope_theta", "seq", "vocab", "activation", "experts", "top_k")
        specs = [{**{k: m[k] for k in keys if k in m}, "layers": BASE_LAYERS, "out": str(p)}
                 for p, m in missing.items()]
        print(f"exporting {len(specs)} graph-only 2-layer GPT shapes into {CACHE} (torch, FakeTensorMode) ...",
              file=sys.stderr)
        subprocess.run([str(TORCH_PYTHON), str(Path(__file__).resolve()), "--build-worker", json.dumps(specs)],
                       check=True, timeout=timeout_s,
                       env={**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"})
    for path, model in todo.items():
        base = gpt_file(model, BASE_LAYERS)
        proto = onnx.load(str(base), load_external_data=False)
        if model["layers"] != BASE_LAYERS:
            replicate_layers(proto, int(model["layers"]), prefix=LAYER_PREFIX[model.get("kind", "gpt")])
        partial = path.with_name(path.name + ".partial")
        onnx.save_model(proto, str(partial))
        os.replace(partial, path)
        print(f"built {path.name}", file=sys.stderr, flush=True)
    return [str(p) for p in todo]


# ------------------------------------------------------------------------------------------------
# Pricing


A100_NODE = REPO.parent / "shared" / "calibration" / "a100_single_node_h1024.csv"
"""Megatron-DeepSpeed GPT runs on one 8-GPU A100 node (vTrain's validation set, width 1,024)."""

A100_NODE_HOLDOUT_LAYERS = (16, 24)
"""The fixed split of :data:`A100_NODE`: the 16- and 24-layer models are held out (360 rows, 36
jobs), the 12- and 20-layer models are the fit rows (360 rows, 36 jobs). A whole model is on one
side, so no job is split; 16 layers lies between the fit depths and 24 beyond them."""


A100_NODE_INTRA_LINK = {
    "name": "nvlink-vtrain-node",
    "bandwidth_bytes_per_s": 150e9,
    "latency_s": 2e-6,
    "collective_efficiency": 0.77,
    "source": "vTrain's validation configs (config/validation/single/*.json) give the node "
              "intra_node_bandwidth 150 (GB/s per GPU and direction); latency and bus-bandwidth share as the "
              "nvlink3 preset",
}
"""The node of :data:`A100_NODE`, as its source describes it (the A100 preset's NVLink is 300 GB/s)."""


def _csv_split(row):
    """A CSV row's split (:data:`A100_NODE_HOLDOUT_LAYERS`), unless the file gave one, and its node's
    link (:data:`A100_NODE_INTRA_LINK`)."""
    if row.model.get("kind") != "gpt":
        return row
    if row.intra_link is None:
        row = dataclasses.replace(row, intra_link=dict(A100_NODE_INTRA_LINK))
    if row.split == "holdout":
        return row
    held = int(row.model["layers"]) in A100_NODE_HOLDOUT_LAYERS
    return dataclasses.replace(row, split="holdout" if held else "fit")


def load_rows(paths: Sequence[Path]):
    from objectives.calibration import read_step_rows

    rows = []
    for path in paths:
        found = read_step_rows(path, models_dir=REPO / "examples")
        rows += [_csv_split(r) for r in found] if Path(path).suffix.lower() == ".csv" else found
    ids = [r.id for r in rows]
    duplicated = sorted({i for i in ids if ids.count(i) > 1})
    if duplicated:
        raise SystemExit(f"duplicate row ids: {', '.join(duplicated)}; give every row its own id")
    return rows


def _with_files(rows):
    """Rows with ``model.path`` set: GPT specs to their cached file, ONNX paths made absolute."""
    out = []
    for row in rows:
        model = dict(row.model)
        if model.get("kind") in BUILT_KINDS:
            model["path"] = str(gpt_file(model))
            model["dims"] = {"seq": int(model["seq"])}
        elif model.get("path") and not Path(model["path"]).is_absolute():
            model["path"] = str(REPO / model["path"])
        out.append(dataclasses.replace(row, model=model))
    return out


def _constants_for(row, calibration) -> tuple | None:
    """The calibration file's constants that apply to ``row``: its device's (same device), a link's
    (same link name)."""
    if calibration is None:
        return None
    from objectives.calibration import calibratable_parameters, parameter_values
    from planner.calibrate import row_cluster

    own = row_cluster(row)
    params = [p for p in calibratable_parameters(calibration)
              if (p.owner == "device" and calibration.device.name == own.device.name)
              or (p.owner != "device" and getattr(calibration, p.owner).name == getattr(own, p.owner).name)]
    if not params:
        return None
    return params, parameter_values(calibration, params)


def _load_calibration(path: Path):
    """The cluster of a ``planner calibrate`` file, with every fitted constant it records applied.

    ``objectives.cluster.load_cluster`` reads ``kernel_latency_s`` and the links' ``latency_s`` but
    not (yet) every [Empirical] field a fit writes (``host_dispatch_s``...); those are set here from
    the file's top level (device fields) and its link mappings, so the score uses what was fitted.
    """
    import yaml

    from objectives.calibration import calibratable_parameters, with_parameters
    from objectives.cluster import load_cluster

    cluster = load_cluster(path)
    data = yaml.safe_load(path.read_text(encoding="utf-8"))
    params, values = [], []
    for p in calibratable_parameters(cluster):
        source = data if p.owner == "device" else data.get(p.owner)
        if isinstance(source, Mapping) and isinstance(source.get(p.field), (int, float)):
            params.append(p)
            values.append(float(source[p.field]))
    return with_parameters(cluster, params, values) if params else cluster


def price(rows, *, calibration=None, plain: bool = False, fsdp_units: bool = False):
    from planner.calibrate import default_graph_for, price_rows

    graph_for = default_graph_for()
    priced = []
    for row in rows:
        if not Path(row.model["path"]).exists():
            from planner.calibrate import Priced

            priced.append(Priced(row=row, reason="no ONNX file (run without --no-build to build it)"))
            continue
        priced += price_rows([row], graph_for=graph_for, constants=_constants_for(row, calibration), plain=plain,
                             fsdp_units=fsdp_units)
        last = priced[-1]
        state = f"{last.time_s:.3g} s" if last.valid else f"no prediction ({last.reason[:70]})"
        print(f"  {row.id}: {state} [{last.estimate_s:.1f} s]", file=sys.stderr, flush=True)
    return priced


# ------------------------------------------------------------------------------------------------
# Report


def report(priced, *, split: str, fit_rows: Sequence[Any] = ()) -> dict[str, Any]:
    """Scores of the priced rows of ``split`` (JSON-ready); ``fit_rows`` set the FLOP baseline's utilisation."""
    chosen = [p for p in priced if p.row.split == split]
    groups = [p.row.group for p in chosen]
    time_scores = group_summaries(groups, [p.time_s for p in chosen], [p.row.step_s for p in chosen])
    with_memory = [p for p in chosen if p.row.memory_bytes]
    memory_scores = group_summaries([p.row.group for p in with_memory], [_predicted_memory(p) for p in with_memory],
                                    [p.row.memory_bytes for p in with_memory])
    with_reserved = [p for p in chosen if p.row.reserved_bytes and p.valid]
    # the allocator's reserved peak against the whole prediction (its reserve, objectives.memory.OTHER_FRACTION, included)
    reserved_scores = group_summaries([p.row.group for p in with_reserved], [p.memory_bytes for p in with_reserved],
                                      [p.row.reserved_bytes for p in with_reserved])
    # every row ran: a row whose predicted live tensors exceed its own GPU's memory (the source's, else
    # the preset's) is a false "does not fit"; one whose whole prediction does, the allocator's reserve
    # included, is "tight" (the planner picks it, with a note, when nothing else fits)
    false_no_fit = [p.row.id for p in chosen if _does_not_fit(p)]
    tight = [p.row.id for p in chosen
             if p.valid and not _does_not_fit(p) and p.memory_bytes + p.nccl_bytes > device_memory(p.row)]
    # NCCL's buffers are outside the allocator's figures (compared with the measured peaks without them) and in
    # the verdict; the verdict on the live tensors alone is reported beside it
    without_nccl = [p.row.id for p in chosen if _does_not_fit_without_nccl(p)]
    jobs: dict[str, list[tuple[float, float]]] = {}
    for p in chosen:
        if p.row.devices > 1:
            jobs.setdefault(p.row.job, []).append((p.time_s, p.row.step_s))
    multi = {k: v for k, v in jobs.items() if len(v) > 1}
    multi_node = {k: v for k, v in multi.items() if any(p.row.job == k and p.row.group == "multi-node" for p in chosen)}
    return {
        "split": split,
        "rows": [
            {
                "id": p.row.id, "group": p.row.group, "regime": regime(p.row), "style": style(p.row),
                "split": p.row.split, "job": p.row.job,
                "measured_s": p.row.step_s, "predicted_s": p.time_s if p.valid else None,
                "error_pct": (p.time_s / p.row.step_s - 1) * 100 if p.valid else None,
                "measured_memory_bytes": p.row.memory_bytes,
                "predicted_memory_bytes": _predicted_memory(p) if p.valid else None,
                "measured_reserved_bytes": p.row.reserved_bytes,
                "predicted_reserved_bytes": p.memory_bytes if p.valid else None,
                "predicted_nccl_bytes": p.nccl_bytes if p.valid else None,
                "fits": p.fits, "reason": p.reason, "source": p.row.source, "assumed": list(p.row.assumed),
            }
            for p in chosen
        ],
        "step_time": time_scores,
        "memory": memory_scores,
        "reserved": reserved_scores,
        "false_does_not_fit": {"rows": len(false_no_fit), "of": sum(p.valid for p in chosen), "ids": false_no_fit},
        "tight": {"rows": len(tight), "ids": tight},
        "false_does_not_fit_without_nccl": {"rows": len(without_nccl), "ids": without_nccl},
        "regimes": regime_scores(chosen),
        "dims_2026": dims_scores(chosen),
        "scale_trend": scale_trend(chosen),
        "ranking": {"all": ranking_scores(multi), "multi-node": ranking_scores(multi_node)},
        "coverage": {"rows": len(chosen), "priced": sum(p.valid for p in chosen)},
        "flop_baseline": flop_baseline(fit_rows, [p.row for p in chosen]) if split == "holdout" else {},
    }


def _fmt(value: float | None, spec: str) -> str:
    width = int("".join(c for c in spec.split(".")[0] if c.isdigit()) or 0)
    return "-".rjust(width) if value is None or not math.isfinite(value) else format(value, spec)


def print_table(result: dict[str, Any], *, header: str) -> None:
    print(header)
    print(f"{'row':44} {'group':22} {'measured s':>11} {'predicted s':>11} {'err %':>7} {'mem GB':>7} {'pred GB':>7}")
    for r in result["rows"]:
        mem = r["measured_memory_bytes"] / 1e9 if r["measured_memory_bytes"] else None
        pmem = r["predicted_memory_bytes"] / 1e9 if r["predicted_memory_bytes"] and mem else None
        line = (f"{r['id'][:44]:44} {r['group'][:22]:22} {_fmt(r['measured_s'], '11.4g')} "
                f"{_fmt(r['predicted_s'], '11.4g')} {_fmt(r['error_pct'], '+7.1f')} {_fmt(mem, '7.1f')} {_fmt(pmem, '7.1f')}")
        if r["reason"]:
            line += f"  ({r['reason'][:90]})"
        print(line)
    print()
    print(f"{'step time':22} {'rows':>5} {'missing':>7} {'median |err| %':>15} {'MAPE %':>8} {'bias %':>8}")
    for name, s in result["step_time"].items():
        print(f"{name[:22]:22} {s['rows']:5d} {s['missing']:7d} {_fmt(s['median_abs_pct'], '15.1f')} "
              f"{_fmt(s['mape_pct'], '8.1f')} {_fmt(s['bias_pct'], '+8.1f')}")
    print()
    for title, key in (("memory", "memory"), ("reserved memory", "reserved")):
        print(f"{title:22} {'rows':>5} {'missing':>7} {'median |err| %':>15} {'MAPE %':>8} {'bias %':>8}")
        for name, s in result.get(key, {}).items():
            print(f"{name[:22]:22} {s['rows']:5d} {s['missing']:7d} {_fmt(s['median_abs_pct'], '15.1f')} "
                  f"{_fmt(s['mape_pct'], '8.1f')} {_fmt(s['bias_pct'], '+8.1f')}")
        print()
    for label, scores in result.get("regimes", {}).items():
        print(f"{'by ' + label:28} {'rows':>5} {'missing':>7} {'median |err| %':>15} {'bias %':>8} {'false no-fit':>12}")
        for name, s in scores.items():
            print(f"{name[:28]:28} {s['rows']:5d} {s['missing']:7d} {_fmt(s['median_abs_pct'], '15.1f')} "
                  f"{_fmt(s['bias_pct'], '+8.1f')} {s['false_does_not_fit']:12d}")
        print()
    _print_dims_and_trend(result)
    wrong = result.get("false_does_not_fit", {})
    print(f"false 'does not fit' (rows that ran, predicted live tensors and NCCL's buffers over their device's memory): "
          f"{wrong.get('rows', 0)}"
          + (f" ({', '.join(wrong['ids'])})" if wrong.get("ids") else ""))
    tight = result.get("tight", {})
    print(f"tight (live tensors and NCCL's buffers fit, not the allocator's reserve: picked with a note): {tight.get('rows', 0)}"
          + (f" ({', '.join(tight['ids'])})" if tight.get("ids") else ""))
    nccl = result.get("false_does_not_fit_without_nccl", {})
    print(f"false 'does not fit' on the live tensors alone (NCCL's buffers left out, not the verdict): {nccl.get('rows', 0)}"
          + (f" ({', '.join(nccl['ids'])})" if nccl.get("ids") else ""))
    for name, s in result["ranking"].items():
        print(f"ranking ({name}): {s['jobs']} jobs, top-1 {_fmt(s['top1'] * 100 if s['jobs'] else None, '.0f')}%, "
              f"mean regret {_fmt(s['mean_regret_pct'], '.1f')}%, pairs {s['pairs']} ordered "
              f"{_fmt(s['pair_accuracy'] * 100 if s['pairs'] else None, '.0f')}%, jobs with an unpriced layout "
              f"{s['incomplete_jobs']}")
    c = result["coverage"]
    print(f"coverage: {c['priced']} of {c['rows']} rows priced")
    base = result.get("flop_baseline") or {}
    if base:
        parts = ", ".join(f"{name} {_fmt(s['median_abs_pct'], '.1f')}%" for name, s in base.items()
                          if name != "utilisation")
        print(f"reference, 6 (8 with full recompute) x params x tokens at one utilisation fitted on the fit rows "
              f"({base['utilisation'] * 100:.0f}% of peak): median |err| {parts}")


def _print_dims_and_trend(result: dict[str, Any]) -> None:
    """:func:`print_table`'s lines for issue 24's dims (:func:`dims_scores`) and the H100 scale trend."""
    dims = result.get("dims_2026", {})
    if dims:
        print(f"{'issue 24 dims':22} {'rows':>5} {'median |err| %':>15} {'bias %':>8} {'mem rows':>8} {'mem |err| %':>12}")
        for name, s in dims.items():
            t, m = s["step_time"], s["memory"]
            print(f"{name:22} {t['rows']:5d} {_fmt(t['median_abs_pct'], '15.1f')} {_fmt(t['bias_pct'], '+8.1f')} "
                  f"{m['rows']:8d} {_fmt(m['median_abs_pct'], '12.1f')}")
        print()
    trend = result.get("scale_trend", {})
    if trend.get("rows"):
        print(f"H100 multi-node trend (rows over 8 GPUs, no DDP): {trend['rows']} rows over {trend['devices']} GPUs, "
              f"signed error slope {_fmt(trend['slope_pct_per_doubling'], '+.2f')} points per doubling of GPUs")


HOST_GRID: dict[str, tuple[float, ...]] = {
    "layer_host_s": (0.70e-3, 0.75e-3, 0.80e-3, 0.85e-3, 0.90e-3, 0.95e-3, 1.00e-3),
    "microbatch_host_s": (0.0, 0.5e-3, 1e-3, 2e-3),
    "p2p_overhead_s": (0.0, 1e-4, 3e-4),
}
"""``--fit-host``'s grid (docs/VALIDATION.md, "One 8-GPU A100 node")."""


def parse_host_grid(text: str) -> dict[str, tuple[float, ...]]:
    """``--host-grid``'s text, ``field=v1,v2;field=v3``, as a grid (seconds; fields of :data:`HOST_GRID`).

    >>> parse_host_grid("layer_host_s=0,1e-3;microbatch_host_s=2e-3")
    {'layer_host_s': (0.0, 0.001), 'microbatch_host_s': (0.002,)}
    """
    grid: dict[str, tuple[float, ...]] = {}
    for part in filter(None, (p.strip() for p in text.split(";"))):
        name, _, values = part.partition("=")
        if name.strip() not in HOST_GRID or not values.strip():
            raise SystemExit(f"--host-grid: '{part}' is not FIELD=V1,V2 with FIELD among {', '.join(HOST_GRID)}")
        try:
            grid[name.strip()] = tuple(float(v) for v in values.split(","))
        except ValueError:
            raise SystemExit(f"--host-grid: '{part}' has a value that is not seconds") from None
    return grid


def fit_host_costs(rows, grid: Mapping[str, Sequence[float]] = HOST_GRID) -> list[tuple[float, dict[str, float], dict]]:
    """Grid search of the device's host costs (``objectives.fixed_costs``) on ``rows``: every point's
    mean squared relative step-time error and within-job ranking, best first.

    The host costs act after the per-op tables (``objectives.pipeline_price``), so each row's stage
    cost models are built once and every grid point only re-prices the pipeline.
    """
    import itertools

    from objectives.pipeline_cost import PipelineCostCache
    from planner.calibrate import default_graph_for, row_cluster, row_settings
    from planner.estimate import estimate

    graph_for = default_graph_for()
    caches = [(r, row_cluster(r), PipelineCostCache(graph_for(r), cluster=row_cluster(r), settings=row_settings(r)))
              for r in rows]
    names = list(grid)
    results = []
    for values in itertools.product(*(grid[n] for n in names)):
        point = dict(zip(names, values))
        errors, jobs = [], {}
        for row, cluster, cache in caches:
            cache.cluster = dataclasses.replace(cluster, device=dataclasses.replace(cluster.device, **point))
            e = estimate(cache, cluster=cache.cluster, tp=row.tp, pp=row.pp, dp=row.dp, cp=row.cp, micro_batch=row.micro_batch,
                         global_batch=row.global_batch, recompute=row.recompute, sequence_parallel=row.sequence_parallel,
                         zero=row.zero, schedule=row.schedule, chunks=row.chunks, settings=row_settings(row))
            errors.append(e.time_s / row.step_s - 1.0)
            jobs.setdefault(row.job, []).append((e.time_s, row.step_s))
        mse = sum(x * x for x in errors) / len(errors)
        median = sorted(abs(x) for x in errors)[len(errors) // 2]
        results.append((mse, point, {"median_abs_pct": 100 * median, **ranking_scores(jobs)}))
        print(f"  {point}: mean squared rel. error {mse:.4f}, median |err| {100 * median:.1f}%", file=sys.stderr, flush=True)
    return sorted(results, key=lambda r: r[0])


FLASH_FACTOR_GRID: tuple[float, ...] = (1.0, 1.3, 1.4, 1.5, 1.6, 1.65, 1.7, 1.75, 1.78, 1.8, 1.82, 1.85, 1.9, 2.0, 2.2)
"""``--fit-flash-share``'s grid: FlashAttention-2's time inside training as a multiple of its bars' (1 / the
share; ``objectives.flash_rates.FA2_IN_TRAINING_SHARE``)."""


def fit_flash_share(rows, grid: Sequence[float] = FLASH_FACTOR_GRID) -> list[dict[str, float]]:
    """Grid search of ``objectives.flash_rates.FA2_IN_TRAINING_SHARE`` on ``rows`` (fit rows whose attention
    is priced from FlashAttention-2's bars): each time factor's root mean square and median relative
    step-time error and the least-squares slope of the signed error on log2 of the sequence among the rows
    at the most common GPU count (points per doubling), best (smallest root mean square) first. The share
    acts in the per-op tables, so every point re-prices every row; the module's value is restored after."""
    import numpy as np

    import objectives.flash_rates as flash_rates
    from planner.calibrate import default_graph_for, price_rows

    graph_for = default_graph_for()
    kept, results = flash_rates.FA2_IN_TRAINING_SHARE, []
    try:
        for factor in grid:
            flash_rates.FA2_IN_TRAINING_SHARE = 1.0 / factor
            priced = [p for r in rows for p in price_rows([r], graph_for=graph_for) if p.valid]
            errors = np.array([100.0 * (p.time_s / p.row.step_s - 1.0) for p in priced])
            with_seq = [(p.row.devices, int(p.row.model["seq"]), e) for p, e in zip(priced, errors) if p.row.model.get("seq")]
            gpus = max({d for d, _, _ in with_seq}, key=lambda d: sum(g == d for g, _, _ in with_seq)) if with_seq else 0
            trend = [(s, e) for d, s, e in with_seq if d == gpus]
            slope = (float(np.polyfit(np.log2([s for s, _ in trend]), [e for _, e in trend], 1)[0])
                     if len({s for s, _ in trend}) > 1 else float("nan"))
            results.append({"factor": factor, "share": 1.0 / factor, "rows": len(priced),
                            "rms_pct": float(np.sqrt(np.mean(errors ** 2))), "median_abs_pct": float(np.median(np.abs(errors))),
                            "bias_pct": float(np.median(errors)), "slope_per_doubling_seq": slope, "at_gpus": gpus})
            print(f"  x{factor:.2f}: root mean square {results[-1]['rms_pct']:.2f}%, median |err| "
                  f"{results[-1]['median_abs_pct']:.1f}%, slope on log2 seq at {gpus} GPUs {slope:+.1f}", file=sys.stderr,
                  flush=True)
    finally:
        flash_rates.FA2_IN_TRAINING_SHARE = kept
    return sorted(results, key=lambda r: r["rms_pct"])


def _fit_flash_share(paths: Sequence[Path], args: argparse.Namespace) -> int:
    """``--fit-flash-share``: the fit rows priced with a FlashAttention-2-derived kernel, the grid, the best point."""
    from objectives.flash_rates import FA2_KERNELS

    rows = _with_files([r for r in load_rows(paths) if r.split == "fit" and r.attention in FA2_KERNELS and args.only in r.id])
    if not args.no_build:
        build_missing([r.model for r in rows if r.model.get("kind") in BUILT_KINDS])
    rows = [r for r in rows if Path(r.model["path"]).exists()]
    ranked = fit_flash_share(rows)
    best = ranked[0]
    print(f"best of {len(ranked)} points on {best['rows']} fit rows: time x{best['factor']:.2f} (share "
          f"{best['share']:.3f}), root mean square {best['rms_pct']:.2f}%, median |err| {best['median_abs_pct']:.1f}% "
          f"(bias {best['bias_pct']:+.1f}%), slope on log2 seq at {best['at_gpus']} GPUs {best['slope_per_doubling_seq']:+.1f} points")
    if args.out:
        args.out.write_text(json.dumps(ranked, indent=2) + "\n", encoding="utf-8")
    return 0


def _calibrate(paths: Sequence[Path], args: argparse.Namespace) -> int:
    """``--calibrate-to``: fit on the device's fit rows, score its held-out rows, write the cluster file."""
    import numpy as np
    import yaml

    from planner.calibrate import base_cluster, calibrate_steps, check_cluster_file, format_report

    rows = _with_files([r for r in load_rows(paths) if r.device == args.device and args.only in r.id])
    if not rows:
        raise SystemExit(f"no rows of device {args.device}; choose --device among the rows' devices")
    if not args.no_build:
        build_missing([r.model for r in rows if r.model.get("kind") in BUILT_KINDS])
    base = base_cluster(rows, device=args.device, cluster_file=None)
    fields = [f.strip() for f in args.fit_fields.split(",") if f.strip()] or None
    report = calibrate_steps(rows, base=base, holdout=np.array([r.split == "holdout" for r in rows]), fields=fields,
                             plain=args.plain, fsdp_units=args.fsdp_units)
    args.calibrate_to.write_text(yaml.safe_dump(report.cluster_file, sort_keys=False), encoding="utf-8")
    print(format_report(report, output=str(args.calibrate_to)))
    for text in check_cluster_file(args.calibrate_to, report.fit.params, report.fit.after):
        print(f"warning: {text}", file=sys.stderr)
    if args.out:
        args.out.write_text(json.dumps(report.as_dict(), indent=2, default=lambda v: None) + "\n", encoding="utf-8")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=Path, nargs="*", default=None,
                        help="runs files (default: bench/fidelity/runs_*.jsonl)")
    parser.add_argument("--split", choices=("holdout", "fit"), default="holdout",
                        help="rows to score: holdout (default; the score) or fit (in-sample, for calibration)")
    parser.add_argument("--calibration", type=Path, default=None,
                        help="a cluster file (planner calibrate -o): its fitted constants replace the presets' "
                             "for rows of its device and links")
    parser.add_argument("--plain", action="store_true", help="price with the plain roofline (no engine/attention)")
    parser.add_argument("--fsdp-units", action="store_true",
                        help="price ZeRO-3 per fully_shard unit, one flat collective each, prefetched one unit ahead "
                             "(TrainingSettings.fsdp_units, objectives/fsdp_units.py; a diagnostic, off by default)")
    parser.add_argument("--a100-node", action="store_true",
                        help=f"score the one-node A100 Megatron-DeepSpeed runs ({A100_NODE.name}; held out: the "
                             f"{' and '.join(map(str, A100_NODE_HOLDOUT_LAYERS))}-layer models) instead of runs_*.jsonl")
    parser.add_argument("--fit-host", action="store_true",
                        help="grid-search the device's host costs (layer_host_s, microbatch_host_s, p2p_overhead_s) "
                             "on the fit rows and print the best point (how the a100-80gb preset's were fitted)")
    parser.add_argument("--host-grid", default="",
                        help="--fit-host's grid instead of the A100 one, e.g. 'layer_host_s=0,1e-3;microbatch_host_s=0,2e-3' "
                             "(seconds; a field left out keeps its preset value)")
    parser.add_argument("--fit-flash-share", action="store_true",
                        help="grid-search FlashAttention-2's in-training share of its bars on the fit rows that run it "
                             "and print the best point (how objectives.flash_rates.FA2_IN_TRAINING_SHARE was fitted)")
    parser.add_argument("--only", default="", help="only rows whose id contains this text")
    parser.add_argument("--no-build", action="store_true", help="do not build missing GPT models (their rows get no prediction)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of the table")
    parser.add_argument("--out", type=Path, default=None, help="also write the JSON to this file")
    parser.add_argument("--calibrate-to", type=Path, default=None,
                        help="fit the [Empirical] constants of --device on its fit rows (planner calibrate), write "
                             "this cluster file, and print the held-out rows' error before and after")
    parser.add_argument("--device", default="a100-80gb", help="device of --calibrate-to (a preset name)")
    parser.add_argument("--fit-fields", default="", help="constants --calibrate-to fits, comma-separated (default all)")
    parser.add_argument("--build-worker", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.build_worker is not None:
        _build_worker(json.loads(args.build_worker))
        return 0
    started = time.perf_counter()
    paths = args.runs or ([A100_NODE] if args.a100_node else sorted(DATA.glob("runs_*.jsonl")))
    if args.calibrate_to is not None:
        return _calibrate(paths, args)
    if args.fit_host:
        rows = _with_files([r for r in load_rows(paths) if r.split == "fit" and args.only in r.id])
        if not args.no_build:
            build_missing([r.model for r in rows if r.model.get("kind") in BUILT_KINDS])
        ranked = fit_host_costs(rows, parse_host_grid(args.host_grid) if args.host_grid else HOST_GRID)
        mse, point, scores = ranked[0]
        print(f"best of {len(ranked)} points on {len(rows)} fit rows: {point} (mean squared rel. error {mse:.4f}, "
              f"median |err| {scores['median_abs_pct']:.1f}%, top-1 {scores['top1']:.0%}, regret "
              f"{scores['mean_regret_pct']:.1f}%, pairs {scores['pair_accuracy']:.0%})")
        return 0
    if args.fit_flash_share:
        return _fit_flash_share(paths, args)
    every = load_rows(paths)
    rows = _with_files([r for r in every if args.only in r.id and r.split == args.split])
    if not args.no_build:
        build_missing([r.model for r in rows if r.model.get("kind") in BUILT_KINDS])
    calibration = _load_calibration(args.calibration) if args.calibration is not None else None
    print(f"pricing {len(rows)} rows ...", file=sys.stderr)
    priced = price(rows, calibration=calibration, plain=args.plain, fsdp_units=args.fsdp_units)
    result = report(priced, split=args.split, fit_rows=[r for r in every if r.split == "fit"])
    commit = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    result["meta"] = {
        "commit": commit, "date": time.strftime("%Y-%m-%d", time.gmtime()), "runs": [str(p) for p in paths],
        "calibration": str(args.calibration) if args.calibration else None, "plain": args.plain,
        "fsdp_units": args.fsdp_units,
        "seconds": round(time.perf_counter() - started, 1),
    }
    text = json.dumps(result, indent=2, default=lambda v: None)
    if args.out:
        args.out.write_text(text + "\n", encoding="utf-8")
    if args.json:
        print(text)
    else:
        label = "held-out rows (the score)" if args.split == "holdout" else "FIT rows (in-sample: not a score)"
        print_table(result, header=f"fidelity: {label}; commit {commit}, {result['meta']['date']}"
                                   + (f", calibration {args.calibration}" if args.calibration else "")
                                   + (", plain roofline" if args.plain else ""))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
