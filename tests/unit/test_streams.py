"""`make test`'s two streams (taiji_harness.streams): one exit status for both, and the marks that
split them."""

from pathlib import Path

import pytest

from taiji_harness.streams import MAIN_ORDER, NO_TESTS, WAITS, combined, main_paths, waits
from taiji_harness.testing import REPO


@pytest.mark.parametrize(
    "main, side, expected",
    [
        (0, 0, 0),
        (1, 0, 1),
        (0, 1, 1),
        (2, 1, 2),
        (NO_TESTS, 0, 0),
        (0, NO_TESTS, 0),
        (NO_TESTS, 1, 1),
        (NO_TESTS, NO_TESTS, NO_TESTS),
    ],
)
def test_a_failure_in_either_stream_fails_the_run(main, side, expected):
    assert combined(main, side) == expected


def test_every_waiting_file_and_test_exists_and_only_those_wait(request):
    """A renamed file or test would silently leave the waiting stream (and run in the main one)."""
    missing = [
        entry
        for entry in WAITS
        if not (REPO / entry.split("::")[0]).is_file()
        or "::" in entry
        and f"def {entry.split('::')[1]}(" not in (REPO / entry.split("::")[0]).read_text()
    ]
    assert not missing, f"taiji_harness.streams.WAITS names files or tests that do not exist: {missing}"
    assert request.node.get_closest_marker("waits") is None
    assert waits(
        "tests/integration/test_docs.py::test_a_page_loads_in_chromium_without_console_errors[index.html]"
    )
    assert waits("tests/integration/test_launcher.py::test_signal_to_launcher_stops_all_workers[SIGINT]")
    assert not waits("tests/integration/test_launcher.py::test_an_exited_workers_grandchild_is_not_orphaned")


def test_the_main_stream_runs_the_pure_tests_first_unless_tests_are_named():
    assert main_paths(["-q", "-p", "no:cacheprovider", "--durations=40"]) == list(MAIN_ORDER)
    assert MAIN_ORDER[0] == str(REPO / "tests" / "unit") and all(Path(path).is_dir() for path in MAIN_ORDER)
    assert {
        p.name
        for p in (REPO / "tests").iterdir()
        if p.is_dir() and p.name.startswith(("unit", "faults", "integration", "multihost", "gpu"))
    } == {Path(path).name for path in MAIN_ORDER}
    assert main_paths(["-q", str(REPO / "tests/unit/test_streams.py") + "::test_x"]) == []
