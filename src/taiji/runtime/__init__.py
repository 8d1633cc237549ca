"""Inside a worker: membership, state, and the training loop."""
