"""Training across GPUs (issue #25): collectives over the links between GPUs, and later sharded memory
and the multi-GPU planner."""
