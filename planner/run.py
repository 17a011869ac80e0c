"""``python -m planner.run PLAN.json [--config CONFIG.json]``: train a Hugging Face decoder under a DTensor plan.

The plan is the JSON that ``planner ... --export dtensor`` writes (:mod:`exporters.dtensor`); the
config is the model's Hugging Face ``config.json`` (``LlamaConfig``, ``GPT2Config``...). Without
``--config`` the config is derived from the plan (:func:`config_from_plan`: the family from the
parameter names, the sizes from the plan's ``model`` section and parameter shapes);
``--write-config FILE`` writes that config for editing. Run it with
``torchrun --nproc-per-node N -m planner.run ...`` so that every process gets its rank (run bare, it
prints that command with the plan's N). A plan or config it cannot use is one ``error:`` line and
exit 2. The steps, one function each:

1. :func:`build_model`: ``AutoModelForCausalLM.from_config`` with a fixed seed (every rank builds
   the same weights);
2. :func:`prepare_model`: transformers ``Conv1D`` (GPT-2, weights ``[in, out]``) becomes ``nn.Linear``;
   a packed colwise weight (fused ``[q, k, v]``) has its output rows reordered rank-major so that
   each ``tp`` rank's contiguous shard holds its slice of every part; every parameter's shape is
   checked against the plan;
3. :func:`apply_plan`: ``init_device_mesh`` -> ``parallelize_module(model, mesh["tp"], styles)``
   (an unmatched module name is an error, not torch's warning), tied weights tied again,
   attention widths made local; then ``fully_shard`` per block and at the root on ``mesh["dp"]``
   for ZeRO-3;
4. :func:`train`: Adam on random tokens (next-token cross entropy), gradients averaged over ``dp``
   (FSDP2 does it for ZeRO-3; an all-reduce after backward otherwise, as DDP does);
5. a per-rank report: losses, every parameter's local shape and placements, and the bytes of
   parameters, gradients and optimizer state read from the tensors, plus the bytes saved for
   backward during one forward (``torch.autograd.graph.saved_tensors_hooks``).

torch is imported only here and only when available: planning never needs it.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import warnings
from dataclasses import dataclass, field
from fnmatch import fnmatch
from pathlib import Path
from typing import Any

from planner.core.errors import InputError

try:  # planning never needs torch; only running a plan does
    import torch
    import torch.distributed as dist
    from torch import nn
except ImportError:  # pragma: no cover - the planner's own environment has no torch
    torch = None  # type: ignore[assignment]

__all__ = [
    "Prepared",
    "config_from_plan",
    "check_plan",
    "build_model",
    "prepare_model",
    "apply_plan",
    "train",
    "memory_report",
    "tokens",
    "run_plan",
    "main",
]


@dataclass
class Prepared:
    """What :func:`prepare_model` changed, so full tensors can be mapped back to the original model."""

    from_conv1d: set[str] = field(default_factory=set)
    """Parameter names whose module was a transformers ``Conv1D`` (stored ``[in, out]``)."""
    permutations: dict[str, Any] = field(default_factory=dict)
    """Parameter name -> row order of a packed weight (``new = old[perm]``)."""


def _require_torch() -> None:
    if torch is None:
        raise InputError(
            "planner.run needs torch and transformers, which the planner itself does not; install them "
            "(pip install torch==2.13.0 transformers, or `make setup-integration`)"
        )


# ----------------------------------------------------------------------------------------------
# The plan and the config, checked before any process group exists


def _require(value: Any, kind: type | tuple[type, ...], where: str) -> Any:
    if isinstance(value, bool) or not isinstance(value, kind):
        names = kind.__name__ if isinstance(kind, type) else " or ".join(k.__name__ for k in kind)
        raise InputError(f"the plan's {where} must be {'an' if names[0] in 'aeiou' else 'a'} {names}; "
                         "re-export it with `planner ... --export dtensor`")
    return value


def check_plan(plan: Any) -> dict[str, Any]:
    """Check the parts of a DTensor plan this launcher reads (types, the mesh against the world size).

    Raises
    ------
    InputError
        Not a DTensor plan, or a key missing or of the wrong type; the message names the key.

    Examples
    --------
    >>> check_plan({"target": "megatron"})
    Traceback (most recent call last):
    ...
    planner.core.errors.InputError: this is a megatron plan, not a DTensor one; write one with `planner ... --export dtensor`
    """
    if not isinstance(plan, dict):
        raise InputError("the plan is not a JSON object; write one with `planner ... --export dtensor`")
    if plan.get("target") != "dtensor":
        target = plan.get("target")
        kind = f"a {target} plan" if isinstance(target, str) and len(target) < 40 else "not a plan"
        raise InputError(f"this is {kind}, not a DTensor one; write one with `planner ... --export dtensor`")

    def get(container: dict[str, Any], key: str, kind: type | tuple[type, ...], where: str) -> Any:
        if key not in container:
            raise InputError(f"the plan has no '{where}'; re-export it with `planner ... --export dtensor`")
        return _require(container[key], kind, where)

    world = get(plan, "world_size", int, "world_size")
    per_node = get(plan, "nproc_per_node", int, "nproc_per_node")
    mesh = get(plan, "mesh", dict, "mesh")
    shape = get(mesh, "shape", list, "mesh.shape")
    names = get(mesh, "dim_names", list, "mesh.dim_names")
    if sorted(map(str, names)) != ["dp", "tp"] or len(shape) != 2:
        raise InputError("the plan's mesh must have the dims dp and tp; re-export it with `planner ... --export dtensor`")
    sizes = [_require(size, int, "mesh.shape") for size in shape]
    if world < 1 or per_node < 1 or min(sizes) < 1 or sizes[0] * sizes[1] != world:
        raise InputError(f"the plan's mesh {sizes} does not hold its world_size {world}; re-export it")
    for key in ("tp_plan", "params", "degrees", "activation_checkpoint", "training", "batch"):
        get(plan, key, dict, key)
    get(plan["degrees"], "dp", int, "degrees.dp")
    get(plan["batch"], "micro_batch", int, "batch.micro_batch")
    get(plan["training"], "precision", str, "training.precision")
    get(plan["training"], "optimizer", str, "training.optimizer")
    get(plan["activation_checkpoint"], "mode", str, "activation_checkpoint.mode")
    for key, entry in plan["params"].items():
        entry = _require(entry, dict, f"params.{key}")
        get(entry, "name", str, f"params.{key}.name")
        if not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in get(entry, "shape", list, f"params.{key}.shape")):
            raise InputError(f"the plan's params.{key}.shape must list sizes; re-export it")
        get(entry, "aliases", list, f"params.{key}.aliases")
    for key, style in plan["tp_plan"].items():
        get(_require(style, dict, f"tp_plan.{key}"), "style", str, f"tp_plan.{key}.style")
    return plan


def read_plan_file(path: Path) -> dict[str, Any]:
    """A DTensor plan file, read and checked (:func:`check_plan`); one-line errors."""
    if not path.is_file():
        what = "does not exist" if not path.exists() else "is not a regular file"
        raise InputError(f"plan {path} {what}; write one with `planner ... --export dtensor -o {path.name}`")
    try:
        plan = json.loads(path.read_text(encoding="utf-8"), parse_constant=_refuse_constant)
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"cannot read plan {path} ({exc.__class__.__name__}); check the file") from None
    except (ValueError, RecursionError) as exc:
        reason = "nested too deeply" if isinstance(exc, RecursionError) else str(exc).splitlines()[0][:120]
        raise InputError(f"plan {path} is not JSON ({reason}); write one with `planner ... --export dtensor`") from None
    return check_plan(plan)


def _refuse_constant(name: str) -> float:
    raise ValueError(f"{name} is not a number a plan holds")


def config_from_plan(plan: dict[str, Any]) -> dict[str, Any]:
    """A Hugging Face config (``model_type`` + keyword arguments) of the model a plan was made for.

    The family comes from the parameter names the plan lists (GPT-2's ``attn.c_attn``, Llama's
    ``self_attn.q_proj`` + ``mlp.gate_proj``; Qwen2 when only q/k/v have biases), the sizes from the
    plan's ``model`` section and its parameter shapes, the rotary base and the norms' epsilon from the
    numbers the exporter read from the file (``rope_theta``, ``norm_eps``; the family's defaults where the
    file does not hold them). Weights are random in :func:`build_model` anyway, so these are all a config
    must get right; :func:`prepare_model` then checks every parameter's shape against the plan. What no
    parameter shows and such a config would not compute (the section's ``beyond_sizes``: a scaled RoPE,
    sliding windows, ...) is refused. Dropout is 0 and the KV cache off (training).

    Raises
    ------
    InputError
        The plan records no model section, its parameter names are of no family known here, or its model
        computes what a config of its sizes would not (``beyond_sizes``).

    Examples
    --------
    >>> plan = {"model": {"num_layers": 2, "hidden_size": 64, "num_attention_heads": 8, "num_key_value_heads": 4,
    ...     "head_dim": 8, "ffn_hidden_size": 128, "vocab_size": 1000, "seq_length": 16, "tied_embeddings": False},
    ...     "params": {"q": {"name": "model.layers.0.self_attn.q_proj.weight", "shape": [64, 64]},
    ...                "g": {"name": "model.layers.0.mlp.gate_proj.weight", "shape": [128, 64]}}}
    >>> config = config_from_plan(plan)
    >>> config["model_type"], config["num_key_value_heads"], config["intermediate_size"]
    ('llama', 4, 128)
    """
    model = plan.get("model")
    if not isinstance(model, dict):
        raise InputError("the plan records no model sizes (exported from a model without repeated blocks); "
                         "pass --config CONFIG.json, the model's Hugging Face config")
    shapes = {entry["name"]: list(entry["shape"]) for entry in plan.get("params", {}).values()}
    names = set(shapes)

    def has(suffix: str) -> bool:
        return any(name.endswith(suffix) for name in names)

    try:
        layers, hidden = int(model["num_layers"]), int(model["hidden_size"])
        heads, vocab = int(model["num_attention_heads"]), int(model["vocab_size"])
        ffn = int(model["ffn_hidden_size"])
        seq = int(model.get("seq_length") or 0)
        tied = bool(model.get("tied_embeddings"))
    except (KeyError, TypeError, ValueError):
        raise InputError("the plan's model section lacks sizes (num_layers, hidden_size, ...); re-export it or "
                         "pass --config CONFIG.json") from None
    beyond = [str(item) for item in model.get("beyond_sizes") or ()]
    if beyond:
        raise InputError(f"the plan's model has {'; '.join(beyond)}, which a config derived from its sizes would not "
                         "compute; pass --config CONFIG.json, the model's Hugging Face config")
    theta, eps = model.get("rope_theta"), model.get("norm_eps")
    if has(".attn.c_attn.weight"):
        positions = shapes.get("transformer.wpe.weight", [max(seq, 1)])[0]
        return {**({"layer_norm_epsilon": float(eps)} if isinstance(eps, (int, float)) else {}),
            "model_type": "gpt2", "n_layer": layers, "n_embd": hidden, "n_head": heads, "n_inner": ffn,
            "vocab_size": vocab, "n_positions": int(positions), "tie_word_embeddings": tied, "use_cache": False,
            "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0, "bos_token_id": None, "eos_token_id": None,
        }
    if has(".self_attn.q_proj.weight") and has(".mlp.gate_proj.weight"):
        kv_heads = int(model.get("num_key_value_heads") or heads)
        head_dim = int(model.get("head_dim") or hidden // heads)
        qkv_bias, out_bias = has(".self_attn.q_proj.bias"), has(".self_attn.o_proj.bias")
        qk_norm = _qk_norm_family(shapes, head_dim)
        config: dict[str, Any] = {
            "model_type": qk_norm or ("qwen2" if qkv_bias and not out_bias else "llama"),
            "num_hidden_layers": layers, "hidden_size": hidden, "num_attention_heads": heads,
            "num_key_value_heads": kv_heads, "intermediate_size": ffn, "vocab_size": vocab,
            "max_position_embeddings": max(seq, 1), "tie_word_embeddings": tied, "use_cache": False,
        }
        if head_dim != hidden // heads:
            config["head_dim"] = head_dim
        if isinstance(theta, (int, float)):  # transformers 5 moves it into rope_parameters itself
            config["rope_theta"] = float(theta)
        if isinstance(eps, (int, float)):
            config["rms_norm_eps"] = float(eps)
        if config["model_type"] == "qwen3":
            config["head_dim"] = head_dim  # Qwen3Config's default is 128, not hidden / heads
            config["attention_bias"] = qkv_bias
        if config["model_type"] == "llama":
            config["attention_bias"] = qkv_bias
            config["mlp_bias"] = has(".mlp.gate_proj.bias")
        return config
    raise InputError("cannot tell the model's family from the plan's parameter names (GPT-2 and Llama-style "
                     "decoders are known); pass --config CONFIG.json, the model's Hugging Face config")


def _qk_norm_family(shapes: dict[str, list[int]], head_dim: int) -> str | None:
    """``"qwen3"`` when the plan's Llama-style layers normalise queries and keys per head (``q_norm`` / ``k_norm``
    of ``head_dim`` channels after the projections, the input norms kept, no MLP bias: Qwen3's layer), ``None``
    when they have no such norm.

    Raises
    ------
    InputError
        Query/key norms of another kind (OLMo-2's over the whole projection, with output norms in place of input
        norms), which neither a Llama nor a Qwen3 config computes.
    """
    norms = {name: shape for name, shape in shapes.items() if name.endswith((".self_attn.q_norm.weight",
                                                                             ".self_attn.k_norm.weight"))}
    if not norms:
        return None
    per_head = all(shape == [head_dim] for shape in norms.values())
    input_norms = any(name.endswith(".input_layernorm.weight") for name in shapes)
    mlp_bias = any(name.endswith(".mlp.gate_proj.bias") for name in shapes)
    if per_head and input_norms and not mlp_bias:
        return "qwen3"
    first = min(norms)
    raise InputError(f"the plan's model normalises queries and keys ({first}: {norms[first]}) in a way no config "
                     "derived here computes (Qwen3's per-head norms are); pass --config CONFIG.json, the model's "
                     "Hugging Face config")


def _read_config(path: Path) -> dict[str, Any]:
    """A Hugging Face ``config.json`` as a dict with ``model_type``; one-line errors."""
    if not path.is_file():
        raise InputError(f"config {path} is not a file; pass the model's Hugging Face config.json or leave out "
                         "--config to derive it from the plan")
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise InputError(f"config {path} is not JSON ({exc.__class__.__name__}); pass the model's config.json") from None
    if not isinstance(config, dict) or not isinstance(config.get("model_type"), str):
        raise InputError(f"config {path} has no 'model_type'; pass a Hugging Face config.json (config.to_json_file)")
    return config


def launch_command(plan: dict[str, Any], plan_path: Path, extra: list[str]) -> str:
    """The torchrun command that runs ``plan``: ``--nproc-per-node`` from the plan, ``--nnodes`` too
    when it spans nodes.

    >>> launch_command({"world_size": 4, "nproc_per_node": 4}, Path("p.json"), [])
    'torchrun --nproc-per-node 4 -m planner.run p.json'
    """
    import shlex

    words = ["torchrun", "--nproc-per-node", str(plan["nproc_per_node"])]
    nodes = int(plan["world_size"]) // int(plan["nproc_per_node"])
    if nodes > 1:
        words += ["--nnodes", str(nodes), "--node-rank", "$NODE_RANK", "--master-addr", "$MASTER_ADDR"]
    words += ["-m", "planner.run", str(plan_path), *extra]
    return " ".join(w if w.startswith("$") else shlex.quote(w) for w in words)


# ----------------------------------------------------------------------------------------------
# Model


def build_model(config: Any, *, seed: int, device: str = "cpu") -> "nn.Module":
    """A causal LM from a Hugging Face config (a ``PretrainedConfig``, a dict with ``model_type``, or a
    ``config.json`` path), initialised from ``seed``, in training mode."""
    from transformers import AutoConfig, AutoModelForCausalLM, PretrainedConfig

    if not isinstance(config, PretrainedConfig):
        if isinstance(config, (str, Path)):
            config = json.loads(Path(config).read_text())
        config = dict(config)
        config = AutoConfig.for_model(config.pop("model_type"), **config)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config)
    return model.to(device).train()


def _matching(model: "nn.Module", pattern: str) -> list[tuple[str, "nn.Module"]]:
    """Modules whose FQN matches ``pattern`` token by token (``fnmatch``), as parallelize_module does."""
    tokens = pattern.split(".")
    found = []
    for name, module in model.named_modules():
        parts = name.split(".")
        if name and len(parts) == len(tokens) and all(fnmatch(p, t) for p, t in zip(parts, tokens)):
            found.append((name, module))
    return found


def _set_module(model: "nn.Module", name: str, module: "nn.Module") -> None:
    parent_name, _, leaf = name.rpartition(".")
    setattr(model.get_submodule(parent_name) if parent_name else model, leaf, module)


def _packed_order(parts: list[int], tp: int) -> list[int]:
    """Row order putting rank ``r``'s slice of every part together: ``[q_0 k_0 v_0 q_1 k_1 v_1 ...]``.

    >>> _packed_order([4, 2], 2)
    [0, 1, 4, 2, 3, 5]
    """
    starts = [sum(parts[:i]) for i in range(len(parts))]
    order: list[int] = []
    for rank in range(tp):
        for start, width in zip(starts, parts):
            chunk = width // tp
            order += range(start + rank * chunk, start + (rank + 1) * chunk)
    return order


def prepare_model(model: "nn.Module", plan: dict[str, Any]) -> Prepared:
    """Make ``model`` what the plan describes: ``nn.Linear`` for ``Conv1D``, packed weights reordered
    for ``tp``, and every parameter's shape checked (``ValueError`` with the fix otherwise)."""
    prepared = Prepared()
    for name, module in list(model.named_modules()):
        if type(module).__name__ == "Conv1D" and hasattr(module, "nf") and hasattr(module, "nx"):
            linear = nn.Linear(module.nx, module.nf, bias=module.bias is not None)
            linear = linear.to(device=module.weight.device, dtype=module.weight.dtype)
            with torch.no_grad():
                linear.weight.copy_(module.weight.t())
                if module.bias is not None:
                    linear.bias.copy_(module.bias)
            _set_module(model, name, linear)
            prepared.from_conv1d.add(f"{name}.weight")
    tp = int(plan["mesh"]["shape"][plan["mesh"]["dim_names"].index("tp")])
    for pattern, style in plan["tp_plan"].items():
        parts = style.get("packed")
        if not parts or tp == 1:
            continue
        order = torch.tensor(_packed_order(list(parts), tp))
        for name, module in _matching(model, pattern):
            with torch.no_grad():
                for leaf in ("weight", "bias"):
                    param = getattr(module, leaf, None)
                    if param is not None:
                        param.copy_(param[order.to(param.device)])
                        prepared.permutations[f"{name}.{leaf}"] = order
            parent = model.get_submodule(name.rpartition(".")[0])
            # GPT-2 splits its fused QKV output by a global width; the local output is 1/tp of it.
            if hasattr(parent, "split_size"):
                parent.split_size //= tp
    _check_shapes(model, plan)
    return prepared


def _check_shapes(model: "nn.Module", plan: dict[str, Any]) -> None:
    names = {name: p for name, p in model.named_parameters(remove_duplicate=False)}
    covered: set[str] = set()
    for entry in plan["params"].values():
        found = [n for n in (entry["name"], *entry["aliases"]) if n in names]
        if not found:
            raise ValueError(
                f"the plan's parameter {entry['name']} is not in the model; pass --config with the config of the model "
                "the plan was made for"
            )
        for name in found:
            if list(names[name].shape) != list(entry["shape"]):
                raise ValueError(
                    f"parameter {name} has shape {list(names[name].shape)} but the plan says {entry['shape']}; pass "
                    "--config with the config of the model the plan was made for"
                )
            covered.add(name)
    missing = sorted(set(names) - covered)
    if missing:
        raise ValueError(f"parameter {missing[0]} of the model is not in the plan; plan the model built from this config")


# ----------------------------------------------------------------------------------------------
# Parallelism


def _placement(spec: list[Any]):
    from torch.distributed.tensor import Replicate, Shard

    if spec[0] == "shard":
        return Shard(int(spec[1]))
    if spec[0] == "replicate":
        return Replicate()
    raise ValueError(f"unknown placement {spec}; use ['shard', dim] or ['replicate']")


def _style(spec: dict[str, Any]):
    """A ``torch.distributed.tensor.parallel`` style from its JSON description."""
    from torch.distributed.tensor import parallel as tp

    kind = spec["style"]
    local = spec.get("use_local_output")
    if kind in ("colwise", "rowwise"):
        cls = tp.ColwiseParallel if kind == "colwise" else tp.RowwiseParallel
        return cls(
            input_layouts=_placement(spec["input_layouts"][0]),
            output_layouts=_placement(spec["output_layouts"][0]),
            use_local_output=bool(local),
        )
    if kind == "sequence_parallel":
        return tp.SequenceParallel(sequence_dim=int(spec.get("sequence_dim", 1)), use_local_output=bool(local))
    if kind == "prepare_input":
        return tp.PrepareModuleInput(
            input_layouts=tuple(_placement(p) for p in spec["input_layouts"]),
            desired_input_layouts=tuple(_placement(p) for p in spec["desired_input_layouts"]),
            use_local_output=bool(local),
        )
    if kind == "prepare_output":
        return tp.PrepareModuleOutput(
            output_layouts=tuple(_placement(p) for p in spec["output_layouts"]),
            desired_output_layouts=tuple(_placement(p) for p in spec["desired_output_layouts"]),
            use_local_output=bool(local),
        )
    raise ValueError(f"unknown style '{kind}'; use colwise, rowwise, sequence_parallel, prepare_input or prepare_output")


def _tie_groups(model: "nn.Module") -> list[list[str]]:
    by_id: dict[int, list[str]] = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        by_id.setdefault(id(param), []).append(name)
    return [names for names in by_id.values() if len(names) > 1]


def _retie(model: "nn.Module", groups: list[list[str]]) -> None:
    """parallelize_module gives each module its own DTensor parameter; shared weights share again."""
    from torch.distributed.tensor import DTensor

    for names in groups:
        params = [model.get_parameter(n) for n in names]
        first = params[0]
        for name, param in zip(names[1:], params[1:]):
            if param is first:
                continue
            same = isinstance(param, DTensor) == isinstance(first, DTensor) and (
                not isinstance(first, DTensor) or param.placements == first.placements
            )
            if not same:
                raise ValueError(f"tied weights {names[0]} and {name} got different layouts; shard both or neither")
            module_name, _, leaf = name.rpartition(".")
            setattr(model.get_submodule(module_name), leaf, first)


def _shard_gradients_like_parameters(model: "nn.Module") -> None:
    """Keep each gradient in its parameter's placements, as the plan does.

    torch 2.13's embedding backward gives a vocabulary-parallel (``Shard(0)``) table a ``Replicate``
    gradient: every rank would keep the whole table's gradient. Re-sharding it as it is accumulated
    is a local slice (no communication); the full gradient still exists for a moment in backward.
    (FSDP2 reduce-scatters gradients into the sharded layout itself.)
    """
    from torch.distributed.tensor import DTensor

    def reshard(param: "torch.Tensor") -> None:
        grad = param.grad
        if isinstance(grad, DTensor) and grad.placements != param.placements:
            param.grad = grad.redistribute(param.device_mesh, param.placements)

    for param in model.parameters():
        if isinstance(param, DTensor):
            param.register_post_accumulate_grad_hook(reshard)


def apply_plan(model: "nn.Module", plan: dict[str, Any], mesh: Any) -> None:
    """Tensor parallelism on ``mesh["tp"]``, then FSDP2 on ``mesh["dp"]`` (HSDP: on ``dp`` unflattened into
    ``("dp_replicate", "dp_shard")``) when the plan has ``fsdp``."""
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard
    from torch.distributed.tensor.parallel import parallelize_module

    groups = _tie_groups(model)
    if plan["tp_plan"]:
        styles = {fqn: _style(spec) for fqn, spec in plan["tp_plan"].items()}
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            parallelize_module(model, mesh["tp"], styles)
        # torch only warns about a plan key that matches no module; a plan for another model is an error.
        unresolved = [str(w.message) for w in caught if "could not be resolved" in str(w.message)]
        if unresolved:
            raise ValueError(unresolved[0].split(":")[0] + "; the plan was made for another model")
        for caught_warning in caught:
            warnings.warn(caught_warning.message, caught_warning.category, stacklevel=2)
        _retie(model, groups)
        if not plan.get("fsdp"):
            _shard_gradients_like_parameters(model)
    if plan["activation_checkpoint"]["mode"] == "full":
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    fsdp = plan.get("fsdp")
    if fsdp:
        mixed = plan["training"]["precision"] == "bf16-mixed"
        policy = MixedPrecisionPolicy(
            param_dtype=torch.bfloat16 if mixed else torch.float32, reduce_dtype=torch.float32
        )
        dims = tuple(fsdp["mesh_dims"])
        # HSDP: dp unflattened into (dp_replicate, dp_shard), FSDP2 shards on the inner dim and
        # replicates on the outer (torchtitan's ParallelDims.build_mesh unflattens the same way)
        shard_mesh = mesh["dp"] if dims == ("dp",) else mesh._unflatten("dp", tuple(fsdp["mesh_shape"]), dims)[dims]
        # parameter offload (objectives.offload): the shards, gradients and Adam state on the host; pinned
        # memory needs an accelerator
        offload = {"offload_policy": CPUOffloadPolicy(pin_memory=torch.cuda.is_available())} if fsdp.get("offload_policy") == "cpu" else {}
        for pattern in fsdp["modules"]:
            for _, block in _matching(model, pattern):
                fully_shard(block, mesh=shard_mesh, reshard_after_forward=fsdp["reshard_after_forward"], mp_policy=policy, **offload)
        fully_shard(model, mesh=shard_mesh, reshard_after_forward=fsdp["reshard_after_forward"], mp_policy=policy, **offload)


def _local(tensor: "torch.Tensor") -> "torch.Tensor":
    from torch.distributed.tensor import DTensor

    return tensor.to_local() if isinstance(tensor, DTensor) else tensor


def _average_over_dp(model: "nn.Module", group: Any, dp: int) -> None:
    """DDP's gradient sync: every gradient summed over the dp group and divided by dp."""
    for param in model.parameters():
        if param.grad is not None:
            grad = _local(param.grad)
            dist.all_reduce(grad, group=group)
            grad.div_(dp)


# ----------------------------------------------------------------------------------------------
# Training and measuring


def tokens(step: int, *, batch: int, seq: int, vocab: int, seed: int) -> "torch.Tensor":
    """The global batch of step ``step``: ``[batch, seq]`` random token ids (the same on every rank)."""
    generator = torch.Generator().manual_seed(seed + 1000 + step)
    return torch.randint(0, vocab, (batch, seq), generator=generator)


def _loss(model: "nn.Module", ids: "torch.Tensor") -> "torch.Tensor":
    logits = model(input_ids=ids).logits
    return nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1).float(), ids[:, 1:].flatten())


def _saved_bytes(model: "nn.Module", ids: "torch.Tensor") -> tuple["torch.Tensor", int]:
    """The loss, and the bytes of the distinct storages the forward saves for backward (parameters
    excluded): the activation memory that lives until backward."""
    from torch.distributed.tensor import DTensor

    storages: dict[int, int] = {}

    def pack(tensor: "torch.Tensor") -> "torch.Tensor":
        local = tensor._local_tensor if isinstance(tensor, DTensor) else tensor
        # An async redistribute's result wraps the tensor its collective writes into.
        local = getattr(local, "elem", local) if type(local).__name__ == "AsyncCollectiveTensor" else local
        storage = local.untyped_storage()
        key = storage.data_ptr()
        params = {_local(p).untyped_storage().data_ptr() for p in model.parameters()}
        if key not in params and storage.nbytes() > 0:
            storages[key] = storage.nbytes()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        logits = model(input_ids=ids).logits
    loss = nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1).float(), ids[:, 1:].flatten())
    return loss, sum(storages.values())


def train(
    model: "nn.Module",
    optimizer: "torch.optim.Optimizer",
    *,
    steps: int,
    batch: int,
    seq: int,
    vocab: int,
    seed: int,
    dp_rank: int,
    dp: int,
    dp_group: Any,
    sync_gradients: bool,
    device: str,
    autocast: bool = False,
) -> dict[str, Any]:
    """``steps`` optimizer steps on this dp rank's rows of each global batch.

    Returns the local losses, the dp-averaged losses, the saved activation bytes of the first
    forward, and the step times (s). Gradients of the last step are kept (for memory readings).
    """
    if batch % dp:
        raise ValueError(f"the global batch {batch} does not divide into {dp} data-parallel ranks")
    rows = slice(dp_rank * batch // dp, (dp_rank + 1) * batch // dp)
    losses, mean_losses, times = [], [], []
    saved = 0
    for step in range(steps):
        started = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        ids = tokens(step, batch=batch, seq=seq, vocab=vocab, seed=seed)[rows].to(device)
        with torch.autocast(device_type=device.split(":")[0], dtype=torch.bfloat16, enabled=autocast):
            if step == 0:
                loss, saved = _saved_bytes(model, ids)
            else:
                loss = _loss(model, ids)
        loss.backward()
        if sync_gradients:
            _average_over_dp(model, dp_group, dp)
        optimizer.step()
        times.append(time.perf_counter() - started)
        value = loss.detach().clone()
        losses.append(float(value))
        if dp > 1:
            dist.all_reduce(value, group=dp_group)
        mean_losses.append(float(value) / dp)
    return {"losses": losses, "mean_losses": mean_losses, "saved_activation_bytes": saved, "step_times_s": times}


def _nbytes(tensor: "torch.Tensor") -> int:
    local = _local(tensor)
    return local.numel() * local.element_size()


def memory_report(model: "nn.Module", optimizer: "torch.optim.Optimizer") -> dict[str, int]:
    """Bytes this rank holds, read from the tensors: parameters, gradients, optimizer state.

    ``optimizer_bytes`` counts the per-element state (Adam's two moments, SGD's momentum);
    ``optimizer_step_bytes`` the scalar step counters, one per parameter tensor.
    """
    params = list(model.parameters())
    report = {
        "params_bytes": sum(_nbytes(p) for p in params),
        "grads_bytes": sum(_nbytes(p.grad) for p in params if p.grad is not None),
        "optimizer_bytes": 0,
        "optimizer_step_bytes": 0,
    }
    for state in optimizer.state.values():
        for key, value in state.items():
            if torch.is_tensor(value):
                report["optimizer_step_bytes" if key == "step" else "optimizer_bytes"] += _nbytes(value)
    return report


def _offload_policy(model: "nn.Module") -> str | None:
    """The class name of FSDP2's offload policy as applied (``CPUOffloadPolicy`` or ``OffloadPolicy``; read from
    the private parameter groups: ``fully_shard`` exposes none); ``None`` without FSDP."""
    groups = [m._get_fsdp_state()._fsdp_param_group for m in model.modules() if hasattr(m, "_get_fsdp_state")]
    names = {type(group.offload_policy).__name__ for group in groups if group is not None}
    return names.pop() if len(names) == 1 else None


def _words(placement: Any) -> str:
    """A placement in the plan's words: ``replicate``, ``shard(D)`` (``_StridedShard`` too), ``partial``."""
    if placement.is_replicate():
        return "replicate"
    dim = getattr(placement, "dim", None)
    return f"shard({dim})" if dim is not None else "partial"


def _shard_report(model: "nn.Module") -> dict[str, dict[str, Any]]:
    from torch.distributed.tensor import DTensor

    result = {}
    for name, param in model.named_parameters():
        if isinstance(param, DTensor):
            names = param.device_mesh.mesh_dim_names or tuple(str(i) for i in range(param.device_mesh.ndim))
            placements = {n: _words(p) for n, p in zip(names, param.placements)}
        else:
            placements = {}
        grad = param.grad
        result[name] = {
            "local_shape": list(_local(param).shape),
            "grad_local_shape": None if grad is None else list(_local(grad).shape),
            "placements": placements,
        }
    return result


def _full_tensors(model: "nn.Module", prepared: Prepared) -> dict[str, dict[str, "torch.Tensor"]]:
    """Every parameter and gradient gathered whole (a collective: every rank calls it), mapped back
    to the original model's layout (packed rows restored, Conv1D ``[in, out]``)."""
    from torch.distributed.tensor import DTensor

    def whole(tensor: "torch.Tensor", name: str) -> "torch.Tensor":
        full = tensor.full_tensor() if isinstance(tensor, DTensor) else tensor
        full = full.detach().float().cpu().clone()
        order = prepared.permutations.get(name)
        if order is not None:
            full = full[torch.argsort(order)]
        if name in prepared.from_conv1d:
            full = full.t().contiguous()
        return full

    params, grads = {}, {}
    for name, param in model.named_parameters():
        params[name] = whole(param, name)
        if param.grad is not None:
            grads[name] = whole(param.grad, name)
    return {"params": params, "grads": grads}


def run_plan(
    plan: dict[str, Any],
    config: Any,
    *,
    steps: int = 2,
    seed: int = 0,
    lr: float = 1e-3,
    batch: int | None = None,
    seq: int | None = None,
    device: str = "cpu",
    report_dir: str | Path | None = None,
    gather: bool = False,
) -> dict[str, Any]:
    """Apply ``plan`` to the model of ``config`` and train ``steps`` steps (process group initialised).

    Returns this rank's report; with ``report_dir`` it is also written to ``rank{R}.json`` there, and
    with ``gather`` rank 0 writes the whole parameters and gradients to ``full.pt``.
    """
    from torch.distributed.device_mesh import init_device_mesh

    world = dist.get_world_size()
    if world != plan["world_size"]:
        raise ValueError(f"the plan needs {plan['world_size']} processes, torchrun started {world}; pass --nproc-per-node")
    mesh = init_device_mesh(device.split(":")[0], tuple(plan["mesh"]["shape"]), mesh_dim_names=tuple(plan["mesh"]["dim_names"]))
    model = build_model(config, seed=seed, device=device)
    vocab = int(model.config.vocab_size)
    prepared = prepare_model(model, plan)
    apply_plan(model, plan, mesh)
    settings = plan["training"]
    if settings["optimizer"] == "adam":
        optimizer = torch.optim.Adam(model.parameters(), lr=lr, foreach=False)
    else:
        optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9, foreach=False)
    dp = int(plan["degrees"]["dp"])
    dp_mesh = mesh["dp"]
    result = train(
        model,
        optimizer,
        steps=steps,
        batch=batch or int(plan["batch"]["micro_batch"]),
        seq=seq or int(plan["batch"]["seq_length"]),
        vocab=vocab,
        seed=seed,
        dp_rank=dp_mesh.get_local_rank(),
        dp=dp,
        dp_group=dp_mesh.get_group(),
        sync_gradients=dp > 1 and not plan.get("fsdp"),
        device=device,
        autocast=settings["precision"] == "bf16-mixed" and not plan.get("fsdp"),
    )
    rank = dist.get_rank()
    report = {
        "rank": rank,
        "coordinate": dict(zip(plan["mesh"]["dim_names"], mesh.get_coordinate())),
        **result,
        "memory": memory_report(model, optimizer),
        "offload_policy": _offload_policy(model),
        "params": _shard_report(model),
    }
    if report_dir is not None:
        from planner.outputs import write_output, write_output_with

        out = Path(report_dir)
        out.mkdir(parents=True, exist_ok=True)
        # a re-run replaces its own reports (force), but never writes through a link or onto a FIFO
        write_output(out / f"rank{rank}.json", json.dumps(report, indent=1), force=True, flag="--report")
        if gather:
            full = _full_tensors(model, prepared)
            if rank == 0:
                saved = {**full, "mean_losses": result["mean_losses"]}
                write_output_with(out / "full.pt", lambda path: torch.save(saved, path), force=True, flag="--report")
    return report


def _run_checked(plan: dict[str, Any], config: Any, **kwargs: Any) -> dict[str, Any]:
    """:func:`run_plan`, with a config that does not build the plan's model (an unknown
    ``model_type``, a parameter of another shape: ``ValueError`` with the fix) as a user error."""
    try:
        return run_plan(plan, config, **kwargs)
    except (ValueError, KeyError) as exc:
        text = " ".join(str(exc).split())[:300]
        raise InputError(f"the config does not build the plan's model: {text}") from None


def _preflight(plan: dict[str, Any], config: Any) -> None:
    """Build the config's model on the meta device (no memory, no weights) and check it against the
    plan, so a wrong config is one line here, not one traceback per rank after torchrun started."""
    try:
        with torch.device("meta"):
            model = build_model(config, seed=0, device="meta")
        prepare_model(model, plan)
    except (ValueError, KeyError, TypeError) as exc:
        text = " ".join(str(exc).split())[:300]
        raise InputError(f"the config does not build the plan's model: {text}") from None


def main(argv: list[str] | None = None) -> int:
    """Command line; see the module docstring. User errors are one ``error:`` line and exit code 2."""
    try:
        return _main(argv)
    except InputError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2


def _main(argv: list[str] | None) -> int:
    parser = argparse.ArgumentParser(prog="python -m planner.run", description=__doc__.splitlines()[0])
    parser.add_argument("plan", type=Path, help="DTensor plan JSON (planner ... --export dtensor)")
    parser.add_argument("--config", type=Path, default=None,
                        help="Hugging Face config.json of the model (default: derived from the plan)")
    parser.add_argument("--write-config", type=Path, default=None, metavar="FILE",
                        help="write the config derived from the plan to FILE and exit (no torch needed)")
    parser.add_argument("--force", action="store_true", help="with --write-config: replace an existing FILE")
    parser.add_argument("--steps", type=int, default=2, help="optimizer steps (default 2)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the weights and the random tokens")
    parser.add_argument("--lr", type=float, default=1e-3, help="learning rate (default 1e-3)")
    parser.add_argument("--batch", type=int, default=None, help="global batch per step (default: the plan's)")
    parser.add_argument("--seq", type=int, default=None, help="sequence length (default: the plan's)")
    parser.add_argument("--report", type=Path, default=None, help="write rank{R}.json reports to this folder")
    parser.add_argument("--gather", action="store_true", help="with --report: rank 0 also writes full.pt")
    args = parser.parse_args(argv)
    plan = read_plan_file(args.plan)
    if args.write_config is not None:
        from planner.outputs import write_output

        write_output(args.write_config, json.dumps(config_from_plan(plan), indent=2) + "\n", force=args.force,
                     flag="--write-config")
        print(f"wrote {args.write_config}; run the plan with: "
              f"{launch_command(plan, args.plan, ['--config', str(args.write_config)])}", file=sys.stderr)
        return 0
    config: Any = _read_config(args.config) if args.config is not None else config_from_plan(plan)
    _require_torch()
    _preflight(plan, config)
    if "RANK" not in os.environ or "WORLD_SIZE" not in os.environ:
        extra = [] if args.config is None else ["--config", str(args.config)]
        raise InputError(f"planner.run starts one process per device under torchrun; run: "
                         f"{launch_command(plan, args.plan, extra)}")
    if int(os.environ["WORLD_SIZE"]) != plan["world_size"]:
        raise InputError(f"the plan needs {plan['world_size']} processes, torchrun started {os.environ['WORLD_SIZE']}; "
                         f"run: {launch_command(plan, args.plan, [])}")
    device = f"cuda:{int(os.environ.get('LOCAL_RANK', 0))}" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda"):
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if device.startswith("cuda") else "gloo")
    try:
        report = _run_checked(
            plan,
            config,
            steps=args.steps,
            seed=args.seed,
            lr=args.lr,
            batch=args.batch,
            seq=args.seq,
            device=device,
            report_dir=args.report,
            gather=args.gather,
        )
        if report["rank"] == 0:
            memory = report["memory"]
            print(
                f"mesh {plan['mesh']['shape']} {plan['mesh']['dim_names']}: losses "
                + ", ".join(f"{x:.4f}" for x in report["mean_losses"])
                + f"; rank 0 holds params {memory['params_bytes']} B, grads {memory['grads_bytes']} B, "
                f"optimizer {memory['optimizer_bytes']} B",
                file=sys.stderr,
            )
    finally:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
