"""The ``planner`` command: parses options, calls the library, hands results to :mod:`planner.render`.

Errors the user can fix (:class:`~planner.core.errors.PlannerError`) are caught once, in :func:`main`,
and printed as one line on stderr with exit code 2; a traceback appears only with ``--debug``.
stdout carries only the table or the JSON, so ``--json | jq`` works.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import sys
from pathlib import Path
from typing import Annotated, Any, Callable, Optional, Sequence

import typer
from rich.text import Text
from typer.core import TyperGroup

try:  # typer >= 0.20 ships its own copy of click
    from typer._click.exceptions import ClickException, UsageError
except ImportError:  # pragma: no cover - older typer on the real click
    from click.exceptions import ClickException, UsageError

from exporters.targets import EXPORT_FORMATS, TARGETS, target_names
from exporters.targets import target as find_target
from planner.core.dims import parse_dims
from planner.core.dims import shown as _shown
from planner.core.errors import InputError, PlannerError
from planner.render import SafeConsole, printable

__all__ = ["app", "main", "parse_dims"]  # parse_dims: planner.core.dims, kept importable here


class _OneLineErrors(TyperGroup):
    """The command group, with Click's usage errors (a missing argument, an unknown option, ``--top 0``)
    printed as one line, ``error: ...; see planner CMD --help``, exit 2, like every other user error
    (Click draws a five-line usage box)."""

    def main(self, args: Any = None, prog_name: Any = None, complete_var: Any = None,
             standalone_mode: bool = True, **extra: Any) -> Any:
        try:
            code = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        except UsageError as error:
            # `planner` alone raises NoArgsIsHelpError after printing the help: nothing to add
            if type(error).__name__ != "NoArgsIsHelpError":
                command = error.ctx.command_path if error.ctx is not None else "planner"
                _print_error(f"{error.format_message().rstrip('.')}; see {command} --help")
            code = 2
        except ClickException as error:
            _print_error(error.format_message())
            code = error.exit_code
        except typer.Abort:
            _print_error("aborted")
            code = 1
        if not standalone_mode:
            return code
        sys.exit(code if isinstance(code, int) else 0)


app = typer.Typer(
    cls=_OneLineErrors,
    name="planner",
    help=(
        "Find how to split the training of an ONNX model over N devices: the time-per-step vs "
        "memory-per-device Pareto frontier of parallelization strategies, exported as launch plans."
    ),
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

stderr = SafeConsole(stderr=True, highlight=False, markup=False)  # names from the input: no markup, no escapes
_state = {"debug": False}


def _print_error(message: str, label: str = "error:") -> None:
    """``error: MESSAGE`` on stderr; the message is plain text (names from the input may hold
    ``[...]``, which Rich would otherwise read as markup: a crash, or a terminal link)."""
    stderr.print(Text.assemble((label, "red"), " ", printable(str(message))), soft_wrap=True)


def _warn(message: str) -> None:
    stderr.print(Text.assemble(("warning:", "yellow"), " ", printable(str(message))), soft_wrap=True)

# Option types, defined once so every command's help reads the same.
ModelArg = Annotated[Path, typer.Argument(help="ONNX model file (weights may be stripped).", show_default=False)]
DimOpt = Annotated[
    Optional[list[str]],
    typer.Option("--dim", help="Bind a symbolic dim, NAME=VALUE (repeatable), e.g. --dim batch=32 --dim seq=32k (k = 1,024, m = 1,048,576).", show_default=False),
]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON on stdout instead of a table.")]
QuietOpt = Annotated[bool, typer.Option("--quiet", "-q", help="No progress output on stderr (what the import warns about the model still prints; --json carries it too).")]


def handle_errors(command: Callable[..., None]) -> Callable[..., None]:
    """Run a command, turning our errors into one line on stderr and exit code 2.

    Internal bugs print one line and exit 1; ``--debug`` shows their traceback instead. stdout is
    flushed last, so that a full disk is this command's error (:class:`planner.render.OutputError`,
    silent when the reader of a pipe exited), not a message from the interpreter after it.
    """

    @functools.wraps(command)
    def wrapper(*args: object, **kwargs: object) -> None:
        from planner.render import flush_stdout

        try:
            command(*args, **kwargs)
            flush_stdout()
        except PlannerError as error:
            if _state["debug"]:
                raise
            if not getattr(error, "quiet", False):
                _print_error(str(error))
            raise typer.Exit(error.exit_code) from None
        except (typer.Exit, typer.Abort, KeyboardInterrupt):
            raise
        except Exception as error:  # noqa: BLE001 - the last line of defence
            if _state["debug"]:
                raise
            text = " ".join(str(error).split())[:500]
            _print_error(
                f"{type(error).__name__}: {text} (rerun with --debug for the traceback, and please report it)",
                label="internal error:",
            )
            raise typer.Exit(1) from None

    return wrapper


@app.callback()
def _root(
    debug: Annotated[bool, typer.Option("--debug", help="Show tracebacks of internal errors.")] = False,
) -> None:
    _state["debug"] = debug


@app.command()
@handle_errors
def inspect(model: ModelArg, dim: DimOpt = None, json_out: JsonOpt = False) -> None:
    """Summarise a model: node counts, op types, parameters, FLOPs, repeated blocks, opaque ops.

    Example: planner inspect examples/gpt2.onnx --dim batch=8 --dim seq=1024
    """
    from importers import import_model
    from importers.summary import summarize
    from planner import render

    graph = import_model(model, parse_dims(dim))
    summary = summarize(graph)
    for warning in graph.warnings:
        _warn(warning)
    render.summary(summary, json_out=json_out)


DevicesOpt = Annotated[
    str,
    typer.Option(
        "--devices",
        "-n",
        help="Device count, or a list/range to see scaling: 16, 8,16,32 or 8-64 (doubling).",
    ),
]
PlanDevicesOpt = Annotated[
    Optional[str],
    typer.Option(
        "--devices",
        "-n",
        help="Device count, or a list/range to see scaling: 16, 8,16,32 or 8-64 (doubling). "
        "Default: the --cluster file's count, else 8.",
        show_default=False,
    ),
]
DeviceOpt = Annotated[
    str, typer.Option("--device", help="Device preset (see `planner devices`), e.g. h100-sxm, a100-80gb.")
]
PerNodeOpt = Annotated[
    Optional[int], typer.Option("--devices-per-node", help="Devices per node, the devices one NVLink domain joins (default: min(devices, the preset's node: 8, or 72 for a GB200 NVL72 rack)).", show_default=False)
]
ClusterOpt = Annotated[
    Optional[Path], typer.Option("--cluster", help="Cluster file (YAML or JSON); overrides --device.", show_default=False)
]
MemLimitOpt = Annotated[
    Optional[str],
    typer.Option("--mem-limit", help="Memory per device, e.g. 16GB or 80GiB (default: the device's memory).", show_default=False),
]
DtypeOpt = Annotated[str, typer.Option("--dtype", help="Training precision: bf16-mixed (bf16), fp32 or fp8 (the linear layers' GEMMs in FP8, bf16 elsewhere: Megatron-LM and torchtitan rows); plan searches a list, e.g. bf16,fp8 (default bf16: FP8 changes the numerics, so it is opt-in).")]
OptimizerOpt = Annotated[str, typer.Option("--optimizer", help="Optimizer: adam or sgd.")]
ZeroOpt = Annotated[int, typer.Option("--zero", help="ZeRO stage 0-3 (shards optimizer state / +grads / +params).")]
NoOverlapOpt = Annotated[bool, typer.Option("--no-overlap", help="Price every collective on the critical path and export the launchers' overlap flags off (default: communication overlapped as the launchers overlap it: gradient reductions beside backward, ZeRO-3/FSDP gathers prefetched).")]
RecomputeOpt = Annotated[str, typer.Option("--recompute", help="Activation recomputation: none, selective, mlp or full.")]
CostOpt = Annotated[str, typer.Option("--cost", help="Cost model: roofline, measured (needs --profile-db) or pase.")]
ProfileDbOpt = Annotated[
    Optional[Path], typer.Option("--profile-db", help="Profile database written by `planner profile`.", show_default=False)
]

_TARGETS_HELP = "; ".join(f"{name} ({t.help})" for name, t in EXPORT_FORMATS.items()) + "."
"""Each export format and what it writes, from the registry (:data:`exporters.targets.EXPORT_FORMATS`)."""

_PLAN_EXAMPLES = """
Examples:

  planner plan examples/gpt2.onnx --devices 16 --mem-limit 16GB --dim batch=32 --dim seq=1024

  planner plan examples/gpt2.onnx -n 16 --dim batch=32 --dim seq=1024 --pick 1 --export megatron -o megatron.json

  planner plan model.onnx -n 64 --dim seq=2048 --global-batch 512 --fix pp=4,zero=1

  planner plan model.onnx --devices 8,16,32 --device h100-sxm --dim batch=64 --json | jq '.[0].rows[0]'

  planner plan model.onnx -n 16 --dim batch=32 --target generic    # every plan, launched or not

  planner plan model.onnx -n 16 --dim batch=32 --target generic --method frontier --plot f.png   # PaSE/FT per-op research frontier

  planner plan model.onnx -n 256 --dim seq=2048 --global-batch 1024 --tokens 2T --price-per-gpu-hour 2.5

  planner plan model.onnx -n 128,256,512 --dim seq=2048 --global-batch 1024 --tokens 300B --price-per-gpu-hour 2.5 --json -q | jq '[.[].rows[] | select(.fits and .run.days <= 30)] | min_by(.run.cost_usd) | .summary, .run'

Every row is a plan a launcher runs (Megatron-LM, DeepSpeed, Mesh-TF, DTensor, torchtitan), priced under that
launcher's execution model, over pipeline stages, dp x cp x tp layouts, micro-batch, ZeRO and
recomputation; the model's batch is the global batch (--global-batch overrides it). --fix pins any
degree or knob; --target X lists only X's plans; --target generic lists every plan over the same knobs,
each op split its own way, whether a launcher runs it or not (--method, --epsilon, --seed, --plot: the
per-op research frontier of one step at the model's batch, PaSE's DP and FT's Pareto search).
--tokens T prices a run on every row: steps = T / (global batch x the model's sequence length), rounded
up; days = steps x step time; GPU-hours = days x 24 x the devices a row launches on; cost = GPU-hours x --price-per-gpu-hour.
The jq line above prints the cheapest plan, over three device counts, that finishes within 30 days.
"""


MAX_DEVICES = 1 << 20
"""Largest ``--devices`` (1,048,576): beyond it no search table fits in memory, and a typo such as
``1073741824`` should stop at once, not after minutes of enumerating splits."""

_MAX_DEVICE_COUNTS = 64
"""Most counts one ``--devices`` sweep may name (each is a whole search)."""


def parse_devices(text: str) -> list[int]:
    """Parse ``--devices``: ``16``, ``8,16,32`` or ``8-64`` (doubling from 8 to 64).

    Every count is at most :data:`MAX_DEVICES`, checked before a range is expanded.

    Examples
    --------
    >>> parse_devices("8,16")
    [8, 16]
    >>> parse_devices("4-32")
    [4, 8, 16, 32]
    """
    counts: list[int] = []
    parts = text.split(",")
    if len(parts) > _MAX_DEVICE_COUNTS:
        raise InputError(f"--devices lists {len(parts)} counts; give at most {_MAX_DEVICE_COUNTS}")
    try:
        for part in parts:
            part = part.strip()
            if len(part) > 40:  # int() of a 5000-digit string is an error of its own; say the fix
                raise ValueError
            if "-" in part:
                low_text, high_text = part.split("-", 1)
                low, high = int(low_text), int(high_text)
                if low < 1 or high < low:
                    raise ValueError
                _check_device_count(max(low, high), text)  # before expanding: 1-10**12 is refused at once
                count = low
                while count <= high:
                    counts.append(count)
                    count *= 2
            else:
                counts.append(int(part))
    except ValueError:
        raise InputError(f"cannot read --devices '{_shown(text)}'; write 16, 8,16,32 or 8-64") from None
    if not counts or any(c < 1 for c in counts):
        raise InputError(f"--devices must be at least 1 (got '{_shown(text)}')")
    for count in counts:
        _check_device_count(count, text)
    return sorted(set(counts))


def _check_device_count(count: int, text: str) -> None:
    if count > MAX_DEVICES:
        raise InputError(f"--devices {_shown(text)} asks for {count:,} devices; the planner handles at most {MAX_DEVICES:,}")


def parse_sizes(text: str, flag: str) -> tuple[int, ...]:
    """Parse a comma-separated list of positive integers (``--pp 1,2,4``, ``--stage-layers 5,6,6,7``).

    Examples
    --------
    >>> parse_sizes("1,2,4", "--pp")
    (1, 2, 4)
    """
    try:
        values = tuple(int(part) for part in text.split(","))
    except ValueError:
        raise InputError(f"cannot read {flag} '{text}'; write positive integers separated by commas, e.g. {flag} 1,2,4") from None
    if not values or any(v < 1 for v in values):
        raise InputError(f"{flag} takes positive integers (got '{text}')")
    return values


ScheduleOpt = Annotated[
    Optional[str],
    typer.Option("--schedule", help="Pipeline schedule: gpipe, 1f1b (default), interleaved, zb-h1 or zbv (zero-bubble: torchtitan under --engine eager).", show_default=False),
]
ChunksOpt = Annotated[
    Optional[int],
    typer.Option("--chunks", min=1, help="Model chunks per device for --schedule interleaved or zb-h1 (default 1; zbv: 2).", show_default=False),
]


_DEFAULT_DEVICES = 8


def _device_counts(devices: str | None, cluster_file: Path | None) -> list[int]:
    """``--devices`` parsed; without it, the cluster file's own count (it describes the cluster), else 8."""
    if devices is not None:
        return parse_devices(devices)
    if cluster_file is not None:
        return [_load_cluster(cluster_file).devices]
    return [_DEFAULT_DEVICES]


def _load_cluster(cluster_file: Path):
    """:func:`objectives.cluster.load_cluster`, after :func:`planner.input_files.check_cluster_nesting`
    (a YAML file of 100,000 nested ``[`` would keep PyYAML busy for minutes)."""
    from objectives.cluster import load_cluster
    from planner.input_files import check_cluster_nesting

    check_cluster_nesting(cluster_file)
    return load_cluster(cluster_file)


def _cluster(devices: int, device: str, devices_per_node: int | None, cluster_file: Path | None):
    """The cluster from a file (whose device count must be ``devices``) or from a device preset."""
    from objectives.cluster import make_cluster

    if cluster_file is None:
        return make_cluster(device, devices=devices, devices_per_node=devices_per_node)
    cluster = _load_cluster(cluster_file)
    if cluster.devices != devices:
        raise InputError(
            f"--devices {devices} contradicts the cluster file {cluster_file}: {cluster.devices} devices "
            f"({cluster.nodes} nodes x {cluster.devices_per_node}); drop --devices or edit the file's nodes/devices"
        )
    if devices_per_node is not None and devices_per_node != cluster.devices_per_node:
        raise InputError(
            f"--devices-per-node {devices_per_node} contradicts the cluster file {cluster_file} "
            f"({cluster.devices_per_node} per node); drop --devices-per-node or edit the file"
        )
    return cluster


PLAIN_PROGRESS_AFTER_S = 2.0
"""Without a terminal, progress lines start once a command has run this long (s): a quick command
stays silent on stderr (its only line is its result or its error), a long one says what it does."""

_PLAIN_FRACTION_EVERY_S = 10.0
"""Without a terminal, a long stage's fraction done and time left are repeated at most this often (s)."""


class _Progress:
    """Stage progress on stderr, ``progress(stage, fraction_done)``; nothing with ``--quiet``.

    On a terminal: a spinner, the stage, and, once the stage reports a fraction, a bar with the
    time elapsed and the time left. Elsewhere (a pipe, a CI log): one plain line per stage, and the
    fraction with the time left every :data:`_PLAIN_FRACTION_EVERY_S`, once the command has run
    :data:`PLAIN_PROGRESS_AFTER_S`.
    """

    def __init__(self, quiet: bool, *, unit: str = "") -> None:
        import time

        self._clock = time.perf_counter
        self._started = self._clock()
        self._quiet = quiet
        self._live = not quiet and stderr.is_terminal
        self._stage: str | None = None
        self._stage_started = self._started
        self._printed_stage: str | None = None
        self._printed_at = 0.0
        self._progress = None
        self._task = None
        if self._live:
            from rich.progress import (
                BarColumn, Progress, SpinnerColumn, TaskProgressColumn, TextColumn, TimeElapsedColumn,
                TimeRemainingColumn,
            )

            self._progress = Progress(
                SpinnerColumn(), TextColumn("{task.description}", markup=False), BarColumn(), TaskProgressColumn(),
                TimeElapsedColumn(), TextColumn("left"), TimeRemainingColumn(),
                console=stderr, transient=True,
            )

    def __enter__(self) -> "_Progress":
        if self._progress is not None:
            self._progress.__enter__()
            self._task = self._progress.add_task("starting", total=None)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._progress is not None:
            self._progress.__exit__(*exc)

    def __call__(self, stage: str, fraction: float) -> None:
        now = self._clock()
        known = 0.0 < fraction <= 1.0
        if stage != self._stage:
            self._stage, self._stage_started = stage, now
            if self._progress is not None:
                # a new stage restarts the clock the time left is estimated from
                self._progress.reset(self._task, description=stage, total=1.0 if known else None,
                                     completed=fraction if known else 0.0)
        elif self._progress is not None:
            self._progress.update(self._task, total=1.0 if known else None, completed=fraction if known else 0.0)
        if self._live or self._quiet or now - self._started < PLAIN_PROGRESS_AFTER_S:
            return
        elapsed = now - self._started
        if stage != self._printed_stage:
            self._plain(f"[{elapsed:.0f} s] {stage}")
            self._printed_stage, self._printed_at = stage, now
        elif known and fraction < 1.0 and now - self._printed_at >= _PLAIN_FRACTION_EVERY_S:
            left = (now - self._stage_started) * (1.0 - fraction) / fraction
            self._plain(f"[{elapsed:.0f} s] {stage}: {fraction:.0%} done, about {_duration(left)} left")
            self._printed_at = now

    @staticmethod
    def _plain(line: str) -> None:
        stderr.print(Text(printable(line)), soft_wrap=True)


def _duration(seconds: float) -> str:
    """``42 s``, ``3 min``, ``2.5 h``: a time left, as roughly as it is known.

    >>> _duration(42.4), _duration(185), _duration(9000)
    ('42 s', '3 min', '2.5 h')
    """
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


@app.command(epilog=_PLAN_EXAMPLES)
@handle_errors
def plan(
    model: ModelArg,
    devices: PlanDevicesOpt = None,
    mem_limit: MemLimitOpt = None,
    dim: DimOpt = None,
    device: DeviceOpt = "a100-80gb",
    devices_per_node: PerNodeOpt = None,
    cluster: ClusterOpt = None,
    dtype: DtypeOpt = "bf16-mixed",
    no_overlap: NoOverlapOpt = False,
    optimizer: OptimizerOpt = "adam",
    zero: Annotated[Optional[int], typer.Option("--zero", help="ZeRO stage 0-3 (shards optimizer state / +grads / +params); default: searched (--target generic: 0).", show_default=False)] = None,
    recompute: Annotated[Optional[str], typer.Option("--recompute", help="Activation recomputation: none, selective (Megatron's attention core), mlp (Megatron's --recompute-modules mlp), full or op (torchtitan's op-level policy); default: searched, each launcher's modes (--target generic: none).", show_default=False)] = None,
    cost: CostOpt = "roofline",
    profile_db: ProfileDbOpt = None,
    method: Annotated[Optional[str], typer.Option("--method", help="--target generic: the per-op research search of one step: dp (exact fastest), frontier (time/memory Pareto set), nsga2 or exhaustive.", show_default=False)] = None,
    epsilon: Annotated[Optional[float], typer.Option("--epsilon", help="--target generic: frontier memory bucket width (0: exact, slower; default 0.01).", show_default=False)] = None,
    seed: Annotated[Optional[int], typer.Option("--seed", min=0, help="--target generic: seed of --method nsga2 (default 0).", show_default=False)] = None,
    time_limit: Annotated[float, typer.Option("--time-limit", min=0.001, help="Wall-clock seconds for each plan, from its start (on a loaded machine a search sees less in them; the planner's own start, about a second of CPU, comes before it and printing the table after): importing the model and pricing pure data parallelism spend it first, never cut; the launchers' searches share what is left and stop at their share once a plan is found (an exact per-stage search predicted past its share is answered by a short heuristic, and one running past it stops between steps); when nothing fits, the CPU-offload search gets what is left, at least a quarter more. A cut plan ends with a note of each phase's seconds (--target generic: the search degrades to the hull, restricted configurations, NSGA-II, and says so).")] = 60.0,
    max_memory: Annotated[Optional[str], typer.Option("--max-memory", help="Memory the planner itself may use, e.g. 8GB (default: min(4 GiB, half of RAM)); no search step passes it.", show_default=False)] = None,
    target: Annotated[Optional[str], typer.Option("--target", help=f"List only the plans this launcher runs; generic: every plan, each op split its own way, run by a launcher or not ({target_names()}; default: every launcher).", show_default=False)] = None,
    fix: Annotated[Optional[list[str]], typer.Option("--fix", help="Pin degrees and knobs, the search fills in the rest: e.g. pp=4,tp=2,zero=1,recompute=full,mb=2 (keys dp, tp, pp, cp, ep, zero, recompute, mb, offload, hsdp, tp_overlap, reshard, cuda_graphs, p2p_overlap; cp: context parallelism, the sequence split, searched where each rank keeps at least 1,024 tokens, across nodes for megatron and torchtitan (tp inside one), inside a node for deepspeed's Ulysses (torchtitan: ZeRO-3 only); ep: an MoE model's experts; offload: none, optimizer, activations or parameters (ZeRO-3), CPU offload; hsdp: the data-parallel ranks the ZeRO states are sharded over (x cp under FSDP2), replicated over the rest, 2 replicas at least (deepspeed: ZeRO++'s hpZ, a secondary parameter copy over N ranks, zero_hpz_partition_size); tp_overlap: on or off, Megatron-LM's --tp-comm-overlap or torchtitan's async TP (compiled), tp > 1 with sp; reshard: default, always or never, FSDP2's reshard_after_forward at ZeRO-3, torchtitan and dtensor; cuda_graphs: on or off, each micro-batch replayed as one CUDA graph, torchtitan's default at pp=1, priced so unless off; on with --target megatron: each transformer layer captured, --cuda-graph-impl transformer_engine; p2p_overlap: on or off, the interleaved schedule's transfers beside the chunks' passes, Megatron-LM's default with --chunks above 1, off exported as --no-overlap-p2p-communication). The precision is --dtype. Repeatable: --fix pp=4 --fix zero=1 pins both.", show_default=False)] = None,
    collapse: Annotated[float, typer.Option("--collapse", help="Merge rows within this relative tolerance of a faster listed row in both time and memory (0: every Pareto point).")] = 0.01,
    top: Annotated[int, typer.Option("--top", min=1, help="Show at most K rows of the table (--json has them all).")] = 10,
    json_out: JsonOpt = False,
    plot: Annotated[Optional[Path], typer.Option("--plot", help="--target generic: write a PNG of the frontier.", show_default=False)] = None,
    pick: Annotated[Optional[int], typer.Option("--pick", help="Row to export (default: the pick, *: the fastest row within the limit, or a row within 0.01% of it on fewer devices, fewer tp x pp x cp x ep ways or less memory, with a note naming the fastest).", show_default=False)] = None,
    export_format: Annotated[Optional[str], typer.Option("--export", help=f"Write the picked plan: {_TARGETS_HELP}", show_default=False)] = None,
    output: Annotated[Optional[Path], typer.Option("--output", "-o", help="File for --export (default: stdout).", show_default=False)] = None,
    force: Annotated[bool, typer.Option("--force", help="Overwrite an existing output file.")] = False,
    global_batch: Annotated[Optional[int], typer.Option("--global-batch", min=1, help="Samples per step (default: the model's batch dim as bound by --dim).", show_default=False)] = None,
    micro_batch: Annotated[Optional[int], typer.Option("--micro-batch", min=1, help="Samples per data-parallel rank per micro-batch (default: searched).", show_default=False)] = None,
    pp: Annotated[Optional[str], typer.Option("--pp", help="Pipeline sizes to consider, e.g. 1,2,4 (default: every size that fits).", show_default=False)] = None,
    schedule: ScheduleOpt = None,
    chunks: ChunksOpt = None,
    allow_batch_split: Annotated[bool, typer.Option("--allow-batch-split", help="Micro-batch a loss coupled across the batch too (a contrastive loss such as CLIP's): such rows train a different objective; default: one micro-batch per step for it.")] = False,
    engine: Annotated[Optional[str], typer.Option("--engine", help="Kernels the launcher runs: fused (Megatron/DeepSpeed/torch.compile class), eager (PyTorch eager, one kernel per op) or roofline (no execution model: the plain roofline). Default: each launcher's (generic: fused, flash).", show_default=False)] = None,
    attention: Annotated[Optional[str], typer.Option("--attention", help="Attention as flash (FlashAttention-2 kernel, no s x s scores), cudnn (cuDNN fused kernel: TransformerEngine on Hopper+), flex (FlexAttention's Triton kernel: torchtitan) or explicit (MatMul-Softmax-MatMul). Default: the target's.", show_default=False)] = None,
    capacity_factor: Annotated[float, typer.Option("--capacity-factor", help="MoE models: expert capacity / (tokens x top-k / experts); 1.0 is dropless routing. Expert parallelism (ep) is searched.")] = 1.0,
    tokens: Annotated[Optional[str], typer.Option("--tokens", help="Price a training run of this many tokens on every row: its days and GPU-hours (and cost with --price-per-gpu-hour); e.g. 2T or 300B (K/M/B/T = 10^3/10^6/10^9/10^12). A sample is the model's sequence length of tokens.", show_default=False)] = None,
    samples: Annotated[Optional[str], typer.Option("--samples", help="Like --tokens, in samples (for models without a sequence, e.g. a CNN): e.g. 115.2M.", show_default=False)] = None,
    price_per_gpu_hour: Annotated[Optional[float], typer.Option("--price-per-gpu-hour", help="Dollars per device per hour: adds each row's cost of the --tokens/--samples run.", show_default=False)] = None,
    quiet: QuietOpt = False,
) -> None:
    """Print the time-per-step vs memory-per-device Pareto frontier of launchable plans; pick and export one."""
    from planner.run_cost import run_request
    from planner.search.budget import PlanDeadline

    deadline = PlanDeadline(limit_s=time_limit)  # --time-limit from here: the import and every phase after it spend it
    counts = _checked_counts(devices, device, devices_per_node, cluster)
    if target is not None:
        find_target(target)
    run = run_request(tokens, samples, price_per_gpu_hour)
    research = [flag for flag, value in (("--method", method), ("--epsilon", epsilon), ("--seed", seed),
                                         ("--max-memory", max_memory), ("--plot", plot)) if value is not None]
    if research and target != "generic":
        raise InputError(f"{', '.join(research)} shape the per-op research search; add --target generic")
    if run is not None and cost == "pase":  # PaSE's tables price FLOP-equivalents, not seconds
        raise InputError("--tokens/--samples price a run in days; --cost pase prices FLOP-equivalents, not seconds")
    export = _export_request(export_format, pick, output, force=force, sweep=len(counts) > 1, json_out=json_out)
    dims = parse_dims(dim)
    precisions = _precisions(dtype)
    training = dict(precision="bf16-mixed" if "fp8" in precisions else precisions[0], optimizer=optimizer,
                    capacity_factor=capacity_factor, overlap=not no_overlap)
    shape = dict(micro_batch=micro_batch, pp=pp, schedule=schedule, chunks=chunks, time_limit=time_limit,
                 precisions=precisions)
    if target == "generic" and research:
        # the research answer: PaSE's and FT's per-op frontier of one step (``--method``), at one ZeRO stage
        if len(precisions) > 1:
            raise InputError("--target generic prices one precision; pass a single --dtype (bf16, fp32 or fp8)")
        training["fp8"] = "delayed" if precisions == ("fp8",) else None
        if fix is not None:
            raise InputError("--fix pins the degrees of launchable plans; leave out --target generic, or use --zero/--recompute")
        settings = _settings("generic", engine, attention, zero_stage=zero or 0, recompute=recompute or "none", **training)
        requests = _requests(counts, device, devices_per_node, cluster, settings=settings, mem_limit=mem_limit,
                             cost=cost, profile_db=profile_db, time_limit=time_limit, method=method, epsilon=epsilon,
                             seed=seed, max_memory=max_memory)  # fmt: skip
        _plan_per_op(model, dims, requests, global_batch=global_batch, shape=shape, top=top, json_out=json_out,
                     quiet=quiet, plot=plot, force=force, export=export, run=run, deadline=deadline)  # fmt: skip
        return
    from planner.core.degrees import parse_fix

    pins = _with_flags(parse_fix(",".join(fix) if fix else None), zero=zero, recompute=recompute)  # repeated --fix: one list
    if pins.tp_overlap == "on":  # objectives.tp_overlap: Megatron-LM's userbuffers or torchtitan's async TP, each its own
        training.update(_tp_overlap_settings(target, engine))
    if pins.reshard not in (None, "default"):  # FSDP2's reshard_after_forward: its ZeRO-3 rows, torchtitan and DTensor
        if target not in (None, "torchtitan", "dtensor"):
            raise InputError(f"--fix reshard={pins.reshard} is FSDP2's reshard_after_forward, which {target} does not set; "
                             "use --target torchtitan or dtensor, or drop it")
        training["reshard_after_forward"] = pins.reshard
        pins = dataclasses.replace(pins, zero=3)
    pins = _cuda_graphs_pin(pins, target, training)
    if pins.p2p_overlap is not None:  # Megatron-LM's overlap_p2p_comm pinned (unpinned: Target.priced_p2p_overlap)
        training["p2p_overlap"] = pins.p2p_overlap == "on"
    requests = _requests(counts, device, devices_per_node, cluster, settings=_settings("generic", None, None, **training),
                         mem_limit=mem_limit, cost=cost, profile_db=profile_db, time_limit=time_limit)  # fmt: skip
    _plan_launchable(model, dims, requests, global_batch=global_batch, shape=shape, pins=pins, target=target,
                     engine=engine, attention=attention, collapse=collapse, top=top, json_out=json_out, quiet=quiet,
                     export=export, run=run, allow_batch_split=allow_batch_split, deadline=deadline)  # fmt: skip


def _cuda_graphs_pin(pins: Any, target: str | None, training: dict[str, Any]) -> Any:
    """``pins`` after ``--fix cuda_graphs=on`` (``objectives.fixed_costs``); ``training`` gets the setting. torchtitan
    (and the generic plan, the headroom line's reproduction of a graph-priced row) replays each micro-batch as one
    graph, at ``pp = 1``; Megatron-LM captures each transformer layer (``--cuda-graph-impl transformer_engine``), at
    any ``pp``, without recomputation (``TransformerConfig.__post_init__``: full recomputation only under a whole-step
    graph, graphed selective recomputation not with its default dropout) or activation offload."""
    if pins.cuda_graphs != "on":
        return pins
    if target == "megatron":
        if pins.recompute not in (None, "none") or pins.offload == "activations":
            what = f"recompute={pins.recompute}" if pins.recompute not in (None, "none") else "offload=activations"
            raise InputError(f"--fix cuda_graphs=on captures each transformer layer, which Megatron-LM refuses with "
                             f"{what} (TransformerConfig: no recomputation or CPU offloading under per-layer CUDA "
                             f"graphs); drop {what} or cuda_graphs=on")
        training.update(cuda_graphs=True, cuda_graph_scope="layers")
        return dataclasses.replace(pins, recompute="none")
    if target not in ("torchtitan", "generic"):
        raise InputError("--fix cuda_graphs=on prices CUDA-graph replay, which torchtitan (each micro-batch, at pp=1) "
                         "and Megatron-LM (each transformer layer) run; add --target torchtitan or megatron, or leave it "
                         "out (torchtitan's rows at pp=1 are priced with graphs as it runs them)")
    if (pins.pp or 1) > 1:  # torchtitan's _validate_cuda_graphs
        raise InputError(f"--fix cuda_graphs=on replays each micro-batch as one CUDA graph, which torchtitan does not "
                         f"capture under pipeline parallelism: drop pp={pins.pp} or cuda_graphs=on")
    training["cuda_graphs"] = True
    return dataclasses.replace(pins, pp=1)


def _requests(counts: list[int], device: str, devices_per_node: int | None, cluster: Path | None, *, settings: Any,
              mem_limit: str | None, cost: str, profile_db: Path | None, time_limit: float, method: str | None = None,
              epsilon: float | None = None, seed: int | None = None, max_memory: str | None = None) -> list:
    """One :class:`~planner.plan.PlanRequest` per device count (``--cost``, ``--method``, ``--epsilon``...
    checked here, before any import or search)."""
    from planner.core.units import parse_size
    from planner.plan import PlanRequest

    return [
        PlanRequest(
            cluster=_cluster(count, device, devices_per_node, cluster), settings=settings,
            method=method or "frontier", cost_model=cost,  # type: ignore[arg-type]
            memory_limit_bytes=parse_size(mem_limit) if mem_limit is not None else None, profile_db=profile_db,
            epsilon=0.01 if epsilon is None else epsilon, seed=seed or 0, time_limit_s=time_limit,
            max_memory_bytes=parse_size(max_memory) if max_memory is not None else None,
        )
        for count in counts
    ]  # fmt: skip


def _with_flags(pins: Any, *, zero: int | None, recompute: str | None) -> Any:
    """``--fix`` with ``--zero`` / ``--recompute`` folded in (they pin those knobs too)."""
    changes = {}
    for name, value in (("zero", zero), ("recompute", recompute)):
        if value is None:
            continue
        if getattr(pins, name) not in (None, value):
            raise InputError(f"--{name} {value} and --fix {name}={getattr(pins, name)} disagree; give one")
        changes[name] = value
    return dataclasses.replace(pins, **changes) if changes else pins


def _plan_per_op(model: Path, dims: dict[str, int], requests: list, *, global_batch: int | None, shape: dict,
                 top: int, json_out: bool, quiet: bool, plot: Path | None, force: bool,
                 export: "_ExportRequest | None", run: Any = None, deadline: Any = None) -> None:
    """The per-op research frontier of one step at the model's batch (``--target generic`` with
    ``--method``/``--epsilon``/``--seed``/``--plot``/``--max-memory``), answered as the launchable
    table (:func:`planner.research.research_frontier`; with ``run``, a :class:`planner.run_cost.RunRequest`,
    priced on every row; ``deadline``: the first plan's ``--time-limit``, started with the command)."""
    from planner.plan import plan_file
    from planner.research import research_frontier
    from planner.run_cost import price_frontier

    pipeline_flags = [flag for flag, value in (("--global-batch", global_batch), ("--micro-batch", shape["micro_batch"]),
                                               ("--pp", shape["pp"]), ("--schedule", shape["schedule"]),
                                               ("--chunks", shape["chunks"])) if value is not None]  # fmt: skip
    if pipeline_flags:
        raise InputError(f"{', '.join(pipeline_flags)} shape pipelines and the per-op research search (--method, --epsilon, "
                         "--seed, --plot, --max-memory) plans one step; leave those out to plan pipelines with --target generic")
    if plot is not None:
        from planner.outputs import check_output, plot_formats

        check_output(plot, force=force, flag="--plot", formats=plot_formats())
    with _Progress(quiet) as progress:
        graph, results = plan_file(model, dims, requests, target="generic", progress=progress, with_targets=False,
                                   export=export and export.format, deadline=deadline)
    for warning in graph.warnings:  # facts about the model, not progress: --quiet keeps them
        _warn(warning)
    request = results[0].request
    timed_on = _timed_on(results[0], request.profile_db) if request.cost_model == "measured" else None
    frontiers = [research_frontier(result, timed_on=timed_on) for result in results]
    if plot is not None:
        from planner import render
        from planner.outputs import write_output_with

        write_output_with(plot, lambda temporary: render.plot_frontier(
            frontiers[-1], temporary, model=graph.name, format=plot.suffix.lower().lstrip(".")), force=force, flag="--plot")
        if not quiet:
            stderr.print(f"wrote {plot}", soft_wrap=True)
    runs = [None if run is None else price_frontier(run, f, model=model.name) for f in frontiers]
    _show_frontiers(frontiers, model=model.stem, top=top, json_out=json_out, export=export, runs=runs,
                    warnings=graph.warnings)


def _plan_launchable(model: Path, dims: dict[str, int], requests: list, *, global_batch: int | None, shape: dict,
                     pins: Any, target: str | None, engine: str | None, attention: str | None, collapse: float,
                     top: int, json_out: bool, quiet: bool, export: "_ExportRequest | None", run: Any = None,
                     allow_batch_split: bool = False, whole_graph: str | None = None, deadline: Any = None) -> None:
    """The main answer: the launchable frontier (:func:`planner.launchable.plan_launchable_file`), rendered
    (with ``run``, a :class:`planner.run_cost.RunRequest`, priced on every row), and the picked row exported.
    ``deadline``: the first plan's ``--time-limit`` (:class:`planner.search.budget.PlanDeadline`), started
    with the command."""
    from planner.coupling import NotSamples
    from planner.launchable import plan_launchable_file
    from planner.run_cost import price_frontier

    try:
        with _Progress(quiet) as progress:
            warnings, frontiers = plan_launchable_file(
                model, dims, requests, global_batch=global_batch, micro_batch=shape["micro_batch"],
                pipeline_sizes=parse_sizes(shape["pp"], "--pp") if shape["pp"] is not None else None,
                schedule=shape["schedule"], chunks=shape["chunks"], pins=pins,
                launchers=None if target is None else (target,), engine=engine, attention=attention, collapse=collapse,
                progress=progress, allow_batch_split=allow_batch_split, precisions=shape.get("precisions", ()),
                whole_graph=whole_graph, export=export and export.format, deadline=deadline,
            )  # fmt: skip
    except NotSamples as refusal:
        if global_batch is not None or shape["micro_batch"] is not None or pins.mb is not None or (pins.dp or 1) > 1:
            raise  # the user asked to split the batch: one line, exit 2
        # the whole graph is one sample: the same launchable table, one pass per step (dp 1)
        _plan_launchable(model, dims, requests, global_batch=None, shape=shape, pins=pins, target=target, engine=engine,
                         attention=attention, collapse=collapse, top=top, json_out=json_out, quiet=quiet, export=export,
                         run=run, whole_graph=refusal.reason, deadline=deadline)  # fmt: skip
        return
    for warning in warnings:  # facts about the model, not progress: --quiet keeps them
        _warn(warning)
    runs = [None if run is None else price_frontier(run, f, model=model.name) for f in frontiers]
    _show_frontiers(frontiers, model=model.stem, top=top, json_out=json_out, export=export, runs=runs,
                    warnings=warnings)


def _show_frontiers(frontiers: list, *, model: str, top: int, json_out: bool,
                    export: "_ExportRequest | None", runs: list | None = None, warnings: Sequence[str] = ()) -> None:
    """``planner plan``'s one answer, launchable or research (:class:`planner.launchable.LaunchFrontier`
    each): the tables (a sweep's scaling too) or JSON, with ``runs`` (:class:`planner.run_cost.RunPricing`
    per frontier) priced on every row, and the picked row exported (:func:`planner.launchable.export_row`);
    exit 2 when nothing fits and no row was picked. ``warnings``: the import's, kept in the JSON (``"warnings"``)."""
    from planner import render
    from planner.launchable import export_row

    runs = runs or [None] * len(frontiers)
    if json_out:
        data = [render.launch_json(f, model=model, run=r, warnings=warnings) for f, r in zip(frontiers, runs)]
        render.print_json(data[0] if len(data) == 1 else data)
    else:
        for frontier, priced in zip(frontiers, runs):
            if frontier.rows:  # a cluster with no plan at all is the error below, not an empty table
                render.launch_table(frontier, model=model, top=top, run=priced, exporting=export is not None)
        if len(frontiers) > 1:
            render.devices_table(frontiers)
    infeasible = [f for f in frontiers if f.chosen is None]
    for frontier in infeasible[1:]:
        if not frontier.rows and not json_out:  # no table says it: one line each (the first is the error)
            _warn(f"{_devices(frontier.cluster.devices)}: {frontier.message}")
    if export is not None:
        first = frontiers[0]
        index = _pick_index(first.rows, first.chosen, first.message, export.pick)
        _warn_over_limit(first, index)
        _emit(export_row(first, index, export.format), export.format, export.output, index, force=export.force)
    if infeasible and (export is None or export.pick is None):
        # The table (or JSON) above is the result; the exit code tells scripts that nothing fits.
        raise InputError(f"{_devices(infeasible[0].cluster.devices)}: {infeasible[0].message}")


def _devices(count: int) -> str:
    """``"1 device"``, ``"8 devices"``."""
    return f"{count} device{'' if count == 1 else 's'}"


def _checked_counts(devices: str | None, device: str, devices_per_node: int | None, cluster: Path | None) -> list[int]:
    """The ``--devices`` counts, every cluster of a sweep checked before any search."""
    counts = _device_counts(devices, cluster)
    for count in counts:
        try:
            _cluster(count, device, devices_per_node, cluster)
        except InputError as exc:
            if len(counts) == 1:
                raise
            raise InputError(f"--devices {devices} means {', '.join(map(str, counts))}; {exc}") from None
    return counts


def _precisions(dtype: str, *, single: bool = False) -> tuple[str, ...]:
    """``--dtype``'s precisions (``bf16`` is ``bf16-mixed``), each once, in order; ``single``: exactly one."""
    names = {"bf16": "bf16-mixed", "bf16-mixed": "bf16-mixed", "fp32": "fp32", "fp8": "fp8"}
    given = [part.strip() for part in dtype.split(",") if part.strip()]
    unknown = [part for part in given if part not in names]
    if unknown or not given:
        raise InputError(f"--dtype must be bf16-mixed (bf16), fp32 or fp8 (got {dtype!r}), e.g. --dtype bf16,fp8")
    if single and len(given) > 1:
        raise InputError(f"--dtype takes one precision here (got {dtype!r}); planner plan searches a list")
    return tuple(dict.fromkeys(names[part] for part in given))


def _tp_overlap_settings(target: str | None, engine: str | None) -> dict[str, Any]:
    """The settings of ``--fix tp_overlap=on`` under ``--target``: tensor-parallel communication under the GEMMs the
    way its launcher runs it (``Target.tp_overlap_method``: Megatron-LM's userbuffers, torchtitan's micro-pipelined
    async TP, compiled blocks only); any other target, and torchtitan under ``--engine eager``, is refused in one line."""
    if target not in ("megatron", "torchtitan"):
        raise InputError("--fix tp_overlap=on is Megatron-LM's --tp-comm-overlap (Transformer Engine userbuffers) or "
                         "torchtitan's async TP (torch.compile's micro-pipelined TP), which the other launchers do "
                         "not run; add --target megatron or --target torchtitan")
    if target == "torchtitan" and engine == "eager":
        raise InputError("--fix tp_overlap=on is torchtitan's async TP, which runs inside torch.compile'd blocks "
                         "(--compile.enable); drop --engine eager or the pin")
    from exporters.targets import TARGETS

    return {"tp_comm_overlap": True, "tp_overlap_method": TARGETS[target].tp_overlap_method}


def _settings(target: str, engine: str | None, attention: str | None, **training: Any):
    """The training settings, with the execution model of ``--target`` under ``--engine`` / ``--attention``."""
    from planner.core.settings import TrainingSettings

    execution = _execution(target, engine, attention)
    return TrainingSettings(engine=execution and execution.engine, attention=execution and execution.attention,
                            dropout=execution is not None and execution.dropout, **training)  # fmt: skip


def _export_request(
    export_format: str | None, pick: int | None, output: Path | None, *, force: bool, sweep: bool, json_out: bool
) -> "_ExportRequest | None":
    """``--export`` / ``--pick`` / ``-o`` checked before the search (``--pick`` or ``-o`` alone export
    the generic plan); ``None`` when nothing is exported."""
    if (pick is not None or output is not None) and export_format is None:
        export_format = "generic"
    if export_format is not None and sweep:
        raise InputError("--export needs a single --devices value")
    if export_format is not None and json_out and output is None:
        # stdout holds the frontier's JSON: a second document after it would make it unreadable
        raise InputError("--export with --json writes the plan to a file: add -o FILE")
    _check_export_request(export_format, pick, output, force=force)
    return None if export_format is None else _ExportRequest(format=export_format, pick=pick, output=output, force=force)


def _timed_on(result: Any, profile_db: Path | None) -> str | None:
    """``--cost measured``: the device and provider whose timings priced the ops (``"AMD EPYC (2 cores),
    cpu"``), chosen by the same call the cost model made, so the table names where its times come
    from, not only the cluster preset's name; ``None`` when the database holds no timings."""
    from objectives.profile import open_measured

    lookup = open_measured(
        profile_db, result.graph, cluster_device=result.request.cluster.device.name,
        precision=result.request.settings.precision,
    )
    return None if lookup.source is None else f"{lookup.source.device_name}, {lookup.source.provider}"


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class _ExportRequest:
    """``--export FORMAT [--pick N] [-o FILE] [--force]``."""

    format: str
    pick: int | None
    output: Path | None
    force: bool


@app.command()
@handle_errors
def estimate(
    model: ModelArg,
    devices: Annotated[int, typer.Option("--devices", "-n", min=1, help="Total devices (tp x cp x pp x dp).")],
    tp: Annotated[int, typer.Option("--tp", min=1, help="Tensor-parallel size.")],
    pp: Annotated[int, typer.Option("--pp", min=1, help="Pipeline-parallel size.")],
    micro_batch: Annotated[int, typer.Option("--micro-batch", min=1, help="Samples per data-parallel rank per micro-batch.")],
    global_batch: Annotated[int, typer.Option("--global-batch", min=1, help="Samples per step.")],
    dp: Annotated[Optional[int], typer.Option("--dp", min=1, help="Data-parallel size (default: devices / (tp x cp x pp)).", show_default=False)] = None,
    cp: Annotated[int, typer.Option("--cp", min=1, help="Context-parallel size (Megatron's --context-parallel-size: each rank holds seq / cp tokens, keys and values all-gathered).")] = 1,
    zero: ZeroOpt = 0,
    recompute: RecomputeOpt = "none",
    sequence_parallel: Annotated[bool, typer.Option("--sequence-parallel", help="Megatron's sequence parallelism (needs --tp > 1).")] = False,
    schedule: ScheduleOpt = None,
    chunks: ChunksOpt = None,
    stage_layers: Annotated[Optional[str], typer.Option("--stage-layers", help="Layers per pipeline stage, e.g. 5,6,6,7 (default: even).", show_default=False)] = None,
    dim: DimOpt = None,
    device: DeviceOpt = "a100-80gb",
    devices_per_node: PerNodeOpt = None,
    cluster: ClusterOpt = None,
    mem_limit: MemLimitOpt = None,
    dtype: DtypeOpt = "bf16-mixed",
    no_overlap: NoOverlapOpt = False,
    rank: Annotated[bool, typer.Option("--rank/--no-rank", help="Also search the frontier to rank the configuration.")] = True,
    json_out: JsonOpt = False,
    target: Annotated[str, typer.Option("--target", help="The launcher whose row this is, priced as its search prices it (its kernels, ZeRO synchronisation and CUDA-graph replay: torchtitan's at --pp 1); the layout is Megatron's pattern.")] = "megatron",
    cuda_graphs: Annotated[Optional[bool], typer.Option("--cuda-graphs/--no-cuda-graphs", help="Price each micro-batch replayed as a CUDA graph, or not (default: as --target runs it; --fix cuda_graphs of planner plan).", show_default=False)] = None,
    p2p_overlap: Annotated[Optional[bool], typer.Option("--p2p-overlap/--no-p2p-overlap", help="Price the interleaved schedule's steady-state transfers beside the other direction's chunk pass, or waited (default: as --target runs it, Megatron-LM's overlap_p2p_comm on with --chunks above 1; --fix p2p_overlap of planner plan).", show_default=False)] = None,
    engine: Annotated[Optional[str], typer.Option("--engine", help="Kernels the launcher runs: fused (Megatron/DeepSpeed/torch.compile class), eager (PyTorch eager, one kernel per op) or roofline (the plain roofline). Default: Megatron's (fused, flash).", show_default=False)] = None,
    attention: Annotated[Optional[str], typer.Option("--attention", help="Attention as flash (FlashAttention-2 kernel, no s x s scores), cudnn (cuDNN fused kernel), flex (FlexAttention's Triton kernel) or explicit (MatMul-Softmax-MatMul). Default: Megatron's (fused, cudnn).", show_default=False)] = None,
    quiet: QuietOpt = False,
) -> None:
    """Price one Megatron-style configuration you already use, and rank it against the frontier.

    Example: planner estimate model.onnx -n 16 --tp 2 --pp 2 --micro-batch 1 --global-batch 64 --zero 1

    Example: planner estimate examples/gpt2.onnx --dim seq=1024 -n 8 --tp 2 --pp 4 --micro-batch 1 --global-batch 32 --schedule interleaved --chunks 3

    Example: planner estimate examples/gpt2.onnx --dim seq=1024 -n 8 --tp 1 --pp 4 --micro-batch 2 --global-batch 32 --stage-layers 2,3,4,3
    """
    from planner import render
    from planner.core.settings import TrainingSettings
    from planner.core.units import parse_size
    from planner.estimate import estimate_file

    dims = parse_dims(dim)
    _check_device_count(devices, str(devices))
    the_cluster = _cluster(devices, device, devices_per_node, cluster)
    limit = parse_size(mem_limit) if mem_limit is not None else None
    find_target(target)  # an unknown launcher, in one line
    execution = _execution(target, engine, attention, the_cluster.device)
    (precision,) = _precisions(dtype, single=True)
    if precision == "fp8":
        from objectives.precision import require_fp8

        require_fp8(the_cluster.device)
    settings = TrainingSettings(precision="bf16-mixed" if precision == "fp8" else precision,  # type: ignore[arg-type]
                                fp8="delayed" if precision == "fp8" else None,  # Megatron-LM's Transformer Engine
                                engine=execution and execution.engine, attention=execution and execution.attention,
                                dropout=execution is not None and execution.dropout, overlap=not no_overlap,
                                p2p_overlap=p2p_overlap)
    with _Progress(quiet) as progress:
        warnings, result = estimate_file(
            model, dims, cluster=the_cluster, global_batch=global_batch, settings=settings, memory_limit_bytes=limit,
            rank=rank, progress=progress,
            tp=tp, pp=pp, dp=dp, cp=cp, micro_batch=micro_batch, zero=zero, recompute=recompute,
            sequence_parallel=sequence_parallel, schedule=schedule or "1f1b", chunks=chunks or 1,
            stage_layers=parse_sizes(stage_layers, "--stage-layers") if stage_layers is not None else None,
            target=target, cuda_graphs=cuda_graphs,
        )  # fmt: skip
    for warning in warnings:  # facts about the model, not progress: --quiet keeps them
        _warn(warning)
    render.estimate_report(result, json_out=json_out, warnings=warnings)
    if not result.valid:
        raise InputError(result.reason)


def _execution(target: str, engine: str | None, attention: str | None, device=None):
    """The execution model of ``--target`` on ``device`` with ``--engine`` / ``--attention`` over it (an
    unknown target is reported by the target check itself)."""
    from planner.launcher_options import launcher_execution

    return launcher_execution(target, None, engine, attention, device)


def _pick_index(points, chosen: int | None, message: str, pick: int | None) -> int:
    """The row ``--pick`` names (default: the highlighted one), as an index into ``points``."""
    if not points:
        raise InputError(f"nothing to export: {message}" if message else "nothing to export: the table has no row")
    if pick is None:
        if chosen is None:
            raise InputError(f"nothing fits to export ({message}); pass --pick N to export a row anyway")
        return chosen
    if not 1 <= pick <= len(points):
        raise InputError(f"--pick {pick} is out of range; choose a row from 1 to {len(points)}")
    return pick - 1


def _warn_over_limit(frontier: Any, index: int) -> None:
    """One warning when ``--pick`` names a row whose memory per device is over the limit: it is exported, as
    asked, but a launch of it runs out of memory."""
    from planner.core.units import format_bytes

    row = frontier.rows[index]
    if row.fits:
        return
    fitting = "" if frontier.chosen is None else f"; the pick within the limit is #{frontier.chosen + 1}"
    _warn(f"row {index + 1} needs {format_bytes(row.point.memory_bytes)} per device, over the "
          f"{format_bytes(frontier.memory_limit_bytes)} limit: a launch of it will not fit{fitting}")


def _emit(document: dict, export_format: str, output: Path | None, index: int, *, force: bool) -> None:
    """Print an exported plan on stdout, or write it to ``output`` and say so on stderr (also under
    ``--quiet``, which silences progress, not the command's result; ``--json`` asks for ``-o``:
    :func:`_check_export_request`)."""
    from planner import render

    text = json.dumps(document, indent=2) + "\n"
    if output is None:
        render.stdout.print_json(text)
        return
    from planner.outputs import write_output

    write = find_target(export_format, flag="--export").write  # a model file (onnx), else the JSON text
    write_output(output, text if write is None else write(document, output), force=force)
    stderr.print(f"wrote {export_format} plan of row {index + 1} to {output}" + _notes_line(document), soft_wrap=True)


def _notes_line(document: dict) -> str:
    """The exported plan's notes (what the launch needs beyond the plan, what the file could not show),
    one per line after the "wrote" line, since a plan written to a file shows them nowhere else."""
    notes = [n for n in document.get("notes", ()) if isinstance(n, str)]
    return "".join(f"\n  note: {n}" for n in notes)


def _check_export_request(export_format: str | None, pick: int | None, output: Path | None, *, force: bool) -> None:
    """What ``--export``, ``--pick`` and ``-o`` say that is wrong whatever the search finds: told
    before the search, not after minutes of it."""
    if export_format is not None:
        find_target(export_format, flag="--export")
    if pick is not None and pick < 1:
        raise InputError(f"--pick {pick} is out of range; rows are numbered from 1")
    if output is not None:
        from planner.outputs import check_output

        check_output(output, force=force, flag="-o")


@app.command()
@handle_errors
def profile(
    model: ModelArg,
    dim: DimOpt = None,
    devices: DevicesOpt = "8",
    devices_per_node: PerNodeOpt = None,
    profile_db: Annotated[Path, typer.Option("--profile-db", help="SQLite database to fill (created if missing; resumable).")] = Path("planner-profile.db"),
    provider: Annotated[str, typer.Option("--provider", help="cpu or cuda (onnxruntime, forward only); torch-cpu or torch-cuda (PyTorch, forward and backward).")] = "cpu",
    repeats: Annotated[int, typer.Option("--repeats", min=1, help="Timed runs per shard (median kept).")] = 10,
    max_shards: Annotated[Optional[int], typer.Option("--max-shards", min=1, help="Stop after measuring this many shards (resume later).", show_default=False)] = None,
    json_out: JsonOpt = False,
    quiet: QuietOpt = False,
) -> None:
    """Measure every distinct per-device op shard with onnxruntime or PyTorch into a profile database.

    Example: planner profile examples/gpt2.onnx --dim batch=1 --dim seq=128 --devices 4 --profile-db gpt2.db
    """
    from planner import render
    from planner.profiling import profile_file

    with _Progress(quiet) as progress:
        reports = profile_file(
            model, parse_dims(dim), parse_devices(devices), profile_db, devices_per_node=devices_per_node,
            provider=provider, repeats=repeats, max_shards=max_shards, progress=progress,
        )  # fmt: skip
    if json_out:
        render.print_json([r.to_json() if hasattr(r, "to_json") else r.summary() for r in reports])
    else:
        for report in reports:
            render.stdout.print(report.summary())
        render.stdout.print(f"profile database: {profile_db}")


PlanArg = Annotated[
    Path,
    typer.Argument(help="A plan written by `planner plan ... --export generic -o FILE`; - reads it from stdin.",
                   show_default=False),
]
ModelOpt = Annotated[
    Optional[Path], typer.Option("--model", help="The ONNX model (default: the path recorded in the plan).", show_default=False)
]


@app.command()
@handle_errors
def explain(
    plan_file: PlanArg,
    model: ModelOpt = None,
    top: Annotated[int, typer.Option("--top", min=1, help="Ops to list by time and by memory (of each stage of a table row).")] = 10,
    all_ops: Annotated[bool, typer.Option("--all", help="List every op.")] = False,
    json_out: JsonOpt = False,
) -> None:
    """Explain a saved plan. A row of the launchable table (its --export generic or onnx) is priced again:
    step-time parts, fixed costs, per-stage forward/backward/gradient-sync times and memory, and each
    stage's ops (split, forward, backward, time per step, communication, memory), which with the stage's
    redistribution, tied copies and host wait add up to its times; under an execution model each op's
    kernels and their launch time, and each collective's NCCL algorithm, protocol and latency, inside
    those times. A per-op plan (--target generic --method ...) shows how each op is split, its compute,
    communication by kind and link, memory, and the same fixed costs.

    Example: planner explain plan.json

    Example: cat plan.json | planner explain -
    """
    from planner import render
    from planner.input_files import STDIN_NAME, saved_plan_paths
    from planner.launchable import load_saved

    with saved_plan_paths([plan_file], command="explain") as (path,):
        loaded = load_saved(path, model=model)
    if path != plan_file and dataclasses.is_dataclass(loaded) and hasattr(loaded, "path"):
        loaded = dataclasses.replace(loaded, path=Path(STDIN_NAME))  # the copy is gone: name where it came from
    render.explain(loaded, top=top, json_out=json_out, all_ops=all_ops)


@app.command()
@handle_errors
def compare(
    plan_a: PlanArg,
    plan_b: PlanArg,
    model: ModelOpt = None,
    top: Annotated[int, typer.Option("--top", min=1, help="Ops to list.")] = 15,
    json_out: JsonOpt = False,
) -> None:
    """Compare two saved plans of one model: the difference by cost component and by op (B - A).

    Example: planner compare fast.json small.json

    Example: cat small.json | planner compare fast.json -
    """
    from planner import render
    from planner.input_files import saved_plan_paths
    from planner.launchable import load_saved_pair

    with saved_plan_paths([plan_a, plan_b], command="compare") as (path_a, path_b):
        _check_one_model(path_a, path_b)
        first, second = load_saved_pair(path_a, path_b, model=model)
    render.compare(first, second, json_out=json_out, top=top)


def _check_one_model(first: Path, second: Path) -> None:
    """:class:`InputError` when two saved plans name different model files (``model.sha256``): their
    difference would mix the models' own with the plans'."""
    from exporters.generic import read_plan

    models = [read_plan(path).data.get("model", {}) for path in (first, second)]
    if models[0].get("sha256") != models[1].get("sha256"):
        shown = " vs ".join(f"{m.get('name', '?')} (sha256 {str(m.get('sha256', '?'))[:12]})" for m in models)
        raise InputError(f"the two plans are of different model files, {shown}; compare plans of one model")


@app.command("export")
@handle_errors
def export_plan(
    plan_file: PlanArg,
    export_format: Annotated[str, typer.Option("--format", "-f", help=f"Launch target: {_TARGETS_HELP}")] = "generic",
    model: ModelOpt = None,
    output: Annotated[Optional[Path], typer.Option("--output", "-o", help="Output file (default: stdout).", show_default=False)] = None,
    force: Annotated[bool, typer.Option("--force", help="Overwrite an existing output file.")] = False,
) -> None:
    """Re-export a saved plan (pipeline plans included) for a training framework.

    Example: planner export plan.json --format megatron -o megatron.json

    Example: cat plan.json | planner export - --format deepspeed
    """
    from planner import render
    from planner.export import export_saved_plan
    from planner.input_files import saved_plan_paths

    find_target(export_format, flag="--format")
    if output is not None:
        from planner.outputs import check_output

        check_output(output, force=force, flag="-o")
    with saved_plan_paths([plan_file], command="export") as (path,):
        document = export_saved_plan(path, export_format, model=model)
    text = json.dumps(document, indent=2) + "\n"
    if output is None:
        render.print_json(document)
    else:
        from planner.outputs import write_output

        write = find_target(export_format, flag="--format").write  # a model file (onnx), else the JSON text
        write_output(output, text if write is None else write(document, output), force=force)
        stderr.print(f"wrote {export_format} plan to {output}" + _notes_line(document), soft_wrap=True)


@app.command()
@handle_errors
def devices(json_out: JsonOpt = False) -> None:
    """List the device presets (peak FLOP/s, memory, bandwidth, default links, source)."""
    from objectives.cluster import DEFAULT_LINKS, DEVICE_PRESETS
    from planner import render

    rows = []
    for name, device in DEVICE_PRESETS.items():
        intra, inter = DEFAULT_LINKS.get(name, ("", ""))
        rows.append(
            {
                "name": name,
                "half_tflops": max(device.peak_flops.get("bf16", 0.0), device.peak_flops.get("fp16", 0.0)) / 1e12,
                "fp32_tflops": device.peak_flops.get("fp32", 0.0) / 1e12,
                "memory_bytes": device.memory_bytes,
                "memory_bandwidth_tb_per_s": device.memory_bandwidth_bytes_per_s / 1e12,
                "intra_link": intra,
                "inter_link": inter,
                "source": device.source,
            }
        )
    render.devices_presets(rows, json_out=json_out)


@app.command()
@handle_errors
def calibrate(
    steps: Annotated[Path, typer.Argument(help="JSONL of measured steps (shared/calibration format or bench/fidelity runs).", show_default=False)],
    output: Annotated[Path, typer.Option("--output", "-o", help="Cluster file to write (YAML; read back by --cluster).", show_default=False)],
    device: Annotated[Optional[str], typer.Option("--device", help="Device preset of rows that name none (default: the first row's).", show_default=False)] = None,
    cluster: ClusterOpt = None,
    models_dir: Annotated[Path, typer.Option("--models-dir", help="Folder of <model>.onnx for rows that name a model.")] = Path("examples"),
    holdout_every: Annotated[int, typer.Option("--holdout-every", min=0, help="Hold out every N-th row (0: only --holdout and the rows' split).")] = 3,
    holdout: Annotated[Optional[list[str]], typer.Option("--holdout", help="Hold out rows by KEY=VALUE[,VALUE] (repeatable), e.g. model=llama.", show_default=False)] = None,
    fit: Annotated[Optional[str], typer.Option("--fit", help="Constants to fit, comma-separated (default: every [Empirical] one).", show_default=False)] = None,
    rounds: Annotated[int, typer.Option("--rounds", min=1, max=10, help="Re-linearisations of the fit.")] = 3,
    force: Annotated[bool, typer.Option("--force", help="Replace an existing output file.")] = False,
    json_out: JsonOpt = False,
) -> None:
    """Fit the cost model's [Empirical] constants to measured steps; write a cluster file; score it on held-out rows.

    Example: planner calibrate ../shared/calibration/h100_steps_examples.jsonl --device h100-sxm --holdout model=llama -o h100.yaml
    """
    from planner import calibrate as cal
    from planner.render import write_stdout

    if cluster is not None:
        from planner.input_files import check_cluster_nesting

        check_cluster_nesting(cluster)
    fields = [f.strip() for f in fit.split(",") if f.strip()] if fit else None
    run = cal.calibrate_file(
        steps, output, device=device, cluster_file=cluster, models_dir=models_dir, holdout_every=holdout_every,
        holdout=holdout, fit=fields, rounds=rounds, force=force,
    )  # fmt: skip
    if json_out:
        write_stdout(json.dumps({**run.report.as_dict(), "output": str(run.output),
                                 "unread_fields": list(run.unread_fields)}, indent=2) + "\n")
    else:
        write_stdout(cal.format_report(run.report, output=str(run.output)) + "\n")
    for text in run.unread_fields:
        _warn(text)


def main() -> None:
    """Console-script entry point."""
    app()
