"""Which layers rotate and Llama 3.1's scaled RoPE reach the Megatron-LM and torchtitan exports exactly, or they
refuse (sweep H5 findings 3 and 4: SmolLM3's NoPE layers were exported with RoPE on every layer).

Fixtures: ``tests/data/rotary_cases`` (``tests/importers/make_rotary_cases.py``, transformers configs there). Oracles:
the configs (transformers' ``SmolLM3Config``: ``no_rope_layers[i] = int((i + 1) % interval != 0)``, 1 rotating;
Llama 3.1's rope parameters) and Meta's ``apply_scaling`` written out below, megatron-core 0.16.1's expansion of
``no_rope_freq`` N to ``([0] * (N - 1) + [1]) * (L / N)`` (``transformer_config.py:1972-1973``).
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from exporters import export
from exporters.megatron.families import megatron_family, megatron_rotary_args
from exporters.torchtitan import families as titan
from exporters.torchtitan.config_module import torchtitan_config_module
from exporters.validate import megatron_violations, parse_megatron_args
from importers.onnx_facts import file_facts
from importers.rotary import _candidates, _llama3_fit, rotary_frequencies, rotated_layers
from importers.transformer import analyze_transformer
from planner.core.errors import UnsupportedExport
from planner.plan import load_graph
from tests.exporters.graphs import make_cluster, make_input, spaces_for

DATA = Path(__file__).resolve().parents[1] / "data" / "rotary_cases"
DIMS = {"batch": 2, "seq": 64}
LAYERS = 4


def _smollm3_rotates(interval: int) -> list[int]:
    """transformers' SmolLM3Config default: layer i rotates unless (i + 1) is a multiple of the interval."""
    return [int((i + 1) % interval != 0) for i in range(LAYERS)]


def _apply_scaling(base: float, pairs: int, factor: float, low: float, high: float, original: int) -> list[float]:
    """Meta's Llama 3.1 ``apply_scaling`` of b^(-2i/d), one frequency at a time."""
    out = []
    for i in range(pairs):
        theta = base ** (-i / pairs)
        wavelength = 2 * math.pi / theta
        if wavelength < original / high:
            out.append(theta)
        elif wavelength > original / low:
            out.append(theta / factor)
        else:
            smooth = (original / wavelength - low) / (high - low)
            out.append((1 - smooth) * theta / factor + smooth * theta)
    return out


def _file_frequencies(path: Path) -> np.ndarray:
    (values,) = [v for name, v in _candidates(file_facts(path)) if "inv_freq" in name or "rotary" in name] or [
        v for _, v in _candidates(file_facts(path))]
    return values


@pytest.mark.parametrize(("name", "rotates"), [
    ("smollm3_ts_consts", _smollm3_rotates(2)), ("smollm3_dynamo_consts", _smollm3_rotates(2)),
    ("smollm3_list_ts_consts", [1, 0, 1, 1]), ("llama31_ts_consts", [1] * LAYERS),
])
def test_the_layers_that_rotate_are_read(name, rotates):
    graph = load_graph(DATA / f"{name}.onnx", DIMS)
    read = rotated_layers(graph, analyze_transformer(graph).attention)
    assert read == tuple("both" if r else "none" for r in rotates)


@pytest.mark.parametrize(("name", "flag"), [
    ("smollm3_ts_consts", "2"), ("smollm3_dynamo_consts", "2"), ("smollm3_list_ts_consts", "[0,1,0,0]"),
])
def test_megatron_skips_rope_on_the_same_layers(name, flag):
    graph = load_graph(DATA / f"{name}.onnx", DIMS)
    model = analyze_transformer(graph)
    args, note = megatron_rotary_args(graph, model)
    assert args == ["--rotary-base", "2000000", "--no-rope-freq", flag]  # SmolLM3Config's rope_theta 2e6
    parsed = parse_megatron_args(["--num-layers", str(LAYERS), "--hidden-size", "128", "--num-attention-heads", "2",
                                  "--seq-length", "64", "--max-position-embeddings", "64", "--micro-batch-size", "1",
                                  "--position-embedding-type", "rope", *args])
    assert not megatron_violations(parsed, world_size=1, env={})
    freq = parsed["no-rope-freq"]
    skips = freq if isinstance(freq, list) else ([0] * (freq - 1) + [1]) * (LAYERS // freq)  # TransformerConfig's
    rotates = [1, 0, 1, 1] if "list" in name else _smollm3_rotates(2)
    assert skips == [1 - r for r in rotates] and "no RoPE" in note
    out = export("megatron", make_input(graph, spaces_for(graph, 2), [0] * len(graph.ops), cluster=make_cluster(1, 2)))
    assert out["args"][out["args"].index("--no-rope-freq") + 1] == flag


def test_no_rope_freq_must_fit_the_layers():
    """TransformerConfig asserts num_layers % no_rope_freq == 0 and a list of one entry per layer."""
    base = ["--num-layers", "4", "--hidden-size", "128", "--num-attention-heads", "2", "--seq-length", "64",
            "--max-position-embeddings", "64", "--micro-batch-size", "1"]
    assert any("must divide the 4 layers" in v for v in megatron_violations(base + ["--no-rope-freq", "3"], world_size=1, env={}))
    assert any("one 0 (RoPE) or 1 (no RoPE) per layer" in v
               for v in megatron_violations(base + ["--no-rope-freq", "[0,1,0]"], world_size=1, env={}))


@pytest.mark.parametrize("name", ["smollm3_ts_consts", "smollm3_list_ts_consts"])
def test_torchtitan_refuses_nope_layers_in_one_line(name):
    graph = load_graph(DATA / f"{name}.onnx", DIMS)
    with pytest.raises(UnsupportedExport) as caught:
        titan.torchtitan_arch(graph)
    reason = caught.value.reason
    layers = "layer 1 " if "list" in name else "layers 1, 3 "
    assert "\n" not in reason and f"in {layers}(counting from 0) its attention does not rotate" in reason


@pytest.mark.parametrize("name", ["llama31_ts_consts", "llama31_dynamo_consts"])
def test_llama31_scaling_is_read_and_exported(name):
    path = DATA / f"{name}.onnx"
    expected = _apply_scaling(500000.0, 32, 8.0, 1.0, 4.0, 8192)
    np.testing.assert_allclose(_file_frequencies(path), expected, rtol=1e-6)  # the fixture is Llama 3.1's
    found = rotary_frequencies(path)
    assert found is not None and not found.geometric and found.llama3 is not None
    s = found.llama3
    assert (s.base, s.factor, s.low_freq_factor, s.high_freq_factor, s.original_max_position_embeddings) == (
        500000.0, 8.0, 1.0, 4.0, 8192)
    graph = load_graph(path, DIMS)
    model = analyze_transformer(graph)
    assert megatron_family(graph, model).family == "gpt"
    args, note = megatron_rotary_args(graph, model)
    assert args == ["--rotary-base", "500000", "--use-rope-scaling", "--rope-scaling-factor", "8"]
    arch = titan.torchtitan_arch(graph)
    assert (arch.family.name, arch.theta, arch.scaling) == ("llama3", 500000.0, s)
    text = torchtitan_config_module(arch)
    assert ('scaling="llama", scaling_factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0' in text
            and "original_max_position_embeddings=8192" in text)


def test_a_scaling_megatron_cannot_say_is_refused_and_torchtitan_writes_it():
    """original_max_position_embeddings 4096: wavelength bounds 4096 / 1 and 4096 / 4 tokens, which
    --use-rope-scaling (fixed 8192 / 1 and 8192 / 4) does not give; torchtitan's RoPE.Config sets all four."""
    path = DATA / "llama31_short_ts_consts.onnx"
    np.testing.assert_allclose(_file_frequencies(path), _apply_scaling(500000.0, 32, 8.0, 1.0, 4.0, 4096), rtol=1e-6)
    graph = load_graph(path, DIMS)
    with pytest.raises(UnsupportedExport, match="wavelength bounds 4096 and 1024 tokens"):
        megatron_family(graph, analyze_transformer(graph))
    s = titan.torchtitan_arch(graph).scaling
    assert s is not None and s.factor == 8.0
    # only the bounds show in the frequencies: original / low and original / high are the config's
    assert (s.original_max_position_embeddings / s.low_freq_factor, s.original_max_position_embeddings / s.high_freq_factor) == (
        4096.0, 1024.0)


@pytest.mark.parametrize(("pairs", "config"), [
    (32, (8.0, 1.0, 4.0, 8192)),     # 3 interpolated frequencies
    (64, (32.0, 1.0, 4.0, 8192)),    # Llama 3.2's factor
    (32, (16.0, 2.0, 8.0, 16384)),   # the same bounds as Llama 3.1's: read as 1, 4, 8192
    (8, (8.0, 1.0, 4.0, 8192)),      # one interpolated frequency
    (64, (8.0, 1.0, 2.0, 3000)),     # bounds off the defaults
])
def test_the_fit_reproduces_the_frequencies(pairs, config):
    values = np.array(_apply_scaling(500000.0, pairs, *config), dtype=np.float32).astype(np.float64)
    fit = _llama3_fit(values)
    assert fit is not None and fit.base == 500000.0 and fit.factor == config[0]
    again = _apply_scaling(fit.base, pairs, fit.factor, fit.low_freq_factor, fit.high_freq_factor,
                           fit.original_max_position_embeddings)
    np.testing.assert_allclose(again, values, rtol=2e-5)


def test_frequencies_no_llama_scaling_gives_are_refused():
    """A YaRN-like ramp over the index (not over the wavelength's inverse) is no Llama 3.1 scaling."""
    theta = 10000.0 ** (-np.arange(32) / 32)
    ramp = np.clip((np.arange(32) - 8) / 16, 0, 1)
    values = (theta / 8 * ramp + theta * (1 - ramp)).astype(np.float32).astype(np.float64)
    assert _llama3_fit(values) is None
