"""The code stays ruff-clean (the rule families chosen in pyproject), ruff-formatted, and
mypy --strict clean, all of src/nsqpy (config in pyproject)."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent


def tool(name: str) -> str:
    path = BIN / name
    if not path.exists():
        found = shutil.which(name)
        if found is None:
            pytest.fail(f"{name} is not installed (it is a dev dependency: scripts/setup.sh)")
        return found
    return str(path)


@pytest.mark.timeout(120)
def test_ruff_clean():
    res = subprocess.run(
        [tool("ruff"), "check", "src", "tests", "bench"], cwd=ROOT, capture_output=True, text=True
    )
    assert res.returncode == 0, res.stdout + res.stderr


@pytest.mark.timeout(120)
def test_ruff_format_applied():
    res = subprocess.run(
        [tool("ruff"), "format", "--check", "src", "tests", "bench"], cwd=ROOT, capture_output=True, text=True
    )
    assert res.returncode == 0, res.stdout + res.stderr


@pytest.mark.timeout(300)
def test_mypy_strict():
    res = subprocess.run([tool("mypy")], cwd=ROOT, capture_output=True, text=True)
    assert res.returncode == 0, res.stdout + res.stderr
