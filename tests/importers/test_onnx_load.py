"""Tests of importers.onnx_load: hashing, never reading weights, and one-line errors with a fix."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from importers import onnx_load
from importers.onnx_load import load_onnx, read_small_external_int
from planner.core.errors import ModelError, PlannerError


def _mlp(opset: int = 18, hidden: int = 64) -> onnx.ModelProto:
    """x[batch, 32] -> MatMul(w1) -> Relu -> Reshape(shape) -> y; w1 big, shape a small int64."""
    rng = np.random.default_rng(0)
    inits = [
        numpy_helper.from_array(rng.standard_normal((32, hidden)).astype(np.float32), "w1"),
        numpy_helper.from_array(np.array([-1, hidden], np.int64), "shape"),
    ]
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["h"], name="mm"),
        helper.make_node("Relu", ["h"], ["r"], name="relu"),
        helper.make_node("Reshape", ["r", "shape"], ["y"], name="reshape"),
    ]
    graph = helper.make_graph(
        nodes,
        "mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 32])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", hidden])],
        initializer=inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def _save_external(model: onnx.ModelProto, path: Path, threshold: int = 0) -> Path:
    onnx.save_model(
        model,
        str(path),
        save_as_external_data=True,
        all_tensors_to_one_file=True,
        location=path.name + ".data",
        size_threshold=threshold,
    )
    return path.with_name(path.name + ".data")


def _assert_one_line(exc: pytest.ExceptionInfo) -> str:
    message = str(exc.value)
    assert "\n" not in message and message.strip() == message and ";" in message
    return message


class TestLoadOnnx:
    def test_inline_weights_and_hash(self, tmp_path: Path) -> None:
        path = tmp_path / "m.onnx"
        onnx.save(_mlp(), str(path))
        model, digest = load_onnx(path)
        assert digest == hashlib.sha256(path.read_bytes()).hexdigest()
        w1 = next(t for t in model.graph.initializer if t.name == "w1")
        assert numpy_helper.to_array(w1).shape == (32, 64)

    def test_str_path_accepted(self, tmp_path: Path) -> None:
        path = tmp_path / "m.onnx"
        onnx.save(_mlp(), str(path))
        assert load_onnx(str(path))[1] == hashlib.sha256(path.read_bytes()).hexdigest()

    def test_external_data_present_weights_not_loaded(self, tmp_path: Path) -> None:
        path = tmp_path / "m.onnx"
        data = _save_external(_mlp(), path)
        model, digest = load_onnx(path)
        # The hash is of the .onnx file only, the weights stay external (not read) ...
        assert digest == hashlib.sha256(path.read_bytes()).hexdigest()
        w1 = next(t for t in model.graph.initializer if t.name == "w1")
        assert w1.data_location == TensorProto.EXTERNAL and not w1.raw_data
        assert list(w1.dims) == [32, 64]
        # ... but the small int64 shape tensor was read back (shape inference needs it).
        shape = next(t for t in model.graph.initializer if t.name == "shape")
        assert shape.data_location == TensorProto.DEFAULT
        assert numpy_helper.to_array(shape).tolist() == [-1, 64]
        assert data.exists()

    def test_external_data_absent(self, tmp_path: Path) -> None:
        path = tmp_path / "m.onnx"
        _save_external(_mlp(), path).unlink()
        model, _ = load_onnx(path)
        by_name = {t.name: t for t in model.graph.initializer}
        assert list(by_name["w1"].dims) == [32, 64]
        assert by_name["w1"].data_type == TensorProto.FLOAT
        assert by_name["shape"].data_location == TensorProto.EXTERNAL  # lost with its file

    def test_missing_file(self, tmp_path: Path) -> None:
        with pytest.raises(ModelError, match="does not exist; check the path") as exc:
            load_onnx(tmp_path / "nope.onnx")
        _assert_one_line(exc)

    def test_directory(self, tmp_path: Path) -> None:
        with pytest.raises(ModelError, match="is a directory; pass the .onnx file") as exc:
            load_onnx(tmp_path)
        _assert_one_line(exc)

    def test_unreadable(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        path = tmp_path / "m.onnx"
        onnx.save(_mlp(), str(path))

        real_open = os.open

        def deny(target, *args, **kwargs):
            if str(target) == str(path):
                raise PermissionError(13, "Permission denied")
            return real_open(target, *args, **kwargs)

        # Root ignores file modes, so simulate the OS refusing the read.
        monkeypatch.setattr(os, "open", deny)
        with pytest.raises(ModelError, match="cannot read .*Permission denied.*permissions") as exc:
            load_onnx(path)
        _assert_one_line(exc)

    @pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no named pipes on this platform")
    def test_fifo_refused_without_blocking(self, tmp_path: Path) -> None:
        # Opening a FIFO for reading blocks until a writer comes: the check must not open it so.
        path = tmp_path / "pipe.onnx"
        os.mkfifo(path)
        with pytest.raises(ModelError, match=r"is a FIFO \(named pipe\), not a regular file") as exc:
            load_onnx(path)
        _assert_one_line(exc)

    @pytest.mark.parametrize("device", ["/dev/zero", "/dev/null", "/dev/urandom"])
    def test_device_refused(self, device: str) -> None:
        if not Path(device).exists():
            pytest.skip(f"{device} is absent")
        with pytest.raises(ModelError, match="is a character device, not a regular file") as exc:
            load_onnx(device)
        _assert_one_line(exc)

    def test_symlink_to_regular_file_is_read(self, tmp_path: Path) -> None:
        path = tmp_path / "m.onnx"
        onnx.save(_mlp(), str(path))
        (tmp_path / "link.onnx").symlink_to(path)
        assert load_onnx(tmp_path / "link.onnx")[1] == load_onnx(path)[1]

    def test_too_big_refused_before_reading(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        path = tmp_path / "m.onnx"
        onnx.save(_mlp(), str(path))
        size = path.stat().st_size
        monkeypatch.setattr(onnx_load, "MAX_MODEL_BYTES", size - 1)
        with pytest.raises(ModelError, match="more than a protobuf message can hold.*external data") as exc:
            load_onnx(path)
        _assert_one_line(exc)
        monkeypatch.setattr(onnx_load, "MAX_MODEL_BYTES", size)
        assert load_onnx(path)[0].graph.node

    def test_size_bound_is_protobufs_limit(self) -> None:
        assert onnx_load.MAX_MODEL_BYTES == 2**31 - 1

    @pytest.mark.skipif(os.geteuid() == 0, reason="root reads files regardless of their mode")
    def test_unreadable_mode(self, tmp_path: Path) -> None:
        path = tmp_path / "m.onnx"
        onnx.save(_mlp(), str(path))
        path.chmod(0)
        with pytest.raises(ModelError, match="cannot read"):
            load_onnx(path)

    def test_not_onnx(self, tmp_path: Path) -> None:
        path = tmp_path / "notes.onnx"
        path.write_text("this is not a model\n" * 20)
        with pytest.raises(ModelError) as exc:
            load_onnx(path)
        assert "re-export" in _assert_one_line(exc) or "ONNX exporter" in str(exc.value)

    @pytest.mark.parametrize("fraction", [0.1, 0.5, 0.9, 0.99])
    def test_truncated(self, tmp_path: Path, fraction: float) -> None:
        full = _mlp().SerializeToString()
        path = tmp_path / "cut.onnx"
        path.write_bytes(full[: int(len(full) * fraction)])
        with pytest.raises(ModelError) as exc:
            load_onnx(path)
        _assert_one_line(exc)

    def test_empty_graph(self, tmp_path: Path) -> None:
        graph = helper.make_graph([], "empty", [], [])
        path = tmp_path / "empty.onnx"
        onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]), str(path))
        with pytest.raises(ModelError, match="empty graph") as exc:
            load_onnx(path)
        _assert_one_line(exc)

    def test_old_opset_converted_with_a_note(self, tmp_path: Path) -> None:
        path = tmp_path / "old.onnx"
        onnx.save(_mlp(opset=11), str(path))
        notes: list[str] = []
        model, _ = load_onnx(path, notes)
        assert [o.version for o in model.opset_import if o.domain == ""] == [13]
        assert notes == ["'old.onnx' uses opset 11: converted to opset 13 with onnx.version_converter"]
        # The named batch stays as it is: only a fixed batch of 1 is rebound.
        assert model.graph.input[0].type.tensor_type.shape.dim[0].dim_param == "batch"

    def test_old_opset_the_converter_refuses(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        from onnx import version_converter

        def refuse(model, target):
            raise RuntimeError("No Adapter For Foo\nmore lines")

        monkeypatch.setattr(version_converter, "convert_version", refuse)
        path = tmp_path / "old.onnx"
        onnx.save(_mlp(opset=11), str(path))
        with pytest.raises(ModelError, match=r"opset 11 and onnx's version converter cannot convert it to opset 13 \(No Adapter For Foo\); re-export") as exc:
            load_onnx(path)
        _assert_one_line(exc)

    def test_opset_13_accepted(self, tmp_path: Path) -> None:
        path = tmp_path / "m13.onnx"
        onnx.save(_mlp(opset=13), str(path))
        load_onnx(path)

    @pytest.mark.parametrize("op_type", ["If", "Loop", "Scan"])
    def test_control_flow(self, tmp_path: Path, op_type: str) -> None:
        body = helper.make_graph(
            [helper.make_node("Identity", ["x"], ["z"])],
            "body",
            [],
            [helper.make_tensor_value_info("z", TensorProto.FLOAT, ["batch", 32])],
        )
        attr = {"If": {"then_branch": body, "else_branch": body}, "Loop": {"body": body},
                "Scan": {"body": body, "num_scan_inputs": 1}}[op_type]
        cond = helper.make_tensor_value_info("c", TensorProto.BOOL, [])
        nodes = [helper.make_node(op_type, ["c"], ["y"], name="cf", **attr)]
        graph = helper.make_graph(
            nodes,
            "cf",
            [cond, helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 32])],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        )
        path = tmp_path / "cf.onnx"
        onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]), str(path))
        with pytest.raises(ModelError, match=f"{op_type}.*not supported; export with the control "
                                             "flow unrolled / traced") as exc:
            load_onnx(path)
        _assert_one_line(exc)

    def test_ir_too_new(self, tmp_path: Path) -> None:
        model = _mlp()
        model.ir_version = onnx.IR_VERSION + 5
        path = tmp_path / "future.onnx"
        path.write_bytes(model.SerializeToString())
        with pytest.raises(ModelError, match="IR version .* upgrade onnx") as exc:
            load_onnx(path)
        _assert_one_line(exc)

    def test_opset_too_new(self, tmp_path: Path) -> None:
        model = _mlp()
        model.opset_import[0].version = onnx.defs.onnx_opset_version() + 3
        path = tmp_path / "future.onnx"
        path.write_bytes(model.SerializeToString())
        with pytest.raises(ModelError, match="newer than this onnx library knows"):
            load_onnx(path)

    def test_no_opset(self, tmp_path: Path) -> None:
        model = _mlp()
        del model.opset_import[:]
        path = tmp_path / "noopset.onnx"
        path.write_bytes(model.SerializeToString())
        with pytest.raises(ModelError, match="no default ONNX opset"):
            load_onnx(path)

    def test_dangling_input(self, tmp_path: Path) -> None:
        model = _mlp()
        del model.graph.node[0]  # what a file cut at a node boundary looks like
        path = tmp_path / "cut.onnx"
        path.write_bytes(model.SerializeToString())
        with pytest.raises(ModelError, match="reads 'h'.*truncated or corrupt") as exc:
            load_onnx(path)
        _assert_one_line(exc)

    def test_names_not_utf8(self, tmp_path: Path) -> None:
        model = _mlp()
        model.graph.node[1].name = "QQQQ"
        path = tmp_path / "bad.onnx"
        path.write_bytes(model.SerializeToString().replace(b"QQQQ", b"\xff\xfeQQ"))
        with pytest.raises(ModelError, match="not valid UTF-8") as exc:
            load_onnx(path)
        _assert_one_line(exc)

    def test_control_characters_in_names_stay_one_line(self, tmp_path: Path) -> None:
        model = _mlp()
        model.graph.node[1].input[0] = "h\nnext"
        path = tmp_path / "nl.onnx"
        path.write_bytes(model.SerializeToString())
        with pytest.raises(ModelError, match=r"reads 'h\\nnext'") as exc:
            load_onnx(path)
        _assert_one_line(exc)

    def test_errors_are_planner_errors(self, tmp_path: Path) -> None:
        with pytest.raises(PlannerError):
            load_onnx(tmp_path / "missing.onnx")


class TestReadSmallExternalInt:
    def _stripped(self, tmp_path: Path) -> tuple[onnx.ModelProto, Path]:
        path = tmp_path / "m.onnx"
        data = _save_external(_mlp(), path)
        model = onnx.load(str(path), load_external_data=False)
        return model, data

    def test_reads_small_int(self, tmp_path: Path) -> None:
        model, _ = self._stripped(tmp_path)
        shape = next(t for t in model.graph.initializer if t.name == "shape")
        values = read_small_external_int(model, shape, tmp_path)
        assert values is not None and values.dtype == np.int64 and values.tolist() == [-1, 64]
        by_name = read_small_external_int(model, "shape", tmp_path)
        assert by_name is not None and by_name.tolist() == [-1, 64]

    def test_float_weight_never_read(self, tmp_path: Path) -> None:
        model, _ = self._stripped(tmp_path)
        assert read_small_external_int(model, "w1", tmp_path) is None

    def test_too_big(self, tmp_path: Path) -> None:
        model, _ = self._stripped(tmp_path)
        assert read_small_external_int(model, "shape", tmp_path, max_bytes=15) is None
        assert read_small_external_int(model, "shape", tmp_path, max_bytes=16) is not None

    def test_missing_data_file(self, tmp_path: Path) -> None:
        model, data = self._stripped(tmp_path)
        data.unlink()
        assert read_small_external_int(model, "shape", tmp_path) is None

    def test_inline_and_unknown(self, tmp_path: Path) -> None:
        model = _mlp()
        assert read_small_external_int(model, "shape", tmp_path) is None  # inline: not external
        assert read_small_external_int(model, "nope", tmp_path) is None

    def test_location_outside_base_dir(self, tmp_path: Path) -> None:
        model, data = self._stripped(tmp_path)
        inner = tmp_path / "inner"
        inner.mkdir()
        shape = next(t for t in model.graph.initializer if t.name == "shape")
        for entry in shape.external_data:
            if entry.key == "location":
                entry.value = "../" + data.name
        assert read_small_external_int(model, shape, inner) is None

    def test_short_file(self, tmp_path: Path) -> None:
        model, data = self._stripped(tmp_path)
        shape = next(t for t in model.graph.initializer if t.name == "shape")
        offset = int({e.key: e.value for e in shape.external_data}["offset"])
        data.write_bytes(data.read_bytes()[: offset + 8])
        assert read_small_external_int(model, shape, tmp_path) is None
