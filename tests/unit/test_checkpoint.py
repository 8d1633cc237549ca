"""Checkpoints: the pure schedule, layout and pruning; writing and reading parts (local disk and
an fsspec memory file system); a one-worker Job resumed bitwise; bad checkpoints refused."""

import errno
import json
import os
import threading

import pytest
import torch
import torch.nn.functional as F
from torch.utils.data import TensorDataset

import taiji
from taiji.checkpoint import layout
from taiji.checkpoint import writer as writer_mod
from taiji.checkpoint.config import Checkpoint, due, effective, parse_every
from taiji.checkpoint.layout import Listing, Manifest, TensorInfo, assign, model_differences, to_prune
from taiji.checkpoint.reader import export, find, load_tensors
from taiji.checkpoint.storage import Storage
from taiji.checkpoint.writer import Writer
from taiji.errors import CheckpointError, ConfigError
from taiji.runtime.peer import Peer

# -- pure decisions ------------------------------------------------------------------------


def test_interval_parsing():
    assert parse_every("10m") == (600.0, None) and parse_every("90s") == (90.0, None)
    assert (
        parse_every("2h") == (7200.0, None)
        and parse_every("500") == (None, 500)
        and parse_every(7) == (None, 7)
    )
    for bad in ("ten minutes", "1.5", "-3", "5d"):
        with pytest.raises(ConfigError):
            parse_every(bad)
    with pytest.raises(ConfigError):
        Checkpoint("/x", every="1m", steps=5)
    with pytest.raises(ConfigError):
        Checkpoint("/x", keep=0)
    with pytest.raises(ConfigError):
        Checkpoint("", resume="auto")


def test_due_by_steps_and_by_agreed_clock():
    assert [s for s in range(1, 13) if due(s, 0.0, 0, 0.0, (None, 4))] == [4, 8, 12]
    assert not due(8, 0.0, 8, 0.0, (None, 4)), "never twice at one step (e.g. a resumed checkpoint)"
    assert not due(3, 1000.0 + 59, 0, 1000.0, (60.0, None)) and due(3, 1000.0 + 60, 0, 1000.0, (60.0, None))
    assert not due(5, 1e9, 0, 0.0, (None, None)), "no interval: only the final checkpoint"


def test_assign_splits_bytes_evenly_and_deterministically():
    sizes = {"a": 100, "b": 60, "c": 50, "d": 10, "e": 0}
    owners = assign(sizes, 2)
    assert owners == assign(dict(reversed(list(sizes.items()))), 2), "order of the dict does not matter"
    load = [sum(sizes[k] for k, w in owners.items() if w == i) for i in range(2)]
    assert sorted(load) == [110, 110]
    assert set(assign(sizes, 1).values()) == {0}
    assert set(assign({"x": 5}, 3).values()) == {0}, "more writers than tensors: the rest write nothing"


def test_prune_keeps_the_newest_complete_and_everything_newer():
    listing = Listing.of([(10, True), (20, True), (25, False), (30, True), (40, False)])
    assert listing.latest == 30
    assert to_prune(listing, keep=2) == [10, 25], "old complete beyond keep, and abandoned incomplete ones"
    assert to_prune(listing, keep=1) == [10, 20, 25]
    assert to_prune(listing, keep=1, in_flight=(20,)) == [10, 25]
    assert to_prune(Listing.of([(5, False)]), keep=1) == [], "nothing complete yet: delete nothing"


def test_model_differences_name_each_difference():
    saved = {
        "w": TensorInfo((2, 3), "float32"),
        "b": TensorInfo((2,), "float32"),
        "old": TensorInfo((1,), "float32"),
    }
    now = {
        "w": TensorInfo((3, 3), "float32"),
        "b": TensorInfo((2,), "float64"),
        "new": TensorInfo((1,), "float32"),
    }
    diffs = model_differences(saved, now)
    assert any("old is in the checkpoint but not in the model" in d for d in diffs)
    assert any("new is in the model but not in the checkpoint" in d for d in diffs)
    assert any("w: shape [2, 3]" in d for d in diffs) and any("b: dtype float32" in d for d in diffs)


def test_newer_format_refused():
    data = Manifest(1, "x", 1, 1, 0.0, 1, {}, {}).to_json()
    data["format"] = layout.FORMAT + 1
    with pytest.raises(ConfigError, match="newer than this taiji reads"):
        Manifest.from_json(data)


def test_launcher_setting_is_the_default():
    launcher = Checkpoint("/ck", every="10m", resume="auto")
    assert effective(None, launcher) is launcher
    own = Checkpoint("/mine", steps=5)
    assert effective(own, launcher).path == "/mine" and effective(own, launcher).resume == "auto"
    assert effective(own, None) is own


# -- parts on storage ----------------------------------------------------------------------


def _manifest(step, parts, tensors, owners):
    return Manifest(
        layout.FORMAT,
        "test",
        step,
        parts,
        0.0,
        parts,
        {k[6:]: TensorInfo(tuple(t.shape), "float32") for k, t in tensors.items() if k.startswith("model.")},
        owners,
        state={"step": step},
    )


def _write(storage, step, tensors, writers=2):
    owners = assign({k: t.numel() * 4 for k, t in tensors.items()}, writers)
    for part in range(writers):
        mine = {k: t for k, t in tensors.items() if owners[k] == part}
        writer_mod.write_part(
            storage,
            step,
            part,
            writer_mod.stage(mine),
            _manifest(step, writers, tensors, owners) if part == 0 else None,
        )
    return owners


@pytest.mark.parametrize("root", ["local", "memory"])
def test_parts_round_trip_and_completeness(tmp_path, root):
    url = str(tmp_path / "ck") if root == "local" else f"memory://taiji-test-{os.getpid()}/ck"
    storage = Storage(url)
    storage.check_writable()
    tensors = {"model.w": torch.randn(4, 3), "model.b": torch.randn(3), "state.0": torch.arange(5.0)}
    _write(storage, 7, tensors)
    owners = assign({k: t.numel() * 4 for k, t in tensors.items()}, 2)  # step 9: writer 1 died mid-save
    writer_mod.write_part(
        storage, 9, 0, {k: t for k, t in tensors.items() if owners[k] == 0}, _manifest(9, 2, tensors, owners)
    )
    assert storage.listing() == Listing((7,), (9,))
    found = find(url)
    assert found.step == 7 and found.manifest.parts == 2
    targets = {k: torch.zeros_like(t) for k, t in tensors.items()}
    load_tensors(found, targets)
    assert all(torch.equal(targets[k], tensors[k]) for k in tensors)
    with pytest.raises(CheckpointError, match="incomplete"):
        find(storage.url_of(layout.checkpoint_name(9)))
    if root == "memory":
        storage.remove("")


def test_a_part_is_checksummed_once_by_its_digest_not_again_by_torch_save(tmp_path):
    """torch.save's per-record CRC-32 (never checked by torch.load) is off while a part is
    written, and the process-wide setting is as it was afterwards; the part still loads."""
    import io
    import zipfile

    storage = Storage(str(tmp_path / "ck"))
    tensors = {"model.w": torch.randn(64, 32), "state.0": torch.arange(50.0)}
    torch.serialization.set_crc32_options(True)
    _write(storage, 3, tensors)
    assert torch.serialization.get_crc32_options() is True
    rel = f"{layout.checkpoint_name(3)}/{layout.part_name(0)}"
    index = storage.read_json(f"{rel}/{layout.INDEX}")
    for key, (name, offset, length) in index.items():
        record = storage.read_ranges(f"{rel}/{name}", [(offset, length)])[0]
        crcs = {info.filename: info.CRC for info in zipfile.ZipFile(io.BytesIO(record)).infolist()}
        assert set(crcs.values()) == {0}, (key, crcs)
    targets = {k: torch.zeros_like(t) for k, t in tensors.items()}
    load_tensors(find(str(tmp_path / "ck")), targets)
    assert all(torch.equal(targets[k], tensors[k]) for k in tensors)


def test_a_dcp_that_returns_its_metadata_without_storage_data_still_indexes_every_tensor(
    tmp_path, monkeypatch
):
    """torch 2.11's FileSystemWriter records where each tensor went on a copy of the metadata, so
    ``dcp.save`` returns it without ``storage_data``: the part's index is read from what it wrote."""
    import dataclasses

    import torch.distributed.checkpoint as dcp

    real_save = dcp.save
    monkeypatch.setattr(
        dcp, "save", lambda *a, **kw: dataclasses.replace(real_save(*a, **kw), storage_data=None)
    )
    storage = Storage(str(tmp_path / "ck"))
    tensors = {"model.w": torch.randn(32, 32), "model.b": torch.randn(32)}
    _write(storage, 2, tensors, writers=1)
    index = storage.read_json(f"{layout.checkpoint_name(2)}/{layout.part_name(0)}/{layout.INDEX}")
    assert sorted(index) == sorted(tensors)
    targets = {k: torch.zeros_like(t) for k, t in tensors.items()}
    load_tensors(find(str(tmp_path / "ck")), targets)
    assert all(torch.equal(targets[k], tensors[k]) for k in tensors)


def test_missing_and_corrupt_checkpoints_refused(tmp_path):
    with pytest.raises(CheckpointError, match="the path does not exist"):
        find(str(tmp_path / "nowhere"))
    assert find(str(tmp_path / "nowhere"), missing_ok=True) is None
    storage = Storage(str(tmp_path / "ck"))
    tensors = {"model.w": torch.randn(64, 64), "model.b": torch.randn(64)}
    owners = _write(storage, 3, tensors)
    part = tmp_path / "ck" / layout.checkpoint_name(3) / layout.part_name(owners["model.w"])
    shard = max(part.glob("*.distcp"), key=lambda p: p.stat().st_size)
    data = bytearray(shard.read_bytes())
    original = bytes(data)
    data[len(data) // 2] ^= 0xFF  # one flipped byte inside the tensor's record
    shard.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="damaged"):
        load_tensors(find(str(tmp_path / "ck")), {k: torch.zeros_like(t) for k, t in tensors.items()})
    shard.write_bytes(original)
    digest = part / layout.DIGEST  # bytes changed in a way the file format itself cannot notice
    digest.write_text(json.dumps({**json.loads(digest.read_text()), "digest": "crc32:00000000"}))
    with pytest.raises(CheckpointError, match="do not match the digest"):
        load_tensors(find(str(tmp_path / "ck")), {k: torch.zeros_like(t) for k, t in tensors.items()})
    shard.write_bytes(bytes(data[:100]))  # truncated
    with pytest.raises(CheckpointError, match="cannot be read"):
        load_tensors(find(str(tmp_path / "ck")), {k: torch.zeros_like(t) for k, t in tensors.items()})


def test_unwritable_root_refused_at_start(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(ConfigError, match="cannot write checkpoints"):
        Storage(str(blocker / "ck")).check_writable()


def test_failed_write_keeps_the_previous_checkpoint(tmp_path, monkeypatch, caplog):
    storage = Storage(str(tmp_path))
    w = Writer(storage)
    t = {"model.w": torch.ones(3)}
    w.save(1, 0, t, _manifest(1, 1, t, {"model.w": 0}))
    assert w.wait()

    def full_disk(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(storage, "dcp_writer", full_disk)
    w.save(2, 0, t, _manifest(2, 1, t, {"model.w": 0}))
    assert w.wait() and w.failures == 1
    assert "No space left on device" in caplog.text and "previous complete checkpoint stays" in caplog.text
    assert storage.listing().latest == 1


# -- a Job ---------------------------------------------------------------------------------

DATA = TensorDataset(
    torch.randn(48, 4, generator=torch.Generator().manual_seed(0)),
    torch.randint(0, 2, (48,), generator=torch.Generator().manual_seed(1)),
)


def _model():
    torch.manual_seed(3)  # dropout draws from torch's RNG: a resumed run continues its stream bitwise
    return torch.nn.Sequential(
        torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Dropout(0.25), torch.nn.Linear(8, 2)
    )


def _train(checkpoint, max_steps, seen=None, run_dir=None):
    model = _model()
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=3, gamma=0.9)
    job = taiji.Job(
        model,
        opt,
        DATA,
        8,
        peer=Peer.solo(),
        log_every=0,
        epochs=3,
        max_steps=max_steps,
        lr_scheduler=sched,
        checkpoint=checkpoint,
        run_dir=run_dir,
    )
    for step in job:
        if seen is not None:
            seen.append((step.epoch, tuple(step.indices.tolist())))
        x, y = step.batch
        step.backward(F.cross_entropy(model(x), y))
    return model, opt, job


def test_job_resumed_at_a_checkpoint_ends_bitwise_equal(tmp_path):
    ref_seen = []
    ref, ref_opt, _ = _train(None, 14, ref_seen)
    root = str(tmp_path / "ck")
    seen = []
    _, _, first = _train(Checkpoint(root, steps=4, keep=2), 10, seen, run_dir=str(tmp_path / "run"))
    assert first.progress.step == 10
    assert Storage(root).listing().complete == (8, 10), "final checkpoint at the stop; keep=2 pruned step 4"
    (tmp_path / "ck" / layout.checkpoint_name(10)).rename(tmp_path / "lost")  # as if lost before it completed
    resumed_seen = []
    model, opt, job = _train(
        Checkpoint(root, steps=4, resume="auto"), 14, resumed_seen, run_dir=str(tmp_path / "run")
    )
    assert resumed_seen[0] == seen[8], "the sample order continues after the checkpoint's step"
    assert seen[:8] + resumed_seen == ref_seen, "exactly once after step 8; steps 9-10 retrained"
    assert all(torch.equal(a, b) for a, b in zip(ref.parameters(), model.parameters()))
    assert opt.state_dict()["state"][0]["step"] == ref_opt.state_dict()["state"][0]["step"]
    assert opt.param_groups[0]["lr"] == ref_opt.param_groups[0]["lr"], "the LR scheduler resumed too"
    events = [json.loads(line) for line in open(tmp_path / "run" / "events.jsonl")]
    resume = [e for e in events if e.get("event", e.get("kind")) == "resume"]
    assert resume and resume[0]["step"] == 8 and resume[0]["checkpoint"].endswith("step-00000008")
    assert resume[0]["lost_run_step"] == 10 and resume[0]["steps_redone"] == 2, resume[
        0
    ]  # the first run's records

    plain = _model()
    info = taiji.load_checkpoint(root, plain)
    assert info["step"] == 14 and all(
        torch.equal(a, b) for a, b in zip(plain.parameters(), model.parameters())
    )
    out = tmp_path / "one.pt"
    export(root, str(out))
    single = torch.load(out, weights_only=True)
    assert torch.equal(single["model"]["0.weight"], model[0].weight) and single["manifest"]["step"] == 14


def test_overlapped_staging_holds_the_committed_step_not_the_next_update(tmp_path, monkeypatch):
    """The writer thread stages parameters and optimizer state while the next step runs; it is
    held back until the step loop reaches its gate before the optimizer update (or, were there
    no gate, until that update is done): a checkpoint then holds step 4's state only if the
    update waited for the staging."""
    held, released = threading.Event(), threading.Event()
    real_stage, real_settle = writer_mod.stage, Writer.settle

    def held_stage(tensors, buffers=None):
        if threading.current_thread().name == "taiji-checkpoint-writer" and tensors:
            held.set()
            assert released.wait(30), "neither the gate nor the update came"
            held.clear()
            released.clear()
        return real_stage(tensors, buffers)

    def updated(*args):
        if held.is_set():
            released.set()

    def gate(self):
        released.set()
        return real_settle(self)

    monkeypatch.setattr(writer_mod, "stage", held_stage)
    monkeypatch.setattr(Writer, "settle", gate)
    ref, ref_opt, _ = _train(None, 4)
    root = str(tmp_path / "ck")
    model = _model()
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    opt.register_step_post_hook(updated)  # without a gate: staging after the update
    job = taiji.Job(
        model,
        opt,
        DATA,
        8,
        peer=Peer.solo(),
        log_every=0,
        epochs=3,
        max_steps=6,
        lr_scheduler=torch.optim.lr_scheduler.StepLR(opt, step_size=3, gamma=0.9),
        checkpoint=Checkpoint(root, steps=4),
        run_dir=str(tmp_path / "run"),
    )
    for step in job:
        x, y = step.batch
        step.backward(F.cross_entropy(model(x), y))
    assert Storage(root).listing().complete == (4, 6)
    loaded = _model()
    info = taiji.load_checkpoint(str(tmp_path / "ck" / layout.checkpoint_name(4)), loaded)
    assert all(torch.equal(a, b) for a, b in zip(ref.parameters(), loaded.parameters())), (
        "step 5's update leaked in"
    )
    saved, expected = info["optimizer"]["state"], ref_opt.state_dict()["state"]
    assert all(torch.equal(saved[i]["exp_avg"], expected[i]["exp_avg"]) for i in expected)
    events = [json.loads(line) for line in open(tmp_path / "run" / "events.jsonl")]
    saves = [e for e in events if e.get("event", e.get("kind")) == "checkpoint"]
    assert [e["step"] for e in saves] == [4, 6] and all(e["overlapped_bytes"] > 0 for e in saves), saves


def test_resume_into_another_model_names_the_differences(tmp_path):
    root = str(tmp_path / "ck")
    _train(Checkpoint(root), 2)
    other = torch.nn.Sequential(
        torch.nn.Linear(4, 16), torch.nn.ReLU(), torch.nn.Dropout(0.25), torch.nn.Linear(16, 2)
    )
    with pytest.raises(
        CheckpointError, match=r"another model: 0.bias: shape \[8\] in the checkpoint, \[16\]"
    ):
        taiji.load_checkpoint(root, other)
    with pytest.raises(CheckpointError, match="no complete checkpoint"):
        _train(Checkpoint(str(tmp_path / "empty"), resume=str(tmp_path / "empty")), 2)


def test_checkpoint_command_and_run_flags(tmp_path, capsys):
    from taiji.launch import checkpoint_cli
    from taiji.launch.parser import build_parser

    root = str(tmp_path / "ck")
    _train(Checkpoint(root), 3)
    assert checkpoint_cli.main(["show", root]) == 0
    assert "step-00000003: step 3, written by 1 worker(s) in 1 part(s)" in capsys.readouterr().out
    assert checkpoint_cli.main(["export", root, str(tmp_path / "m.pt")]) == 0
    assert torch.load(tmp_path / "m.pt", weights_only=True)["manifest"]["step"] == 3
    assert checkpoint_cli.main(["show", str(tmp_path / "none")]) == 2
    assert "no complete checkpoint" in capsys.readouterr().err

    def flags(*extra):
        return checkpoint_cli.parse_run_flags(
            build_parser().parse_args(["run", "-np", "1", *extra, "python", "x.py"])
        )

    parsed = flags("--checkpoint-dir", root, "--checkpoint-every", "5m", "--resume", "auto")
    assert parsed.directory == root and parsed.every == "5m" and parsed.resume == "auto"
    assert flags("--resume", root).resume == root
    for bad, says in [
        (("--resume", "auto"), "needs --checkpoint-dir"),
        (("--checkpoint-every", "5m"), "needs"),
        (("--checkpoint-dir", root, "--checkpoint-every", "soon"), "cannot read"),
        (("--resume", str(tmp_path / "none")), "no complete checkpoint"),
        (("--checkpoint-dir", str(tmp_path / "m.pt" / "x")), "cannot write checkpoints"),
    ]:
        with pytest.raises(ConfigError, match=says):
            flags(*bad)


def test_sigterm_to_a_plain_process_stops_after_the_step_with_a_final_checkpoint(tmp_path):
    import signal

    root = str(tmp_path / "ck")
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    before = signal.getsignal(signal.SIGTERM)
    job = taiji.Job(
        model, opt, DATA, 8, peer=Peer.solo(), log_every=0, epochs=50, checkpoint=Checkpoint(root, steps=100)
    )
    for step in job:
        x, y = step.batch
        step.backward(F.cross_entropy(model(x), y))
        if step.index == 4:
            os.kill(os.getpid(), signal.SIGTERM)  # the notice: handled between bytecodes, here
    assert job.progress.step == 5 and Storage(root).listing().complete == (5,)
    assert signal.getsignal(signal.SIGTERM) is before, "the Job gives SIGTERM back when it ends"


def test_taiji_optimizer_checkpoints_on_schedule_and_resumes(tmp_path):
    root = str(tmp_path / "ck")
    batches = [(DATA.tensors[0][i : i + 8], DATA.tensors[1][i : i + 8]) for i in range(0, 48, 8)]

    def run(checkpoint, upto):
        model = _model()
        opt = taiji.Optimizer(
            torch.optim.Adam(model.parameters(), lr=0.01), model, peer=Peer.solo(), checkpoint=checkpoint
        )
        for x, y in batches[opt.steps : upto]:  # the loop's data position follows opt.steps
            opt.zero_grad()
            F.cross_entropy(model(x), y).backward()
            assert opt.step()
        opt.close()
        return model, opt

    reference, _ = run(None, 6)
    _, first = run(Checkpoint(root, steps=2), 5)
    assert Storage(root).listing().complete == (2, 4)
    model, opt = run(Checkpoint(root, steps=2, resume="auto"), 6)
    assert opt.steps == 6 and all(
        torch.equal(a, b) for a, b in zip(reference.parameters(), model.parameters())
    )
    with pytest.raises(ConfigError, match="needs a checkpoint path"):
        run(None, 0)[1].save()


def test_job_checkpoints_to_an_fsspec_url_and_resumes_from_it():
    root = f"memory://taiji-job-{os.getpid()}/ck"
    ref, _, _ = _train(None, 8)
    _train(Checkpoint(root, steps=3), 6)
    assert Storage(root).listing().complete == (3, 6)
    model, _, job = _train(Checkpoint(root, resume="auto"), 8)
    assert job.progress.step == 8 and all(
        torch.equal(a, b) for a, b in zip(ref.parameters(), model.parameters())
    )
    Storage(root).remove("")


class FakeSupervisor:
    """What the launcher's signal path asks of its Supervisor, recorded."""

    def __init__(self):
        self.calls = []

    def running(self):
        return [object(), object()]

    def drain(self, signum, timeout):
        self.calls.append(("drain", signum, timeout))

    def stop_all(self, grace):
        self.calls.append(("stop_all", grace))


def test_launcher_signal_path_with_and_without_a_checkpoint_dir(tmp_path):
    import signal

    from taiji.checkpoint.config import NOTICE_SIGNAL
    from taiji.launch.checkpoint_cli import EXIT_RESUMABLE, stop_workers

    said, sup = [], FakeSupervisor()
    assert stop_workers(signal.SIGTERM, sup, "", 5.0, 60.0, said.append) == 128 + signal.SIGTERM
    assert sup.calls == [("stop_all", 5.0)] and "nothing was saved" in said[0]
    root = str(tmp_path / "ck")
    _train(Checkpoint(root), 2)
    said, sup = [], FakeSupervisor()
    assert stop_workers(signal.SIGTERM, sup, root, 5.0, 60.0, said.append) == EXIT_RESUMABLE
    assert sup.calls == [("drain", NOTICE_SIGNAL, 60.0), ("stop_all", 5.0)]
    assert f"resumable from {root}/step-00000002" in said[-1]
    said, sup = [], FakeSupervisor()
    assert stop_workers(signal.SIGINT, sup, root, 5.0, 60.0, said.append) == 128 + signal.SIGINT
    assert sup.calls == [("stop_all", 5.0)], "Ctrl-C stops at once, as before"


def test_a_worker_imports_dcp_only_when_it_saves(tmp_path):
    """torch.distributed.checkpoint (with DTensor, sympy, ...) costs a booting worker about a second
    of CPU: a job without checkpoints never imports it, nor does a worker resuming from one (it
    reads the tensors at the offsets each part's index gives); a part without an index (an older
    checkpoint) is read through DCP."""
    import subprocess
    import sys

    tensors = {"model.w": torch.randn(64, 64), "model.b": torch.randn(64), "state.0": torch.arange(3)}
    _write(Storage(str(tmp_path / "ck")), 5, tensors)
    torch.save(tensors, tmp_path / "expected.pt")
    code = (
        "import sys, torch, taiji, taiji.runtime.job, taiji.checkpoint.reader as r, taiji.checkpoint.writer; "
        f"expected = torch.load({str(tmp_path / 'expected.pt')!r}); "
        "targets = {k: torch.zeros_like(t) for k, t in expected.items()}; "
        f"r.load_tensors(r.find({str(tmp_path / 'ck')!r}), targets); "
        "assert all(torch.equal(targets[k], expected[k]) for k in expected), 'loaded wrong'; "
        "assert 'torch.distributed.checkpoint' not in sys.modules, 'imported at boot or to load'"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    for index in (tmp_path / "ck").glob(f"*/*/{layout.INDEX}"):
        index.unlink()
    targets = {k: torch.zeros_like(t) for k, t in tensors.items()}
    load_tensors(find(str(tmp_path / "ck")), targets)
    assert all(torch.equal(targets[k], tensors[k]) for k in tensors)


def test_the_launcher_checks_its_checkpoint_flags_without_importing_torch(tmp_path):
    """`taiji run --checkpoint-dir D --resume PATH` checks D and PATH before any worker starts; it
    must not make the launcher import torch first (seconds before the workers even start)."""
    import subprocess
    import sys

    _write(Storage(str(tmp_path / "ck")), 5, {"model.w": torch.randn(4)})
    code = (
        "import sys, argparse; from taiji.launch import checkpoint_cli as c; "
        f"ns = argparse.Namespace(checkpoint_dir={str(tmp_path / 'new')!r}, checkpoint_every='10', "
        f"resume={str(tmp_path / 'ck')!r}, checkpoint_grace=60.0); "
        f"assert c.parse_run_flags(ns).resume == {str(tmp_path / 'ck')!r}; "
        "assert 'torch' not in sys.modules, 'the launcher imported torch'"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
