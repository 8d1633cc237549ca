"""Exactly-once elastic sampling and real data sets."""

from .datasets import load_fashion_mnist, load_idx_classification
from .sampler import ElasticSampler, SamplerState

__all__ = ["ElasticSampler", "SamplerState", "load_fashion_mnist", "load_idx_classification"]
