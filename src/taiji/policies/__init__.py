"""Adaptation policies: read agreed metrics, return decisions the runtime applies at step boundaries."""

from .base import (
    Context,
    Decision,
    Metrics,
    Policy,
    PolicyError,
    Resize,
    ScaleLR,
    SetBatchSize,
    SetStrategy,
    SetTopology,
    Stop,
)
from .batch import BatchPerWorker, GNSBatchSize, GoodputBatchSize, gns_target_batch, goodput_target_batch
from .cluster import ScheduledResize, ThroughputScaling, parse_policy_names, parse_resize_schedule
from .lr import AdaScaleLR, LinearLRScaling, LRScaling, SqrtLRScaling, lr_scale
from .stop import EarlyStop
from .strategy import InterferenceSwitch, StrategyBySize
from .topology import AdaptiveTopology

__all__ = [
    "Context",
    "Decision",
    "Metrics",
    "Policy",
    "PolicyError",
    "Resize",
    "ScaleLR",
    "SetBatchSize",
    "SetStrategy",
    "SetTopology",
    "Stop",
    "InterferenceSwitch",
    "StrategyBySize",
    "AdaptiveTopology",
    "BatchPerWorker",
    "GNSBatchSize",
    "GoodputBatchSize",
    "gns_target_batch",
    "goodput_target_batch",
    "ScheduledResize",
    "ThroughputScaling",
    "parse_policy_names",
    "parse_resize_schedule",
    "AdaScaleLR",
    "LinearLRScaling",
    "LRScaling",
    "SqrtLRScaling",
    "lr_scale",
    "EarlyStop",
]
