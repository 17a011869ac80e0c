"""DeepSpeed 0.19.8's own ``PipelineModule`` runs its layers as one chain, on CPU: what
``exporters.block_chain`` assumes when DeepSpeed lists no ``pp > 1`` plan of an encoder-decoder or of
two towers (issue 25, task H4). Each layer of a real ``PipelineModule`` receives exactly what the layer
before it returned, and the first layer the module's input: nothing else reaches a layer, so a decoder
layer that needs the encoder's output two layers back gets only its neighbour's."""

from __future__ import annotations

import pytest

from exporters.block_chain import chain_break
from tests.exporters.graphs import gpt_graph

pytestmark = pytest.mark.integration

torch = pytest.importorskip("torch")
pytest.importorskip("deepspeed")

from tests.integration.test_bf16_optimizer import one_rank_group  # noqa: E402,F401  (DeepSpeed on one gloo rank)


class _Recording(torch.nn.Module):
    """Adds ``offset`` and records what it was called with."""

    def __init__(self, offset: float, seen: list):
        super().__init__()
        self.offset, self.seen = offset, seen

    def forward(self, *inputs):
        self.seen.append(inputs)
        return inputs[0] + self.offset


def test_each_layer_gets_only_the_previous_output(one_rank_group):
    from deepspeed.pipe import PipelineModule

    seen: list = []
    module = PipelineModule(layers=[_Recording(10.0 ** k, seen) for k in range(4)], num_stages=1)
    out = module(torch.zeros(2))
    # one chain: 0 -> 1 -> 11 -> 111 -> 1111, one argument per call
    assert [len(args) for args in seen] == [1, 1, 1, 1]
    assert [float(args[0][0]) for args in seen] == [0.0, 1.0, 11.0, 111.0]
    assert float(out[0]) == 1111.0


def test_a_decoder_stack_is_one_chain():
    assert chain_break(gpt_graph(layers=4)) is None
