"""The run-log audit (tests/scripts/elastic_train.py's ``audit``) tells a dropped worker's last,
raced commit (an orphan) from a divergence of the replicas that go on."""

import json

from taiji_harness.testing import load_script


def _write(out, worker, records):
    (out / f"{worker}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))


def _rec(step, version, digest, size):
    return {
        "step": step,
        "version": version,
        "digest": digest,
        "epoch": 0,
        "span": [4 * step, 4 * step + 4],
        "size": size,
    }


def _audit(out):
    return load_script("elastic_train").audit(out, 4, num_samples=64)


def test_a_dropped_workers_last_commit_of_a_redone_step_is_an_orphan(tmp_path):
    for w in ("w0", "w1"):
        _write(tmp_path, w, [_rec(0, 1, "a", 3), _rec(1, 1, "b", 3), _rec(2, 2, "c2", 2), _rec(3, 2, "d", 2)])
    _write(tmp_path, "w2", [_rec(0, 1, "a", 3), _rec(1, 1, "b", 3), _rec(2, 1, "c1", 3)])  # raced the drop
    result = _audit(tmp_path)
    assert result["divergences"] == [] and result["orphans"] == [("w2", 2)]
    assert result["sizes"] == [3, 2] and result["duplicated_samples"] == 0


def test_a_survivor_committing_a_step_twice_or_a_dropped_worker_going_on_is_a_divergence(tmp_path):
    _write(tmp_path, "w0", [_rec(0, 1, "a", 2), _rec(1, 1, "b1", 2), _rec(1, 2, "b2", 1), _rec(2, 2, "c", 1)])
    _write(tmp_path, "w1", [_rec(0, 1, "a", 2), _rec(1, 1, "b1", 2)])
    assert _audit(tmp_path)["divergences"] == [1], "w0 is among the newer version's committers"
    _write(tmp_path, "w0", [_rec(0, 1, "a", 2), _rec(1, 2, "b2", 1), _rec(2, 2, "c", 1)])
    _write(tmp_path, "w1", [_rec(0, 1, "a", 2), _rec(1, 1, "b1", 2), _rec(2, 1, "c1", 2)])
    result = _audit(tmp_path)
    assert result["divergences"] == [1], "w1's step 1 was not its last: not an orphan"
    assert result["orphans"] == [("w1", 2)]
