"""The conda environment and the pip set-up install the same pinned versions."""

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _pins(lines: list[str]) -> dict[str, str]:
    pins = {}
    for line in lines:
        match = re.fullmatch(r"\s*(?:-\s+)?([A-Za-z0-9_.\-]+)==([^\s#]+)\s*", line)
        if match:
            pins[match.group(1).lower().replace("_", "-")] = match.group(2)
    return pins


def test_environment_yml_pins_equal_requirements_and_torch():
    conda = _pins((REPO / "environment.yml").read_text().splitlines())
    pip = _pins((REPO / "requirements.txt").read_text().splitlines())
    torch = re.search(r"^TORCH_VERSION := (\S+)$", (REPO / "Makefile").read_text(), re.M)
    assert torch is not None
    assert conda.pop("torch") == torch.group(1)
    assert conda == pip


def test_lock_agrees_with_top_level_pins():
    lock = _pins((REPO / "requirements.lock").read_text().splitlines())
    pip = _pins((REPO / "requirements.txt").read_text().splitlines())
    for name, version in pip.items():
        assert lock.get(name) == version, (
            f"{name}: requirements.txt {version}, lock {lock.get(name)}"
        )


def test_installed_versions_match_the_pins():
    from importlib.metadata import version

    import torch

    for name, pinned in _pins((REPO / "requirements.txt").read_text().splitlines()).items():
        assert version(name) == pinned, name
    assert torch.__version__.split("+")[0] == re.search(
        r"^TORCH_VERSION := (\S+)$", (REPO / "Makefile").read_text(), re.M
    ).group(1)
