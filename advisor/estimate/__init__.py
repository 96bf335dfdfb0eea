"""The estimator: time of a training step on every device, time-to-train, cost and ranking."""
