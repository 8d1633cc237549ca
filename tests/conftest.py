"""Shared by every test directory (unit/, integration/, faults/, multihost/).

The test directories are not packages (no __init__.py): test module basenames are unique across
tests/, and pytest reports a clash. No test module imports another; shared helpers live in the
``taiji_harness`` package beside ``taiji`` (src/taiji_harness: ``testing``, ``netns``,
``injector``, and ``bench`` for the benchmarks), imported like any installed package; helper
worker scripts live in tests/scripts/ (load them with ``taiji_harness.testing.load_script``;
benchmarks/soak.py runs tests/scripts/elastic_train.py too).
"""

import os

import pytest

from taiji_harness.results import RESULTS_ENV
from taiji_harness.streams import waits

# a benchmark run by a test (benchmarks/soak.py, print_result in the unit tests) records nothing in
# benchmarks/results/: those files are the figures the docs show
os.environ[RESULTS_ENV] = ""


def pytest_collection_modifyitems(config, items):
    """Mark `waits` the tests of taiji_harness.streams.WAITS: `make test` runs them beside the rest."""
    for item in items:
        if waits(item.nodeid):
            item.add_marker(pytest.mark.waits)


def pytest_configure(config):
    """The tests' own torch computations (the 1-worker reference trajectory of an audit, ranks run
    as threads) use one intra-op thread. On a busy 2-core machine two OpenMP threads per process
    spin against the workers a test launched and the other stream's: the reference of a 638-step
    audit took 27 s with two threads and 0.6 s with one, and ended within 5e-16 of it (the audit allows
    1e-9; the workers of a 2-worker job on 2 cores run one thread each, launch/worker_env.py). Only
    this process's setting: the environment of the processes a test starts is unchanged."""
    import torch

    torch.set_num_threads(1)
