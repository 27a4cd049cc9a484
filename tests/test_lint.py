"""The library, the tests and the benchmarks are ruff clean (lint and format), and the
library's type hints check with mypy (configured in pyproject.toml)."""

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RUFF = Path(sys.executable).parent / "ruff"
MYPY = Path(sys.executable).parent / "mypy"
PATHS = ["lib", "tests", "benchmarks"]


def test_ruff_check():
    result = subprocess.run([RUFF, "check", *PATHS], cwd=REPO, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_ruff_format():
    result = subprocess.run(
        [RUFF, "format", "--check", *PATHS], cwd=REPO, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_mypy():
    result = subprocess.run([MYPY], cwd=REPO, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
