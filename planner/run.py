"""``python -m planner.run PLAN.json --config CONFIG.json``: train a Hugging Face decoder under a DTensor plan.

The plan is the JSON that ``planner ... --export dtensor`` writes (:mod:`exporters.dtensor`); the
config is the model's Hugging Face ``config.json`` (``LlamaConfig``, ``GPT2Config``...). Run it with
``torchrun --nproc-per-node N -m planner.run ...`` so that every process gets its rank. The steps, one
function each:

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

try:  # planning never needs torch; only running a plan does
    import torch
    import torch.distributed as dist
    from torch import nn
except ImportError:  # pragma: no cover - the planner's own environment has no torch
    torch = None  # type: ignore[assignment]

__all__ = [
    "Prepared",
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
        raise SystemExit("planner.run needs torch (and transformers); install them, e.g. `make setup-integration`")


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
    """Tensor parallelism on ``mesh["tp"]``, then FSDP2 on ``mesh["dp"]`` when the plan has ``fsdp``."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
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
        for pattern in fsdp["modules"]:
            for _, block in _matching(model, pattern):
                fully_shard(block, mesh=mesh["dp"], reshard_after_forward=fsdp["reshard_after_forward"], mp_policy=policy)
        fully_shard(model, mesh=mesh["dp"], reshard_after_forward=fsdp["reshard_after_forward"], mp_policy=policy)


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
        "params": _shard_report(model),
    }
    if report_dir is not None:
        out = Path(report_dir)
        out.mkdir(parents=True, exist_ok=True)
        (out / f"rank{rank}.json").write_text(json.dumps(report, indent=1))
        if gather:
            full = _full_tensors(model, prepared)
            if rank == 0:
                torch.save({**full, "mean_losses": result["mean_losses"]}, out / "full.pt")
    return report


def main(argv: list[str] | None = None) -> int:
    """Command line; see the module docstring."""
    parser = argparse.ArgumentParser(prog="python -m planner.run", description=__doc__.splitlines()[0])
    parser.add_argument("plan", type=Path, help="DTensor plan JSON (planner ... --export dtensor)")
    parser.add_argument("--config", type=Path, required=True, help="Hugging Face config.json of the model")
    parser.add_argument("--steps", type=int, default=2, help="optimizer steps (default 2)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the weights and the random tokens")
    parser.add_argument("--lr", type=float, default=1e-3, help="learning rate (default 1e-3)")
    parser.add_argument("--batch", type=int, default=None, help="global batch per step (default: the plan's)")
    parser.add_argument("--seq", type=int, default=None, help="sequence length (default: the plan's)")
    parser.add_argument("--report", type=Path, default=None, help="write rank{R}.json reports to this folder")
    parser.add_argument("--gather", action="store_true", help="with --report: rank 0 also writes full.pt")
    args = parser.parse_args(argv)
    _require_torch()
    plan = json.loads(args.plan.read_text())
    if plan.get("target") != "dtensor":
        raise SystemExit(f"{args.plan} is not a DTensor plan; write one with `planner ... --export dtensor`")
    device = f"cuda:{int(os.environ.get('LOCAL_RANK', 0))}" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda"):
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if device.startswith("cuda") else "gloo")
    try:
        report = run_plan(
            plan,
            args.config,
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
