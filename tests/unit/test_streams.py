"""`make test`'s two streams (taiji_harness.streams): one exit status for both, and the marks that
split them."""
import pytest

from taiji_harness.streams import NO_TESTS, WAITS, combined
from taiji_harness.testing import REPO


@pytest.mark.parametrize("main, side, expected", [
    (0, 0, 0), (1, 0, 1), (0, 1, 1), (2, 1, 2), (NO_TESTS, 0, 0), (0, NO_TESTS, 0),
    (NO_TESTS, 1, 1), (NO_TESTS, NO_TESTS, NO_TESTS)])
def test_a_failure_in_either_stream_fails_the_run(main, side, expected):
    assert combined(main, side) == expected


def test_every_waiting_file_exists_and_only_those_wait(request):
    """A renamed file would silently leave the waiting stream (and run in the main one)."""
    missing = [path for path in WAITS if not (REPO / path).is_file()]
    assert not missing, f"taiji_harness.streams.WAITS names files that do not exist: {missing}"
    assert request.node.get_closest_marker("waits") is None
