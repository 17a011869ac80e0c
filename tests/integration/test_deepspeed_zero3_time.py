"""DeepSpeed 0.19.8's own code against the ZeRO-3 time rule (``objectives.deepspeed_zero3``), on CPU, without a process
group: the defaults it prices (and the export writes: ``exporters.deepspeed.zero3.ZERO3_GATHER``), the order of a
sub-module's fetch (its own gather waited for, then the prefetch), the prefetch's bound, the reuse distance and the
reduce-scatter's own stream."""

from __future__ import annotations

import inspect

import pytest

from exporters.deepspeed.zero3 import ZERO3_GATHER, zero3_gather_keys

pytestmark = pytest.mark.integration

pytest.importorskip("torch")
pytest.importorskip("deepspeed")


def _method_source(module, name: str) -> str:
    """A method's text in its module's source (DeepSpeed wraps some in an nvtx closure that keeps no
    ``__wrapped__``): from ``def name`` to the next method."""
    text = inspect.getsource(module)
    start = text.index(f"    def {name}(")
    return text[start:text.index("\n    def ", start + 1)]


def test_deepspeeds_config_reads_the_priced_bounds_and_overlaps_at_stage_3():
    from deepspeed.runtime.zero.config import DeepSpeedZeroConfig

    defaults = DeepSpeedZeroConfig(stage=3)
    written = DeepSpeedZeroConfig(stage=3, **zero3_gather_keys(ZERO3_GATHER))  # the export's keys, read back
    for config in (defaults, written):
        assert (config.prefetch_bucket_size, config.max_live_parameters, config.max_reuse_distance,
                config.param_persistence_threshold, config.reduce_bucket_size) == (
            ZERO3_GATHER.prefetch_bucket, ZERO3_GATHER.max_live, ZERO3_GATHER.max_reuse_distance,
            ZERO3_GATHER.persistence_threshold, ZERO3_GATHER.reduce_bucket)
        assert config.overlap_comm is True  # the reduce-scatter beside backward, as priced


def test_a_fetch_waits_for_its_own_gather_before_it_prefetches():
    from deepspeed.runtime.zero.partitioned_param_coordinator import PartitionedParameterCoordinator as Coordinator

    fetch = inspect.getsource(Coordinator._fetch_sub_module_impl)
    own, wait = fetch.index("self.__all_gather_params(params_to_fetch"), fetch.index(".wait(handle_dependency")
    bound = fetch.index("max_params_to_prefetch = min(self.__max_n_available_params - self.__n_available_params,")
    assert own < wait < bound < fetch.index("self.__all_gather_params(params_to_prefetch")
    # a parameter is added while the running count is under the bound: at least one whenever it is positive
    assert "while self.__param_queue and numel_prefetching < max_params_to_prefetch:" in fetch


def test_release_keeps_what_is_used_again_within_the_reuse_distance():
    from deepspeed.runtime.zero import partitioned_param_coordinator

    release = _method_source(partitioned_param_coordinator, "__params_to_release")
    assert "if not p.ds_persist" in release  # persistent parameters are never released (nor gathered)
    walk = release.index("for module in self.__submodule_order[step_id:]:")
    assert release.index("if params_traversed >= self.__max_reuse_dist_in_numel:", walk) < release.index(
        "params_to_release.discard(param.ds_id)", walk)


def test_gradients_reduce_scatter_on_their_own_stream():
    from deepspeed.runtime.zero import stage3

    reduce = _method_source(stage3, "__reduce_and_partition_ipg_grads")
    assert "with get_accelerator().stream(self.reduce_and_partition_stream):" in reduce
    assert "__avg_scatter" in reduce
