"""taiji.sched.workload: the shipped Pollux workloads, reader errors that name file and line, and
the seeded synthetic generator."""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest

from taiji.errors import ConfigError
from taiji.sched.workload import (
    PHILLY_MIX,
    JobSpec,
    load_workload,
    pollux_workload,
    read_workload,
    synthetic_workload,
    workload_at_load,
)

HEADER = "name,time,application,num_replicas,batch_size\n"


def write(tmp_path: Path, body: str, name: str = "w.csv") -> Path:
    path = tmp_path / name
    path.write_text(HEADER + body)
    return path


def test_shipped_pollux_workloads_match_the_files():
    jobs = pollux_workload(6)
    assert len(jobs) == 160
    # workload-6.csv, first data rows: "cifar10-0,53,cifar10,6,2048", "deepspeech2-2,326,deepspeech2,8,320"
    assert jobs[0] == JobSpec("cifar10-0", 53.0, "cifar10", 6, 2048)
    assert jobs[2] == JobSpec("deepspeech2-2", 326.0, "deepspeech2", 8, 320)
    for index in range(1, 9):
        times = [job.submit_time for job in pollux_workload(index)]
        assert times == sorted(times) and 0 <= times[0] and times[-1] < 8 * 3600
    assert load_workload("pollux:3") == pollux_workload(3)


def test_plain_and_gzip_files_read_the_same(tmp_path):
    body = "a-0,5,ncf,1,32768\nb-1,3,bert,6,384\n"
    plain = write(tmp_path, body)
    packed = tmp_path / "w.csv.gz"
    packed.write_bytes(gzip.compress(plain.read_bytes()))
    assert read_workload(plain) == read_workload(packed)
    assert [job.name for job in read_workload(plain)] == ["b-1", "a-0"]  # sorted by time


@pytest.mark.parametrize(
    "body, line, words",
    [
        ("a,1,cifar10,6,2048\nb,2,gpt5,1,8\n", 3, "unknown application 'gpt5'"),
        ("a,1,cifar10,six,2048\n", 2, "'num_replicas' is 'six'"),
        ("a,soon,cifar10,6,2048\n", 2, "'time' is 'soon'"),
        ("a,1,cifar10,6\n", 2, "4 fields, expected 5"),
        ("a,1,cifar10,6,2048\na,2,cifar10,6,2048\n", 3, "repeats line 2"),
        ("a,-1,cifar10,6,2048\n", 2, "time >= 0"),
        ("a,1,cifar10,0,2048\n", 2, "num_replicas >= 1"),
        ("a,1,cifar10,6,nan\n", 2, "'batch_size' is 'nan'"),
        ("x,0,ncf,1,32768\na,nan,cifar10,6,2048\n", 3, "'time' is NaN"),
    ],
)
def test_malformed_rows_name_the_file_and_line(tmp_path, body, line, words):
    path = write(tmp_path, body)
    with pytest.raises(ConfigError) as error:
        read_workload(path)
    assert f"{path}:{line}:" in str(error.value)
    assert words in str(error.value)


def test_bad_headers_and_empty_files_are_named(tmp_path):
    missing = tmp_path / "m.csv"
    missing.write_text("name,time,application\nx,1,ncf\n")
    with pytest.raises(ConfigError, match=r"m\.csv:1: header lacks column\(s\) num_replicas, batch_size"):
        read_workload(missing)
    empty = tmp_path / "e.csv"
    empty.write_text("")
    with pytest.raises(ConfigError, match="e.csv: empty file"):
        read_workload(empty)
    with pytest.raises(ConfigError, match="no jobs"):
        read_workload(write(tmp_path, "\n"))
    with pytest.raises(ConfigError, match="cannot read"):
        read_workload(tmp_path / "absent.csv")
    with pytest.raises(ConfigError, match="1..8"):
        pollux_workload(9)
    with pytest.raises(ConfigError, match="pollux:1"):
        load_workload("pollux:x")


def test_synthetic_workloads_are_seeded_and_philly_shaped():
    first, again, other = synthetic_workload(7), synthetic_workload(7), synthetic_workload(8)
    assert first == again and first != other
    assert len(first) == 160
    times = [job.submit_time for job in first]
    assert times == sorted(times) and 0 <= times[0] and times[-1] <= 8 * 3600
    configs = {(app, n, b) for app, n, b, _ in PHILLY_MIX}
    assert all((job.application, job.num_replicas, job.batch_size) in configs for job in first)
    assert len({job.name for job in first}) == 160
    share_small = sum(job.application in ("ncf", "cifar10") for job in synthetic_workload(1, 2000)) / 2000
    assert 0.7 < share_small < 0.85  # 998 of the 1280 Pollux jobs are ncf or cifar10
    with pytest.raises(ConfigError):
        synthetic_workload(1, num_jobs=0)


def test_load_1_is_the_shipped_workload_unchanged():
    assert workload_at_load(6, 1.0) == pollux_workload(6)
    assert load_workload("pollux:6@1.0") == load_workload("pollux:6") == pollux_workload(6)


def test_load_2_is_a_seeded_reconstruction_with_twice_the_jobs_in_the_same_window():
    jobs = workload_at_load(6, 2.0)
    assert len(jobs) == 320 and len(workload_at_load(6, 0.5)) == 80
    times = [job.submit_time for job in jobs]
    assert times == sorted(times) and 0 <= times[0] and times[-1] < 8 * 3600
    assert workload_at_load(6, 2.0) == jobs == load_workload("pollux:6@2.0")
    assert workload_at_load(3, 2.0) != jobs
    configs = {(app, n, b) for app, n, b, _ in PHILLY_MIX}
    assert all((job.application, job.num_replicas, job.batch_size) in configs for job in jobs)


@pytest.mark.parametrize("load", [0.0, -1.0, float("nan"), float("inf"), 0.001])
def test_bad_loads_are_config_errors(load):
    with pytest.raises(ConfigError, match="relative job load"):
        workload_at_load(6, load)


def test_bad_load_specs_name_the_expected_form():
    with pytest.raises(ConfigError, match="pollux:6@2.0"):
        load_workload("pollux:6@twice")
    with pytest.raises(ConfigError, match="relative job load"):
        load_workload("pollux:6@0")
    with pytest.raises(ConfigError, match="1..8"):
        workload_at_load(9, 2.0)
