"""Metrics computed inside the training step from tensors the step already has."""

from .gns import GNSEstimator, two_batch_estimates
from .stats import ControlRow, StepStats

__all__ = ["GNSEstimator", "StepStats", "ControlRow", "two_batch_estimates"]
