"""What a training run costs on each plan: ``planner plan ... --tokens 2T --price-per-gpu-hour 2.5``.

A run of :math:`T` tokens, at :math:`s` tokens per sample (the model's sequence length), on a plan
of global batch :math:`B` samples, step time :math:`t` seconds and :math:`N` devices takes

.. math::

    \\text{steps} = \\lceil T / (B s) \\rceil, \\quad
    \\text{seconds} = \\text{steps} \\cdot t, \\quad
    \\text{GPU-hours} = \\text{seconds} \\cdot N / 3600, \\quad
    \\text{cost} = \\text{GPU-hours} \\cdot p

with :math:`p` the price of one device for one hour (dollars). ``--samples S`` counts samples
instead (:math:`\\text{steps} = \\lceil S / B \\rceil`), for models without a sequence (a CNN, an
MLP) or to count tokens yourself. Whole steps: the last, partial batch is a step too.

The sequence length :math:`s` is the query length of the model's attention, as the exporters read it
(:func:`importers.transformer.analyze_transformer`; ``--dim seq=2048`` binds it). Each row is priced at
its own step time, global batch and the cluster's device count; nothing here searches.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from decimal import Decimal
from typing import Any, Sequence

from planner.core.dims import shown
from planner.core.errors import InputError, PlannerError

__all__ = ["RunRequest", "RunCost", "RunPricing", "parse_count", "run_request", "price_run", "price_frontier",
           "tokens_per_sample"]

SUFFIXES = {"K": 10**3, "M": 10**6, "B": 10**9, "T": 10**12}
"""Decimal multipliers of ``--tokens`` / ``--samples`` (``2T`` = 2 x 10^12; case does not matter)."""

MAX_COUNT = 10**18
"""Most tokens or samples a run may have (10^18: a thousand times the largest runs published)."""

MAX_PRICE_PER_GPU_HOUR = 1e6
"""Highest ``--price-per-gpu-hour`` (dollars): anything above is a typo, not a price."""

SECONDS_PER_DAY = 86_400.0
SECONDS_PER_HOUR = 3_600.0


@dataclass(frozen=True, slots=True, kw_only=True)
class RunRequest:
    """The run to price: ``--tokens`` or ``--samples`` (exactly one), and ``--price-per-gpu-hour``."""

    tokens: int | None = None
    """Tokens to train on (``None``: :attr:`samples` is given)."""
    samples: int | None = None
    """Samples to train on (``None``: :attr:`tokens` is given)."""
    price_per_gpu_hour: float | None = None
    """Dollars for one device for one hour (``None``: no cost, only days and GPU-hours)."""

    def __post_init__(self) -> None:
        if (self.tokens is None) == (self.samples is None):
            raise InputError("give --tokens N or --samples N (one of them) to price a run")

    def describe(self, tokens_per_sample: int | None) -> str:
        """E.g. ``"2T tokens (1,953,125,000 samples of 1,024 tokens)"``."""
        if self.tokens is None:
            return f"{_count_text(self.samples)} samples"
        samples = self.tokens / tokens_per_sample if tokens_per_sample else 0
        return f"{_count_text(self.tokens)} tokens ({samples:,.0f} samples of {tokens_per_sample:,} tokens)"


@dataclass(frozen=True, slots=True, kw_only=True)
class RunCost:
    """One plan's run: its steps, wall-clock time, device time and price."""

    steps: int
    """Optimizer steps (whole: the last, partial batch counts as a step)."""
    seconds: float
    """Wall-clock time of the run: steps x step time (s)."""
    gpu_hours: float
    """Device time: seconds x devices / 3600 (device-hours)."""
    cost: float | None
    """GPU-hours x the price per GPU-hour (dollars); ``None`` without a price."""
    devices: int = 0
    """Devices billed: those the plan launches on (0: not given)."""

    @property
    def days(self) -> float:
        """Wall-clock time of the run (days of 24 h)."""
        return self.seconds / SECONDS_PER_DAY

    def to_json(self) -> dict[str, Any]:
        """``steps``, ``seconds``, ``days``, ``gpu_hours``, ``cost_usd`` (``None`` without a price), ``devices``."""
        return {"steps": self.steps, "seconds": self.seconds, "days": self.days, "gpu_hours": self.gpu_hours,
                "cost_usd": self.cost, "devices": self.devices}  # fmt: skip


@dataclass(frozen=True, slots=True, kw_only=True)
class RunPricing:
    """A run priced on every row of one launchable frontier, and on its data-parallel baseline."""

    request: RunRequest
    tokens_per_sample: int | None
    """The model's sequence length (tokens); ``None`` when the run is given in samples."""
    devices: int
    rows: tuple[RunCost, ...]
    """One per row of the frontier, in its order."""
    baseline: RunCost | None = None

    def to_json(self) -> dict[str, Any]:
        """What was priced: tokens, samples, tokens per sample, devices and the price."""
        request = self.request
        samples = request.samples if request.tokens is None else request.tokens / self.tokens_per_sample
        return {"tokens": request.tokens, "samples": samples, "tokens_per_sample": self.tokens_per_sample,
                "devices": self.devices, "price_per_gpu_hour": request.price_per_gpu_hour}  # fmt: skip


def parse_count(text: str, flag: str) -> int:
    """Read a token or sample count: digits, a decimal point, an exponent, ``_`` or ``,`` between
    digits, and one suffix K, M, B or T (:data:`SUFFIXES`).

    Examples
    --------
    >>> parse_count("2T", "--tokens"), parse_count("1.5b", "--tokens"), parse_count("300e9", "--tokens")
    (2000000000000, 1500000000, 300000000000)

    Raises
    ------
    InputError
        Not a number, not whole, not positive, or over :data:`MAX_COUNT`.
    """
    example = f"write e.g. {flag} 2T, 300B or 1.5e12 (K/M/B/T = 10^3/10^6/10^9/10^12)"
    raw = text.strip().replace("_", "").replace(",", "")
    multiplier = SUFFIXES.get(raw[-1:].upper(), 1) if raw else 1
    digits = raw[:-1] if multiplier != 1 else raw
    if not digits or len(digits) > 40 or not all(c.isdigit() or c in ".eE+-" for c in digits):
        raise InputError(f"cannot read {flag} '{shown(text)}'; {example}")
    try:
        value = Decimal(digits) * multiplier
    except ArithmeticError:  # InvalidOperation, Overflow
        raise InputError(f"cannot read {flag} '{shown(text)}'; {example}") from None
    if not value.is_finite() or value <= 0:
        raise InputError(f"{flag} must be positive (got '{shown(text)}'); {example}")
    if value > MAX_COUNT:
        raise InputError(f"{flag} {shown(text)} is over 10^18 (1,000,000T); give the run's real size, e.g. {flag} 2T")
    if value != value.to_integral_value():
        raise InputError(f"{flag} {shown(text)} is {value} (not a whole number); give a whole count, e.g. {flag} 2T")
    return int(value)


def run_request(tokens: str | None, samples: str | None, price_per_gpu_hour: float | None) -> RunRequest | None:
    """The run ``--tokens`` / ``--samples`` / ``--price-per-gpu-hour`` ask for (``None``: none).

    Raises
    ------
    InputError
        Both or (with a price) neither count; a count :func:`parse_count` refuses; a price that is
        not a positive, finite number of dollars up to :data:`MAX_PRICE_PER_GPU_HOUR`.
    """
    if tokens is None and samples is None:
        if price_per_gpu_hour is not None:
            raise InputError("--price-per-gpu-hour prices a run: add its size, --tokens N (e.g. 2T) or --samples N")
        return None
    if tokens is not None and samples is not None:
        raise InputError("give --tokens or --samples, not both (a sample is the model's sequence length of tokens)")
    if price_per_gpu_hour is not None and not 0 < price_per_gpu_hour <= MAX_PRICE_PER_GPU_HOUR:
        raise InputError(f"--price-per-gpu-hour must be dollars per device-hour, above 0 and at most "
                         f"{MAX_PRICE_PER_GPU_HOUR:,.0f} (got {price_per_gpu_hour}); e.g. --price-per-gpu-hour 2.5")  # fmt: skip
    return RunRequest(tokens=None if tokens is None else parse_count(tokens, "--tokens"),
                      samples=None if samples is None else parse_count(samples, "--samples"),
                      price_per_gpu_hour=price_per_gpu_hour)  # fmt: skip


def price_run(request: RunRequest, *, step_time_s: float, global_batch: int, devices: int,
              tokens_per_sample: int | None) -> RunCost:
    """One plan's run (formulas in the module docstring).

    Parameters
    ----------
    step_time_s:
        The plan's time per optimizer step (s).
    global_batch:
        Samples per step.
    devices:
        Devices the plan runs on (each billed for the whole run).
    tokens_per_sample:
        Tokens in one sample (needed with :attr:`RunRequest.tokens`).
    """
    if request.tokens is not None:
        if not tokens_per_sample:
            raise InputError("--tokens needs the tokens per sample; pass --samples N instead")
        per_step = global_batch * tokens_per_sample
        steps = -(-request.tokens // per_step)
    else:
        steps = -(-request.samples // global_batch)  # type: ignore[operator]
    seconds = steps * step_time_s
    gpu_hours = seconds * devices / SECONDS_PER_HOUR
    cost = None if request.price_per_gpu_hour is None else gpu_hours * request.price_per_gpu_hour
    return RunCost(steps=steps, seconds=seconds, gpu_hours=gpu_hours, cost=cost, devices=devices)


def tokens_per_sample(graph: Any, model: str) -> int:
    """The model's sequence length (tokens per sample): its attention's query length.

    Raises
    ------
    InputError
        The model has no attention (no sequence to count tokens by): the message says to pass
        ``--samples`` instead.
    """
    from importers.transformer import analyze_transformer

    try:
        length = int(analyze_transformer(graph).seq_length)
    except PlannerError:
        length = 0
    if length < 1:
        raise InputError(f"--tokens counts samples of the model's sequence length, and {model} has no attention to "
                         "read it from; pass --samples N (the samples to train on) instead")  # fmt: skip
    return length


def price_frontier(request: RunRequest, frontier: Any, *, model: str) -> RunPricing:
    """``request`` priced on every row of a :class:`planner.launchable.LaunchFrontier` (and its
    data-parallel baseline), each at its step time and global batch, billed for the devices it
    launches on: a launcher's row its degrees' (a plan on fewer devices than the cluster's, beside
    or instead of the N-device search, uses only those), a per-op plan the cluster's."""
    rows: Sequence[Any] = frontier.rows
    length = None
    if request.tokens is not None and rows:
        first = rows[0]
        length = tokens_per_sample(first.cache.graph(first.point.micro_batch), model)
    devices = int(frontier.cluster.devices)

    def cost(row: Any) -> RunCost:
        launched = int(row.degrees.devices) if any(t != "generic" for t in row.targets) else devices
        return price_run(request, step_time_s=row.time_s, global_batch=int(row.point.global_batch), devices=launched,
                         tokens_per_sample=length)  # fmt: skip

    baseline = None if frontier.baseline is None or not rows else cost(frontier.baseline)
    return RunPricing(request=request, tokens_per_sample=length, devices=devices, rows=tuple(cost(r) for r in rows),
                      baseline=baseline)  # fmt: skip


def _count_text(count: int | None) -> str:
    """``2T``, ``300B``, ``1.5M`` when a suffix writes it exactly in at most four digits; else ``1,234,567``."""
    if count is None:
        return ""
    for suffix, multiplier in reversed(SUFFIXES.items()):
        value = Decimal(count) / multiplier
        if value >= 1 and len(value.normalize().as_tuple().digits) <= 4:
            return f"{value.normalize():,f}{suffix}"
    return f"{count:,}"
