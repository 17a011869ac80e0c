"""Per-family op rules: one ONNX node -> its iteration space (:class:`RuleResult`).

``OP_RULES`` maps an op type (default ONNX domain; ``"domain:OpType"`` for other domains) to its
rule. :func:`apply_rule` looks a node up, runs the rule and never raises: an unknown op type, or a
rule that cannot read a malformed node, gives an ``opaque`` result with a warning.

Families: :mod:`.matmul`, :mod:`.conv`, :mod:`.elementwise`, :mod:`.norm`, :mod:`.reduce`,
:mod:`.gather`, :mod:`.views`, :mod:`.concat`, :mod:`.rnn`, :mod:`.pool`, :mod:`.loss`, :mod:`.opaque`.
"""

from __future__ import annotations

from importers.op_rules._base import (
    Axes,
    DimBuilder,
    NodeContext,
    Rule,
    RuleResult,
    axes_of,
    broadcast_axes,
    numel,
)
from importers.op_rules.concat import (
    concat_rule,
    pad_rule,
    shape_rule,
    slice_rule,
    source_rule,
    split_rule,
    tile_rule,
    trilu_rule,
)
from importers.op_rules.conv import conv_rule, conv_transpose_rule
from importers.op_rules.elementwise import ELEMENTWISE_OPS, elementwise_rule
from importers.embedding_bag import DOMAIN as _BAG_DOMAIN, EMBEDDING_BAG_OPS
from importers.op_rules.gather import (
    embedding_bag_rule,
    gather_elements_rule,
    gather_nd_rule,
    gather_rule,
    one_hot_rule,
    scatter_elements_rule,
    scatter_nd_rule,
)
from importers.op_rules.loss import nll_loss_rule, softmax_cross_entropy_rule
from importers.op_rules.matmul import einsum_rule, gemm_rule, matmul_rule
from importers.op_rules.norm import (
    batch_norm_rule,
    group_norm_rule,
    instance_norm_rule,
    layer_norm_rule,
    lp_norm_rule,
    mvn_rule,
    softmax_rule,
)
from importers.op_rules.opaque import opaque_rule
from importers.op_rules.pool import global_pool_rule, pool_rule, resize_rule
from importers.op_rules.reduce import REDUCE_OPS, arg_reduce_rule, cumsum_rule, reduce_rule, topk_rule
from importers.op_rules.rnn import rnn_rule
from importers.op_rules.views import VIEW_OPS, ViewMap, view_rule
from planner.core.errors import PlannerError

__all__ = [
    "OP_RULES",
    "apply_rule",
    "rule_for",
    "Axes",
    "DimBuilder",
    "NodeContext",
    "Rule",
    "RuleResult",
    "ViewMap",
    "axes_of",
    "broadcast_axes",
    "numel",
    "ELEMENTWISE_OPS",
    "REDUCE_OPS",
    "VIEW_OPS",
]


def _build_registry() -> dict[str, Rule]:
    rules: dict[str, Rule] = {}
    for op in ELEMENTWISE_OPS:
        rules[op] = elementwise_rule
    for op in REDUCE_OPS:
        rules[op] = reduce_rule
    for op in VIEW_OPS:
        rules[op] = view_rule
    rules.update(
        {
            "MatMul": matmul_rule,
            "MatMulInteger": matmul_rule,
            "Gemm": gemm_rule,
            "Einsum": einsum_rule,
            "Conv": conv_rule,
            "ConvTranspose": conv_transpose_rule,
            "MaxPool": pool_rule,
            "AveragePool": pool_rule,
            "LpPool": pool_rule,
            "GlobalAveragePool": global_pool_rule,
            "GlobalMaxPool": global_pool_rule,
            "GlobalLpPool": global_pool_rule,
            "Resize": resize_rule,
            "Upsample": resize_rule,
            "LayerNormalization": layer_norm_rule,
            "RMSNormalization": layer_norm_rule,
            "BatchNormalization": batch_norm_rule,
            "GroupNormalization": group_norm_rule,
            "InstanceNormalization": instance_norm_rule,
            "LpNormalization": lp_norm_rule,
            "MeanVarianceNormalization": mvn_rule,
            "Softmax": softmax_rule,
            "LogSoftmax": softmax_rule,
            "Hardmax": softmax_rule,
            "ArgMax": arg_reduce_rule,
            "ArgMin": arg_reduce_rule,
            "CumSum": cumsum_rule,
            "TopK": topk_rule,
            "Gather": gather_rule,
            "GatherElements": gather_elements_rule,
            "GatherND": gather_nd_rule,
            "ScatterND": scatter_nd_rule,
            "ScatterElements": scatter_elements_rule,
            "OneHot": one_hot_rule,
            "Concat": concat_rule,
            "Split": split_rule,
            "Slice": slice_rule,
            "Pad": pad_rule,
            "Tile": tile_rule,
            "Trilu": trilu_rule,
            "Shape": shape_rule,
            "Size": shape_rule,
            "Constant": source_rule,
            "ConstantOfShape": source_rule,
            "Range": source_rule,
            "EyeLike": source_rule,
            "RandomNormal": source_rule,
            "RandomUniform": source_rule,
            "RandomNormalLike": source_rule,
            "RandomUniformLike": source_rule,
            "SoftmaxCrossEntropyLoss": softmax_cross_entropy_rule,
            "NegativeLogLikelihoodLoss": nll_loss_rule,
            "LSTM": rnn_rule,
            "GRU": rnn_rule,
            "RNN": rnn_rule,
        }
    )
    # onnxruntime contrib ops that exporters and optimisers emit.
    for op in ("Gelu", "FastGelu", "BiasGelu", "QuickGelu"):
        rules[f"com.microsoft:{op}"] = elementwise_rule
    for op in ("SkipLayerNormalization", "SimplifiedLayerNormalization", "SkipSimplifiedLayerNormalization"):
        rules[f"com.microsoft:{op}"] = layer_norm_rule
    rules["SimplifiedLayerNormalization"] = layer_norm_rule
    # nn.EmbeddingBag, rewritten from the exporters' loops by importers.embedding_bag
    for op in EMBEDDING_BAG_OPS.values():
        rules[f"{_BAG_DOMAIN}:{op}"] = embedding_bag_rule
    return rules


OP_RULES: dict[str, Rule] = _build_registry()
"""Op type (``"domain:OpType"`` outside the default domain) -> rule."""


def rule_for(op_type: str, domain: str = "") -> Rule | None:
    """The rule of an op type, ``None`` when there is none.

    Examples
    --------
    >>> rule_for("MatMul").__name__, rule_for("Gelu", "com.microsoft").__name__, rule_for("Foo")
    ('matmul_rule', 'elementwise_rule', None)
    """
    if domain in ("", "ai.onnx"):
        return OP_RULES.get(op_type)
    return OP_RULES.get(f"{domain}:{op_type}")


def apply_rule(ctx: NodeContext) -> RuleResult:
    """Run the node's rule; unknown op types and unreadable nodes become ``opaque`` (never raises).

    Examples
    --------
    >>> apply_rule(NodeContext(name="x", op_type="NoSuchOp", output_shapes=((3,),))).kind
    'opaque'
    """
    rule = rule_for(ctx.op_type, ctx.domain)
    if rule is None:
        return opaque_rule(ctx)
    try:
        return rule(ctx)
    except PlannerError:
        raise  # the file is wrong (a product whose shapes cannot multiply): the user must know
    except Exception as error:  # a malformed node must not stop the import
        return opaque_rule(ctx, f"could not be analysed ({type(error).__name__}: {error})")
