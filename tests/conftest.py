"""Shared by every test directory (unit/, integration/, faults/): puts tests/ on sys.path, so a
test module anywhere below imports the harness as ``from _harness import ...`` — also when it is
run alone (``pytest tests/unit/test_x.py``) and under ``--import-mode=importlib``.

The test directories are not packages (no __init__.py): test module basenames are unique across
tests/, and pytest reports a clash. No test module imports another; shared helpers live in
tests/_harness.py, helper worker scripts in tests/scripts/ (load them with
``_harness.load_script``; benchmarks/soak.py runs tests/scripts/elastic_train.py too).
"""
import sys
from pathlib import Path

TESTS = str(Path(__file__).resolve().parent)
if TESTS not in sys.path:
    sys.path.insert(0, TESTS)
