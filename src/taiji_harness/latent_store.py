"""A real store made slow: every write takes a fixed delay, as across a slow network (etcd on a loaded
host), so that a test can tell a rendezvous paid from one built ahead. Shared by tests/unit."""

from __future__ import annotations

import time

import torch.distributed as dist


class LatentStore(dist.Store):
    """A real store whose every write takes ``delay`` seconds, as a store across a slow network
    does (etcd on a loaded host): a group's rendezvous costs at least one ``delay``."""

    def __init__(self, inner, delay: float):
        super().__init__()
        self.inner, self.delay = inner, delay

    def set(self, key, value):
        time.sleep(self.delay)
        self.inner.set(key, value)

    def get(self, key):
        return self.inner.get(key)

    def wait(self, keys, timeout=None):
        return self.inner.wait(keys) if timeout is None else self.inner.wait(keys, timeout)

    def check(self, keys):
        return self.inner.check(keys)

    def add(self, key, value):
        return self.inner.add(key, value)

    def set_timeout(self, timeout):
        self.inner.set_timeout(timeout)

    def clone(self):
        return LatentStore(self.inner.clone(), self.delay)
