"""The sandbox a student's kernels run in at grading time: bubblewrap, one per student.

Every student is graded in a sandbox of their own, started once for the whole submission
through bubblewrap (``bwrap``, Debian package ``bubblewrap``), the unprivileged sandbox that
Flatpak builds on: a small, well-kept tool that uses the kernel's own namespaces and needs no
daemon. Inside it runs the student's *zygote* (:mod:`chainrule.grading.zygote`): one
interpreter that imports numpy, torch and the course library once, and forks the kernel of
each notebook, and the launcher of each pool of gloo ranks those kernels start, so that the
submission pays for one interpreter start, not one per notebook and per world. Inside, the
processes

- see only the read-only Python environment (interpreter, virtual environment, the course
  library), a minimal ``/etc``, a private copy of the student's own files as their home and
  working folder (a fresh copy for each notebook), a private ``/tmp`` and the folder of their
  connection sockets: no ``source/``, ``release/``, gradebook, exchange, other students'
  folders, course configuration or real home directory; where the environment lies inside
  one of those folders (a virtual environment in the course folder), the folder is hidden
  under an empty one and only the environment is shown again;
- run as uid 65534 ("nobody") in a user namespace, with every capability dropped and no
  further user namespace allowed (``--disable-userns``);
- have their own PID namespace (everything they start dies with the sandbox), network
  namespace (only their own loopback), IPC, UTS and cgroup namespaces;
- are in one control group (:mod:`chainrule.grading.cgroup`) that caps their memory as a
  whole, ``/tmp`` and ``/dev/shm`` included (each is also a tmpfs of bounded size), caps their
  number of processes, and counts their CPU time; and each has a hard address-space limit
  (``prlimit``), which it cannot raise.

Kernels talk over Jupyter's IPC transport (Unix sockets in a folder both sides see), since no
TCP port of a process in its own network namespace can be reached from outside. With
``isolate=False`` (``--no-sandbox``) the same zygote runs unconfined, with only the limits.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from queue import Empty
from typing import Any

import zmq.asyncio
from jupyter_client.asynchronous import AsyncKernelClient
from jupyter_client.manager import AsyncKernelManager
from jupyter_client.provisioning.local_provisioner import LocalProvisioner

from chainrule.grading.cgroup import Cgroup

BWRAP = "bwrap"
SANDBOX_UID = 65534
#: Where the student's homes (one folder per notebook) appear inside the sandbox.
HOMES_INSIDE = "/home/student"
#: System folders the interpreter and its libraries need, read-only (symlinks stay symlinks).
SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
#: Files of the host's /etc that dynamic linking and locales read; nothing else of /etc shows.
ETC_FILES = ("/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/localtime", "/etc/nsswitch.conf")
#: Size of the sandbox's RAM-backed ``/tmp`` and ``/dev/shm`` (each), at most.
TMPFS_MB = 512
#: Seconds a forked kernel may take to bind its sockets before its client connects anyway.
KERNEL_BIND_TIMEOUT = 30.0
#: How long a kernel client waits for each answer while the kernel starts.
POLL_S = 0.02
#: Seconds the zygote may take to import numpy, torch and the course library.
ZYGOTE_START_TIMEOUT = 120.0

INSTALL_HINT = (
    "bubblewrap (bwrap) is needed to grade in a sandbox: on Debian or Ubuntu "
    "`apt-get install bubblewrap`, on Fedora `dnf install bubblewrap`; where it cannot run "
    "(macOS, a container without user namespaces) grade with --no-sandbox, and the grades "
    "are then not isolated from the students' code"
)


def _isolation_args() -> list[str]:
    return [
        "--unshare-all",
        "--unshare-user",
        "--disable-userns",
        "--uid",
        str(SANDBOX_UID),
        "--gid",
        str(SANDBOX_UID),
        "--die-with-parent",
        "--new-session",
        "--cap-drop",
        "ALL",
    ]


def sandbox_problem() -> str | None:
    """Why kernels cannot be sandboxed here (``None`` when they can)."""
    if sys.platform != "linux":
        return f"sandboxing needs Linux namespaces; this is {sys.platform}. {INSTALL_HINT}"
    if shutil.which(BWRAP) is None:
        return f"`{BWRAP}` was not found on PATH. {INSTALL_HINT}"
    probe = [BWRAP, *_isolation_args(), *_system_binds(), "/bin/true"]
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


def _inside(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip("/") + "/")


def _nested_out(folders: Sequence[str]) -> list[str]:
    """``folders`` without those inside another one (bwrap binds each once)."""
    kept: list[str] = []
    for folder in sorted(folders, key=len):
        if not any(_inside(folder, k) for k in kept):
            kept.append(folder)
    return kept


def mounts(environment: Sequence[str], hidden: Sequence[str]) -> list[str]:
    """bwrap arguments showing ``environment`` read-only, with each ``hidden`` folder that lies
    inside it covered by an empty one, and the environment folders inside a hidden one shown
    again on top (parents are mounted before their children)."""
    shown = _nested_out(environment)
    covered = [h for h in _nested_out(hidden) if any(_inside(h, e) for e in shown)]
    again = [e for e in environment if any(_inside(e, h) for h in covered)]
    steps = [(p, "bind") for p in shown] + [(p, "hide") for p in covered]
    steps += [(p, "bind") for p in _nested_out(again) if p not in shown]
    steps.sort(key=lambda step: step[0].count("/"))
    args: list[str] = []
    for path, kind in steps:
        args += ["--ro-bind", path, path] if kind == "bind" else ["--tmpfs", path]
    return args


#: A code cell that uses torch: imports it, or starts ranks on a torch.distributed backend.
USES_TORCH = re.compile(r"^\s*(import|from)\s+torch\b|[\"'](gloo|nccl)[\"']", re.MULTILINE)


def uses_torch(notebooks: Sequence[Path]) -> bool:
    """Whether a code cell of these (instructor's) notebooks uses torch (:data:`USES_TORCH`):
    if none does, a sandbox need not import it before the first kernel."""
    for path in notebooks:
        for cell in json.loads(path.read_text()).get("cells", []):
            source = cell.get("source", "")
            text = "".join(source) if isinstance(source, list) else str(source)
            if cell.get("cell_type") == "code" and USES_TORCH.search(text):
                return True
    return False


@dataclass
class StudentSandbox:
    """One student's sandbox: its folders, its control group and its zygote.

    ``workspace`` holds ``homes/<notebook>`` (a fresh copy of ``files`` for each notebook),
    ``ipc`` (the zygote's socket, each kernel's connection file and IPC sockets) and
    ``etc`` (the sandbox's own ``passwd``, ``group``, ``hosts``). ``hidden`` lists folders no
    process inside may see even where the environment lies within them (the course folder,
    the snapshots, the output folder). ``memory_limit_mb`` caps the whole sandbox (its control
    group) and each process in it (``prlimit``). ``preload_torch``: whether the zygote imports
    torch (see :func:`uses_torch`).
    """

    workspace: Path
    files: Path
    memory_limit_mb: int | None
    isolate: bool = True
    hidden: list[str] = field(default_factory=list)
    environment: dict[str, str] = field(default_factory=dict)
    preload_torch: bool = True
    zygote: subprocess.Popen[bytes] | None = None
    group: Cgroup | None = None
    started_s: float = 0.0
    imports_s: float = 0.0

    @property
    def homes(self) -> Path:
        return self.workspace / "homes"

    @property
    def sockets(self) -> Path:
        return self.workspace / "ipc"

    @property
    def etc(self) -> Path:
        return self.workspace / "etc"

    @property
    def address(self) -> str:
        """The zygote's socket (the same path inside and outside the sandbox)."""
        return str(self.sockets / "zygote")

    def home_inside(self, notebook: str) -> str:
        """A notebook's home as its kernel sees it."""
        root = HOMES_INSIDE if self.isolate else str(self.homes)
        return f"{root}/{notebook}"

    def prepare(self) -> None:
        """Create the sandbox's folders and its own ``/etc`` files (the host's are not shown)."""
        for folder in (self.homes, self.sockets, self.etc):
            folder.mkdir(parents=True, exist_ok=True)
        (self.etc / "passwd").write_text(
            f"student:x:{SANDBOX_UID}:{SANDBOX_UID}:student:{HOMES_INSIDE}:/usr/sbin/nologin\n"
        )
        (self.etc / "group").write_text(f"student:x:{SANDBOX_UID}:\n")
        (self.etc / "hosts").write_text(
            "127.0.0.1 localhost sandbox\n::1 localhost\n::ffff:127.0.0.1 localhost\n"
        )
        (self.etc / "hostname").write_text("sandbox\n")
        for folder in (self.homes, self.sockets):
            os.chmod(folder, 0o777)  # uid 65534 inside writes here

    def fresh_home(self, notebook: str) -> Path:
        """A new copy of the student's files, the home of ``notebook``'s kernel."""
        home = self.homes / notebook
        if home.exists():
            shutil.rmtree(home)
        shutil.copytree(self.files, home, symlinks=True)
        for folder, _, _ in os.walk(home):
            os.chmod(folder, 0o777)
        (home / ".tmp").mkdir(exist_ok=True)
        os.chmod(home / ".tmp", 0o777)
        return home

    def base_env(self) -> dict[str, str]:
        """The zygote's whole environment: nothing of the grader's leaks in."""
        tmp = "/tmp" if self.isolate else str(self.workspace / "tmp")
        env = {
            "HOME": HOMES_INSIDE if self.isolate else str(self.homes),
            "USER": "student",
            "PATH": os.pathsep.join([str(Path(sys.executable).parent), "/usr/bin", "/bin"]),
            "LANG": "C.UTF-8",
            "TMPDIR": tmp,
            "MPLBACKEND": "Agg",
            "MPLCONFIGDIR": f"{tmp}/matplotlib",
            "PYTHONSAFEPATH": "1",
            "PYTHONDONTWRITEBYTECODE": "1",
            "CHAINRULE_SANDBOXED": "1" if self.isolate else "0",
        }
        env.update(self.environment)
        return env

    def kernel_env(self, notebook: str) -> dict[str, str]:
        """What a notebook's kernel adds to the zygote's environment."""
        home = self.home_inside(notebook)
        return {"HOME": home, "IPYTHONDIR": f"{home}/.ipython", "TMPDIR": f"{home}/.tmp"}

    def command(self, argv: Sequence[str]) -> list[str]:
        """``argv`` started in the sandbox (or unconfined, with the limits only)."""
        limit = []
        if self.memory_limit_mb:
            size = int(self.memory_limit_mb) * 1024 * 1024
            limit = ["prlimit", f"--as={size}:{size}", "--"]
        join = self.group.join_command() if self.group is not None else []
        if not self.isolate:
            return [*join, *limit, *argv]
        env = [arg for name, value in self.base_env().items() for arg in ("--setenv", name, value)]
        etc = [
            arg
            for name in ("passwd", "group", "hosts", "hostname")
            for arg in ("--ro-bind", str(self.etc / name), f"/etc/{name}")
        ]
        etc += [
            arg for path in ETC_FILES if Path(path).exists() for arg in ("--ro-bind", path, path)
        ]
        tmpfs_mb = min(TMPFS_MB, (self.memory_limit_mb or TMPFS_MB * 4) // 4)
        tmpfs_bytes = str(tmpfs_mb * 1024 * 1024)
        return [
            *join,
            *limit,
            BWRAP,
            *_isolation_args(),
            "--hostname",
            "sandbox",
            *_system_binds(),
            # A private /tmp first: the binds after it stay visible, so an environment or a
            # course checked out under /tmp (a CI clone) is still there inside.
            "--size",
            tmpfs_bytes,
            "--tmpfs",
            "/tmp",
            *mounts(environment_dirs(), self.hidden),
            *etc,
            "--proc",
            "/proc",
            "--dev",
            "/dev",
            "--size",
            tmpfs_bytes,
            "--tmpfs",
            "/dev/shm",
            "--bind",
            str(self.homes),
            HOMES_INSIDE,
            "--bind",
            str(self.sockets),
            str(self.sockets),
            "--chdir",
            HOMES_INSIDE,
            "--clearenv",
            *env,
            "--",
            *argv,
        ]

    def start(self, log: Any = None) -> None:
        """Start the control group and the zygote; return once it serves (it has imported
        numpy, torch and the course library)."""
        started = time.monotonic()
        self.prepare()
        argv = [sys.executable, "-P", "-m", "chainrule.grading.zygote", self.address]
        if not self.preload_torch:
            argv.append("--without-torch")
        env = self.base_env() if not self.isolate else {"PATH": "/usr/bin:/bin"}
        if not self.isolate:
            (self.workspace / "tmp").mkdir(exist_ok=True)
        self.zygote = subprocess.Popen(
            self.command(argv),
            stdin=subprocess.PIPE,  # the zygote's lifeline: it ends when the grader does
            stdout=log,
            stderr=log,
            env=env,
            cwd=str(self.homes),
            start_new_session=True,
        )
        deadline = started + ZYGOTE_START_TIMEOUT
        while not os.path.exists(self.address + ".ready"):
            if self.zygote.poll() is not None:
                raise RuntimeError(
                    f"the sandbox's zygote exited while starting (status {self.zygote.returncode})"
                )
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"the sandbox's zygote did not start in {ZYGOTE_START_TIMEOUT:g} s"
                )
            time.sleep(0.01)
        self.started_s = time.monotonic() - started
        try:
            with open(self.address + ".ready") as ready:
                self.imports_s = float(json.load(ready)["imports_s"])
        except (OSError, ValueError, KeyError, TypeError):
            self.imports_s = 0.0

    def request(self, kind: str, payload: dict[str, Any]) -> tuple[int, socket.socket]:
        """Ask the zygote to fork a process of ``kind`` (see :mod:`chainrule.grading.zygote`);
        its pid inside the sandbox and the connection to it. The zygote starts listening
        right after it says it is ready, so a refused connection is tried again briefly."""
        from chainrule.dist import forks

        deadline = time.monotonic() + 10.0
        while True:
            try:
                return forks.request(self.address, kind, payload)
            except (ConnectionRefusedError, FileNotFoundError):
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.01)

    def signal(self, pid: int, signum: int) -> None:
        """Send ``signum`` to the process group of ``pid`` (a pid inside the sandbox)."""
        _, sock = self.request("signal", {"pid": pid, "signal": signum})
        sock.recv(1)  # the helper closes the connection when it has sent the signal
        sock.close()

    def reset(self) -> None:
        """Kill every process of the sandbox but the zygote (what a notebook left running)."""
        try:
            _, sock = self.request("reset", {})
        except OSError:
            return
        sock.settimeout(10)
        try:
            sock.recv(1)
        except OSError:
            pass
        sock.close()

    def stop(self) -> None:
        """End the zygote and everything in the sandbox (its control group, if it has one,
        is the caller's to remove)."""
        if self.zygote is not None:
            if self.zygote.stdin is not None:
                self.zygote.stdin.close()
            try:
                self.zygote.wait(2.0)
            except subprocess.TimeoutExpired:
                os.killpg(self.zygote.pid, signal.SIGKILL)
                self.zygote.wait()
        if self.group is not None:
            self.group.kill()


class ZygoteProvisioner(LocalProvisioner):
    """Jupyter's local provisioner, with the kernel forked by the sandbox's zygote instead of
    started as a new process (the connection file is written as for any kernel)."""

    sandbox: StudentSandbox
    notebook: str
    _lifeline: socket.socket | None = None

    async def launch_kernel(self, cmd: list[str], **kwargs: Any) -> Any:
        """Ask the zygote for a kernel with this connection file."""
        km = self.parent
        assert km is not None
        given = cmd.index("-f") + 2 if "-f" in cmd else len(cmd)
        payload = {
            "connection_file": km.connection_file,
            "arguments": cmd[given:],  # nbgrader's, e.g. --HistoryManager.hist_file=:memory:
            "home": self.sandbox.home_inside(self.notebook),
            "env": self.sandbox.kernel_env(self.notebook),
        }
        self.pid, self._lifeline = self.sandbox.request("kernel", payload)
        self._lifeline.setblocking(False)
        self.pgid = self.pid
        self.process = None
        await self._sockets_bound(km)
        return self.connection_info

    async def _sockets_bound(self, km: Any) -> None:
        """Return once the kernel has bound its IPC sockets (or died): a client that connects
        earlier is refused and ZeroMQ tries again only 100 ms later."""
        ports = (km.shell_port, km.iopub_port, km.stdin_port, km.control_port, km.hb_port)
        paths = [f"{km.ip}-{port}" for port in ports]
        deadline = time.monotonic() + KERNEL_BIND_TIMEOUT
        while not all(os.path.exists(path) for path in paths):
            if await self.poll() is not None or time.monotonic() > deadline:
                return  # the client's wait for the kernel says what went wrong
            await asyncio.sleep(0.002)

    @property
    def has_process(self) -> bool:
        return self._lifeline is not None

    async def poll(self) -> int | None:
        """``None`` while the kernel lives; its lifeline closes when it ends."""
        if self._lifeline is None:
            return 0
        try:
            data = self._lifeline.recv(1)
        except BlockingIOError:
            return None
        except OSError:
            data = b""
        return None if data else -1

    async def wait(self) -> int | None:
        while await self.poll() is None:
            await asyncio.sleep(0.01)
        if self._lifeline is not None:
            self._lifeline.close()
            self._lifeline = None
        return -1

    async def send_signal(self, signum: int) -> None:
        if self._lifeline is not None and self.pid:
            self.sandbox.signal(self.pid, signum)

    async def kill(self, restart: bool = False) -> None:
        await self.send_signal(signal.SIGKILL)

    async def terminate(self, restart: bool = False) -> None:
        await self.send_signal(signal.SIGTERM)


class PromptKernelClient(AsyncKernelClient):
    """Jupyter's asynchronous kernel client, ready as soon as the kernel is.

    A kernel is ready when it answers ``kernel_info`` on the shell channel and its IOPub
    messages reach the client: a new subscriber misses what the kernel publishes before its
    subscription arrives. jupyter_client waits 0.2 s of silence on IOPub before it asks again
    (and a second each on the shell channel); this client asks again every 20 ms, which
    costs a forked kernel a few milliseconds instead of a quarter of a second. Replies to the
    extra requests are ignored by nbclient, which waits for the reply to its own request.
    """

    async def wait_for_ready(self, timeout: float | None = None) -> None:
        deadline = time.monotonic() + (timeout if timeout is not None else float("inf"))
        while True:
            self.kernel_info()
            try:
                reply = await self.shell_channel.get_msg(timeout=POLL_S)
                if reply["msg_type"] == "kernel_info_reply":
                    await self.iopub_channel.get_msg(timeout=POLL_S)
                    self._handle_kernel_info_reply(reply)
                    return
            except Empty:
                pass
            if not await self._async_is_alive():
                raise RuntimeError("Kernel died before replying to kernel_info")
            if time.monotonic() > deadline:
                raise RuntimeError(f"Kernel didn't respond in {timeout:g} seconds")


class SandboxedKernelManager(AsyncKernelManager):
    """A kernel manager whose kernel the student's sandbox forks (:class:`ZygoteProvisioner`).

    The kernel is interrupted with an ``interrupt_request`` message and talks over IPC sockets
    in the sandbox's socket folder.
    """

    def __init__(self, sandbox: StudentSandbox, notebook: str, **kwargs: Any) -> None:
        kwargs.setdefault("transport", "ipc")
        # One ZeroMQ context for every kernel of this process, never terminated: a context
        # of a finished kernel that the garbage collector terminated later would block (its
        # ``term`` waits for every socket), and a process grades or validates many notebooks.
        kwargs.setdefault("context", zmq.asyncio.Context.instance())
        super().__init__(**kwargs)
        self.client_factory = PromptKernelClient
        folder = sandbox.sockets / notebook
        folder.mkdir(parents=True, exist_ok=True)
        os.chmod(folder, 0o777)
        self.connection_file = str(folder / "kernel.json")
        self.ip = str(folder / "kernel")
        provisioner = ZygoteProvisioner(kernel_id=self.kernel_id or "", parent=self)
        provisioner.sandbox = sandbox
        provisioner.notebook = notebook
        self.provisioner = provisioner

    async def _async_wait(self, pollinterval: float = 0.01) -> None:
        """Wait for the kernel to end, looking every 10 ms (jupyter_client looks every 100)."""
        await super()._async_wait(pollinterval=pollinterval)

    def client(self, **kwargs: Any) -> Any:
        """A client of this kernel, on the same ZeroMQ context."""
        kwargs.setdefault("context", self.context)
        return super().client(**kwargs)

    @classmethod
    def forking_in(cls, sandbox: StudentSandbox, notebook: str) -> type[SandboxedKernelManager]:
        """A kernel manager class (for nbclient's ``kernel_manager_class``) whose kernels
        ``sandbox`` forks, each in a fresh copy of the sandbox's files as ``notebook``'s home."""

        class Forked(cls):  # type: ignore[valid-type,misc]
            def __init__(self, **kwargs: Any) -> None:
                sandbox.fresh_home(notebook)
                super().__init__(sandbox, notebook, **kwargs)

        return Forked

    async def _async_pre_start_kernel(self, **kw: Any) -> tuple[list[str], dict[str, Any]]:
        if self.kernel_spec is not None:
            self.kernel_spec.interrupt_mode = "message"
        assert self.provisioner is not None
        self.provisioner.kernel_spec = self.kernel_spec
        return await super()._async_pre_start_kernel(**kw)


def new_workspace(root: str | Path | None) -> Path:
    """A new private folder for one student's sandbox."""
    return Path(tempfile.mkdtemp(prefix="student-", dir=root or None))
