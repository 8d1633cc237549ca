"""runtime/allocator.py: glibc keeps a training step's freed buffers mapped, so the next step does
not fault the same pages in again; the user's own choice (or TAIJI_MALLOC_TUNING=0) wins."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
from typing import Any

import pytest

from taiji.runtime import allocator

# after making a Job (or not): three "steps" of ten 10 MiB blocks allocated and freed (as activations
# are); prints how much of the freed memory glibc keeps for the next step (mallinfo2's free heap bytes)
STEPS = r"""
import ctypes, json, sys
import torch
import taiji
from taiji.runtime.allocator import applied
if sys.argv[1] == "job":  # what a training script does: make a Job
    data = torch.utils.data.TensorDataset(torch.randn(8, 2), torch.randn(8, 1))
    model = torch.nn.Linear(2, 1)
    taiji.Job(model, torch.optim.SGD(model.parameters(), lr=0.1), data, 4).close()
tuned = applied()
libc = ctypes.CDLL("libc.so.6")
class MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
                 "fordblks", "keepcost")]
libc.mallinfo2.restype = MallInfo2
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]
kept = []
for step in range(3):
    blocks = [libc.malloc(10 << 20) for _ in range(10)]
    for block in blocks:
        ctypes.memset(block, 1, 10 << 20)
    for block in blocks:
        libc.free(block)
    kept.append(libc.mallinfo2().fordblks)
print(json.dumps({"tuned": tuned, "kept_mib": [k / 2**20 for k in kept]}))
"""

glibc_only = pytest.mark.skipif(
    platform.system() != "Linux"
    or platform.libc_ver()[0] != "glibc"
    or tuple(int(x) for x in platform.libc_ver()[1].split(".")[:2]) < (2, 33),
    reason="the thresholds are glibc's (mallinfo2 since 2.33)",
)


def run_steps(mode: str, **env: str) -> dict[str, Any]:
    environ = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("MALLOC_") and k not in ("TAIJI_MALLOC_TUNING", "GLIBC_TUNABLES")
    }
    done = subprocess.run(
        [sys.executable, "-c", STEPS, mode],
        capture_output=True,
        text=True,
        timeout=120,
        env={**environ, **env},
        check=True,
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


@glibc_only
def test_freed_step_buffers_stay_mapped_for_the_next_step():
    default = run_steps("default")
    tuned = run_steps("job")
    assert default["tuned"] is False and tuned["tuned"] is True
    # glibc's defaults hand back all but at most 64 MiB of the 100 MiB (then fault it in again);
    # tuned, the heap keeps it for the next step
    assert max(default["kept_mib"]) < 70, default
    assert min(tuned["kept_mib"]) >= 95, tuned


@glibc_only
def test_the_users_choice_wins():
    off = run_steps("job", TAIJI_MALLOC_TUNING="0")
    assert off["tuned"] is False and max(off["kept_mib"]) < 70, off


def test_the_user_chooses_through_any_of_mallocs_settings():
    assert allocator.tuning_wanted({})
    assert not allocator.tuning_wanted({"TAIJI_MALLOC_TUNING": "0"})
    assert allocator.tuning_wanted({"TAIJI_MALLOC_TUNING": "1"})
    for name in ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_", "MALLOC_MMAP_MAX_"):
        assert not allocator.tuning_wanted({name: "65536"})
    assert not allocator.tuning_wanted({"GLIBC_TUNABLES": "glibc.malloc.trim_threshold=1000000"})
    assert allocator.tuning_wanted({"GLIBC_TUNABLES": "glibc.cpu.hwcaps=-AVX2"})
