"""The framework integrations are optional extras (issue #39): taiji imports neither framework unless
its integration is imported, and an integration without its framework names the extra to install.
The state a framework's checkpoint carries of taiji's resumes a Job where its data stood."""

from __future__ import annotations

import subprocess
import sys

import pytest

from taiji_harness.testing import REPO

# each runs in a fresh interpreter: the framework must not be imported already
_MISSING = """
import sys
sys.modules[{name!r}] = None  # as if not installed
try:
    import taiji.integrations.{integration}
except ImportError as exc:
    print(exc)
"""
_UNUSED = """
import sys
import taiji, taiji.integrations, taiji.integrations.loop
taiji.Job, taiji.Optimizer
print(sorted(m for m in ("lightning", "transformers", "accelerate") if m in sys.modules))
"""


def _run(code: str) -> str:
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=str(REPO), timeout=120
    ).stdout.strip()


@pytest.mark.parametrize(
    "integration,name,extra",
    [("lightning", "lightning", "taiji[lightning]"), ("transformers", "transformers", "taiji[transformers]")],
)
def test_a_missing_framework_names_its_extra(integration, name, extra):
    assert extra in _run(_MISSING.format(name=name, integration=integration))


def test_taiji_imports_no_framework_unless_asked():
    assert _run(_UNUSED) == "[]"


def _loop(resume=None):
    import torch
    from torch.utils.data import TensorDataset

    import taiji
    from taiji.integrations.loop import FrameworkLoop
    from taiji.runtime.peer import Peer

    torch.manual_seed(0)
    data = TensorDataset(torch.arange(11.0).unsqueeze(1), torch.arange(11) % 2)
    model = torch.nn.Linear(1, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)

    def make_job():
        return taiji.Job(
            model,
            opt,
            data,
            4,
            epochs=3,
            peer=Peer.solo(),
            policies=[taiji.policies.LRScaling()],
            monitoring=taiji.MonitorOptions(log_every=0, run_dir=""),
        )

    return FrameworkLoop(make_job, len(data), None, resume=resume), model


def _train(loop, model, stop_after=None):
    """What a framework's step does with the loop: forward, backward, finish; the indices per step."""
    import torch.nn.functional as F

    seen = {}
    loop.start()
    while loop.step is not None and (stop_after is None or len(seen) < stop_after):
        x, y = loop.batch
        seen[loop.step.index] = loop.step.indices.tolist()
        loop.step.backward(F.cross_entropy(model(x), y))
        loop.finish()
    return seen


def test_a_framework_checkpoint_s_taiji_state_resumes_the_job_where_its_data_stood(tmp_path):
    import torch

    from taiji.errors import ConfigError
    from taiji.integrations.loop import check_one_resume, saved_state

    first, model = _loop()
    before = _train(first, model, stop_after=4)
    torch.save(saved_state(first.job, 1), tmp_path / "state.pt")  # as inside a framework's checkpoint
    weights = {k: v.clone() for k, v in model.state_dict().items()}
    before.update(_train(first, model))
    first.job.close()

    saved = torch.load(tmp_path / "state.pt", weights_only=True)  # what the frameworks load back
    progress = saved["state"]["progress"]
    assert saved["step"] == 4 and (progress["epoch"], progress["cursor"]) == (
        1,
        4,
    )  # 11 samples: 4+4+3, then 4
    second, model = _loop(resume=saved)
    model.load_state_dict(weights)  # the framework's own part
    after = _train(second, model)
    assert min(after) == 4 and after == {s: i for s, i in before.items() if s >= 4}, (
        "the same order, exactly once"
    )
    assert second.job.progress.step == first.job.progress.step

    with pytest.raises(ConfigError, match="format"):
        _train(_loop(resume=dict(saved, format=99))[0], model)
    import taiji

    with pytest.raises(ConfigError, match="one checkpoint"):
        check_one_resume(
            taiji.FaultOptions(checkpoint=taiji.Checkpoint(str(tmp_path / "ck"), resume="auto")),
            "ckpt_path='x'",
        )
    check_one_resume(taiji.FaultOptions(checkpoint=taiji.Checkpoint(str(tmp_path / "ck"))), "ckpt_path='x'")
