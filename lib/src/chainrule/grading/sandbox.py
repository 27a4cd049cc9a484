"""The sandbox a student's kernel runs in at grading time: bubblewrap, and what it may see.

Every grading kernel is started through bubblewrap (``bwrap``, Debian package ``bubblewrap``),
the unprivileged sandbox that Flatpak builds on. It is a small, well-kept tool that uses the
kernel's own namespaces, and it needs no daemon and no set-uid helper when started as root
or where user namespaces are allowed. Inside, the kernel

- sees only the read-only Python environment (interpreter, virtual environment, the course
  library), a minimal ``/etc``, a private copy of this student's own submission as its home
  and working folder, a private ``/tmp``, and the folder of its connection sockets: no
  ``source/``, ``release/``, gradebook, exchange, other students' folders, course
  configuration or real home directory;
- runs as uid 65534 ("nobody") in a user namespace, with every capability dropped;
- has its own PID namespace (everything it starts dies with it), network namespace (only its
  own loopback: no network, and no port it opens can collide with another kernel's), IPC,
  UTS and cgroup namespaces;
- has a hard address-space limit (``prlimit``), which it cannot raise.

Its channels use Jupyter's IPC transport (Unix sockets in a folder both sides see), since no
TCP port of a kernel in its own network namespace can be reached from outside.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from jupyter_client.manager import AsyncKernelManager
from traitlets import Any as AnyTrait

BWRAP = "bwrap"
SANDBOX_UID = 65534
#: Where the private copy of the submission appears inside the sandbox.
HOME_INSIDE = "/home/student"
#: System folders the interpreter and its libraries need, read-only (symlinks stay symlinks).
SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
#: Files of the host's /etc that dynamic linking and locales read; nothing else of /etc shows.
ETC_FILES = ("/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/localtime", "/etc/nsswitch.conf")

INSTALL_HINT = (
    "bubblewrap (bwrap) is needed to grade in a sandbox: on Debian or Ubuntu "
    "`apt-get install bubblewrap`, on Fedora `dnf install bubblewrap`; where it cannot run "
    "(macOS, a container without user namespaces) grade with --no-sandbox, and the grades "
    "are then not isolated from the students' code"
)


def sandbox_problem() -> str | None:
    """Why kernels cannot be sandboxed here (``None`` when they can)."""
    if sys.platform != "linux":
        return f"sandboxing needs Linux namespaces; this is {sys.platform}. {INSTALL_HINT}"
    if shutil.which(BWRAP) is None:
        return f"`{BWRAP}` was not found on PATH. {INSTALL_HINT}"
    probe = [BWRAP, "--unshare-all", "--unshare-user", "--die-with-parent"]
    probe += ["--uid", str(SANDBOX_UID), "--gid", str(SANDBOX_UID), *_system_binds(), "/bin/true"]
    try:
        result = subprocess.run(probe, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as error:
        return f"`{BWRAP}` could not be started ({error}). {INSTALL_HINT}"
    if result.returncode != 0:
        return f"`{BWRAP}` cannot create namespaces here: {result.stderr.strip()}. {INSTALL_HINT}"
    return None


def _system_binds() -> list[str]:
    args: list[str] = []
    for folder in SYSTEM_DIRS:
        path = Path(folder)
        if path.is_symlink():
            args += ["--symlink", os.readlink(path), folder]
        elif path.is_dir():
            args += ["--ro-bind", folder, folder]
    return args


def environment_dirs() -> list[str]:
    """The read-only folders of the Python environment: interpreter, venv, course library."""
    import chainrule

    folders = {sys.base_prefix, sys.prefix, str(Path(chainrule.__file__).resolve().parents[1])}
    return sorted(str(Path(f).resolve()) for f in folders)


def _nested_out(folders: list[str]) -> list[str]:
    """``folders`` without those inside another one (bwrap binds each once)."""
    kept: list[str] = []
    for folder in sorted(folders, key=len):
        if not any(folder == k or folder.startswith(k.rstrip("/") + "/") for k in kept):
            kept.append(folder)
    return kept


@dataclass
class KernelSandbox:
    """How one grading kernel is confined.

    ``home`` is the private copy of the submission (the kernel's home and working folder),
    ``sockets`` the folder of its connection file and IPC sockets, ``etc`` a folder holding
    the sandbox's own ``passwd``, ``group`` and ``hosts``. ``memory_limit_mb`` is a hard limit
    on the address space of every process in it. With ``isolate=False`` (``--no-sandbox``)
    the kernel runs unconfined, with only the memory limit and a clean environment.
    """

    home: Path
    sockets: Path
    etc: Path
    memory_limit_mb: int | None
    isolate: bool = True
    environment: dict[str, str] = field(default_factory=dict)

    def prepare(self) -> None:
        """Create the sandbox's own ``/etc`` files (the host's are not shown)."""
        self.etc.mkdir(parents=True, exist_ok=True)
        self.sockets.mkdir(parents=True, exist_ok=True)
        (self.etc / "passwd").write_text(
            f"student:x:{SANDBOX_UID}:{SANDBOX_UID}:student:{HOME_INSIDE}:/usr/sbin/nologin\n"
        )
        (self.etc / "group").write_text(f"student:x:{SANDBOX_UID}:\n")
        (self.etc / "hosts").write_text(
            "127.0.0.1 localhost sandbox\n::1 localhost\n::ffff:127.0.0.1 localhost\n"
        )
        (self.etc / "hostname").write_text("sandbox\n")

    def kernel_env(self) -> dict[str, str]:
        """The kernel's whole environment: nothing of the grader's leaks in."""
        home = HOME_INSIDE if self.isolate else str(self.home)
        env = {
            "HOME": home,
            "USER": "student",
            "PATH": os.pathsep.join([str(Path(sys.executable).parent), "/usr/bin", "/bin"]),
            "LANG": "C.UTF-8",
            "TMPDIR": "/tmp" if self.isolate else str(self.home / ".tmp"),
            "MPLBACKEND": "Agg",
            "MPLCONFIGDIR": f"{home}/.config/matplotlib",
            "IPYTHONDIR": f"{home}/.ipython",
            "PYTHONSAFEPATH": "1",
            "PYTHONDONTWRITEBYTECODE": "1",
        }
        env.update(self.environment)
        return env

    def wrap(self, argv: Sequence[str]) -> list[str]:
        """``argv`` (the kernel's command line) started inside the sandbox."""
        limit = []
        if self.memory_limit_mb:
            size = int(self.memory_limit_mb) * 1024 * 1024
            limit = ["prlimit", f"--as={size}:{size}", "--"]
        if not self.isolate:
            return [*limit, *argv]
        env = [
            arg for name, value in self.kernel_env().items() for arg in ("--setenv", name, value)
        ]
        binds = [arg for folder in _nested_out(environment_dirs()) for arg in _ro(folder)]
        etc = [
            arg
            for name in ("passwd", "group", "hosts", "hostname")
            for arg in ("--ro-bind", str(self.etc / name), f"/etc/{name}")
        ]
        etc += [arg for path in ETC_FILES if Path(path).exists() for arg in _ro(path)]
        return [
            *limit,
            BWRAP,
            "--unshare-all",
            "--unshare-user",
            "--uid",
            str(SANDBOX_UID),
            "--gid",
            str(SANDBOX_UID),
            "--hostname",
            "sandbox",
            "--die-with-parent",
            "--new-session",
            "--cap-drop",
            "ALL",
            *_system_binds(),
            # A private /tmp first: binds after it stay visible, so an environment or a
            # course checked out under /tmp (a CI clone) is still there inside.
            "--tmpfs",
            "/tmp",
            *binds,
            *etc,
            "--proc",
            "/proc",
            "--dev",
            "/dev",
            "--tmpfs",
            "/dev/shm",
            "--bind",
            str(self.home),
            HOME_INSIDE,
            "--bind",
            str(self.sockets),
            str(self.sockets),
            "--chdir",
            HOME_INSIDE,
            "--clearenv",
            *env,
            "--",
            *argv,
        ]


def _ro(path: str) -> list[str]:
    return ["--ro-bind", path, path]


class SandboxedKernelManager(AsyncKernelManager):
    """A kernel manager that starts its kernel inside a :class:`KernelSandbox`.

    The kernel is interrupted with an ``interrupt_request`` message (a signal to the sandbox's
    launcher would not reach it) and talks over IPC sockets in ``sandbox.sockets``; its
    command line gets ``-P`` so that no file of the submission can shadow an installed module.
    """

    sandbox = AnyTrait(None, help="the KernelSandbox this kernel runs in")

    def __init__(self, sandbox: KernelSandbox, **kwargs: Any) -> None:
        kwargs.setdefault("transport", "ipc")
        super().__init__(**kwargs)
        self.sandbox = sandbox
        self.connection_file = str(sandbox.sockets / "kernel.json")
        self.ip = str(sandbox.sockets / "kernel")

    def format_kernel_cmd(self, extra_arguments: list[str] | None = None) -> list[str]:
        """The kernel spec's command, with ``python -P``, wrapped in the sandbox."""
        assert self.kernel_spec is not None
        self.kernel_spec.interrupt_mode = "message"
        argv = super().format_kernel_cmd(extra_arguments)
        if Path(argv[0]).name.startswith("python") and "-P" not in argv[1:2]:
            argv = [argv[0], "-P", *argv[1:]]
        return self.sandbox.wrap(argv)

    async def _async_launch_kernel(self, kernel_cmd: list[str], **kw: Any) -> None:
        """Launch with the sandbox's environment, not the grader's."""
        kw["env"] = (
            self.sandbox.kernel_env() if not self.sandbox.isolate else {"PATH": "/usr/bin:/bin"}
        )
        kw["cwd"] = str(self.sandbox.home)
        await super()._async_launch_kernel(kernel_cmd, **kw)
