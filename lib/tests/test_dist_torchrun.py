"""The torchrun example runs as two real processes on gloo and agrees with the simulated world."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from chainrule import dist

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "torchrun_data_parallel.py"
OPTIONS = {"steps": 30, "batch": 8, "lr": 0.05, "seed": 3}

pytestmark = pytest.mark.skipif(
    not dist.is_available("gloo"), reason="torch.distributed with gloo is not available"
)


def load_example():
    spec = importlib.util.spec_from_file_location("torchrun_data_parallel", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
def test_torchrun_with_two_gloo_processes_matches_the_simulated_world(tmp_path):
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node=2",
        str(EXAMPLE),
        "--backend",
        "gloo",
        *(f"--{key}={value}" for key, value in OPTIONS.items()),
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=180, cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert len(lines) == 1, done.stdout  # printed by rank 0 only
    result = json.loads(lines[0].removeprefix("RESULT "))
    assert result["world_size"] == 2 and result["replicas_agree"]

    simulated = dist.run(load_example().train, 2, kwargs=OPTIONS)
    assert simulated[0]["replicas_agree"]
    # Two ranks: the all-reduce is a + b on both backends, so the numbers agree bit for bit.
    assert result["weights"] == simulated[0]["weights"]
    assert result["loss"] == simulated[0]["loss"]
    np.testing.assert_allclose(result["weights"], load_example().TRUE_WEIGHTS, atol=0.2)
