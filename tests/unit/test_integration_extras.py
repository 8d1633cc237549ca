"""The framework integrations are optional extras (issue #39): taiji imports neither framework unless
its integration is imported, and an integration without its framework names the extra to install."""
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
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=str(REPO),
                          timeout=120).stdout.strip()


@pytest.mark.parametrize("integration,name,extra", [("lightning", "lightning", "taiji[lightning]"),
                                                    ("transformers", "transformers", "taiji[transformers]")])
def test_a_missing_framework_names_its_extra(integration, name, extra):
    assert extra in _run(_MISSING.format(name=name, integration=integration))


def test_taiji_imports_no_framework_unless_asked():
    assert _run(_UNUSED) == "[]"
