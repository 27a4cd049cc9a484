"""A JupyterLab server on a temporary copy of the course, for the browser tests.

``LabServer.start(course_root, workdir)`` copies the course (``course/``, ``source/``,
``release/``, ``nbgrader_config.py``) into ``workdir/course``, gives the server its own
Jupyter config, data, runtime, IPython and JupyterLab settings folders under ``workdir``, leaves
the nbgrader exchange where a fresh clone has it (``exchange/`` of the course copy, which
``nbgrader_config.py`` makes on first use), starts ``jupyter lab`` from the course copy (the
nbgrader extensions read ``nbgrader_config.py`` from the server's working directory) and waits
until ``/api/status`` answers. ``stop()`` asks the server to shut down (which ends its kernels),
then ends whatever is left of it and of the kernels it started, by process id.

JupyterLab settings written before start: no news fetching and no update check (the "get
notified about official Jupyter news?" toast would cover controls), and notebooks rendered
without windowing so that every cell and output is in the DOM.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

COURSE_ITEMS = ("course", "source", "release", "nbgrader_config.py")

LAB_SETTINGS = {
    "@jupyterlab/apputils-extension/notification.jupyterlab-settings": {
        "fetchNews": "false",
        "checkForUpdates": False,
    },
    "@jupyterlab/notebook-extension/tracker.jupyterlab-settings": {"windowingMode": "none"},
}

STARTUP_TIMEOUT_S = 120.0
SHUTDOWN_TIMEOUT_S = 30.0


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def copy_course(course_root: Path, destination: Path) -> None:
    """Copy the parts of the course a student and an instructor see into ``destination``."""
    destination.mkdir(parents=True)
    for name in COURSE_ITEMS:
        source = course_root / name
        if source.is_dir():
            shutil.copytree(
                source,
                destination / name,
                ignore=shutil.ignore_patterns(".ipynb_checkpoints", "__pycache__"),
            )
        elif source.exists():
            shutil.copy2(source, destination / name)


def write_lab_settings(settings_dir: Path) -> None:
    """Write the JupyterLab user settings the tests rely on (see the module docstring)."""
    for relative, values in LAB_SETTINGS.items():
        path = settings_dir / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(values))


@dataclass
class LabServer:
    """A running ``jupyter lab`` process and the folders it works in."""

    workdir: Path
    course_root: Path
    root: Path
    exchange: Path
    env: dict[str, str]
    port: int
    token: str
    process: subprocess.Popen | None = None
    log_path: Path | None = None
    _log_file: object = field(default=None, repr=False)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def url(self, path: str) -> str:
        """Address of ``path`` on this server, with the token."""
        separator = "&" if "?" in path else "?"
        return f"{self.base_url}/{path.lstrip('/')}{separator}token={self.token}"

    @classmethod
    def start(cls, course_root: Path, workdir: Path, log_path: Path) -> LabServer:
        """Copy the course into ``workdir``, start JupyterLab there and wait until it answers."""
        root = workdir / "course"
        copy_course(course_root, root)
        folders = {
            name: workdir / name
            for name in (
                "jupyter_config",
                "jupyter_data",
                "jupyter_runtime",
                "ipython",
                "lab_settings",
                "lab_workspaces",
            )
        }
        for folder in folders.values():
            folder.mkdir(parents=True, exist_ok=True)
        write_lab_settings(folders["lab_settings"])
        venv_bin = str(Path(sys.executable).parent)
        outside = {k: v for k, v in os.environ.items() if k != "NBGRADER_EXCHANGE"}
        env = dict(
            outside,
            PATH=venv_bin + os.pathsep + os.environ.get("PATH", ""),
            JUPYTER_CONFIG_DIR=str(folders["jupyter_config"]),
            JUPYTER_DATA_DIR=str(folders["jupyter_data"]),
            JUPYTER_RUNTIME_DIR=str(folders["jupyter_runtime"]),
            IPYTHONDIR=str(folders["ipython"]),
            JUPYTERLAB_SETTINGS_DIR=str(folders["lab_settings"]),
            JUPYTERLAB_WORKSPACES_DIR=str(folders["lab_workspaces"]),
        )
        server = cls(
            workdir=workdir,
            course_root=course_root,
            root=root,
            exchange=root / "exchange",
            env=env,
            port=free_port(),
            token=secrets.token_hex(16),
            log_path=log_path,
        )
        server._launch(folders["lab_settings"], folders["lab_workspaces"])
        return server

    def _launch(self, settings_dir: Path, workspaces_dir: Path) -> None:
        command = [
            str(Path(self.env["PATH"].split(os.pathsep)[0]) / "jupyter"),
            "lab",
            "--no-browser",
            "--allow-root",
            f"--port={self.port}",
            "--ServerApp.port_retries=0",
            f"--IdentityProvider.token={self.token}",
            "--ServerApp.ip=127.0.0.1",
            f"--LabApp.user_settings_dir={settings_dir}",
            f"--LabApp.workspaces_dir={workspaces_dir}",
            # A kernel asked to shut down is stopped at once instead of after its own exit:
            # tearing down what a lesson imported (torch, the course library) costs about a
            # second of CPU per kernel, and nothing here reads what a kernel does on exit.
            "--KernelManager.shutdown_wait_time=0",
        ]
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log_file = open(self.log_path, "w")  # noqa: SIM115 - closed in stop()
        self.process = subprocess.Popen(
            command,
            cwd=self.root,
            env=self.env,
            stdout=self._log_file,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            self._wait_until_answering()
        except BaseException:
            self.stop()
            raise

    def _wait_until_answering(self) -> None:
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(
                    f"jupyter lab exited with code {self.process.returncode}:\n{self.log_tail()}"
                )
            try:
                with urllib.request.urlopen(self.url("/api/status"), timeout=5) as response:
                    if response.status == 200:
                        return
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            time.sleep(0.25)
        raise TimeoutError(
            f"jupyter lab did not answer within {STARTUP_TIMEOUT_S} s:\n{self.log_tail()}"
        )

    def log_tail(self, lines: int = 60) -> str:
        """The last lines of the server's log."""
        if self.log_path is None or not self.log_path.exists():
            return ""
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def run(self, *args: str, timeout: float = 180) -> subprocess.CompletedProcess:
        """Run a command (an nbgrader CLI call) in the course copy with the server's env."""
        return subprocess.run(
            list(args),
            cwd=self.root,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    def api(self, method: str, path: str) -> object:
        """Call the server's REST API; the decoded JSON answer (None when empty)."""
        request = urllib.request.Request(self.url(path), method=method)
        with urllib.request.urlopen(request, timeout=30) as response:
            body = response.read()
        return json.loads(body) if body else None

    def shutdown_kernels(self) -> None:
        """End every session and kernel, so that the next test starts from a quiet server."""
        for session in self.api("GET", "/api/sessions"):
            self.api("DELETE", f"/api/sessions/{session['id']}")
        for kernel in self.api("GET", "/api/kernels"):
            self.api("DELETE", f"/api/kernels/{kernel['id']}")

    def stop(self) -> None:
        """Shut the server and its kernels down; nothing it started is left running."""
        if self.process is not None and self.process.poll() is None:
            self._request_shutdown()
            try:
                self.process.wait(timeout=SHUTDOWN_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self._signal_group(signal.SIGTERM)
                try:
                    self.process.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    self._signal_group(signal.SIGKILL)
                    self.process.wait(timeout=10)
        self._end_leftover_kernels()
        if self._log_file is not None:
            self._log_file.close()
            self._log_file = None

    def _request_shutdown(self) -> None:
        request = urllib.request.Request(self.url("/api/shutdown"), method="POST", data=b"")
        try:
            urllib.request.urlopen(request, timeout=10).close()
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            self._signal_group(signal.SIGTERM)

    def _signal_group(self, signum: int) -> None:
        try:
            os.killpg(self.process.pid, signum)
        except ProcessLookupError:
            pass

    def _end_leftover_kernels(self) -> None:
        """Kill any kernel whose connection file lives in this server's runtime folder.

        Kernels run in their own session, so ending the server's process group does not reach
        them; the connection-file path on their command line identifies the ones it started.
        """
        marker = str(self.workdir / "jupyter_runtime").encode()
        for pid in kernel_pids_with(marker):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def leftover_processes(self) -> list[int]:
        """Process ids still running that this server or its kernels started."""
        pids = kernel_pids_with(str(self.workdir / "jupyter_runtime").encode())
        if self.process is not None and self.process.poll() is None:
            pids.append(self.process.pid)
        return pids


def kernel_pids_with(marker: bytes) -> list[int]:
    """Ids of live processes whose command line contains ``marker`` (Linux /proc)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if marker in cmdline and int(entry.name) != os.getpid():
            pids.append(int(entry.name))
    return pids
