"""The CPU's side of training (issue #27): the input pipeline timed on this machine, and the samples per
second a GPU's host supplies against those the GPU consumes."""
