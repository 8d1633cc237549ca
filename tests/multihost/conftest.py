"""The emulated hosts every many-host test runs on (network namespaces, taiji_harness/netns.py)."""
import pytest

from taiji_harness.netns import EmulatedHosts, unavailable

WHY_NOT = unavailable()


@pytest.fixture
def hosts3():
    """Three emulated hosts; skipped, with the reason, where namespaces cannot be made."""
    if WHY_NOT:
        pytest.skip(f"no emulated hosts here: {WHY_NOT}")
    with EmulatedHosts(3) as hosts:
        yield hosts
