"""Interleaved stages whose layers their model chunks do not divide, exported to Megatron-LM as
``--pipeline-model-parallel-layout``: megatron-core 0.16.1's own ``TransformerConfig`` (its
``PipelineParallelLayerLayout`` parse and validation) builds each rank's virtual stages with the
layers the plan was priced with (``objectives.schedules.chunk_layers``)."""

from __future__ import annotations

import pytest

from exporters.megatron import export_megatron
from exporters.validate import megatron_violations, parse_megatron_args
from planner.core.chunks import chunk_layers
from planner.core.settings import TrainingSettings
from tests.exporters.graphs import gpt_graph
from tests.exporters.test_megatron import _pipeline_input, _transformer_config_kwargs

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("layers", [[8, 8, 7, 7], [3, 3], [2, 4, 3, 3]])
def test_megatron_core_builds_the_priced_chunks(layers):
    pytest.importorskip("torch")
    pytest.importorskip("megatron.core")
    from megatron.core.transformer.enums import LayerType
    from megatron.core.transformer.transformer_config import TransformerConfig

    pp, chunks = len(layers), 2
    # priced as Megatron-LM's search prices them: transfers overlapped (Target.priced_p2p_overlap), nothing written
    out = export_megatron(_pipeline_input(gpt_graph(layers=sum(layers)), 1, 1, layers, schedule="interleaved",
                                          chunks=chunks, micro_batches=2 * pp, settings=TrainingSettings(p2p_overlap=True)))
    assert megatron_violations(out["args"], world_size=out["world_size"]) == []
    config = TransformerConfig(**_transformer_config_kwargs(parse_megatron_args(out["args"])))
    layout = config.pipeline_model_parallel_layout
    assert (config.pipeline_model_parallel_size, config.virtual_pipeline_model_parallel_size) == (pp, chunks)
    built = [[layout.layout[rank][v].count(LayerType.decoder) for v in range(chunks)] for rank in range(pp)]
    assert built == [list(chunk_layers(n, chunks, first_stage=rank == 0)) for rank, n in enumerate(layers)]
    # the embedding on rank 0's first chunk, the loss on the last rank's last chunk
    assert LayerType.embedding in layout.layout[0][0] and LayerType.loss in layout.layout[-1][-1]
