"""DeepSpeed's communication on gloo (CPU), without JIT-building its shared-memory all-reduce kernel.

``deepspeed.init_distributed`` (deepspeed 0.19.8, ``comm/torch.py``: ``TorchBackend.__init__`` ->
``build_shm_op``) compiles ``csrc/cpu/comm/shm*.cpp`` with g++ into ``~/.cache/torch_extensions`` whenever the CPU
accelerator's ``deepspeed_shm_comm`` op probes as compatible, and its ninja file names the environment's absolute
path, so every fresh clone builds it again: 87.6 CPU s (75.2 user + 12.4 sys, the compiler's) and 229 s of wall
at load 8 (2026-12-01, task h25e). The op serves only ``inference_all_reduce`` (``comm/torch.py``), which neither
caller here reaches: the one-rank group of ``test_bf16_optimizer.py`` returns before it (``world_size <= 1``), and
``deepspeed.initialize`` with ``tensor_parallel.autotp_size`` sets AutoTP's training mode (``deepspeed/__init__.py``,
``set_autotp_mode(training=True)``), whose row-parallel layers all-reduce through ``dist.all_reduce`` on the gloo
group (``module_inject/layers.py``, ``RowParallel.forward``). ``build_shm_op`` returns no op when
``deepspeed.ops.__compatible_ops__`` marks it incompatible (that dict is probed once and kept: ``ops/__init__.py``).
"""

from __future__ import annotations

SHARED_MEMORY_OP = "deepspeed_shm_comm"


def init_distributed_on_gloo() -> None:
    """``deepspeed.init_distributed(dist_backend="gloo")`` from the ``RANK`` / ``WORLD_SIZE`` / ``MASTER_*``
    environment, with DeepSpeed's shared-memory all-reduce op marked unbuildable first (see the module)."""
    import deepspeed
    import deepspeed.ops

    deepspeed.ops.__compatible_ops__[SHARED_MEMORY_OP] = False
    deepspeed.init_distributed(dist_backend="gloo")
