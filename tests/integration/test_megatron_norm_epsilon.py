"""Issue 25 with megatron-core itself: the Megatron export's ``--norm-epsilon`` is the field megatron-core
0.16.1 fills from that flag (``TransformerConfig.layernorm_epsilon``'s ``argparse_meta``), and its value is
the epsilon transformers builds the model's norms with (``LlamaConfig``/``Qwen2Config.rms_norm_eps``, the
zoo's defaults): the exported model normalises as the file's does."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from tests.exporters.test_megatron import _transformer_config_kwargs
from tests.exporters.test_megatron_families import _export, _graph

pytestmark = pytest.mark.integration

ZOO = Path(__file__).resolve().parents[1] / "zoo"


@pytest.mark.parametrize(("name", "config_class"), [("llama_ts_consts", "LlamaConfig"), ("qwen2_dynamo_consts", "Qwen2Config")])
def test_megatrons_norm_epsilon_is_the_models(name, config_class):
    pytest.importorskip("megatron.core")
    transformers = pytest.importorskip("transformers")
    from exporters.validate import parse_megatron_args
    from megatron.core.transformer.transformer_config import TransformerConfig

    field = next(f.name for f in dataclasses.fields(TransformerConfig)
                 if "--norm-epsilon" in f.metadata.get("argparse_meta", {}).get("arg_names", ()))
    assert field == "layernorm_epsilon"
    args = parse_megatron_args(_export(_graph(ZOO / f"{name}.onnx"), 2, 4)["args"])
    config = TransformerConfig(**_transformer_config_kwargs(args))
    assert config.layernorm_epsilon == getattr(transformers, config_class)().rms_norm_eps == 1e-6
