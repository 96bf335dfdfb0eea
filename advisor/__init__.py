"""gpu-advisor: predict training time, memory and cost of a PyTorch model on every GPU."""

__version__ = "0.1.0"
