"""Data plane: collectives between workers of one cluster version."""
