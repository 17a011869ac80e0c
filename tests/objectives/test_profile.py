"""Tests of objectives.onnx_build (shard rebuild) and objectives.profile (timing, database).

Expected shard shapes are computed by hand in each test; the rebuilt one-node models are run by
onnxruntime itself. No assertion is made on timing relations (a shared machine is noisy).
"""

from __future__ import annotations

import multiprocessing
import sqlite3
import time

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from objectives.onnx_build import build_shard_model, random_inputs, shard_spec, shard_spec_or_reason
from objectives.profile import (
    ProfileDB,
    ProfileRow,
    detect_device_name,
    measure_shards,
    open_measured,
    profile_graph,
)
from planner.core.configs import ConfigOptions, enumerate_configs
from planner.core.errors import InputError
from planner.core.graph import IterDim, NodeSpec, Op, OpGraph, Tensor, TensorAccess


# --------------------------------------------------------------------------------------------------
# Hand-built ops.


def _attr(name: str, value: object) -> bytes:
    return helper.make_attribute(name, value).SerializeToString()


def _const(values: list[int]) -> bytes:
    return numpy_helper.from_array(np.array(values, dtype=np.int64)).SerializeToString()


def matmul_op(m: int = 12, n: int = 32, k: int = 16, *, dtype: str = "float32", name: str = "mm") -> Op:
    """y[m, n] = a[m, k] @ b[k, n]."""
    return Op(
        name=name,
        kind="matmul",
        op_type="MatMul",
        flops=2.0 * m * n * k,
        dims=(IterDim(name="m", size=m, is_batch=True), IterDim(name="n", size=n),
              IterDim(name="k", size=k, kind="reduction")),
        inputs=(TensorAccess(tensor="a", axes=(("m",), ("k",))), TensorAccess(tensor="b", axes=(("k",), ("n",)))),
        outputs=(TensorAccess(tensor="y", axes=(("m",), ("n",))),),
        node=NodeSpec(op_type="MatMul", input_shapes=((m, k), (k, n)), input_dtypes=(dtype, dtype),
                      output_shapes=((m, n),), output_dtypes=(dtype,)),
    )


def softmax_op() -> Op:
    """Softmax over the last axis of x[4, 6, 10]."""
    shape = (4, 6, 10)
    axes = (("b",), ("h",), ("s",))
    return Op(
        name="softmax",
        kind="softmax",
        op_type="Softmax",
        flops=5.0 * 240,
        dims=(IterDim(name="b", size=4, is_batch=True), IterDim(name="h", size=6),
              IterDim(name="s", size=10, kind="normalized")),
        inputs=(TensorAccess(tensor="x", axes=axes),),
        outputs=(TensorAccess(tensor="p", axes=axes),),
        node=NodeSpec(op_type="Softmax", attributes=(_attr("axis", -1),), input_shapes=(shape,),
                      input_dtypes=("float32",), output_shapes=(shape,), output_dtypes=("float32",)),
    )


def conv_op() -> Op:
    """y[2, 6, 8, 8] = conv(x[2, 4, 8, 8], w[6, 4, 3, 3], bias[6]), padding 1, stride 1."""
    return Op(
        name="conv",
        kind="conv",
        op_type="Conv",
        flops=2.0 * 2 * 6 * 8 * 8 * 4 * 9,
        dims=(
            IterDim(name="b", size=2, is_batch=True),
            IterDim(name="co", size=6),
            IterDim(name="oh", size=8, kind="spatial", halo=2),
            IterDim(name="ow", size=8, kind="spatial", halo=2),
            IterDim(name="ci", size=4, kind="reduction"),
            IterDim(name="kh", size=3, kind="reduction", splittable=False),
            IterDim(name="kw", size=3, kind="reduction", splittable=False),
        ),
        inputs=(
            TensorAccess(tensor="x", axes=(("b",), ("ci",), ("oh",), ("ow",))),
            TensorAccess(tensor="w", axes=(("co",), ("ci",), ("kh",), ("kw",))),
            TensorAccess(tensor="bias", axes=(("co",),)),
        ),
        outputs=(TensorAccess(tensor="y", axes=(("b",), ("co",), ("oh",), ("ow",))),),
        node=NodeSpec(
            op_type="Conv",
            attributes=(_attr("kernel_shape", [3, 3]), _attr("pads", [1, 1, 1, 1])),
            input_shapes=((2, 4, 8, 8), (6, 4, 3, 3), (6,)),
            input_dtypes=("float32",) * 3,
            output_shapes=((2, 6, 8, 8),),
            output_dtypes=("float32",),
        ),
    )


def _run(op: Op, factors: dict[str, int]) -> list[tuple[int, ...]]:
    """Build the shard model, run it in onnxruntime, return the output shapes."""
    spec = shard_spec(op, factors)
    assert spec is not None, shard_spec_or_reason(op, factors)
    model = build_shard_model(spec)
    onnx.checker.check_model(model)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return [tuple(o.shape) for o in session.run(None, random_inputs(spec))]


def _input_shapes(op: Op, factors: dict[str, int]) -> list[tuple[int, ...]]:
    spec = shard_spec(op, factors)
    assert spec is not None
    return [s.shape for s in spec.inputs]


# --------------------------------------------------------------------------------------------------
# Rebuilding nodes at shard shapes.


class TestShardSpec:
    @pytest.mark.parametrize(
        ("factors", "inputs", "output"),
        [
            ({}, [(12, 16), (16, 32)], (12, 32)),
            ({"m": 2}, [(6, 16), (16, 32)], (6, 32)),
            ({"n": 4}, [(12, 16), (16, 8)], (12, 8)),
            ({"k": 2}, [(12, 8), (8, 32)], (12, 32)),  # partial sums: output is whole
            ({"m": 3, "n": 2, "k": 4}, [(4, 4), (4, 16)], (4, 16)),
        ],
    )
    def test_matmul(self, factors, inputs, output):
        op = matmul_op()
        assert _input_shapes(op, factors) == inputs
        assert _run(op, factors) == [output]

    def test_matmul_weight_behind_transpose(self):
        # the importer folded Transpose(w[n, k]) into the access: the node sees [k, n]
        op = matmul_op()
        folded = Op(
            **{f: getattr(op, f) for f in ("name", "kind", "op_type", "flops", "dims", "outputs", "node")},
            inputs=(op.inputs[0], TensorAccess(tensor="w", axes=(("n",), ("k",)))),
        )
        assert _input_shapes(folded, {"n": 4, "k": 2}) == [(12, 8), (8, 8)]
        assert _run(folded, {"n": 4, "k": 2}) == [(12, 8)]

    def test_explicit_axes_win(self):
        op = matmul_op()
        explicit = Op(
            **{f: getattr(op, f) for f in ("name", "kind", "op_type", "flops", "dims", "outputs")},
            inputs=(),  # no accesses at all: only NodeSpec.input_axes says where the dims are
            node=NodeSpec(op_type="MatMul", input_shapes=((12, 16), (16, 32)), input_dtypes=("float32",) * 2,
                          output_shapes=((12, 32),), output_dtypes=("float32",),
                          input_axes=((("m",), ("k",)), (("k",), ("n",)))),
        )
        assert _input_shapes(explicit, {"m": 2, "k": 4}) == [(6, 4), (4, 32)]
        assert _run(explicit, {"m": 2, "k": 4}) == [(6, 32)]

    @pytest.mark.parametrize(
        ("factors", "shape"),
        [({}, (4, 6, 10)), ({"b": 2, "h": 3}, (2, 2, 10)), ({"s": 2}, (4, 6, 5)), ({"b": 4, "s": 5}, (1, 6, 2))],
    )
    def test_softmax(self, factors, shape):
        op = softmax_op()
        assert _input_shapes(op, factors) == [shape]
        assert _run(op, factors) == [shape]

    @pytest.mark.parametrize(
        ("factors", "x", "w", "y"),
        [
            ({}, (2, 4, 8, 8), (6, 4, 3, 3), (2, 6, 8, 8)),
            ({"b": 2}, (1, 4, 8, 8), (6, 4, 3, 3), (1, 6, 8, 8)),
            ({"co": 3}, (2, 4, 8, 8), (2, 4, 3, 3), (2, 2, 8, 8)),
            ({"ci": 2}, (2, 2, 8, 8), (6, 2, 3, 3), (2, 6, 8, 8)),
            # spatial split: each device's rows, same padding -> 8 / 2 output rows
            ({"oh": 2}, (2, 4, 4, 8), (6, 4, 3, 3), (2, 6, 4, 8)),
            ({"b": 2, "co": 2, "oh": 2, "ow": 2}, (1, 4, 4, 4), (3, 4, 3, 3), (1, 3, 4, 4)),
        ],
    )
    def test_conv(self, factors, x, w, y):
        op = conv_op()
        bias = (6 // factors.get("co", 1),)
        assert _input_shapes(op, factors) == [x, w, bias]
        assert _run(op, factors) == [y]

    def test_depthwise_conv_scales_group(self):
        op = Op(
            name="dw",
            kind="conv",
            op_type="Conv",
            flops=1.0,
            dims=(IterDim(name="b", size=1), IterDim(name="c", size=4), IterDim(name="oh", size=8, kind="spatial"),
                  IterDim(name="ow", size=8, kind="spatial"),
                  IterDim(name="kh", size=3, kind="reduction", splittable=False),
                  IterDim(name="kw", size=3, kind="reduction", splittable=False)),
            inputs=(TensorAccess(tensor="x", axes=(("b",), ("c",), ("oh",), ("ow",))),
                    TensorAccess(tensor="w", axes=(("c",), (), ("kh",), ("kw",)))),
            outputs=(TensorAccess(tensor="y", axes=(("b",), ("c",), ("oh",), ("ow",))),),
            node=NodeSpec(op_type="Conv", attributes=(_attr("group", 4), _attr("pads", [1, 1, 1, 1])),
                          input_shapes=((1, 4, 8, 8), (4, 1, 3, 3)), input_dtypes=("float32",) * 2,
                          output_shapes=((1, 4, 8, 8),), output_dtypes=("float32",)),
        )
        spec = shard_spec(op, {"c": 2})
        groups = [onnx.AttributeProto.FromString(a) for a in spec.attributes]
        assert [a.i for a in groups if a.name == "group"] == [2]  # 4 groups over 2 devices
        assert _run(op, {"c": 2}) == [(1, 2, 8, 8)]

    def test_reshape_target_rewritten(self):
        # x[4, 6] -> Reshape(target [4, -1, 3]) -> y[4, 2, 3]; splitting the leading dim by 2
        op = Op(
            name="reshape",
            kind="data_movement",
            op_type="Reshape",
            flops=0.0,
            dims=(IterDim(name="b", size=4), IterDim(name="c", size=6, splittable=False)),
            inputs=(TensorAccess(tensor="x", axes=(("b",), ("c",))),),
            outputs=(TensorAccess(tensor="y", axes=(("b",), (), ())),),
            node=NodeSpec(op_type="Reshape", input_shapes=((4, 6), (3,)), input_dtypes=("float32", "int64"),
                          output_shapes=((4, 2, 3),), output_dtypes=("float32",),
                          constant_inputs={1: _const([4, -1, 3])}),
        )
        spec = shard_spec(op, {"b": 2})
        target = numpy_helper.to_array(TensorProto.FromString(spec.inputs[1].constant))
        assert target.tolist() == [2, 2, 3]
        assert _run(op, {"b": 2}) == [(2, 2, 3)]
        assert _run(op, {}) == [(4, 2, 3)]  # unsplit: the original target, -1 included

    def test_gather_indices_stay_inside_the_vocab_shard(self):
        # embedding: table[10, 4] (rows v, columns d), ids[2, 3] -> out[2, 3, 4]
        op = Op(
            name="embed",
            kind="embedding",
            op_type="Gather",
            flops=0.0,
            dims=(IterDim(name="i0", size=2), IterDim(name="i1", size=3), IterDim(name="d", size=4),
                  IterDim(name="v", size=10, kind="reduction")),
            inputs=(TensorAccess(tensor="table", axes=(("v",), ("d",))),
                    TensorAccess(tensor="ids", axes=(("i0",), ("i1",)))),
            outputs=(TensorAccess(tensor="out", axes=(("i0",), ("i1",), ("d",))),),
            node=NodeSpec(op_type="Gather", input_shapes=((10, 4), (2, 3)), input_dtypes=("float32", "int64"),
                          output_shapes=((2, 3, 4),), output_dtypes=("float32",)),
        )
        spec = shard_spec(op, {"v": 2, "d": 2})
        assert [s.shape for s in spec.inputs] == [(5, 2), (2, 3)]
        assert spec.inputs[1].index_high == (5,)
        ids = random_inputs(spec)["x1"]
        assert ids.min() >= 0 and ids.max() < 5
        assert _run(op, {"v": 2, "d": 2}) == [(2, 3, 2)]

    def test_attention_scores_behind_folded_views(self):
        # scores[b, h, s, t] = q[b, h, s, d] @ kT[b, h, d, t], where q and k are the projections
        # [b, s, h*d] seen through the folded Reshape + Transpose: the accesses index h*d by (h, k)
        b, s, h, d = 2, 16, 12, 64
        dims = (IterDim(name="b", size=b), IterDim(name="h", size=h), IterDim(name="m", size=s),
                IterDim(name="n", size=s), IterDim(name="k", size=d, kind="reduction"))
        op = Op(
            name="scores", kind="matmul", op_type="MatMul", flops=2.0 * b * h * s * s * d, dims=dims,
            inputs=(TensorAccess(tensor="q", axes=(("b",), ("m",), ("h", "k"))),
                    TensorAccess(tensor="k", axes=(("b",), ("n",), ("h", "k")))),
            outputs=(TensorAccess(tensor="scores", axes=(("b",), ("h",), ("m",), ("n",))),),
            node=NodeSpec(op_type="MatMul", input_shapes=((b, h, s, d), (b, h, d, s)),
                          input_dtypes=("float32",) * 2, output_shapes=((b, h, s, s),), output_dtypes=("float32",)),
        )
        factors = {"h": 2, "m": 2, "k": 4}
        assert _input_shapes(op, factors) == [(2, 6, 8, 16), (2, 6, 16, 16)]
        assert _run(op, factors) == [(2, 6, 8, 16)]

    def test_mask_without_access_broadcasts_like_the_output(self):
        # Where(mask[1, 8, 8], x[4, 8, 8], -1e9): the constant mask is not an operand of the op
        fill = numpy_helper.from_array(np.array(-1e9, dtype=np.float32)).SerializeToString()
        axes = (("b",), ("s",), ("t",))
        op = Op(
            name="where", kind="elementwise", op_type="Where", flops=256.0,
            dims=(IterDim(name="b", size=4), IterDim(name="s", size=8), IterDim(name="t", size=8)),
            inputs=(TensorAccess(tensor="x", axes=axes),), outputs=(TensorAccess(tensor="y", axes=axes),),
            node=NodeSpec(op_type="Where", input_shapes=((1, 8, 8), (4, 8, 8), ()),
                          input_dtypes=("bool", "float32", "float32"), output_shapes=((4, 8, 8),),
                          output_dtypes=("float32",), constant_inputs={2: fill}),
        )
        assert _input_shapes(op, {"b": 2, "s": 2}) == [(1, 4, 8), (2, 4, 8), ()]
        assert _run(op, {"b": 2, "s": 2}) == [(2, 4, 8)]

    def test_unprofilable_cases(self):
        op = matmul_op()
        no_node = Op(**{f: getattr(op, f) for f in ("name", "kind", "op_type", "flops", "dims", "inputs", "outputs")})
        assert shard_spec(no_node, {"m": 2}) is None
        assert "no ONNX node" in shard_spec_or_reason(no_node, {})
        # the node's input cannot hold the split dim anywhere (rank-1 input of size 7)
        odd = Op(
            **{f: getattr(op, f) for f in ("name", "kind", "op_type", "flops", "dims", "outputs")},
            inputs=(TensorAccess(tensor="a", axes=(("m",),)),),
            node=NodeSpec(op_type="Relu", input_shapes=((7,),), input_dtypes=("float32",),
                          output_shapes=((7,),), output_dtypes=("float32",)),
        )
        assert shard_spec(odd, {"m": 2}) is None
        assert shard_spec(odd, {}) is not None  # unsplit: the node as it is

    def test_signature_shared_across_ops_and_configs(self):
        big, small = matmul_op(m=12, name="a"), matmul_op(m=6, name="b")
        assert shard_spec(big, {"m": 2}).key == shard_spec(small, {}).key  # same per-device shard
        assert shard_spec(big, {"m": 2}).key != shard_spec(big, {"m": 3}).key
        assert shard_spec(big, {}).key != shard_spec(matmul_op(dtype="float16"), {}).key
        assert shard_spec(big, {"m": 2}).model_key == shard_spec(big, {"n": 2}).model_key


# --------------------------------------------------------------------------------------------------
# Measuring.


class TestMeasure:
    def test_times_are_positive(self):
        op = matmul_op()
        specs = [shard_spec(op, f) for f in ({}, {"m": 2}, {"n": 4})]
        results = measure_shards(specs, repeats=3, warmup=1)
        assert all(r.median_s > 0 and r.repeats == 3 and r.spread_s >= 0 for r in results)

    def test_bfloat16_is_measured_as_float32(self):
        spec = shard_spec(matmul_op(dtype="bfloat16"), {"m": 2})
        (result,) = measure_shards([spec], repeats=2, warmup=1)
        assert result.median_s > 0
        assert result.measured_dtypes == "float32,float32,float32"

    def test_wrong_rebuild_is_rejected_not_timed(self):
        # an access that claims the output has 5 rows: the node makes 12, so the shape check fails
        op = matmul_op()
        liar = Op(
            **{f: getattr(op, f) for f in ("name", "kind", "op_type", "flops", "dims", "inputs")},
            outputs=(TensorAccess(tensor="y", axes=(("m",), ("n",))),),
            node=NodeSpec(op_type="MatMul", input_shapes=((12, 16), (16, 32)), input_dtypes=("float32",) * 2,
                          output_shapes=((12, 32),), output_dtypes=("float32",),
                          output_axes=((("n",), ("m",)),)),  # wrong on purpose
        )
        (result,) = measure_shards([shard_spec(liar, {"m": 2})], repeats=2, warmup=1)
        assert isinstance(result, str) and "wrong shape" in result

    def test_cuda_unavailable_is_an_input_error(self):
        if "CUDAExecutionProvider" in ort.get_available_providers():
            pytest.skip("this onnxruntime build has CUDA")
        with pytest.raises(InputError, match="not available in this onnxruntime build"):
            measure_shards([shard_spec(matmul_op(), {})], provider="cuda")
        with pytest.raises(InputError, match="unknown provider"):
            measure_shards([], provider="tpu")


# --------------------------------------------------------------------------------------------------
# The database.


def _row(signature: str, median_s: float = 1e-3, device: str = "dev") -> ProfileRow:
    return ProfileRow(signature=signature, provider="cpu", device_name=device, median_s=median_s, repeats=5,
                      spread_s=1e-5, measured_dtypes="float32", method="profiler", description=signature,
                      created_unix=1.0)


def _writer(path: str, start: int, stop: int, barrier) -> None:  # noqa: ANN001
    """One process's share of the concurrency test: many small transactions."""
    with ProfileDB(path) as db:
        barrier.wait(timeout=60)  # both processes write at the same time
        for first in range(start, stop, 5):
            db.record([_row(f"sig{i:04d}", median_s=float(i)) for i in range(first, min(first + 5, stop))])
            db.record_failures([(f"bad{first:04d}", "no kernel", "x")], provider="cpu", device_name="dev")


class TestProfileDB:
    def test_round_trip(self, tmp_path):
        path = tmp_path / "sub" / "profile.db"
        with ProfileDB(path) as db:
            assert db.record([_row("a", 0.5), _row("b", 0.25), _row("a", 9.0, device="other")]) == 3
            assert db.record([_row("a", 7.0)]) == 0  # first measurement kept
        with ProfileDB(path) as db:
            assert db.timings(provider="cpu", device_name="dev") == {"a": 0.5, "b": 0.25}
            assert db.timings(provider="cuda", device_name="dev") == {}
            assert [r.signature for r in db.rows()] == ["a", "a", "b"]
            assert db.rows()[2] == _row("b", 0.25)
            assert db.integrity_ok()

    def test_two_processes_into_one_file(self, tmp_path):
        path = str(tmp_path / "shared.db")
        ProfileDB(path).close()
        context = multiprocessing.get_context("spawn")
        barrier = context.Barrier(2)
        workers = [context.Process(target=_writer, args=(path, 0, 300, barrier)),
                   context.Process(target=_writer, args=(path, 150, 450, barrier))]  # 150 rows overlap
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join(timeout=120)
            assert worker.exitcode == 0
        with ProfileDB(path) as db:
            timings = db.timings(provider="cpu", device_name="dev")
            assert timings == {f"sig{i:04d}": float(i) for i in range(450)}
            assert len(db.failures(provider="cpu", device_name="dev")) == len(set(range(0, 300, 5)) | set(range(150, 450, 5)))
            assert db.integrity_ok()
        with sqlite3.connect(path) as conn:
            assert conn.execute("PRAGMA integrity_check").fetchall() == [("ok",)]

    def test_corrupt_file_is_an_input_error(self, tmp_path):
        path = tmp_path / "broken.db"
        path.write_bytes(b"this is not a database at all, just text\n" * 200)
        before = path.read_bytes()
        with pytest.raises(InputError, match=r"unreadable \(file is not a database\).* or choose another path$"):
            ProfileDB(path)
        assert path.read_bytes() == before

    def test_missing_entries_look_up_as_none(self, tmp_path):
        with ProfileDB(tmp_path / "p.db") as db:
            db.record([_row("not-a-real-signature")])
            measured = db.lookup_fn("cpu", device_name="dev")
            assert measured(matmul_op(), {"m": 2}) is None
            assert measured(softmax_op(), {}) is None


# --------------------------------------------------------------------------------------------------
# The whole graph.


def _graph() -> OpGraph:
    ops = (matmul_op(), softmax_op(), conv_op())
    tensors = {
        t.name: t
        for t in (
            Tensor(name="a", shape=(12, 16), dtype="float32", role="input"),
            Tensor(name="b", shape=(16, 32), dtype="float32", role="parameter"),
            Tensor(name="y", shape=(12, 32), dtype="float32", role="activation", producer="mm"),
            Tensor(name="x", shape=(4, 6, 10), dtype="float32", role="input"),
            Tensor(name="p", shape=(4, 6, 10), dtype="float32", role="activation", producer="softmax"),
        )
    }
    return OpGraph(name="tiny", ops=ops, tensors=tensors, edges=())


class TestProfileGraph:
    def test_profile_resume_and_lookup(self, tmp_path):
        graph = _graph()
        options = ConfigOptions(devices=4, devices_per_node=4)
        spaces = [enumerate_configs(op, options) for op in graph.ops]
        expected_keys = {
            shard_spec(op, space.describe(row)).key for op, space in zip(graph.ops, spaces) for row in range(space.size)
        }
        configs = sum(len({tuple(r) for r in space.factors.tolist()}) for space in spaces)
        calls = []
        with ProfileDB(tmp_path / "p.db") as db:
            first = profile_graph(graph, spaces, db, repeats=2, warmup=1, progress=lambda d, t: calls.append((d, t)))
            assert (first.configs, first.shards, first.measured, first.cached) == (
                configs, len(expected_keys), len(expected_keys), 0)
            assert (first.failed, first.pending, first.unprofilable_configs) == (0, 0, 0)
            assert calls[-1] == (len(expected_keys), len(expected_keys))
            second = profile_graph(graph, spaces, db, repeats=2, warmup=1)
            assert (second.measured, second.cached) == (0, len(expected_keys))
            assert set(db.timings(provider="cpu", device_name=detect_device_name("cpu"))) == expected_keys
            measured = db.lookup_fn("cpu")
            for op, space in zip(graph.ops, spaces):
                for row in range(space.size):
                    time_s = measured(op, space.describe(row))
                    assert time_s is not None and time_s > 0

    def test_max_shards_leaves_the_rest_pending(self, tmp_path):
        graph = OpGraph(name="one", ops=(softmax_op(),), tensors={}, edges=())
        spaces = [enumerate_configs(graph.ops[0], ConfigOptions(devices=4, devices_per_node=4))]
        with ProfileDB(tmp_path / "p.db") as db:
            part = profile_graph(graph, spaces, db, repeats=1, warmup=0, max_shards=2)
            assert (part.measured, part.pending) == (2, part.shards - 2)
            rest = profile_graph(graph, spaces, db, repeats=1, warmup=0)
            assert (rest.measured, rest.cached, rest.pending) == (part.shards - 2, 2, 0)

    def test_unprofilable_configs_are_counted(self, tmp_path):
        op = matmul_op()
        no_node = Op(**{f: getattr(op, f) for f in ("name", "kind", "op_type", "flops", "dims", "inputs", "outputs")})
        graph = OpGraph(name="none", ops=(no_node,), tensors={}, edges=())
        spaces = [enumerate_configs(no_node, ConfigOptions(devices=2, devices_per_node=2))]
        with ProfileDB(tmp_path / "p.db") as db:
            report = profile_graph(graph, spaces, db)
        assert (report.shards, report.unprofilable_configs) == (0, spaces[0].size)
        assert report.unprofilable_by_type == {"MatMul": spaces[0].size}

    def test_failures_are_recorded_and_not_retried(self, tmp_path):
        op = softmax_op()
        unknown = Op(
            **{f: getattr(op, f) for f in ("name", "kind", "dims", "inputs", "outputs", "flops")},
            op_type="NoSuchOp",
            node=NodeSpec(op_type="NoSuchOp", input_shapes=((4, 6, 10),), input_dtypes=("float32",),
                          output_shapes=((4, 6, 10),), output_dtypes=("float32",)),
        )
        graph = OpGraph(name="bad", ops=(unknown,), tensors={}, edges=())
        spaces = [enumerate_configs(unknown, ConfigOptions(devices=2, devices_per_node=2))]
        with ProfileDB(tmp_path / "p.db") as db:
            first = profile_graph(graph, spaces, db, repeats=1, warmup=0)
            assert (first.measured, first.failed, first.unprofilable_configs) == (0, first.shards, spaces[0].size)
            assert "onnxruntime cannot run it" in first.examples[0]
            again = profile_graph(graph, spaces, db, repeats=1, warmup=0)
            assert (again.measured, again.failed) == (0, first.shards)
            assert db.lookup_fn("cpu")(unknown, {}) is None

    def test_one_space_per_op(self, tmp_path):
        with ProfileDB(tmp_path / "p.db") as db, pytest.raises(InputError, match="one per op"):
            profile_graph(_graph(), [], db)


# --------------------------------------------------------------------------------------------------
# Whose database: refusing other files, upgrading version 1.


_V1_SCHEMA = """
CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE timings (signature TEXT NOT NULL, provider TEXT NOT NULL, device_name TEXT NOT NULL,
    median_s REAL NOT NULL, repeats INTEGER NOT NULL, spread_s REAL NOT NULL, measured_dtypes TEXT NOT NULL,
    method TEXT NOT NULL, description TEXT NOT NULL, created_unix REAL NOT NULL,
    PRIMARY KEY (signature, provider, device_name)) WITHOUT ROWID;
CREATE TABLE failures (signature TEXT NOT NULL, provider TEXT NOT NULL, device_name TEXT NOT NULL,
    reason TEXT NOT NULL, description TEXT NOT NULL, created_unix REAL NOT NULL,
    PRIMARY KEY (signature, provider, device_name)) WITHOUT ROWID;
INSERT INTO meta VALUES ('schema_version', '1');
INSERT INTO timings VALUES ('old', 'cpu', 'dev', 0.25, 5, 0.0, 'float32', 'profiler', 'old', 1.0);
"""


class TestWhoseDatabase:
    @pytest.mark.parametrize("journal", ["delete", "wal"])
    def test_foreign_database_is_refused_and_left_unchanged(self, tmp_path, journal):
        path = tmp_path / "other.sqlite"
        conn = sqlite3.connect(path)
        conn.execute(f"PRAGMA journal_mode = {journal}")
        conn.execute("CREATE TABLE customers (id INTEGER PRIMARY KEY, name TEXT)")
        conn.executemany("INSERT INTO customers (name) VALUES (?)", [("ada",), ("grace",)])
        conn.commit()
        conn.close()
        before = path.read_bytes()
        with pytest.raises(InputError) as caught:
            ProfileDB(path)
        message = str(caught.value)
        assert "not a planner profile database (tables customers)" in message and "\n" not in message
        assert message.endswith("choose another path (the file was left unchanged)")
        assert path.read_bytes() == before
        with sqlite3.connect(path) as check:  # still the owner's data, in the owner's journal mode
            assert check.execute("SELECT name FROM customers ORDER BY id").fetchall() == [("ada",), ("grace",)]
            assert check.execute("PRAGMA journal_mode").fetchone()[0] == journal
            assert {r[0] for r in check.execute("SELECT name FROM sqlite_master")} == {"customers"}

    def test_another_application_id_is_refused(self, tmp_path):
        path = tmp_path / "app.db"
        with sqlite3.connect(path) as conn:
            conn.execute("PRAGMA application_id = 1234")
            conn.execute("CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)")
        before = path.read_bytes()
        with pytest.raises(InputError, match=r"not a planner profile database \(application id 0x4d2\)"):
            ProfileDB(path)
        assert path.read_bytes() == before

    def test_the_cli_refuses_it_with_exit_2(self, tmp_path):
        from tests.planner.cli_helpers import run_cli

        path = tmp_path / "other.sqlite"
        with sqlite3.connect(path) as conn:
            conn.execute("CREATE TABLE t (x)")
        before = path.read_bytes()
        result = run_cli(["profile", "tests/data/gpt2_tiny.onnx", "--dim", "batch=1", "--dim", "seq=8",
                          "--devices", "2", "--profile-db", path], expected_exit_code=2)
        assert "not a planner profile database" in result.stderr
        assert path.read_bytes() == before

    def test_new_file_is_marked_as_ours(self, tmp_path):
        path = tmp_path / "p.db"
        ProfileDB(path).close()
        with sqlite3.connect(path) as conn:
            assert conn.execute("PRAGMA application_id").fetchone()[0] == 0x504C4E52
            assert conn.execute("SELECT value FROM meta").fetchall() == [("2",)]
        ProfileDB(path).close()  # and opened again

    def test_version_1_is_upgraded_in_place(self, tmp_path):
        path = tmp_path / "v1.db"
        with sqlite3.connect(path) as conn:
            conn.executescript(_V1_SCHEMA)
        with ProfileDB(path) as db:
            (row,) = db.rows()
            assert (row.signature, row.median_s, row.backward_median_s) == ("old", 0.25, None)
            db.record([_row("new", 0.5)])
            assert db.timings(provider="cpu", device_name="dev") == {"old": 0.25, "new": 0.5}
        with sqlite3.connect(path) as conn:
            assert conn.execute("PRAGMA application_id").fetchone()[0] == 0x504C4E52

    def test_newer_layout_is_refused(self, tmp_path):
        path = tmp_path / "p.db"
        ProfileDB(path).close()
        with sqlite3.connect(path) as conn:
            conn.execute("UPDATE meta SET value = '9' WHERE key = 'schema_version'")
        with pytest.raises(InputError, match="newer planner .*upgrade planner"):
            ProfileDB(path)

    def test_missing_file_is_not_created_when_reading(self, tmp_path):
        path = tmp_path / "none.db"
        with pytest.raises(InputError, match=r"no profile database at .*run `planner profile MODEL --profile-db"):
            ProfileDB(path, create=False)
        assert not path.exists()

    def test_a_folder_is_refused(self, tmp_path):
        with pytest.raises(InputError, match="not a regular file"):
            ProfileDB(tmp_path)


# --------------------------------------------------------------------------------------------------
# Claims: two processes share the work.


class TestClaims:
    def test_a_live_claim_is_respected_and_released_by_recording(self, tmp_path):
        path = tmp_path / "p.db"
        with ProfileDB(path) as first, ProfileDB(path) as second:
            assert first.claim(["a", "b"], provider="cpu", device_name="dev") == (["a", "b"], [])
            assert second.claim(["b", "c"], provider="cpu", device_name="dev") == (["c"], ["b"])
            first.record([_row("b")])  # b timed: its claim is gone, and nobody claims it again
            assert second.claimed_elsewhere(["a", "b", "c"], provider="cpu", device_name="dev") == {"a"}
            assert second.claim(["b"], provider="cpu", device_name="dev") == ([], ["b"])
            first.release_claims()
            assert second.claim(["a"], provider="cpu", device_name="dev") == (["a"], [])

    def test_claims_of_a_dead_process_or_too_old_are_taken_over(self, tmp_path):
        import socket
        import subprocess
        import sys

        dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                              text=True, check=True)
        path = tmp_path / "p.db"
        with ProfileDB(path) as db:
            with sqlite3.connect(path) as conn:
                conn.executemany(
                    "INSERT INTO claims VALUES (?, 'cpu', 'dev', ?, ?, 'someone', ?)",
                    [("dead", socket.gethostname(), int(dead.stdout), time.time()),
                     ("old", "another-host", 1, time.time() - 100.0),
                     ("busy", "another-host", 1, time.time())],
                )
            mine, other = db.claim(["dead", "old", "busy"], provider="cpu", device_name="dev", claim_timeout_s=50.0)
            assert (mine, other) == (["dead", "old"], ["busy"])


def _child_script() -> str:
    """One profiling process of the two-process test (argv: me, other, database, output, folder)."""
    return '''
import json, sys, time
from pathlib import Path
import objectives.profile as profile
import objectives.profile_providers as providers
from planner.core.configs import ConfigOptions, enumerate_configs
from tests.objectives.test_profile import _graph

me, other, db_path, out, folder = sys.argv[1:6]
folder = Path(folder)
real = providers.measure_shards  # what the onnxruntime backend calls
state = {"first": True}

def measure_after_the_other_claimed(specs, **kwargs):
    # both processes hold a claim before either measures: the run overlaps by construction
    if state["first"]:
        state["first"] = False
        (folder / f"{me}.measuring").touch()
        deadline = time.time() + 120
        while time.time() < deadline and not any((folder / f"{other}.{s}").exists() for s in ("measuring", "done")):
            time.sleep(0.02)
    return real(specs, **kwargs)

providers.measure_shards = measure_after_the_other_claimed
graph = _graph()
spaces = [enumerate_configs(op, ConfigOptions(devices=4, devices_per_node=4)) for op in graph.ops]
with profile.ProfileDB(db_path) as db:
    report = profile.profile_graph(graph, spaces, db, repeats=1, warmup=0, time_budget_s=0.05)
(folder / f"{me}.done").touch()
Path(out).write_text(json.dumps({"measured": list(report.measured_signatures), "elsewhere": report.elsewhere,
                                 "cached": report.cached, "shards": report.shards, "failed": report.failed}))
'''


class TestTwoProfilers:
    def test_two_processes_measure_disjoint_sets_covering_everything(self, tmp_path):
        import json
        import os
        import subprocess
        import sys
        from pathlib import Path

        root = Path(__file__).resolve().parents[2]
        script = tmp_path / "child.py"
        script.write_text(_child_script())
        db_path = tmp_path / "shared.db"
        ProfileDB(db_path).close()
        env = dict(os.environ, PYTHONPATH=str(root))
        children = [
            subprocess.Popen([sys.executable, str(script), me, other, str(db_path), str(tmp_path / f"{me}.json"),
                              str(tmp_path)], cwd=root, env=env, stderr=subprocess.PIPE, text=True)
            for me, other in (("a", "b"), ("b", "a"))
        ]
        for child in children:
            _, err = child.communicate(timeout=300)
            assert child.returncode == 0, err
        reports = [json.loads((tmp_path / f"{me}.json").read_text()) for me in ("a", "b")]
        graph = _graph()
        spaces = [enumerate_configs(op, ConfigOptions(devices=4, devices_per_node=4)) for op in graph.ops]
        expected = {shard_spec(op, s.describe(r)).key for op, s in zip(graph.ops, spaces) for r in range(s.size)}
        first, second = (set(r["measured"]) for r in reports)
        assert first and second  # both worked ...
        assert not first & second  # ... on different shards ...
        assert first | second == expected  # ... and between them on every shard, each once
        for report, mine in zip(reports, (first, second)):
            assert len(report["measured"]) == len(mine)  # nothing measured twice within a process
            assert (report["failed"], report["cached"]) == (0, 0)
            assert report["elsewhere"] == len(expected) - len(mine)  # it says what the other one did
        with ProfileDB(db_path) as db:
            assert set(db.timings(provider="cpu", device_name=detect_device_name("cpu"))) == expected
            assert db.claimed_elsewhere(expected, provider="cpu", device_name=detect_device_name("cpu")) == set()


# --------------------------------------------------------------------------------------------------
# Which timings a plan uses, and what it is told about them.


class TestOpenMeasured:
    def _db(self, path, rows):
        with ProfileDB(path) as db:
            db.record(rows)

    def test_cpu_profile_for_a_gpu_cluster_names_the_cpu(self, tmp_path):
        path = tmp_path / "p.db"
        key = shard_spec(matmul_op(), {"m": 2}).key
        self._db(path, [_row(key, 2e-3, device="Some CPU (2 cores)")])
        found = open_measured(path, _graph(), cluster_device="a100-80gb")
        assert found.source.device_name == "Some CPU (2 cores)" and found.source.provider == "cpu"
        assert found.notes == (
            "timings measured on Some CPU (2 cores) (provider cpu), not on the cluster's a100-80gb: "
            "compute times are that device's",
        )
        assert found.fn(matmul_op(), {"m": 2}) == 2e-3
        assert found.fn(matmul_op(), {}) is None

    def test_the_clusters_device_is_preferred_and_others_are_noted(self, tmp_path):
        from objectives.torch_profile import call_signature, tensor_view, torch_call

        graph = _graph()
        call = torch_call(graph.ops[0], {"n": 2}, tensors=tensor_view(graph))
        gpu_key = call_signature(call, "bfloat16")
        cpu_rows = [_row(f"cpu{i}", 1.0, device="Some CPU (2 cores)") for i in range(3)]  # more rows...
        gpu = ProfileRow(signature=gpu_key, provider="torch-cuda", device_name="NVIDIA A100-SXM4-80GB",
                         median_s=3e-6, repeats=5, spread_s=0.0, measured_dtypes="bfloat16",
                         method="cuda-events", description="", created_unix=1.0, backward_median_s=7e-6)
        path = tmp_path / "p.db"
        self._db(path, cpu_rows + [gpu])
        found = open_measured(path, graph, cluster_device="a100-80gb")  # ... but the cluster's device wins
        assert (found.source.provider, found.source.device_name) == ("torch-cuda", "NVIDIA A100-SXM4-80GB")
        assert found.notes == ("unused timings in the profile database: 3 of cpu on Some CPU (2 cores)",)
        assert found.fn(graph.ops[0], {"n": 2}) == (3e-6, 7e-6)
        fp32 = open_measured(path, graph, cluster_device="a100-80gb", precision="fp32")
        assert fp32.notes[0] == "timings ran in bfloat16, the plan computes in fp32"
        on_h100 = open_measured(path, graph, cluster_device="h100-sxm")  # no match: the largest group
        assert on_h100.source.provider == "cpu" and "not on the cluster's h100-sxm" in on_h100.notes[0]

    def test_empty_database_and_missing_file(self, tmp_path):
        path = tmp_path / "p.db"
        ProfileDB(path).close()
        found = open_measured(path, _graph(), cluster_device="a100-80gb")
        assert found.source is None and found.fn(matmul_op(), {}) is None
        assert "holds no timings" in found.notes[0]
        with pytest.raises(InputError, match="no profile database"):
            open_measured(tmp_path / "none.db", _graph(), cluster_device="a100-80gb")
        with pytest.raises(InputError, match="has no timings of cuda"):
            open_measured(path, _graph(), cluster_device="a100-80gb", provider="cuda")

    def test_a_plan_on_a_gpu_cluster_with_a_cpu_profile_carries_the_note(self, tmp_path):
        from pathlib import Path

        from objectives.cluster import make_cluster
        from planner.plan import PlanRequest, build_model, load_graph

        graph = load_graph(Path(__file__).resolve().parents[1] / "data" / "gpt2_tiny.onnx", {"batch": 1, "seq": 8})
        spaces = [enumerate_configs(op, ConfigOptions(devices=2, devices_per_node=2)) for op in graph.ops]
        path = tmp_path / "p.db"
        with ProfileDB(path) as db:
            report = profile_graph(graph, spaces, db, repeats=1, warmup=0, max_shards=5)
        request = PlanRequest(cluster=make_cluster("a100-80gb", devices=2), cost_model="measured", profile_db=path)
        model = build_model(graph, request)
        assert (f"timings measured on {report.device_name} (provider cpu), not on the cluster's a100-80gb: "
                "compute times are that device's") in model.notes
        assert model.measured_configs > 0
        with pytest.raises(InputError, match="no profile database"):
            build_model(graph, PlanRequest(cluster=make_cluster("a100-80gb", devices=2), cost_model="measured",
                                           profile_db=tmp_path / "missing.db"))
        assert not (tmp_path / "missing.db").exists()


def test_json_report_of_the_cli(tmp_path):
    import json

    from tests.planner.cli_helpers import run_cli

    result = run_cli(["profile", "tests/data/gpt2_tiny.onnx", "--dim", "batch=1", "--dim", "seq=8", "--devices", "1",
                      "--repeats", "1", "--max-shards", "2", "--profile-db", tmp_path / "p.db", "--json", "--quiet"])
    (report,) = json.loads(result.stdout)
    assert (report["provider"], report["measured"], report["measured_elsewhere"]) == ("cpu", 2, 0)
    assert report["pending"] == report["shards"] - report["failed"] - 2
