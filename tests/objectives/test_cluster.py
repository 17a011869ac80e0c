"""Device and link presets, make_cluster, load_cluster, and their errors."""

from __future__ import annotations

import json

import pytest

from objectives.cluster import (
    DEFAULT_LINKS,
    DEVICE_PRESETS,
    LINK_PRESETS,
    get_device,
    load_cluster,
    make_cluster,
)
from planner.core.errors import InputError

REQUIRED_DEVICES = (
    "v100-32gb", "a100-40gb", "a100-80gb", "h100-sxm", "h100-pcie", "h200", "l40s",
    "rtx-4090", "gtx-1080ti", "rtx-2080ti", "mi300x", "h100-sxm-96gb-500w", "b200", "gb200",
)
REQUIRED_LINKS = (
    "nvlink2", "nvlink3", "nvlink4", "nvlink-h200", "pcie3", "pcie4", "pcie5", "infinity-fabric",
    "ib-edr", "ib-hdr", "ib-ndr", "eth-100g", "eth-25g",
)


def one_line(error: pytest.ExceptionInfo) -> str:
    message = str(error.value)
    assert "\n" not in message
    return message


class TestPresets:
    @pytest.mark.parametrize("name", REQUIRED_DEVICES)
    def test_device_has_cited_positive_numbers(self, name):
        device = DEVICE_PRESETS[name]
        assert device.name == name
        assert device.source
        assert device.memory_bytes > 0 and device.memory_bandwidth_bytes_per_s > 0
        assert set(device.peak_flops) <= {"fp32", "tf32", "bf16", "fp16", "fp8"}
        assert "fp32" in device.peak_flops
        intra, inter = DEFAULT_LINKS[name]
        assert intra in LINK_PRESETS and inter in LINK_PRESETS

    @pytest.mark.parametrize("name", REQUIRED_LINKS)
    def test_link_has_cited_positive_numbers(self, name):
        link = LINK_PRESETS[name]
        assert link.source and link.bandwidth_bytes_per_s > 0 and link.latency_s >= 0

    def test_spec_numbers(self):
        # H100 SXM datasheet prints BF16 1,979 TFLOPS with sparsity: 989.5 dense; 3.35 TB/s is SI.
        h100 = DEVICE_PRESETS["h100-sxm"]
        assert h100.peak_flops["bf16"] == pytest.approx(1979e12 / 2)
        assert h100.memory_bandwidth_bytes_per_s == pytest.approx(3.35e12)
        assert "halved" in h100.source
        # A100 datasheet prints dense BF16 312 TFLOPS.
        assert DEVICE_PRESETS["a100-80gb"].peak_flops["bf16"] == pytest.approx(312e12)
        # Devices without bf16 do not list it.
        assert "bf16" not in DEVICE_PRESETS["v100-32gb"].peak_flops
        # NVLink 4: 900 GB/s both directions -> 450 GB/s each way; NDR 400 Gb/s -> 50 GB/s.
        assert LINK_PRESETS["nvlink4"].bandwidth_bytes_per_s == pytest.approx(450e9)
        assert LINK_PRESETS["nvlink-h200"].bandwidth_bytes_per_s == LINK_PRESETS["nvlink4"].bandwidth_bytes_per_s
        assert LINK_PRESETS["ib-ndr"].bandwidth_bytes_per_s == pytest.approx(400e9 / 8)


class TestMakeCluster:
    def test_defaults(self):
        cluster = make_cluster("h100-sxm", devices=16)
        assert (cluster.nodes, cluster.devices_per_node, cluster.devices) == (2, 8, 16)
        assert cluster.intra_link.name == "nvlink4" and cluster.inter_link.name == "ib-ndr"

    def test_small_cluster_is_one_node(self):
        cluster = make_cluster("a100-40gb", devices=4)
        assert (cluster.nodes, cluster.devices_per_node) == (1, 4)
        assert make_cluster("a100-40gb", devices=4, devices_per_node=8).devices_per_node == 4

    def test_links_by_name(self):
        cluster = make_cluster("l40s", devices=8, devices_per_node=4, intra_link="pcie5", inter_link="IB-HDR")
        assert cluster.intra_link.name == "pcie5" and cluster.inter_link.name == "ib-hdr"
        assert cluster.nodes == 2

    def test_case_insensitive_device(self):
        assert get_device(" MI300X ").name == "mi300x"

    def test_unknown_device_lists_known(self):
        with pytest.raises(InputError) as error:
            make_cluster("tpu-v5", devices=8)
        message = one_line(error)
        assert "tpu-v5" in message and "h100-sxm" in message and "mi300x" in message

    def test_unknown_link(self):
        with pytest.raises(InputError) as error:
            make_cluster("h100-sxm", devices=8, intra_link="nvlink9")
        assert "nvlink4" in one_line(error)

    def test_indivisible_devices(self):
        with pytest.raises(InputError) as error:
            make_cluster("h100-sxm", devices=12, devices_per_node=8)
        assert "multiple of 8" in one_line(error)

    @pytest.mark.parametrize("devices, per_node", [(0, None), (-4, None), (8, 0), (8, -2), (2.5, None)])
    def test_bad_sizes(self, devices, per_node):
        with pytest.raises(InputError) as error:
            make_cluster("h100-sxm", devices=devices, devices_per_node=per_node)
        one_line(error)


class TestLoadCluster:
    def test_yaml_with_presets(self, tmp_path):
        path = tmp_path / "c.yaml"
        path.write_text("device: a100-80gb\nnodes: 4\ndevices_per_node: 8\ninter_link: ib-ndr\n")
        cluster = load_cluster(path)
        assert cluster.devices == 32 and cluster.device.name == "a100-80gb"
        assert cluster.intra_link.name == "nvlink3" and cluster.inter_link.name == "ib-ndr"

    def test_kernel_latency(self, tmp_path):
        path = tmp_path / "c.yaml"
        path.write_text("device: h100-sxm\nkernel_latency_s: 4.0e-6\nnodes: 1\n")
        assert load_cluster(path).device.kernel_latency_s == 4e-6
        assert make_cluster("h100-sxm", devices=8).device.kernel_latency_s == 0.0  # presets: none
        path.write_text("device: h100-sxm\nkernel_latency_s: -1\nnodes: 1\n")
        with pytest.raises(InputError, match="kernel_latency_s"):
            load_cluster(path)

    def test_json_with_full_device_and_link(self, tmp_path):
        spec = {
            "device": {"name": "mygpu", "peak_flops": {"bf16": 5e14, "fp32": 5e13}, "memory": "48GiB",
                       "memory_bandwidth_bytes_per_s": 2e12},
            "devices": 4,
            "intra_link": {"name": "mylink", "bandwidth_bytes_per_s": 1e11, "latency_s": 1e-6},
        }
        path = tmp_path / "c.json"
        path.write_text(json.dumps(spec))
        cluster = load_cluster(path)
        assert cluster.device.memory_bytes == 48 * 2**30
        assert (cluster.nodes, cluster.devices_per_node) == (1, 4)
        assert cluster.intra_link.name == "mylink" and cluster.inter_link.name == "eth-100g"

    def test_yaml_numbers_without_a_dot(self, tmp_path):
        # PyYAML reads 1e13 (no dot) as a string; the loader accepts it as the number it means.
        path = tmp_path / "c.yaml"
        path.write_text(
            "device: {name: x, peak_flops: {fp32: 1e13}, memory: 8GB, memory_bandwidth_bytes_per_s: 1e12}\n"
            "nodes: 1\ndevices_per_node: 2\nintra_link: {name: l, bandwidth_bytes_per_s: 5e10, latency_s: 1e-6}\n"
        )
        cluster = load_cluster(path)
        assert cluster.device.peak_flops["fp32"] == 1e13 and cluster.intra_link.latency_s == 1e-6

    def test_nodes_default_to_eight_devices(self, tmp_path):
        path = tmp_path / "c.yaml"
        path.write_text("device: h200\nnodes: 2\n")
        assert load_cluster(path).devices == 16

    @pytest.mark.parametrize(
        "text, expected",
        [
            ("device: [unclosed\n", "not valid"),
            ("- just\n- a list\n", "mapping"),
            ("nodes: 2\n", "missing 'device'"),
            ("device: h100-sxm\n", "missing 'nodes'"),
            ("device: h100-sxm\nnodes: 0\n", "positive"),
            ("device: h100-sxm\nnodes: two\n", "positive"),
            ("device: h100-sxm\ndevices: 12\ndevices_per_node: 8\n", "whole nodes"),
            ("device: b300\nnodes: 1\n", "unknown device"),
            ("device: {name: x, memory: 8GB, memory_bandwidth_bytes_per_s: 1e12}\nnodes: 1\n", "peak_flops"),
            ("device: {name: x, peak_flops: {int8: 1e15}, memory: 8GB, memory_bandwidth_bytes_per_s: 1e12}\n"
             "nodes: 1\n", "int8"),
            ("device: {name: x, peak_flops: {fp32: 1e13}, memory_bandwidth_bytes_per_s: 1e12}\nnodes: 1\n",
             "missing 'memory'"),
            ("device: {name: x, peak_flops: {fp32: lots}, memory: 8GB, memory_bandwidth_bytes_per_s: 1e12}\n"
             "nodes: 1\n", "peak_flops.fp32"),
            ("device: {name: x, peak_flops: {fp32: 1e13}, memory: 8GB}\nnodes: 1\n", "memory_bandwidth"),
            ("device: h100-sxm\nnodes: 1\nintra_link: {name: l, latency_s: 1e-6}\n", "bandwidth_bytes_per_s"),
            ("device: h100-sxm\nnodes: 1\nintra_link: {name: l, bandwidth_bytes_per_s: -1, latency_s: 0}\n",
             "positive"),
            ("device: h100-sxm\nnodes: 1\ninter_link: 42\n", "inter_link"),
        ],
    )
    def test_malformed(self, tmp_path, text, expected):
        path = tmp_path / "c.yaml"
        path.write_text(text)
        with pytest.raises(InputError) as error:
            load_cluster(path)
        assert expected in one_line(error)

    def test_missing_file(self, tmp_path):
        with pytest.raises(InputError) as error:
            load_cluster(tmp_path / "nope.yaml")
        assert "does not exist" in one_line(error)

    def test_directory(self, tmp_path):
        with pytest.raises(InputError) as error:
            load_cluster(tmp_path)
        one_line(error)

    def test_malformed_json(self, tmp_path):
        path = tmp_path / "c.json"
        path.write_text('{"device": "h100-sxm", "nodes": 1')
        with pytest.raises(InputError) as error:
            load_cluster(path)
        assert "not valid" in one_line(error)


class TestHostileClusterFiles:
    """The loader's bounds, one by one (the CLI side is in tests/planner/test_hostile_cli.py)."""

    @pytest.mark.parametrize(
        "text, needle",
        [
            ('{"device": "h100-sxm", "nodes": NaN}', "not a cluster (NaN is not a finite number)"),
            ('{"device": "h100-sxm", "nodes": 1, "kernel_latency_s": Infinity}', "not a cluster"),
            ('{"device": "h100-sxm", "devices": 1048577}', "1,048,577 devices"),
            ('{"device": "h100-sxm", "nodes": 131073, "devices_per_node": 8}', "1,048,584 devices"),
            ('{"device": {"name": "x", "peak_flops": {"bf16": 1e308}, "memory_bytes": "1e999",'
             ' "memory_bandwidth_bytes_per_s": 1e12}, "devices": 8}', "'memory_bytes' must be a finite number"),
            ('{"device": {"name": "x", "peak_flops": {"bf16": -1}, "memory": "80GB",'
             ' "memory_bandwidth_bytes_per_s": 1e12}, "devices": 8}', "positive, finite"),
            ("[" * 100_000, "not"),
        ],
    )
    def test_refused_in_one_line(self, tmp_path, text, needle):
        path = tmp_path / "cluster.json"
        path.write_text(text)
        with pytest.raises(InputError) as error:
            load_cluster(path)
        assert needle in one_line(error)

    def test_largest_cluster_is_accepted(self, tmp_path):
        path = tmp_path / "cluster.yaml"
        path.write_text("device: h100-sxm\nnodes: 131072\n")  # 131072 x 8 = 2**20
        assert load_cluster(path).devices == 2**20

    def test_aliases_up_to_the_bound_are_fine(self, tmp_path):
        from objectives.cluster import MAX_YAML_ALIASES

        path = tmp_path / "cluster.yaml"
        path.write_text("device: &d h100-sxm\nnodes: 1\nx: [" + ", ".join(["*d"] * MAX_YAML_ALIASES) + "]\n")
        assert load_cluster(path).device.name == "h100-sxm"
        path.write_text("device: &d h100-sxm\nnodes: 1\nx: [" + ", ".join(["*d"] * (MAX_YAML_ALIASES + 1)) + "]\n")
        with pytest.raises(InputError, match="YAML aliases"):
            load_cluster(path)


class TestIssue23Presets:
    """H100 power-capped, H200, B200, GB200 NVL72 (issue 23 part 5): datasheet figures, sparse halved."""

    def test_blackwell_dense_figures_are_half_the_sparse_datasheet(self):
        # HGX B200 / GB200 NVL72 per-GPU tables print FP16/BF16 4.5 / 5 PFLOPS and FP8 9 / 10 with sparsity
        assert DEVICE_PRESETS["b200"].peak_flops["bf16"] == 2.25e15
        assert DEVICE_PRESETS["b200"].peak_flops["fp8"] == 4.5e15
        assert DEVICE_PRESETS["gb200"].peak_flops["bf16"] == 2.5e15
        # memory: nvidia-smi's 189,471 MiB less the driver's 1% (no CUDA total published), less the CUDA context
        assert DEVICE_PRESETS["gb200"].memory_bytes == 189_471 * 2**20 * 99 // 100 - 666_632_192

    def test_gb200_node_is_the_nvl72_rack(self):
        cluster = make_cluster("gb200", devices=144)
        assert (cluster.nodes, cluster.devices_per_node) == (2, 72)
        assert cluster.intra_link.name == "nvlink5" and cluster.intra_link.bandwidth_bytes_per_s == 900e9
        assert make_cluster("b200", devices=16).devices_per_node == 8

    def test_only_fitted_devices_carry_a_matmul_efficiency(self):
        from objectives.compute import FAMILY_EFFICIENCY, family_efficiency

        for name in ("a100-80gb", "b200", "gb200", "h200"):
            assert DEVICE_PRESETS[name].matmul_efficiency is None
            assert family_efficiency("matmul", DEVICE_PRESETS[name]) == FAMILY_EFFICIENCY["matmul"]
        assert DEVICE_PRESETS["h100-sxm"].matmul_efficiency is not None


class TestPresetMemory:
    """Presets' memory as the device exposes it to CUDA less the CUDA context (issue 23, 2026-12-02)."""

    # Datasheet capacities in decimal GB (the figure each preset's ``source`` names): the exposed bytes sit
    # between about that many GB and that many GiB (HBM/GDDR capacities are binary; ECC and the driver take
    # a little), which catches a MiB/MB or GB/GiB slip in any figure.
    DATASHEET_GB = {"v100-32gb": 32, "a100-40gb": 40, "a100-80gb": 80, "h100-sxm": 80, "h100-sxm-96gb-500w": 96,
                    "h100-pcie": 80, "h200": 141, "b200": 180, "gb200": 186, "l40s": 48, "rtx-4090": 24,
                    "gtx-1080ti": 11, "rtx-2080ti": 11, "mi300x": 192}

    def test_hand_figures(self):
        from objectives.cluster import CUDA_CONTEXT_BYTES

        assert CUDA_CONTEXT_BYTES == 666_632_192  # pytorch/pytorch#86509, eager module loading
        # H100 SXM: deviceQuery 85,017,755,648 B (81,079 MiB) - 666,632,192 = 84,351,123,456 (78.56 GiB)
        assert DEVICE_PRESETS["h100-sxm"].memory_bytes == 84_351_123_456
        # A100 SXM4 80GB: deviceQuery 85,100,068,864 B - 666,632,192 = 84,433,436,672
        assert DEVICE_PRESETS["a100-80gb"].memory_bytes == 84_433_436_672
        # H200: nvidia-smi -q 143,771 MiB total, 700 reserved: 143,071 x 1,048,576 = 150,020,816,896 - context
        assert DEVICE_PRESETS["h200"].memory_bytes == 150_020_816_896 - 666_632_192
        # the old decimal-GB figure was 80e9: the H100 preset gains 4.35e9 B
        assert DEVICE_PRESETS["h100-sxm"].memory_bytes - 80 * 10**9 == 4_351_123_456

    def test_every_preset_is_exposed_less_context_and_near_its_datasheet(self):
        from objectives.cluster import CUDA_CONTEXT_BYTES, EXPOSED_MEMORY_BYTES

        assert set(EXPOSED_MEMORY_BYTES) == set(DEVICE_PRESETS) == set(self.DATASHEET_GB)
        for name, device in DEVICE_PRESETS.items():
            exposed = EXPOSED_MEMORY_BYTES[name]
            assert device.memory_bytes == exposed - CUDA_CONTEXT_BYTES, name
            gb = self.DATASHEET_GB[name]
            assert 0.99 * gb * 10**9 <= exposed <= gb * 2**30, (name, exposed)

    def test_cluster_file_memory_is_taken_as_given(self, tmp_path):
        # a cluster file's memory is the limit as the user wrote it, GB decimal: not reduced by the context
        path = tmp_path / "c.yaml"
        path.write_text("device: {name: x, peak_flops: {fp32: 1e13}, memory: 80GB, memory_bandwidth_bytes_per_s: 1e12}\n"
                        "nodes: 1\n")
        assert load_cluster(path).device.memory_bytes == 80 * 10**9
