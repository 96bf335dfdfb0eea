"""Model profiling: per-op cost registry (costs) and the training-step trace on fake tensors (trace)."""
