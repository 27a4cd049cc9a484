"""What the start page checks before the course begins: is everything installed and working?

:func:`run_install_check` gathers, without starting any worker process:

- the versions of the packages the course uses (Python, numpy, torch, JupyterLab, nbgrader, ...);
- whether every course module imports (``chainrule.engine.ops``, ``chainrule.dist``, ...), with the
  error text when one does not;
- which collective backends work here (``chainrule.dist.available_backends()``): ``sim``
  always, ``gloo`` with torch, ``nccl`` with CUDA GPUs;
- whether torch sees a GPU; without one the lessons use the simulated world and gloo;
- whether JupyterLab's nbgrader extension (Validate button, Assignment List) and the widget
  manager (the lessons' sliders) are installed and not disabled, and whether the kernel
  restart hint (:mod:`chainrule.course.restart_hint`) is switched on.

The result is an :class:`InstallReport`; in a notebook it renders itself as Markdown, and its
:attr:`~InstallReport.backend_note` says in one sentence which backends the lessons will use.
"""

from __future__ import annotations

import importlib
import json
import platform
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

PACKAGES: tuple[str, ...] = (
    "chainrule",
    "numpy",
    "torch",
    "matplotlib",
    "ipywidgets",
    "jupyterlab",
    "nbgrader",
    "ipykernel",
)

COURSE_MODULES: tuple[str, ...] = (
    "chainrule.engine.ops",
    "chainrule.engine.gradcheck",
    "chainrule.engine.layers",
    "chainrule.costs.chain_cost",
    "chainrule.course.graph",
    "chainrule.dist",
    "chainrule.parallel.duality",
    "chainrule.parallel.data_parallel",
    "chainrule.parallel.tensor_parallel",
    "chainrule.course.restart_hint",
)

LAB_EXTENSIONS: dict[str, str] = {
    "@jupyter/nbgrader": "nbgrader: the Validate button and the Assignment List",
    "@jupyter-widgets/jupyterlab-manager": "ipywidgets: the lessons' sliders",
}

HINT_EXTENSION = "chainrule.course.restart_hint"


@dataclass(frozen=True)
class Check:
    """One yes/no check with a line of detail (a version, a path, an error message)."""

    name: str
    ok: bool
    detail: str = ""


@dataclass(frozen=True)
class GpuInfo:
    """What torch reports about CUDA devices (``torch_installed`` False: nothing known)."""

    torch_installed: bool
    cuda_available: bool
    device_names: tuple[str, ...] = ()

    @property
    def count(self) -> int:
        return len(self.device_names)


@dataclass(frozen=True)
class InstallReport:
    """Everything :func:`run_install_check` found. ``ok`` is True when nothing is missing."""

    python: str
    versions: dict[str, str | None]
    imports: tuple[Check, ...]
    backends: tuple[str, ...]
    gpu: GpuInfo
    extensions: tuple[Check, ...]

    @property
    def problems(self) -> list[str]:
        """One line per missing package, failed import or missing extension."""
        lines = [f"package {name} is not installed" for name, v in self.versions.items() if not v]
        lines += [f"{c.name} failed: {c.detail}" for c in self.imports if not c.ok]
        lines += [f"{c.name}: {c.detail}" for c in self.extensions if not c.ok]
        return lines

    @property
    def ok(self) -> bool:
        return not self.problems

    @property
    def backend_note(self) -> str:
        """Which backend the lessons' collectives run on, in one sentence."""
        if "nccl" in self.backends:
            return (
                f"{self.gpu.count} GPU(s) found: collectives can run on NCCL "
                '(`backend="nccl"` or `"auto"`); the lessons use the simulated world by default.'
            )
        torch_part = (
            " and on torch.distributed's gloo backend (one process per rank, CPU)"
            if "gloo" in self.backends
            else ""
        )
        return (
            "No GPU here: the lessons run collectives on the simulated world "
            f'(`backend="sim"`, ranks taking turns in one process){torch_part} instead of NCCL.'
        )

    def to_markdown(self) -> str:
        """The report as Markdown: a status line, the backends and GPUs found, then tables of
        versions, imports, extensions. What the backends mean for the lessons is
        :attr:`backend_note`, which the start page says once, after explaining them."""
        status = (
            "**Everything is installed.**"
            if self.ok
            else "**Something is missing:**\n\n" + "\n".join(f"- {p}" for p in self.problems)
        )
        rows = [f"| Python | {self.python} |"]
        rows += [f"| {name} | {v or 'not installed'} |" for name, v in self.versions.items()]
        versions = "| Package | Version |\n|---|---|\n" + "\n".join(rows)
        imports = "| Module | Imports |\n|---|---|\n" + "\n".join(
            f"| `{c.name}` | {'yes' if c.ok else 'no: ' + c.detail} |" for c in self.imports
        )
        extensions = "| Extension | Status |\n|---|---|\n" + "\n".join(
            f"| {c.name} | {'yes' if c.ok else 'no'}: {c.detail} |" for c in self.extensions
        )
        gpu = (
            f"{self.gpu.count} CUDA device(s): {', '.join(self.gpu.device_names)}"
            if self.gpu.cuda_available
            else "none"
        )
        backends = ", ".join(f"`{b}`" for b in self.backends)
        return "\n\n".join(
            [
                status,
                f"**Collective backends available:** {backends}. **GPU:** {gpu}.",
                versions,
                imports,
                extensions,
            ]
        )

    def _repr_markdown_(self) -> str:
        return self.to_markdown()


# -- the individual checks ----------------------------------------------------------------------


def package_versions(names: Iterable[str] = PACKAGES) -> dict[str, str | None]:
    """The installed version of each distribution, ``None`` where it is not installed."""
    versions: dict[str, str | None] = {}
    for name in names:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return versions


def check_imports(modules: Iterable[str] = COURSE_MODULES) -> tuple[Check, ...]:
    """Import each module; a failure is reported with its exception, never raised."""
    checks = []
    for module in modules:
        try:
            importlib.import_module(module)
        except Exception as error:  # report any import failure, whatever its kind
            checks.append(Check(module, False, f"{type(error).__name__}: {error}"))
        else:
            checks.append(Check(module, True))
    return tuple(checks)


def collective_backends() -> tuple[tuple[str, ...], Check]:
    """``chainrule.dist.available_backends()`` and a check saying whether asking worked
    (if it fails, only the simulated world, which needs nothing but numpy, is listed)."""
    name = "chainrule.dist.available_backends()"
    try:
        from chainrule import dist

        backends = tuple(dist.available_backends())
    except Exception as error:  # report, never raise: this is a diagnostic page
        return ("sim",), Check(name, False, f"{type(error).__name__}: {error}")
    return backends, Check(name, True, ", ".join(backends))


def gpu_info() -> GpuInfo:
    """CUDA devices as torch sees them."""
    try:
        import torch
    except ImportError:
        return GpuInfo(torch_installed=False, cuda_available=False)
    if not torch.cuda.is_available():
        return GpuInfo(torch_installed=True, cuda_available=False)
    names = tuple(torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count()))
    return GpuInfo(torch_installed=True, cuda_available=True, device_names=names)


def disabled_lab_extensions(config_dirs: Sequence[str | Path]) -> set[str]:
    """Extensions (or plugins) switched off in ``labconfig/page_config.json`` of any config dir."""
    disabled: set[str] = set()
    for folder in config_dirs:
        path = Path(folder) / "labconfig" / "page_config.json"
        if not path.is_file():
            continue
        try:
            entry = json.loads(path.read_text()).get("disabledExtensions", {})
        except (OSError, ValueError):
            continue
        if isinstance(entry, Mapping):
            disabled |= {name for name, off in entry.items() if off}
        else:
            disabled |= set(entry)
    return disabled


def lab_extension_checks(
    required: Mapping[str, str] = LAB_EXTENSIONS,
    data_dirs: Sequence[str | Path] | None = None,
    config_dirs: Sequence[str | Path] | None = None,
) -> tuple[Check, ...]:
    """Is each JupyterLab extension installed (a ``labextensions/<name>/package.json`` in a
    Jupyter data dir, which is where JupyterLab finds prebuilt extensions) and not disabled?"""
    if data_dirs is None or config_dirs is None:
        from jupyter_core.paths import jupyter_config_path, jupyter_path

        data_dirs = jupyter_path("labextensions") if data_dirs is None else data_dirs
        config_dirs = jupyter_config_path() if config_dirs is None else config_dirs
    disabled = disabled_lab_extensions(config_dirs)
    checks = []
    for name, purpose in required.items():
        found = [Path(d) / name for d in data_dirs if (Path(d) / name / "package.json").is_file()]
        if not found:
            checks.append(Check(name, False, f"not installed ({purpose})"))
        elif name in disabled:
            checks.append(Check(name, False, f"installed but disabled ({purpose})"))
        else:
            checks.append(Check(name, True, purpose))
    return tuple(checks)


def restart_hint_check(shell: Any = None, prefix: str | Path | None = None) -> Check:
    """Is the kernel-restart hint active: loaded in this kernel, or configured for kernels of
    this environment in ``<sys.prefix>/etc/ipython/ipython_kernel_config.py``?"""
    name = "kernel-restart hint"
    if shell is None:
        try:
            from IPython import get_ipython

            shell = get_ipython()
        except ImportError:
            shell = None
    if shell is not None and HINT_EXTENSION in getattr(shell.extension_manager, "loaded", ()):
        return Check(name, True, f"{HINT_EXTENSION} is loaded in this kernel")
    config = Path(sys.prefix if prefix is None else prefix) / "etc/ipython/ipython_kernel_config.py"
    if config.is_file() and HINT_EXTENSION in config.read_text():
        return Check(name, True, f"{HINT_EXTENSION} is enabled in {config}")
    return Check(
        name,
        False,
        f"not enabled: run `%load_ext {HINT_EXTENSION}` here, or put "
        f'`c.InteractiveShellApp.extensions = ["{HINT_EXTENSION}"]` in {config} '
        "(what `make install` writes) for every kernel",
    )


def run_install_check() -> InstallReport:
    """Run every check (about a second: it imports torch)."""
    backends, backends_check = collective_backends()
    return InstallReport(
        python=platform.python_version(),
        versions=package_versions(),
        imports=(*check_imports(), backends_check),
        backends=backends,
        gpu=gpu_info(),
        extensions=(*lab_extension_checks(), restart_hint_check()),
    )
