"""TensorFlowOnSpark's ``TFSparkNode``: what its users import from it, the node context."""

from tfcoord.node.context import TFNodeContext

__all__ = ["TFNodeContext"]
