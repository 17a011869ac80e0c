"""Repeated-block detection on hand-built op graphs (module paths and structure)."""

from __future__ import annotations

from planner.core.graph import Edge, IterDim, Op, OpGraph, TensorAccess

from importers.blocks import find_blocks


def op(index: int, kind: str, path: str | None, size: int = 8) -> Op:
    return Op(
        name=f"op{index}",
        kind=kind,  # type: ignore[arg-type]
        op_type=kind,
        dims=(IterDim(name="d", size=size),),
        inputs=(TensorAccess(tensor=f"t{index - 1}", axes=(("d",),)),),
        outputs=(TensorAccess(tensor=f"t{index}", axes=(("d",),)),),
        flops=float(size),
        module_path=path,
    )


def chain(ops: list[Op]) -> OpGraph:
    edges = tuple(
        Edge(producer=i, consumer=i + 1, tensor=f"t{i}", producer_output=0, consumer_input=0) for i in range(len(ops) - 1)
    )
    return OpGraph(name="g", ops=tuple(ops), tensors={}, edges=edges)


class TestModulePaths:
    def test_transformer_layers(self):
        kinds = ["norm", "matmul", "softmax", "matmul"]
        ops = [op(0, "embedding", "embed")]
        for layer in range(3):
            ops += [op(len(ops), k, f"model.layers.{layer}.part{j}") for j, k in enumerate(kinds)]
        ops.append(op(len(ops), "matmul", "lm_head"))
        (group,) = find_blocks(chain(ops))
        assert group.name == "model.layers"
        assert group.instances == ((1, 2, 3, 4), (5, 6, 7, 8), (9, 10, 11, 12))

    def test_first_block_of_a_stage_differs(self):
        # ResNet: layer1.0 has a downsample conv; layer1.1 and layer1.2 are identical.
        ops = [op(0, "conv", "stem")]
        ops += [op(1, "conv", "layer1.0.conv1"), op(2, "conv", "layer1.0.downsample.0"), op(3, "elementwise", "layer1.0")]
        for block in (1, 2):
            ops += [op(len(ops), "conv", f"layer1.{block}.conv1"), op(len(ops) + 1, "elementwise", f"layer1.{block}")]
        (group,) = find_blocks(chain(ops))
        assert group.name == "layer1[1-2]"
        assert group.instances == ((4, 5), (6, 7))

    def test_outermost_numbered_component_names_the_instance(self):
        ops = [op(0, "embedding", None)]
        for block in range(2):
            for layer in range(2):
                ops.append(op(len(ops), "matmul", f"encoder.block.{block}.layer.{layer}.dense"))
        (group,) = find_blocks(chain(ops))
        assert group.name == "encoder.block" and group.instances == ((1, 2), (3, 4))

    def test_different_sizes_are_not_grouped(self):
        ops = [op(0, "matmul", "h.0", 8), op(1, "matmul", "h.1", 16)]
        assert find_blocks(chain(ops)) == ()


class TestStructural:
    def test_tandem_repeat_without_module_paths(self):
        kinds = ["norm", "matmul", "elementwise"]
        ops = [op(0, "embedding", None)]
        for _ in range(4):
            ops += [op(len(ops) + j, k, None) for j, k in enumerate(kinds)]
        ops.append(op(len(ops), "softmax", None))
        (group,) = find_blocks(chain(ops))
        assert len(group.instances) == 4 and len(group.instances[0]) == 3
        assert group.instances[1] == tuple(i + 3 for i in group.instances[0])

    def test_unconnected_repeats_are_not_blocks(self):
        ops = [op(i, k, None) for i, k in enumerate(["matmul", "norm"] * 3)]
        graph = OpGraph(name="g", ops=tuple(ops), tensors={}, edges=())
        assert find_blocks(graph) == ()
