"""planner: find the time/memory Pareto frontier of parallelization strategies for an ONNX model."""

__version__ = "0.1.0"
