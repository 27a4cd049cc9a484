"""One control group per student's sandbox: its memory, processes and CPU time as a whole.

A per-process address-space limit (``RLIMIT_AS``) bounds each process, not a submission: four
gloo ranks may each take the limit, and the RAM-backed ``/tmp`` and ``/dev/shm`` of the sandbox
belong to no process at all. The kernel's control groups bound them together: every process of
a student's sandbox is in one group, whose

- ``memory`` controller caps the memory of all of them, tmpfs pages included (the kernel
  charges a tmpfs page to the group of the process that wrote it) and kills a process of the
  group (never the grader, which is outside it) when the cap is reached;
- ``pids`` controller caps how many processes and threads it may have (no fork bomb);
- ``cpuacct`` controller (``cpu.stat`` on the unified hierarchy) counts the CPU time they used,
  which is what the grader's time limits count: on a busy machine the wall clock runs faster
  than the submission's own work, its CPU time does not.

Both hierarchies are supported: cgroup v2 (``/sys/fs/cgroup`` with ``cgroup.controllers``) and
the v1 controllers mounted side by side. Creating groups needs root (or a delegated subtree);
where the groups cannot be made, :func:`create` returns ``None`` and the grader says the
memory limit held per process only.
"""

from __future__ import annotations

import os
import signal
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import psutil

ROOT = Path("/sys/fs/cgroup")
PREFIX = "chainrule-grading"
DEFAULT_PIDS = 512


def _writable(path: Path) -> bool:
    return path.is_dir() and os.access(path, os.W_OK)


def own_v1_group(controller: str) -> Path:
    """This process's group in a v1 controller (groups are made under it, so that a grader
    inside a container's group stays inside it)."""
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if controller in controllers.split(","):
            return ROOT / controller / path.lstrip("/")
    return ROOT / controller


@dataclass
class Cgroup:
    """A control group (one folder per hierarchy it spans) and what it is capped at."""

    folders: list[Path]
    unified: bool
    memory_bytes: int | None
    pids: int
    _procs: list[Path] = field(default_factory=list)

    @property
    def name(self) -> str:
        """The group's folder name (the same in every hierarchy)."""
        return self.folders[0].name

    def join_command(self) -> list[str]:
        """A command prefix that moves the process into this group, then runs the rest:
        ``[*group.join_command(), "bwrap", ...]``. A shell writes its own pid into every
        ``cgroup.procs`` and ``exec``s the command, so nothing the command starts is outside
        the group."""
        writes = " && ".join(f'echo $$ > "{p}"' for p in self._procs)
        return ["/bin/sh", "-c", f'{writes} && exec "$0" "$@"']

    def _file(self, *names: str) -> Path | None:
        for folder in self.folders:
            for name in names:
                if (folder / name).exists():
                    return folder / name
        return None

    def cpu_seconds(self) -> float:
        """CPU time used by every process of the group so far, in seconds."""
        usage = self._file("cpuacct.usage")
        if usage is not None:
            return int(usage.read_text()) / 1e9
        stat = self._file("cpu.stat")
        if stat is not None:
            for line in stat.read_text().splitlines():
                key, _, value = line.partition(" ")
                if key == "usage_usec":
                    return int(value) / 1e6
        return 0.0

    def memory_limit_hit(self) -> bool:
        """Whether the group's memory ever reached its cap (a process was refused memory or
        killed for it)."""
        for name in ("memory.oom_control", "memory.events"):  # v1, v2
            counters = self._file(name)
            if counters is None:
                continue
            for line in counters.read_text().splitlines():
                key, _, value = line.partition(" ")
                if key in ("max", "oom", "oom_kill") and value.strip().isdigit():
                    if int(value) > 0:
                        return True
        failcnt = self._file("memory.failcnt")
        return failcnt is not None and int(failcnt.read_text() or 0) > 0

    def memory_peak_bytes(self) -> int:
        """The most memory the group held at once (0 where the kernel does not say)."""
        peak = self._file("memory.max_usage_in_bytes", "memory.peak")
        return int(peak.read_text()) if peak is not None else 0

    def pids_now(self) -> list[int]:
        """The processes in the group now."""
        found: set[int] = set()
        for procs in self._procs:
            try:
                found.update(int(p) for p in procs.read_text().split())
            except OSError:
                continue
        return sorted(found)

    def kill(self, timeout: float = 5.0) -> None:
        """SIGKILL every process of the group until none is left (or ``timeout`` passes)."""
        kill_file = next(
            (f / "cgroup.kill" for f in self.folders if (f / "cgroup.kill").exists()), None
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            pids = self.pids_now()
            if not pids:
                return
            if kill_file is not None:
                kill_file.write_text("1")
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            time.sleep(0.02)

    def remove(self) -> None:
        """Kill what is left in the group and remove its folders."""
        self.kill()
        for folder in self.folders:
            for _ in range(50):
                try:
                    folder.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:  # the last processes are still being reaped
                    time.sleep(0.02)


def _parents() -> list[Path]:
    """The folders this process makes its groups in."""
    if (ROOT / "cgroup.controllers").exists():
        own = Path("/proc/self/cgroup").read_text().split("::", 1)[-1].strip()
        return [ROOT / Path(own).relative_to("/")]
    return [own_v1_group(c) for c in ("memory", "pids", "cpuacct")]


def existing(label: str = "") -> list[Path]:
    """The folders of the groups made here with ``label`` (every group, without one) that
    still exist."""
    pattern = f"{PREFIX}-{label + '-' if label else ''}*"
    return sorted(p for parent in _parents() if parent.is_dir() for p in parent.glob(pattern))


def _make(folder: Path) -> Path:
    folder.mkdir(parents=True)
    return folder


def create(memory_mb: int | None, pids: int = DEFAULT_PIDS, label: str = "") -> Cgroup | None:
    """A new group capped at ``memory_mb`` MiB (none when ``None``) and ``pids`` processes;
    ``None`` where groups cannot be made here."""
    remove_orphans()
    name = f"{PREFIX}-{label + '-' if label else ''}{os.getpid()}-{uuid.uuid4().hex[:10]}"
    memory = None if not memory_mb else int(memory_mb) * 1024 * 1024
    try:
        if (ROOT / "cgroup.controllers").exists():
            return _create_v2(name, memory, pids)
        return _create_v1(name, memory, pids)
    except OSError:
        return None


def _creator(folder: Path) -> int | None:
    """The pid of the process that made the group: its name is
    ``<prefix>-[<label>-]<pid>-<hex>``."""
    parts = folder.name.rsplit("-", 2)
    return int(parts[1]) if len(parts) == 3 and parts[1].isdigit() else None


def remove_orphans() -> None:
    """Remove the groups whose maker has died and that nothing is left in (a grading worker
    killed between making a group and removing it leaves an empty one, which the kernel keeps
    until its folder is removed). The kernel refuses to remove a group with a process in it."""
    for parent in _parents():
        if not parent.is_dir():
            continue
        for folder in parent.glob(f"{PREFIX}-*"):
            pid = _creator(folder)
            if pid is None or psutil.pid_exists(pid):
                continue
            try:
                folder.rmdir()
            except OSError:
                pass


def _create_v2(name: str, memory: int | None, pids: int) -> Cgroup | None:
    (parent,) = _parents()
    available = set((parent / "cgroup.controllers").read_text().split())
    if not {"memory", "pids"} <= available or not _writable(parent):
        return None
    folder = _make(parent / name)
    group = Cgroup([folder], True, memory, pids, [folder / "cgroup.procs"])
    try:
        if memory:
            (folder / "memory.max").write_text(str(memory))
            (folder / "memory.swap.max").write_text("0")
        (folder / "pids.max").write_text(str(pids))
    except OSError:
        group.remove()
        return None
    return group


def _create_v1(name: str, memory: int | None, pids: int) -> Cgroup | None:
    parents = _parents()
    if not all(_writable(p) for p in parents):
        return None
    folders = [_make(p / name) for p in parents]
    group = Cgroup(folders, False, memory, pids, [f / "cgroup.procs" for f in folders])
    try:
        memory_folder, pids_folder = folders[0], folders[1]
        if memory:
            (memory_folder / "memory.limit_in_bytes").write_text(str(memory))
            swap = memory_folder / "memory.memsw.limit_in_bytes"
            if swap.exists():
                swap.write_text(str(memory))
        (pids_folder / "pids.max").write_text(str(pids))
    except OSError:
        group.remove()
        return None
    return group
