"""The start page's installation check: each probe on controlled inputs, then the real thing."""

from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
from chainrule.course.install_check import (
    Check,
    GpuInfo,
    InstallReport,
    check_imports,
    disabled_lab_extensions,
    gpu_info,
    lab_extension_checks,
    package_versions,
    restart_hint_check,
    run_install_check,
)


def _report(backends=("sim", "gloo"), gpu=None, versions=None, imports=(), extensions=()):
    return InstallReport(
        python="3.11.0",
        versions={"numpy": "2.0"} if versions is None else versions,
        imports=tuple(imports),
        backends=tuple(backends),
        gpu=GpuInfo(True, False) if gpu is None else gpu,
        extensions=tuple(extensions),
    )


def test_package_versions_reads_installed_metadata():
    versions = package_versions(["numpy", "surely-not-a-real-distribution"])
    assert versions["numpy"] == np.__version__
    assert versions["surely-not-a-real-distribution"] is None


def test_check_imports_reports_failures_with_their_error(tmp_path, monkeypatch):
    (tmp_path / "broken_course_module.py").write_text("raise RuntimeError('half installed')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    checks = check_imports(["json", "broken_course_module", "no_such_module_here"])
    assert [c.ok for c in checks] == [True, False, False]
    assert checks[1].detail == "RuntimeError: half installed"
    assert checks[2].detail.startswith("ModuleNotFoundError")


def test_lab_extensions_found_missing_and_disabled(tmp_path):
    data = tmp_path / "share" / "labextensions"
    for name in ("@scope/present", "@scope/switched-off"):
        (data / name).mkdir(parents=True)
        (data / name / "package.json").write_text("{}")
    (data / "@scope" / "no-package-json").mkdir()
    config = tmp_path / "etc"
    (config / "labconfig").mkdir(parents=True)
    (config / "labconfig" / "page_config.json").write_text(
        json.dumps({"disabledExtensions": {"@scope/switched-off": True, "@scope/present": False}})
    )
    required = {
        "@scope/present": "p",
        "@scope/switched-off": "s",
        "@scope/no-package-json": "n",
        "@scope/absent": "a",
    }
    checks = lab_extension_checks(required, data_dirs=[data], config_dirs=[config])
    assert [(c.name, c.ok) for c in checks] == [
        ("@scope/present", True),
        ("@scope/switched-off", False),
        ("@scope/no-package-json", False),
        ("@scope/absent", False),
    ]
    assert "disabled" in checks[1].detail and "not installed" in checks[3].detail


def test_disabled_extensions_accepts_the_list_form_and_ignores_bad_files(tmp_path):
    good, bad = tmp_path / "good", tmp_path / "bad"
    for folder in (good, bad):
        (folder / "labconfig").mkdir(parents=True)
    (good / "labconfig" / "page_config.json").write_text('{"disabledExtensions": ["@a/b"]}')
    (bad / "labconfig" / "page_config.json").write_text("not json")
    assert disabled_lab_extensions([good, bad, tmp_path / "missing"]) == {"@a/b"}


def test_restart_hint_check_loaded_configured_or_missing(tmp_path):
    shell = SimpleNamespace(
        extension_manager=SimpleNamespace(loaded={"chainrule.course.restart_hint"})
    )
    assert restart_hint_check(shell=shell, prefix=tmp_path).ok

    bare = SimpleNamespace(extension_manager=SimpleNamespace(loaded=set()))
    assert not restart_hint_check(shell=bare, prefix=tmp_path).ok

    config = tmp_path / "etc" / "ipython"
    config.mkdir(parents=True)
    (config / "ipython_kernel_config.py").write_text(
        'c.InteractiveShellApp.extensions = ["chainrule.course.restart_hint"]\n'
    )
    check = restart_hint_check(shell=bare, prefix=tmp_path)
    assert check.ok and "ipython_kernel_config.py" in check.detail


def test_gpu_info_agrees_with_torch():
    import torch

    info = gpu_info()
    assert info.torch_installed
    assert info.cuda_available == torch.cuda.is_available()
    assert info.count == (torch.cuda.device_count() if info.cuda_available else 0)


def test_backend_note_says_what_replaces_nccl():
    cpu = _report(backends=("sim", "gloo"))
    assert "No GPU" in cpu.backend_note and "gloo" in cpu.backend_note
    assert "gloo" not in _report(backends=("sim",)).backend_note
    gpu = _report(backends=("sim", "gloo", "nccl"), gpu=GpuInfo(True, True, ("H100", "H100")))
    assert "2 GPU(s)" in gpu.backend_note and "NCCL" in gpu.backend_note
    for report in (cpu, gpu):  # the start page says the note once, after the report
        assert report.backend_note not in report.to_markdown()


def test_problems_and_markdown_list_what_is_missing():
    healthy = _report(
        imports=[Check("chainrule.engine.ops", True)], extensions=[Check("x", True, "d")]
    )
    assert healthy.ok and healthy.to_markdown().startswith("**Everything is installed.**")
    broken = _report(
        versions={"numpy": "2.0", "nbgrader": None},
        imports=[Check("chainrule.course.graph", False, "ImportError: boom")],
        extensions=[Check("@jupyter/nbgrader", False, "not installed")],
    )
    assert not broken.ok
    assert broken.problems == [
        "package nbgrader is not installed",
        "chainrule.course.graph failed: ImportError: boom",
        "@jupyter/nbgrader: not installed",
    ]
    text = broken.to_markdown()
    assert "| nbgrader | not installed |" in text and "no: ImportError: boom" in text


def test_run_install_check_on_this_machine():
    report = run_install_check()
    assert report.versions["numpy"] == np.__version__
    assert "sim" in report.backends
    names = [c.name for c in report.imports]
    assert "chainrule.engine.ops" in names and "chainrule.dist.available_backends()" in names
    assert {c.name for c in report.extensions} >= {"@jupyter/nbgrader", "kernel-restart hint"}
    assert report._repr_markdown_() == report.to_markdown()
