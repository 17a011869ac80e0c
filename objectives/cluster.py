r"""Hardware presets and cluster construction: devices, links, ``make_cluster``, ``load_cluster``.

Every preset is spec-sheet data with a ``source``. Conventions:

* Peak FLOP/s are *dense* figures (no 2:4 structured sparsity). Where a datasheet prints only the
  sparse number (marked ``*`` in NVIDIA's Hopper datasheets) it is halved, and the ``source`` says so.
* A dtype a device cannot run (bf16 on V100/Turing/Pascal, tf32 before Ampere) is left out;
  :func:`objectives.compute.peak_flops_per_s` falls back to the fastest available dtype.
* Memory (``memory_bytes``) is what a training process's tensors may use: the memory the device
  exposes to CUDA (:data:`EXPOSED_MEMORY_BYTES`: ``cudaMemGetInfo``'s total, which deviceQuery prints as
  "Total amount of global memory" and PyTorch as ``total_memory``; ``nvidia-smi``'s total less the
  driver's reservation, its ``-q`` "Reserved" line) less :data:`CUDA_CONTEXT_BYTES`, the CUDA context every
  process holds outside PyTorch's allocator. Datasheets print decimal "GB" of a capacity that is about
  as many GiB (an "80 GB" H100 SXM exposes 81,079-81,106 MiB, 85.0e9 B); until 2026-12-02 the presets
  took ``GB * 10**9`` (80e9 B on an H100, 5% under what the planner now takes). Not in the reserve,
  each counted once elsewhere: the caching allocator's fragmentation (``objectives.memory.OTHER_FRACTION``:
  a plan *fits* with it, is *tight* without it) and NCCL's buffers, which depend on the layout
  (``objectives.nccl_memory``, 0.3 GB per communicator at most: a term of every plan's memory,
  ``MemoryBreakdown.nccl_bytes``; a cluster file's ``nccl_buffsize`` follows ``NCCL_BUFFSIZE``). A cluster file's ``memory`` / ``memory_bytes`` is taken as given, as before: the
  bytes the planner compares a plan's memory with (``--mem-limit`` overrides either).
* Rates are SI: ``3.35 TB/s`` is ``3.35e12`` bytes/s (not TiB/s).
* Link bandwidth is *per device, per direction* (what one device can send while it also receives),
  which is what the ring collectives in :mod:`objectives.collectives` consume. Inter-node links are
  one NIC per device (the DGX/HGX layout: eight NICs for eight GPUs).
* Link latencies (``latency_s``) are per-message alpha terms of the alpha-beta model. They are not on
  spec sheets: the values are [Empirical], order-of-magnitude figures for NCCL/RCCL ring steps
  (a few microseconds over NVLink/PCIe/InfiniBand, tens over TCP Ethernet). Checked (h31f,
  2026-12-02) against NCCL's own per-step ring latencies, ``hwLat`` in NVIDIA/nccl
  ``src/graph/tuning.cc`` (commit 01afd20a; LL / LL128 / Simple, microseconds): NVLink 0.47 / 1.9 /
  3.4, PCI 1.0 / 2.5 / 5.7, NET 2.7 / 4.0 / 9.6. NVLink's 2 us lies between LL128 and Simple,
  PCIe's 5 us near Simple; InfiniBand's 5 us lies between LL128 and Simple; for the Ethernet
  presets (10 / 20 us) no source was found (NCCL's table has one NET row for every network).
  Ethernet (h32b, 2026-12-02): whole 2-rank all-reduces of 8-16 KB take 30.3-35.2 us over one
  200 Gb/s RoCE link between two DGX Spark (GB10) nodes (NVIDIA/dgx-spark-playbooks#103, nccl-tests
  2.20.0), against 19.0-20.7 us for 8-64 B over HDR InfiniBand, one A100 per node (NVIDIA/nccl-tests#150):
  RoCE 1.5-1.8x InfiniBand, the presets' eth-100g / ib 2x. Read as the alpha-beta model's two ring
  steps, 15-17.5 us per RoCE step (NCCL's fixed base latency and the launch included). No TCP (25 GbE)
  figure found; no fidelity or calibration row runs over Ethernet, so neither value moves a scored row.

Cluster file format (YAML or JSON), read by :func:`load_cluster`::

    device: h100-sxm            # a preset name (see DEVICE_PRESETS) ...
    # device:                   # ... or a full device:
    #   name: my-gpu
    #   peak_flops: {bf16: 9.9e14, fp32: 6.7e13}     # FLOP/s, dense
    #   memory: 78GiB                                 # or memory_bytes: 83751862272: what tensors may
    #                                                 #   use, taken as given (presets: exposed - context)
    #   memory_bandwidth_bytes_per_s: 3.35e12
    kernel_latency_s: 4.0e-6    # optional: fixed seconds per kernel (default 0; ~4 us on an H100)
    host_dispatch_s: 3.0e-5     # optional, under --engine: kernel_overhead_s, host_dispatch_s,
                                #   collective_overhead_s (Device's defaults; planner calibrate fits them)
    nodes: 2                    # or devices: 16 (total); one of the two is required
    devices_per_node: 8         # optional, default min(devices, 8; 72 for gb200)
    intra_link: nvlink4         # optional: a LINK_PRESETS name or
    inter_link:                 #   {name, bandwidth_bytes_per_s, latency_s}
      name: my-ib
      bandwidth_bytes_per_s: 5.0e10
      latency_s: 5.0e-6
    nccl_buffsize: 4MiB         # optional: NCCL_BUFFSIZE of the job (default NCCL's 4 MiB), which sizes
                                #   NCCL's buffers in each plan's memory (objectives.nccl_memory)

Omitted links default to the device's usual ones (:data:`DEFAULT_LINKS`).
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import math
import stat
from pathlib import Path
from typing import Any, Mapping

import yaml

from planner.core.cluster import Cluster, Device, Link
from planner.core.errors import InputError
from planner.core.units import parse_size

__all__ = [
    "DEVICE_PRESETS",
    "LINK_PRESETS",
    "DEFAULT_LINKS",
    "DEFAULT_DEVICES_PER_NODE",
    "DEFAULT_NODE_SIZES",
    "CUDA_CONTEXT_BYTES",
    "DRIVER_RESERVE_FRACTION",
    "EXPOSED_MEMORY_BYTES",
    "usable_memory_bytes",
    "default_devices_per_node",
    "get_device",
    "get_link",
    "make_cluster",
    "load_cluster",
]

_T = 1e12  # TFLOP/s -> FLOP/s, TB/s -> B/s
_G = 1e9  # GB -> B, GB/s -> B/s

DEFAULT_DEVICES_PER_NODE = 8
"""Devices per node when not given (an HGX/DGX board)."""

_HOPPER_SPARSE = "TF32/BF16/FP16 printed only with 2:4 sparsity (*), halved here"

_MIB = 2**20

CUDA_CONTEXT_BYTES = 666_632_192
"""Bytes the planner keeps free on every device for the CUDA context: device memory a process holds
outside PyTorch's caching allocator (driver state, loaded kernel modules), in neither
``max_memory_allocated`` nor ``max_memory_reserved``. PyTorch's measurement in pytorch/pytorch#86509 (1.13,
"Sets CUDA_MODULE_LOADING to LAZY"): ``cudaMemGetInfo`` total - free after one small tensor is 287,047,680 B
with lazy module loading (PyTorch's default since) and 666,632,192 B with every module loaded at once; a
training step loads kernels as it runs them (cuBLAS, cuDNN, NCCL, fused kernels), so the planner keeps the
larger figure (it includes the tensor's 20 MiB segment). NVIDIA's reply in pytorch/pytorch#109888: "around
400MB if CUDA >= 11.7 is used and lazy module loading enabled"."""

DRIVER_RESERVE_FRACTION = 0.01
"""Share of ``nvidia-smi``'s total the driver keeps from CUDA, for a device whose CUDA-visible total is not
published (:data:`EXPOSED_MEMORY_BYTES` says which): ``nvidia-smi -q`` prints it as "Reserved" (total -
deviceQuery's total), measured 454 of 81,559 MiB on an H100 SXM (0.56%, thamada/nvidia-smi
``nvsim/H100SXMx8_smi.py``, driver 565.57.01), 700 of 143,771 MiB on an H200 (0.49%), and 762 of 81,920 MiB
on an A100 SXM4 80GB (0.93%: deviceQuery's 81,158 MiB, thamada/nvidia-smi ``gls/A100SXMx4_deviceQuery.py``);
1% is above every one measured."""


def _smi(total_mib: int) -> int:
    """CUDA-visible bytes of a device ``nvidia-smi`` reports ``total_mib`` MiB for, its driver's
    reservation (:data:`DRIVER_RESERVE_FRACTION`) taken out.

    >>> _smi(100)  # 100 MiB less 1%
    103809024
    """
    return total_mib * _MIB * round((1 - DRIVER_RESERVE_FRACTION) * 100) // 100


EXPOSED_MEMORY_BYTES: dict[str, int] = {
    # CUDA samples deviceQuery, Tesla V100-SXM2-32GB, CUDA 10.0: "32480 MBytes (34058272768 bytes)", the
    # smallest of the printouts found (32,480-32,511 MiB with CUDA 10.0-12.9)
    "v100-32gb": 34_058_272_768,
    # PaddlePaddle ``paddle.device.cuda.get_device_properties`` docstring: A100-SXM4-40GB total_memory=40536MB
    # (MiB; nvidia-smi prints 40,960 MiB: thundergolfer.com/blog/nvidia-gpu-memory-capacity, Modal)
    "a100-40gb": 40_536 * _MIB,
    # thamada/nvidia-smi gls/A100SXMx4_deviceQuery.py (driver 12.5 / runtime 12.4): NVIDIA A100-SXM4-80GB
    # "81158 MBytes (85100068864 bytes)"; nvidia-smi prints 81,920 MiB (Modal, as above)
    "a100-80gb": 85_100_068_864,
    # CUDA samples deviceQuery, NVIDIA H100 80GB HBM3 (driver 13.0 / runtime 12.5): "81079 MBytes
    # (85017755648 bytes)", the smallest found; thamada/nvidia-smi nvsim/H100SXMx8_deviceQuery.py (12.7 / 12.4):
    # 81,106 MiB, and its nvidia-smi -q (nvsim/H100SXMx8_smi.py): Total 81,559, Reserved 454, Free 81,106 MiB
    "h100-sxm": 85_017_755_648,
    # no CUDA figure for Grand Teton's 96 GB HBM2e H100 found: GH100 with six 16 GiB stacks, whose nvidia-smi
    # total is 97,871 MiB on GH200 96GB and H20 (published nvidia-smi tables), less 1%
    "h100-sxm-96gb-500w": _smi(97_871),
    # PyTorch ``torch.cuda.get_device_properties``: NVIDIA H100 PCIe total_memory=81008MB (MiB)
    "h100-pcie": 81_008 * _MIB,
    # nvidia-smi -q, NVIDIA H200: FB Memory Total 143,771 MiB, Reserved 700 MiB (Modal's table: 143,771 MiB)
    "h200": (143_771 - 700) * _MIB,
    # nvidia-smi, NVIDIA B200: 183,359 MiB (modal-labs/gpu-glossary gpu-glossary/host-software/nvidia-smi.md)
    "b200": _smi(183_359),
    # nvidia-smi, NVIDIA GB200 (driver 580.95.05): 189,471 MiB (published nvidia-smi tables of GB200 trays)
    "gb200": _smi(189_471),
    # thamada/nvidia-smi nvsim/L40S_deviceQuery.py (12.4): NVIDIA L40S "45589 MBytes (47803596800 bytes)"
    "l40s": 47_803_596_800,
    # thamada/nvidia-smi gls/RTX4090_deviceQuery.py (12.4): "24210 MBytes (25386352640 bytes)"
    "rtx-4090": 25_386_352_640,
    # CUDA samples deviceQuery, GeForce GTX 1080 Ti, CUDA 8.0: "11164 MBytes (11706630144 bytes)", the
    # smallest found (11,164-11,264 MiB)
    "gtx-1080ti": 11_706_630_144,
    # CUDA samples deviceQuery, GeForce RTX 2080 Ti, CUDA 10.0 / 10.1: "10986 MBytes (11519983616 bytes)",
    # the smallest found (10,986-10,989 MiB)
    "rtx-2080ti": 11_519_983_616,
    # thamada/nvidia-smi nvsim/MI300X_x4_deviceQuery.py (hipGetDeviceProperties): AMD Instinct MI300X
    # "196592: Total Global Memory (MB)" (MiB); the ROCm context and RCCL (NCCL's port) taken as CUDA's
    "mi300x": 196_592 * _MIB,
}
"""Bytes each preset's device exposes to CUDA (``cudaMemGetInfo``'s total, the most a process can
allocate), with the source of each figure beside it."""


def usable_memory_bytes(exposed_bytes: int) -> int:
    """Bytes a training process's tensors may use on a device exposing ``exposed_bytes`` to CUDA: less
    the CUDA context (:data:`CUDA_CONTEXT_BYTES`). The presets' ``memory_bytes``.

    >>> usable_memory_bytes(EXPOSED_MEMORY_BYTES["h100-sxm"])  # 78.56 GiB of an "80 GB" H100 SXM
    84351123456
    """
    return exposed_bytes - CUDA_CONTEXT_BYTES


DEVICE_PRESETS: dict[str, Device] = {
    "v100-32gb": Device(
        name="v100-32gb",
        compute_capability=7.0,
        peak_flops={"fp32": 15.7 * _T, "fp16": 125.0 * _T},
        memory_bytes=usable_memory_bytes(EXPOSED_MEMORY_BYTES["v100-32gb"]),
        memory_bandwidth_bytes_per_s=900 * _G,
        source=(
            "NVIDIA V100 Tensor Core GPU datasheet (SXM2), "
            "https://images.nvidia.com/content/technologies/volta/pdf/"
            "volta-v100-datasheet-update-us-1165301-r5.pdf; fp16 = Tensor Core; no bf16/tf32"
        ),
    ),
    "a100-40gb": Device(
        name="a100-40gb",
        compute_capability=8.0,
        peak_flops={"fp32": 19.5 * _T, "tf32": 156.0 * _T, "bf16": 312.0 * _T, "fp16": 312.0 * _T},
        memory_bytes=usable_memory_bytes(EXPOSED_MEMORY_BYTES["a100-40gb"]),
        memory_bandwidth_bytes_per_s=1555 * _G,
        source=(
            "NVIDIA A100 Tensor Core GPU datasheet (A100 40GB SXM), "
            "https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/a100/pdf/"
            "nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf; dense figures"
        ),
    ),
    "a100-80gb": Device(
        name="a100-80gb",
        compute_capability=8.0,
        peak_flops={"fp32": 19.5 * _T, "tf32": 156.0 * _T, "bf16": 312.0 * _T, "fp16": 312.0 * _T},
        memory_bytes=usable_memory_bytes(EXPOSED_MEMORY_BYTES["a100-80gb"]),
        memory_bandwidth_bytes_per_s=2039 * _G,
        # [Empirical] host work of a Megatron-DeepSpeed A100 node (objectives.fixed_costs), fitted on the
        # 12- and 20-layer rows of ../shared/calibration/a100_single_node_h1024.csv (360 rows; the 16-
        # and 24-layer rows held out: docs/VALIDATION.md): grid search of the mean squared relative
        # step-time error, layer_host_s 0.70-1.00 ms, microbatch_host_s 0-2 ms, p2p_overhead_s 0-300 us.
        # Not refitted after c7f06df (the optimizer step sharded from ZeRO-1 on): the rows run ZeRO 0, so
        # every fit and held-out row prices to the same seconds before and after (docs/VALIDATION.md)
        layer_host_s=0.9e-3,
        microbatch_host_s=1.0e-3,
        p2p_overhead_s=0.0,
        source=(
            "NVIDIA A100 Tensor Core GPU datasheet (A100 80GB SXM), "
            "https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/a100/pdf/"
            "nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf; dense figures"
        ),
    ),
    "h100-sxm": Device(
        name="h100-sxm",
        compute_capability=9.0,
        peak_flops={"fp32": 67.0 * _T, "tf32": 494.5 * _T, "bf16": 989.5 * _T, "fp16": 989.5 * _T,
                    "fp8": 1979.0 * _T},
        memory_bytes=usable_memory_bytes(EXPOSED_MEMORY_BYTES["h100-sxm"]),
        memory_bandwidth_bytes_per_s=3.35 * _T,
        # [Empirical] fitted with `planner calibrate` (bench/fidelity.py --runs
        # bench/fidelity/runs_h100_cluster.jsonl --calibrate-to FILE --device h100-sxm --fit-fields
        # device.matmul_efficiency) on the llm-foundry MPT-1B and MPT-13B H100 BF16 rows (n=19: every
        # sequence and GPU count of the two models); held out: MPT-760M, 3B, 7B, 30B, 70B (n=33).
        # Re-fitted 2026-12-02 (h27f, Gauss-Newton from 0.616, 8 pricings) under FSDP's two gathers per
        # micro-batch with recompute (386edcb: the fit rows run FSDP1 FULL_SHARD, 5 of the 19 with
        # activation checkpointing; 0.616 was fitted under three): 0.5953, fit rows' median |error| 5.1% -> 3.7%
        # (bias -3.5% -> -1.5%), held-out 5.2% -> 4.0% (bias -2.8% -> -1.1%): docs/VALIDATION.md, "The
        # h100-sxm GEMM rate re-fitted under two gathers". Before: 0.616 (Gauss-Newton from 0.70, causal
        # attention priced full; held out 9.7% -> 6.4%); the fits with causal flash priced at its tiles
        # (0.522) and after the sharded optimizer step (0.496, at 31ac98a) were not adopted, far under
        # torchao's measured H100 bf16 GEMM share (0.69), before flash attention was priced at its
        # measured rates (718ad36): docs/VALIDATION.md, "Causal attention FLOPs" and "The fits re-run
        # after the sharded optimizer step"
        matmul_efficiency=0.5953,
        source=(
            "NVIDIA H100 Tensor Core GPU datasheet (H100 SXM: 80 GB HBM3, 3.35 TB/s, up to 700 W, NVLink "
            "900 GB/s), https://resources.nvidia.com/en-us-tensor-core/nvidia-tensor-core-gpu-datasheet; "
            + _HOPPER_SPARSE + "; FP8 3,958 TFLOPS* halved"
        ),
    ),
    "h100-sxm-96gb-500w": Device(
        name="h100-sxm-96gb-500w",
        compute_capability=9.0,
        peak_flops={"fp32": 67.0 * _T, "tf32": 494.5 * _T, "bf16": 989.5 * _T, "fp16": 989.5 * _T,
                    "fp8": 1979.0 * _T},
        memory_bytes=usable_memory_bytes(EXPOSED_MEMORY_BYTES["h100-sxm-96gb-500w"]),
        memory_bandwidth_bytes_per_s=2.4 * _T,
        source=(
            "torchtitan docs/performance.md (the TorchTitan paper's hosts, arXiv:2410.06511): Grand Teton, "
            "8 H100 per host with 96 GB HBM2e at 2.4 TB/s and a 500 W power limit, NVLink, 400 Gb/s RDMA "
            "per GPU, https://github.com/pytorch/torchtitan/blob/main/docs/performance.md; peak FLOP/s: "
            "the H100 SXM datasheet's (no datasheet prints a 500 W figure); matmul_efficiency: the default "
            "0.70, as a fit on torchtitan Table 1 (n=2, 8 GPUs; held out: Table 3, n=2) gave 0.69 and moved "
            "no held-out row by 1%; re-fitted at 31ac98a (causal flash tiles, the optimizer step sharded) "
            "it gives 0.520, under torchao's measured 0.69, with the two rows' residuals +5.6 / -4.9% "
            "(eager / compiled: one GEMM rate cannot part them), so not adopted (docs/VALIDATION.md)"
        ),
    ),
    "h100-pcie": Device(
        name="h100-pcie",
        compute_capability=9.0,
        peak_flops={"fp32": 51.0 * _T, "tf32": 378.0 * _T, "bf16": 756.5 * _T, "fp16": 756.5 * _T},
        memory_bytes=usable_memory_bytes(EXPOSED_MEMORY_BYTES["h100-pcie"]),
        memory_bandwidth_bytes_per_s=2.0 * _T,
        source=(
            "NVIDIA H100 Tensor Core GPU datasheet (H100 PCIe), "
            "https://resources.nvidia.com/en-us-tensor-core/nvidia-tensor-core-gpu-datasheet; "
            + _HOPPER_SPARSE
        ),
    ),
    "h200": Device(
        name="h200",
        compute_capability=9.0,
        peak_flops={"fp32": 67.0 * _T, "tf32": 494.5 * _T, "bf16": 989.5 * _T, "fp16": 989.5 * _T,
                    "fp8": 1979.0 * _T},
        memory_bytes=usable_memory_bytes(EXPOSED_MEMORY_BYTES["h200"]),
        memory_bandwidth_bytes_per_s=4.8 * _T,
        source=(
            "NVIDIA H200 Tensor Core GPU product page / datasheet (H200 SXM: 141 GB HBM3e, 4.8 TB/s, up to "
            "700 W, NVLink 900 GB/s; the H100 SXM's Tensor Core figures), "
            "https://www.nvidia.com/en-us/data-center/h200/; " + _HOPPER_SPARSE + "; FP8 3,958 TFLOPS* halved"
        ),
    ),
    "b200": Device(
        name="b200",
        compute_capability=10.0,
        peak_flops={"fp32": 75.0 * _T, "tf32": 1100.0 * _T, "bf16": 2250.0 * _T, "fp16": 2250.0 * _T,
                    "fp8": 4500.0 * _T},
        memory_bytes=usable_memory_bytes(EXPOSED_MEMORY_BYTES["b200"]),
        memory_bandwidth_bytes_per_s=7.7 * _T,
        source=(
            "NVIDIA HGX B200 technical specifications, individual Blackwell GPU (HGX platform page, "
            "https://www.nvidia.com/en-us/data-center/hgx/): FP16/BF16 4.5 PFLOPS, TF32 2.2 PFLOPS, FP8 "
            "9 PFLOPS, all with sparsity, halved here; FP32 75 TFLOPS; 180 GB HBM3E at 7.7 TB/s; up to "
            "1,000 W; NVIDIA DGX B200 user guide, hardware overview (8 B200, 1,440 GB in all, two NVLink 5 "
            "switches of 14.4 TB/s aggregate, 8 ConnectX-7 single-port cards), "
            "https://docs.nvidia.com/dgx/dgxb200-user-guide/introduction-to-dgxb200.html"
        ),
    ),
    "gb200": Device(
        name="gb200",
        compute_capability=10.0,
        peak_flops={"fp32": 80.0 * _T, "tf32": 1250.0 * _T, "bf16": 2500.0 * _T, "fp16": 2500.0 * _T,
                    "fp8": 5000.0 * _T},
        memory_bytes=usable_memory_bytes(EXPOSED_MEMORY_BYTES["gb200"]),
        memory_bandwidth_bytes_per_s=8.0 * _T,
        source=(
            "NVIDIA GB200 NVL72 technical specifications, individual Blackwell GPU (GB200 NVL72 page, "
            "https://www.nvidia.com/en-us/data-center/gb200-nvl72/): FP16/BF16 5 PFLOPS, TF32 2.5 PFLOPS, "
            "FP8 10 PFLOPS, all with sparsity, halved here; FP32 80 TFLOPS; 186 GB HBM3E at 8 TB/s; "
            "configurable up to 1,200 W; 72 GPUs in one NVLink 5 domain (130 TB/s in all, 1.8 TB/s per GPU)"
        ),
    ),
    "l40s": Device(
        name="l40s",
        compute_capability=8.9,
        peak_flops={"fp32": 91.6 * _T, "tf32": 183.0 * _T, "bf16": 362.05 * _T, "fp16": 362.05 * _T},
        memory_bytes=usable_memory_bytes(EXPOSED_MEMORY_BYTES["l40s"]),
        memory_bandwidth_bytes_per_s=864 * _G,
        source=(
            "NVIDIA L40S datasheet, https://resources.nvidia.com/en-us-l40s/l40s-datasheet-28413; "
            "dense figures (the sparse ones are marked *)"
        ),
    ),
    "rtx-4090": Device(
        name="rtx-4090",
        compute_capability=8.9,
        peak_flops={"fp32": 82.6 * _T, "tf32": 82.6 * _T, "bf16": 165.2 * _T, "fp16": 165.2 * _T},
        memory_bytes=usable_memory_bytes(EXPOSED_MEMORY_BYTES["rtx-4090"]),
        memory_bandwidth_bytes_per_s=1008 * _G,
        source=(
            "NVIDIA Ada Lovelace GPU architecture whitepaper v2.1, Appendix A (GeForce RTX 4090), "
            "https://images.nvidia.com/aem-dam/Solutions/geforce/ada/"
            "nvidia-ada-gpu-architecture.pdf; dense Tensor Core figures with FP32 accumulate "
            "(training accumulates in FP32)"
        ),
    ),
    "gtx-1080ti": Device(
        name="gtx-1080ti",
        compute_capability=6.1,
        peak_flops={"fp32": 11.34 * _T, "fp16": 0.177 * _T},
        memory_bytes=usable_memory_bytes(EXPOSED_MEMORY_BYTES["gtx-1080ti"]),
        memory_bandwidth_bytes_per_s=484 * _G,
        source=(
            "NVIDIA GeForce GTX 1080 Ti specifications, "
            "https://www.nvidia.com/en-gb/geforce/graphics-cards/geforce-gtx-1080-ti/specifications/; "
            "fp32 = 3584 CUDA cores x 2 x 1582 MHz boost; fp16 runs at 1/64 rate on GP102 "
            "(NVIDIA Pascal GP102 tuning guide); no tensor cores"
        ),
    ),
    "rtx-2080ti": Device(
        name="rtx-2080ti",
        compute_capability=7.5,
        peak_flops={"fp32": 13.4 * _T, "fp16": 53.8 * _T},
        memory_bytes=usable_memory_bytes(EXPOSED_MEMORY_BYTES["rtx-2080ti"]),
        memory_bandwidth_bytes_per_s=616 * _G,
        source=(
            "NVIDIA Turing GPU architecture whitepaper, Table 1 (RTX 2080 Ti reference board), "
            "https://images.nvidia.com/aem-dam/en-zz/Solutions/design-visualization/technologies/"
            "turing-architecture/NVIDIA-Turing-Architecture-Whitepaper.pdf; fp16 = Tensor Core "
            "with FP32 accumulate; no bf16/tf32"
        ),
    ),
    "mi300x": Device(
        name="mi300x",
        peak_flops={"fp32": 163.4 * _T, "tf32": 653.7 * _T, "bf16": 1307.4 * _T, "fp16": 1307.4 * _T},
        memory_bytes=usable_memory_bytes(EXPOSED_MEMORY_BYTES["mi300x"]),
        memory_bandwidth_bytes_per_s=5.3 * _T,
        source=(
            "AMD Instinct MI300X accelerator data sheet / product page, "
            "https://www.amd.com/en/products/accelerators/instinct/mi300/mi300x.html; "
            "dense matrix figures (fp32 = matrix FP32; sparsity figures not used)"
        ),
    ),
}
"""Device presets by name."""

_PCIE = "PCI Express Base Specification (PCI-SIG): x16 per-direction rate after 128b/130b encoding"
_IB = "InfiniBand Trade Association roadmap: per-port data rate, one NIC (HCA) per device"
_LAT = "latency [Empirical]"

LINK_PRESETS: dict[str, Link] = {
    "nvlink2": Link(
        name="nvlink2",
        bandwidth_bytes_per_s=150 * _G,
        latency_s=2e-6,
        source="NVIDIA V100 datasheet: NVLink 300 GB/s total (both directions), so 150 GB/s each; "
        + _LAT,
    ),
    # collective_efficiency 0.77 (h31f, 2026-12-02): NCCL's own model caps an A100 node's bus
    # bandwidth at 235 GB/s (NVIDIA/nccl src/graph/tuning.cc, commit 01afd20a: ``if (compCap80)
    # busBw = std::min(busBw, 235.0f)``), 0.78 of 300 GB/s; NVIDIA/nccl-tests#149 reports all_reduce
    # busbw ~200 GB/s on 8 A100-SXM4-80GB (0.67).
    # NVLink 4 and 5 (h32b, 2026-12-02): NCCL's per-link NVLink bandwidth by compute capability
    # (NVIDIA/nccl src/graph/topo.h: SM80_NVLINK_BW 20.0, SM90_NVLINK_BW 20.6, SM100_NVLINK_BW 40.1 GB/s,
    # 12 links on an A100, 18 on an H100 / H200 / B200): 18 x 20.6 = 370.8 of 450 GB/s (0.82) on NVLink 4,
    # 18 x 40.1 = 721.8 of 900 GB/s (0.80) on NVLink 5 (the "maxBw 721.8" an 8-B200 NCCL log prints,
    # NVIDIA/nccl#1807). Measured on NVLink 4: ring busbw 365-370 GB/s on 2-8 H100 SXM (NVIDIA/nccl#1455,
    # NCCL_ALGO=RING, 2-4 GB), "effective NVLink bandwidth of 370GB/s" with ring (NCCL maintainer,
    # NVIDIA/nccl-tests#212). 12 x 20.0 = 240 of 300 GB/s (0.80) on NVLink 3, capped by tuning.cc as above.
    "nvlink3": Link(
        name="nvlink3",
        bandwidth_bytes_per_s=300 * _G,
        latency_s=2e-6,
        collective_efficiency=0.77,
        source="NVIDIA A100 datasheet: NVLink 600 GB/s total (both directions), so 300 GB/s each; "
        "[Empirical] collective_efficiency 0.77: NCCL all-reduce bus bandwidth ~230 GB/s on an "
        "NVSwitch A100 node (issue 14's Megatron runs, tp 8); " + _LAT,
    ),
    "nvlink4": Link(
        name="nvlink4",
        bandwidth_bytes_per_s=450 * _G,
        latency_s=2e-6,
        collective_efficiency=0.82,
        source="NVIDIA H100 datasheet: NVLink 900 GB/s total (both directions), so 450 GB/s each; "
        "collective_efficiency 0.82: NCCL's NVLink 4 bandwidth, 18 links x 20.6 GB/s = 370.8 GB/s (NVIDIA/nccl "
        "src/graph/topo.h SM90_NVLINK_BW), ring busbw 365-370 GB/s measured on 2-8 H100 SXM (NVIDIA/nccl#1455); " + _LAT,
    ),
    "nvlink-h200": Link(
        name="nvlink-h200",
        bandwidth_bytes_per_s=450 * _G,
        latency_s=2e-6,
        collective_efficiency=0.82,
        source="NVIDIA H200 product page: NVLink 900 GB/s total (same as NVLink 4), 450 GB/s each; "
        "collective_efficiency 0.82 as nvlink4: NCCL prices every compute capability 9.0 GPU's NVLink at "
        "18 x 20.6 GB/s (NVIDIA/nccl src/graph/topo.h SM90_NVLINK_BW); " + _LAT,
    ),
    "nvlink5": Link(
        name="nvlink5",
        bandwidth_bytes_per_s=900 * _G,
        latency_s=2e-6,
        collective_efficiency=0.80,
        source="NVIDIA HGX B200 / GB200 NVL72 specifications: 5th-generation NVLink 1.8 TB/s per GPU (both "
        "directions), so 900 GB/s each (DGX B200: 14.4 TB/s aggregate over 8 GPUs; GB200 NVL72: 130 TB/s "
        "over 72); collective_efficiency 0.80: NCCL's NVLink 5 bandwidth, 18 links x 40.1 GB/s = 721.8 GB/s "
        "(NVIDIA/nccl src/graph/topo.h SM100_NVLINK_BW; an 8-B200 NCCL log's maxBw 721.8, NVIDIA/nccl#1807), "
        "no ring measurement found; " + _LAT,
    ),
    "pcie3": Link(
        name="pcie3", bandwidth_bytes_per_s=15.75 * _G, latency_s=5e-6, source=_PCIE + " (8 GT/s); " + _LAT
    ),
    "pcie4": Link(
        name="pcie4", bandwidth_bytes_per_s=31.5 * _G, latency_s=5e-6, source=_PCIE + " (16 GT/s); " + _LAT
    ),
    "pcie5": Link(
        name="pcie5", bandwidth_bytes_per_s=63.0 * _G, latency_s=5e-6, source=_PCIE + " (32 GT/s); " + _LAT
    ),
    "infinity-fabric": Link(
        name="infinity-fabric",
        bandwidth_bytes_per_s=448 * _G,
        latency_s=2e-6,
        source=(
            "AMD MI300X data sheet: 7 Infinity Fabric links of 128 GB/s (both directions) to the "
            "7 peers of an 8-GPU platform, so 7 x 64 = 448 GB/s each way; " + _LAT
        ),
    ),
    "ib-edr": Link(
        name="ib-edr", bandwidth_bytes_per_s=12.5 * _G, latency_s=5e-6, source=_IB + " (EDR 100 Gb/s); " + _LAT
    ),
    "ib-hdr": Link(
        name="ib-hdr",
        bandwidth_bytes_per_s=25.0 * _G,
        latency_s=5e-6,
        source=_IB + " (HDR 200 Gb/s); a DGX A100 has 8 single-port HDR ConnectX-6 adapters for compute "
        "traffic, one per GPU (NVIDIA DGX A100 datasheet; Narayanan et al. SC'21 section 5, Selene); " + _LAT,
    ),
    "ib-ndr": Link(
        name="ib-ndr",
        bandwidth_bytes_per_s=50.0 * _G,
        latency_s=5e-6,
        source=_IB + " (NDR 400 Gb/s); a DGX H100 has 8 ConnectX-7 400 Gb/s ports for compute traffic, one "
        "per GPU (NVIDIA DGX H100 datasheet); " + _LAT,
    ),
    "ib-xdr": Link(
        name="ib-xdr",
        bandwidth_bytes_per_s=100.0 * _G,
        latency_s=5e-6,
        source=_IB + " (XDR 800 Gb/s, ConnectX-8); NVIDIA DGX SuperPOD B300 reference architecture (XDR 800 Gbps "
        "InfiniBand compute fabric), GB300 NVL72 compute tray (4 ConnectX-8 for 4 GPUs); not the B200 / GB200 "
        "default (their reference architectures name ConnectX-7 / NDR 400 Gb/s); " + _LAT,
    ),
    "eth-100g": Link(
        name="eth-100g",
        bandwidth_bytes_per_s=12.5 * _G,
        latency_s=10e-6,
        source="IEEE 802.3 100 Gb/s Ethernet (RoCE), one NIC per device; " + _LAT,
    ),
    "eth-25g": Link(
        name="eth-25g",
        bandwidth_bytes_per_s=3.125 * _G,
        latency_s=20e-6,
        source="IEEE 802.3 25 Gb/s Ethernet (TCP), one NIC per device; " + _LAT,
    ),
}
"""Link presets by name (per-device, per-direction bandwidth)."""

DEFAULT_LINKS: dict[str, tuple[str, str]] = {
    "v100-32gb": ("nvlink2", "ib-edr"),
    "a100-40gb": ("nvlink3", "ib-hdr"),
    "a100-80gb": ("nvlink3", "ib-hdr"),
    "h100-sxm": ("nvlink4", "ib-ndr"),
    "h100-pcie": ("pcie5", "ib-ndr"),
    "h100-sxm-96gb-500w": ("nvlink4", "ib-ndr"),
    "h200": ("nvlink-h200", "ib-ndr"),
    # DGX B200: 8 ConnectX-7 400 Gb/s for compute traffic (DGX B200 user guide); DGX SuperPOD GB200
    # reference architecture: NDR 400 Gb/s InfiniBand between NVL72 racks
    "b200": ("nvlink5", "ib-ndr"),
    "gb200": ("nvlink5", "ib-ndr"),
    "l40s": ("pcie4", "eth-100g"),
    "rtx-4090": ("pcie4", "eth-25g"),
    "gtx-1080ti": ("pcie3", "eth-25g"),
    "rtx-2080ti": ("pcie3", "eth-25g"),
    "mi300x": ("infinity-fabric", "ib-ndr"),
}
"""Per device preset: (intra-node link, inter-node link) preset names."""

DEFAULT_NODE_SIZES: dict[str, int] = {"gb200": 72}
"""Devices per node (NVLink domain) of the presets whose domain is not :data:`DEFAULT_DEVICES_PER_NODE`:
a GB200 NVL72 rack is one NVLink domain of 72 GPUs (18 compute trays of 4, 9 NVLink switch trays;
NVIDIA GB200 NVL72 page), so its "node" for the intra link is the rack."""


def default_devices_per_node(device: Device) -> int:
    """The device's NVLink domain size: :data:`DEFAULT_NODE_SIZES`, else :data:`DEFAULT_DEVICES_PER_NODE`.

    Examples
    --------
    >>> default_devices_per_node(get_device("gb200")), default_devices_per_node(get_device("h100-sxm"))
    (72, 8)
    """
    return DEFAULT_NODE_SIZES.get(device.name, DEFAULT_DEVICES_PER_NODE)


def get_device(name: str) -> Device:
    """The device preset called ``name`` (case-insensitive).

    Raises
    ------
    InputError
        If there is no such preset (the message lists the known ones).

    Examples
    --------
    >>> get_device("H100-SXM").memory_bytes  # 85,017,755,648 B exposed less the CUDA context
    84351123456
    """
    device = DEVICE_PRESETS.get(name.strip().lower())
    if device is None:
        known = ", ".join(sorted(DEVICE_PRESETS))
        near = nearest_devices(name)
        guess = f" (did you mean {' or '.join(near)}?)" if near else ""
        raise InputError(f"unknown device '{name}'{guess}; use one of {known} or a cluster file with a full device")
    return device


def nearest_devices(name: str) -> list[str]:
    """At most two presets a mistyped device name most likely means: the presets of the same chip (the
    name's part before the first ``-``, e.g. ``h100`` of ``h100-80gb``), nearest first, else the closest
    names (:func:`difflib.get_close_matches`); spelling alone would send ``h100-80gb`` to ``a100-80gb``.

    >>> nearest_devices("h100-80gb"), nearest_devices("MI300"), nearest_devices("tpu-v5")
    (['h100-sxm', 'h100-pcie'], ['mi300x'], [])
    """
    wanted = name.strip().lower()
    chip = wanted.split("-")[0]
    names = sorted(DEVICE_PRESETS)
    same_chip = [n for n in names if len(chip) >= 3 and n.split("-")[0].startswith(chip)]
    if same_chip:
        return difflib.get_close_matches(wanted, same_chip, n=2, cutoff=0.0)
    return difflib.get_close_matches(wanted, names, n=2, cutoff=0.6)


def get_link(name: str) -> Link:
    """The link preset called ``name`` (case-insensitive).

    Raises
    ------
    InputError
        If there is no such preset (the message lists the known ones).

    Examples
    --------
    >>> get_link("ib-ndr").bandwidth_bytes_per_s
    50000000000.0
    """
    link = LINK_PRESETS.get(name.strip().lower())
    if link is None:
        known = ", ".join(sorted(LINK_PRESETS))
        raise InputError(f"unknown link '{name}'; use one of {known} or give a link dict")
    return link


def _positive_int(value: object, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InputError(f"{what} must be a positive whole number (got {value!r}); fix the value")
    return value


def _default_links(device: Device) -> tuple[str, str]:
    # A custom device has no usual links: PCIe 4 inside a node and 100 GbE between nodes are the
    # commonest floor, and the user can override both.
    return DEFAULT_LINKS.get(device.name, ("pcie4", "eth-100g"))


def _build_cluster(
    device: Device,
    *,
    devices: int,
    devices_per_node: int | None,
    intra_link: Link | None,
    inter_link: Link | None,
) -> Cluster:
    devices = _positive_int(devices, "devices")
    if devices_per_node is None:
        devices_per_node = min(devices, default_devices_per_node(device))
    devices_per_node = _positive_int(devices_per_node, "devices per node")
    # Fewer devices than one node holds: a single, partly used node.
    devices_per_node = min(devices_per_node, devices)
    if devices % devices_per_node:
        raise InputError(
            f"{devices} devices cannot fill whole nodes of {devices_per_node}; "
            f"use a multiple of {devices_per_node} devices or another --devices-per-node"
        )
    default_intra, default_inter = _default_links(device)
    return Cluster(
        device=device,
        nodes=devices // devices_per_node,
        devices_per_node=devices_per_node,
        intra_link=intra_link or get_link(default_intra),
        inter_link=inter_link or get_link(default_inter),
    )


def make_cluster(
    device: str,
    *,
    devices: int,
    devices_per_node: int | None = None,
    intra_link: str | None = None,
    inter_link: str | None = None,
) -> Cluster:
    """A cluster of ``devices`` preset devices in whole nodes.

    Parameters
    ----------
    device:
        A :data:`DEVICE_PRESETS` name, e.g. ``"h100-sxm"``.
    devices:
        Total device count.
    devices_per_node:
        Devices per node; default ``min(devices, default_devices_per_node(device))`` (8; 72 for
        ``gb200``, an NVL72 rack). A value above ``devices`` means one partly used node.
    intra_link, inter_link:
        :data:`LINK_PRESETS` names; default the device's usual links (:data:`DEFAULT_LINKS`).

    Returns
    -------
    Cluster

    Raises
    ------
    InputError
        Unknown device or link, sizes below 1, or ``devices`` not a multiple of ``devices_per_node``.

    Examples
    --------
    >>> c = make_cluster("a100-80gb", devices=16)
    >>> (c.nodes, c.devices_per_node, c.intra_link.name, c.inter_link.name)
    (2, 8, 'nvlink3', 'ib-hdr')
    """
    return _build_cluster(
        get_device(device),
        devices=devices,
        devices_per_node=devices_per_node,
        intra_link=get_link(intra_link) if intra_link else None,
        inter_link=get_link(inter_link) if inter_link else None,
    )


def _number(value: object) -> float | None:
    """A finite number, also from a string (PyYAML reads ``1e13``, no dot, as a string); ``None``
    for anything else, ``.inf`` and ``.nan`` included (they would price every step at 0 or NaN)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        value = float(value) if abs(value) < 2**1000 else math.inf
    elif isinstance(value, str) and len(value) <= 64:
        try:
            value = float(value)
        except ValueError:
            return None
    if isinstance(value, float) and math.isfinite(value):
        return value
    return None


def _shown(value: object) -> str:
    """``repr(value)`` cut short for a one-line message."""
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _float_field(spec: Mapping[str, Any], key: str, where: str) -> float:
    if key not in spec:
        raise InputError(f"{where} is missing '{key}'; add it to the cluster file")
    value = _number(spec[key])
    if value is None:
        raise InputError(f"{where}: '{key}' must be a finite number (got {_shown(spec[key])}); fix the cluster file")
    return value


def _device_from_spec(spec: object) -> Device:
    if isinstance(spec, str):
        return get_device(spec)
    if not isinstance(spec, Mapping):
        raise InputError("cluster file: 'device' must be a preset name or a mapping; fix the cluster file")
    where = "cluster file device"
    name = str(spec.get("name", "custom"))
    peak = spec.get("peak_flops")
    if not isinstance(peak, Mapping) or not peak:
        raise InputError(f"{where} needs 'peak_flops' as {{dtype: FLOP/s}}, e.g. {{bf16: 9.9e14}}")
    peak_flops: dict[str, float] = {}
    for dtype, value in peak.items():
        if str(dtype) not in ("fp32", "tf32", "bf16", "fp16", "fp8"):
            raise InputError(f"{where}: unknown dtype '{dtype}' in peak_flops; use fp32, tf32, bf16, fp16 or fp8")
        number = _number(value)
        if number is None or number <= 0:
            raise InputError(f"{where}: peak_flops.{dtype} must be a positive, finite number of FLOP/s; fix the cluster file")
        peak_flops[str(dtype)] = number
    if "memory_bytes" in spec:
        memory_bytes = int(_float_field(spec, "memory_bytes", where))
    elif "memory" in spec:
        memory_bytes = parse_size(str(spec["memory"]))
    else:
        raise InputError(f"{where} is missing 'memory' (e.g. 80GB); add it to the cluster file")
    return Device(
        name=name,
        peak_flops=peak_flops,
        memory_bytes=memory_bytes,
        memory_bandwidth_bytes_per_s=_float_field(spec, "memory_bandwidth_bytes_per_s", where),
        compute_capability=_float_field(spec, "compute_capability", where) if "compute_capability" in spec else None,
        source=str(spec.get("source", "cluster file")),
    )


def _link_from_spec(spec: object, key: str) -> Link | None:
    if spec is None:
        return None
    if isinstance(spec, str):
        return get_link(spec)
    if not isinstance(spec, Mapping):
        raise InputError(f"cluster file: '{key}' must be a link preset name or a mapping; fix the cluster file")
    where = f"cluster file {key}"
    return Link(
        name=str(spec.get("name", key)),
        bandwidth_bytes_per_s=_float_field(spec, "bandwidth_bytes_per_s", where),
        latency_s=_float_field(spec, "latency_s", where),
        collective_efficiency=(
            _float_field(spec, "collective_efficiency", where) if "collective_efficiency" in spec else 1.0
        ),
        source=str(spec.get("source", "cluster file")),
    )


MAX_CLUSTER_DEVICES = 1 << 20
"""Most devices a cluster file may describe (1,048,576, the CLI's ``--devices`` bound too)."""

MAX_CLUSTER_FILE_BYTES = 1 << 20
"""Largest cluster file read (1 MiB); a real one is a few hundred bytes."""

MAX_YAML_ALIASES = 64
"""Most YAML aliases (``*name``) a cluster file may use: a few hundred bytes of nested aliases
(a "billion laughs" file) would otherwise expand to gigabytes."""


def _read_cluster_text(file: Path) -> str:
    """The file's text; only a regular file of at most :data:`MAX_CLUSTER_FILE_BYTES` is read (a FIFO
    would block for ever, ``/dev/zero`` never end)."""
    try:
        info = file.stat()
    except FileNotFoundError:
        raise InputError(f"cluster file '{file}' does not exist; check the path") from None
    except OSError as exc:
        raise InputError(f"cannot read cluster file '{file}' ({exc.strerror}); check the path") from None
    if not stat.S_ISREG(info.st_mode):
        raise InputError(f"cluster file '{file}' is not a regular file; pass a YAML or JSON file")
    if info.st_size > MAX_CLUSTER_FILE_BYTES:
        raise InputError(
            f"cluster file '{file}' is {info.st_size:,} bytes, over the {MAX_CLUSTER_FILE_BYTES:,} a cluster file may "
            "have; pass the small YAML/JSON file described in `planner plan --help`"
        )
    try:
        with open(file, "rb") as handle:
            raw = handle.read(MAX_CLUSTER_FILE_BYTES + 1)  # the file may grow after the stat
        if len(raw) > MAX_CLUSTER_FILE_BYTES:
            raise InputError(f"cluster file '{file}' is over {MAX_CLUSTER_FILE_BYTES:,} bytes; pass a small YAML/JSON file")
        return raw.decode("utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"cannot read cluster file '{file}' ({exc.__class__.__name__}); check the file") from None


def _check_yaml_aliases(text: str, file: Path) -> None:
    """Refuse a YAML file with more than :data:`MAX_YAML_ALIASES` aliases, counted on the event
    stream (linear in the file's size) before anything is built."""
    aliases = 0
    for event in yaml.parse(text, Loader=yaml.SafeLoader):
        if isinstance(event, yaml.AliasEvent):
            aliases += 1
            if aliases > MAX_YAML_ALIASES:
                raise InputError(
                    f"cluster file '{file}' uses more than {MAX_YAML_ALIASES} YAML aliases (*name); write the values out"
                )


def _refuse_json_constant(name: str) -> float:
    raise ValueError(f"{name} is not a finite number")


def load_cluster(path: str | Path) -> Cluster:
    """Read a cluster from a small YAML or JSON file (format in the module docstring).

    Parameters
    ----------
    path:
        The file; ``.json`` is read as JSON, anything else as YAML (a superset of JSON).

    Returns
    -------
    Cluster

    Raises
    ------
    InputError
        Missing or unreadable file, malformed YAML/JSON, missing keys, bad values, unknown presets.
    """
    file = Path(path)
    text = _read_cluster_text(file)
    try:
        if file.suffix.lower() == ".json":
            data = json.loads(text, parse_constant=_refuse_json_constant)
        else:
            _check_yaml_aliases(text, file)
            data = yaml.safe_load(text)
    except (json.JSONDecodeError, yaml.YAMLError) as exc:
        first = str(exc).splitlines()[0] if str(exc) else exc.__class__.__name__
        raise InputError(f"cluster file '{file}' is not valid YAML/JSON ({first}); fix its syntax") from None
    except (ValueError, RecursionError) as exc:  # NaN in JSON, a 5000-digit integer, deep nesting
        reason = "nested too deeply" if isinstance(exc, RecursionError) else str(exc).split(";")[0]
        raise InputError(f"cluster file '{file}' is not a cluster ({reason}); fix the file") from None
    if not isinstance(data, Mapping):
        raise InputError(f"cluster file '{file}' must hold a mapping with 'device' and 'nodes'; see the format")
    if "device" not in data:
        raise InputError(f"cluster file '{file}' is missing 'device'; add a preset name such as h100-sxm")
    device = _device_from_spec(data["device"])
    for key in ("kernel_latency_s", "kernel_overhead_s", "host_dispatch_s", "collective_overhead_s", "layer_host_s",
                "microbatch_host_s", "p2p_overhead_s", "matmul_efficiency"):
        if key in data:  # fixed costs (planner.core.cluster.Device); applies to a preset device too
            device = dataclasses.replace(device, **{key: _float_field(data, key, f"cluster file '{file}'")})
    devices_per_node = data.get("devices_per_node")
    if devices_per_node is not None:
        devices_per_node = _positive_int(devices_per_node, "devices_per_node")
    if "nodes" in data:
        nodes = _positive_int(data["nodes"], "nodes")
        if devices_per_node is None:
            devices_per_node = default_devices_per_node(device)
        devices = nodes * devices_per_node
    elif "devices" in data:
        devices = _positive_int(data["devices"], "devices")
    else:
        raise InputError(f"cluster file '{file}' is missing 'nodes' (or 'devices'); add one")
    if devices > MAX_CLUSTER_DEVICES:
        raise InputError(
            f"cluster file '{file}' describes {devices:,} devices; the planner handles at most "
            f"{MAX_CLUSTER_DEVICES:,}: fix nodes/devices"
        )
    cluster = _build_cluster(
        device,
        devices=devices,
        devices_per_node=devices_per_node,
        intra_link=_link_from_spec(data.get("intra_link"), "intra_link"),
        inter_link=_link_from_spec(data.get("inter_link"), "inter_link"),
    )
    if "nccl_buffsize" in data:  # NCCL_BUFFSIZE of the job (objectives.nccl_memory): "4MiB" or bytes
        value = data["nccl_buffsize"]
        size = value if isinstance(value, int) and not isinstance(value, bool) else parse_size(str(value))
        cluster = dataclasses.replace(cluster, nccl_buffsize_bytes=size)
    return cluster
