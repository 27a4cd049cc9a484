"""What every benchmark shares: a pinned environment, fresh processes, timers, medians, ratios.

Method. Each benchmark function measures a *subject* and its *baseline* in the same process,
alternating them sample by sample, so that both see the same load; its result rows carry the
subject's median time, the baseline's, and the median of the paired ratios subject/baseline.
:func:`run_fresh` runs such a function in a new interpreter (nothing warm from an earlier
benchmark) and :func:`combine` takes the median of every number over several such processes.

Every process runs with the same :data:`PINNED_ENV`: BLAS and OpenMP pinned to one thread (two
threads on two shared cores give bimodal times) and the same glibc allocator settings, so that
no engine pays page faults for large temporaries that another one does not (the mmap threshold
is fixed instead of adapting, and freed memory is kept instead of returned to the system).
"""

from __future__ import annotations

import gc
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]

MMAP_THRESHOLD_BYTES = 32 << 20
"""glibc's largest allowed mmap threshold: blocks below 32 MiB come from the reused heap."""

TRIM_THRESHOLD_BYTES = 1 << 30
"""Free heap memory up to 1 GiB is kept by the process instead of being handed back."""

PINNED_ENV: dict[str, str] = {
    "OMP_NUM_THREADS": "1",
    "OPENBLAS_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
    "MALLOC_MMAP_THRESHOLD_": str(MMAP_THRESHOLD_BYTES),
    "MALLOC_TRIM_THRESHOLD_": str(TRIM_THRESHOLD_BYTES),
    "PYTHONHASHSEED": "0",
}
"""Set identically for every benchmark process and every process those start."""

RESULT_MARKER = "@@BENCHMARK-RESULT@@ "

Row = dict[str, Any]
"""One measured quantity; see :func:`make_row` for the fields."""


# -- environment -----------------------------------------------------------------------------


def bench_env(base: Mapping[str, str] | None = None) -> dict[str, str]:
    """``base`` (default: this process's environment) with :data:`PINNED_ENV` applied and this
    interpreter's ``bin/`` first on ``PATH`` (nbgrader runs ``alembic`` from there)."""
    env = dict(os.environ if base is None else base)
    env.update(PINNED_ENV)
    bin_dir = str(Path(sys.executable).parent)
    env["PATH"] = os.pathsep.join([bin_dir, env.get("PATH", "")])
    python_path = [str(REPO), *filter(None, env.get("PYTHONPATH", "").split(os.pathsep))]
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(python_path))
    return env


def fresh_python(
    code: str, *args: str, cwd: Path | str, what: str, timeout: float = 300
) -> tuple[float, str]:
    """Wall seconds of one fresh ``python -c code args`` in the pinned environment
    (:func:`bench_env`), run in ``cwd``, and its standard output; a failure raises with
    ``what`` failed and its standard error."""
    start = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-c", code, *args],
        cwd=cwd,
        env=bench_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    elapsed = time.perf_counter() - start
    if proc.returncode != 0:
        raise RuntimeError(f"{what} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}")
    return elapsed, proc.stdout


def pin_torch_threads() -> Any:
    """Import torch with one intra-op and one inter-op thread; returns the module."""
    import torch

    torch.set_num_threads(1)
    try:
        torch.set_num_interop_threads(1)
    except RuntimeError:  # already set, or parallel work has already started
        pass
    return torch


# -- timers ----------------------------------------------------------------------------------


@dataclass
class Samples:
    """Per-call seconds of one candidate: wall-clock time, and this thread's CPU time.

    On a loaded machine the wall clock also counts the time the thread waited for a core;
    the CPU time does not, so for single-threaded work it is the steadier of the two.
    """

    wall: list[float] = field(default_factory=list)
    cpu: list[float] = field(default_factory=list)


def time_calls(fn: Callable[[], Any], number: int) -> tuple[float, float]:
    """Wall and CPU seconds per call of ``fn`` over ``number`` back-to-back calls (garbage
    collector off)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        wall, cpu = time.perf_counter(), time.thread_time()
        for _ in range(number):
            fn()
        return (time.perf_counter() - wall) / number, (time.thread_time() - cpu) / number
    finally:
        if enabled:
            gc.enable()


def calibrate(fn: Callable[[], Any], target_s: float) -> int:
    """How many calls of ``fn`` take about ``target_s`` seconds (at least one); warms it up."""
    fn()
    single = max(time_calls(fn, 1)[0], 1e-7)
    return max(1, int(target_s / single))


def compare(
    candidates: Mapping[str, Callable[[], Any]], repeat: int, target_s: float = 0.01
) -> dict[str, Samples]:
    """Seconds-per-call samples of each candidate, the candidates alternating sample by sample.

    Each sample runs a candidate ``number`` times, calibrated so that a sample lasts about
    ``target_s``; ``repeat`` samples per candidate. Alternating makes the i-th samples of all
    candidates see the same load, so their ratios are paired (see :func:`paired_ratio`).
    """
    numbers = {name: calibrate(fn, target_s) for name, fn in candidates.items()}
    samples = {name: Samples() for name in candidates}
    gc.collect()
    for _ in range(repeat):
        for name, fn in candidates.items():
            wall, cpu = time_calls(fn, numbers[name])
            samples[name].wall.append(wall)
            samples[name].cpu.append(cpu)
    return samples


def median(values: Iterable[float]) -> float:
    return float(statistics.median(list(values)))


def paired_ratio(subject: Sequence[float], baseline: Sequence[float]) -> float:
    """The median of ``subject[i] / baseline[i]`` over samples taken side by side (pairs with
    a zero baseline, possible for CPU time at coarse clock resolution, are left out)."""
    ratios = [s / b for s, b in zip(subject, baseline, strict=True) if b > 0]
    return median(ratios) if ratios else math.nan


# -- result rows -----------------------------------------------------------------------------


def make_row(
    key: str,
    label: str,
    seconds: float,
    baseline_seconds: float | None = None,
    baseline: str | None = None,
    ratio: float | None = None,
    **extra: float | int | bool | str,
) -> Row:
    """A result row.

    ``key``: a stable identifier (``family.case``), ``label``: what was measured, ``seconds``:
    the subject's median time; ``baseline``/``baseline_seconds``: what it is compared with and
    its median time; ``ratio``: subject/baseline from paired samples (computed from the two
    medians when not given); ``extra``: further numbers (bandwidths, counts, sanity checks).
    """
    if ratio is None and baseline_seconds:
        ratio = seconds / baseline_seconds
    return {
        "key": key,
        "label": label,
        "seconds": float(seconds),
        "baseline": baseline,
        "baseline_seconds": None if baseline_seconds is None else float(baseline_seconds),
        "ratio": None if ratio is None else float(ratio),
        "extra": dict(extra),
    }


def _combine_values(values: list[Any]) -> Any:
    present = [v for v in values if v is not None]
    if not present:
        return None
    if all(isinstance(v, bool) for v in present):
        return all(present)
    if all(isinstance(v, int | float) for v in present):
        return median(present)
    return present[-1]


def combine(runs: Sequence[Sequence[Row]]) -> list[Row]:
    """One row per key: the median of each number over the runs (fresh processes).

    Booleans (sanity checks) must hold in every run; ``runs`` and the ``spread`` of the
    subject's time (max/min over runs) are added.
    """
    by_key: dict[str, list[Row]] = {}
    for rows in runs:
        for row in rows:
            by_key.setdefault(row["key"], []).append(row)
    combined = []
    for rows in by_key.values():
        out = dict(rows[0])
        for name in ("seconds", "baseline_seconds", "ratio"):
            out[name] = _combine_values([r[name] for r in rows])
        names = dict.fromkeys(name for r in rows for name in r["extra"])
        out["extra"] = {
            name: _combine_values([r["extra"].get(name) for r in rows]) for name in names
        }
        times = [r["seconds"] for r in rows if r["seconds"] > 0]
        out["runs"] = len(rows)
        out["spread"] = max(times) / min(times) if times else None
        combined.append(out)
    return combined


def check_rows(rows: Iterable[Row]) -> None:
    """Raise ValueError unless every time and ratio is a positive finite number."""
    for row in rows:
        for name in ("seconds", "baseline_seconds", "ratio"):
            value = row.get(name)
            if name != "seconds" and value is None:
                continue
            if not (isinstance(value, int | float) and math.isfinite(value) and value > 0):
                raise ValueError(f"{row.get('key')}: {name} is {value!r}")


# -- fresh processes -------------------------------------------------------------------------


def run_fresh(target: str, kwargs: Mapping[str, Any] | None = None, timeout: float = 900) -> Any:
    """Call ``target`` (``"module:function"``) with ``kwargs`` in a new interpreter started with
    :func:`bench_env`; return what it returned (JSON). Raises RuntimeError with the child's
    output if it fails."""
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.harness", target, json.dumps(dict(kwargs or {}))],
        cwd=REPO,
        env=bench_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith(RESULT_MARKER) and proc.returncode == 0:
            return json.loads(line[len(RESULT_MARKER) :])
    raise RuntimeError(
        f"benchmark {target} failed (exit code {proc.returncode}):\n"
        f"{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
    )


def run_fresh_repeated(
    target: str, kwargs: Mapping[str, Any] | None, runs: int, timeout: float = 900
) -> list[Row]:
    """:func:`run_fresh` ``runs`` times (each returning rows) and :func:`combine` the rows."""
    results = [run_fresh(target, kwargs, timeout) for _ in range(runs)]
    rows = combine(results)
    check_rows(rows)
    return rows


def environment_probe() -> dict[str, Any]:
    """What a fresh benchmark process sees of :data:`PINNED_ENV` (to check the pinning)."""
    return {"env": {name: os.environ.get(name) for name in PINNED_ENV}, "pid": os.getpid()}


def _child_main(argv: Sequence[str]) -> int:
    target, kwargs = argv[0], json.loads(argv[1]) if len(argv) > 1 else {}
    module_name, function_name = target.split(":")
    module = __import__(module_name, fromlist=[function_name])
    result = getattr(module, function_name)(**kwargs)
    sys.stdout.write("\n" + RESULT_MARKER + json.dumps(result) + "\n")
    sys.stdout.flush()
    return 0


# -- the machine -----------------------------------------------------------------------------


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _memory_gib() -> float | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) / (1 << 20)
    except OSError:
        pass
    return None


def _numpy_blas() -> str:
    """The BLAS numpy uses: threadpoolctl's view when it is installed, else numpy's config."""
    try:
        from threadpoolctl import threadpool_info
    except ImportError:
        threadpool_info = None
    import numpy as np

    if threadpool_info is not None:
        pools = [p for p in threadpool_info() if p.get("user_api") == "blas"]
        if pools:
            return ", ".join(
                f"{p.get('internal_api')} {p.get('version')} ({p.get('num_threads')} threads)"
                for p in pools
            )
    try:
        config = np.show_config(mode="dicts")
        blas = config["Build Dependencies"]["blas"]
        return f"{blas.get('name')} {blas.get('version')} (numpy build config)"
    except Exception:  # noqa: BLE001 - older numpy, or a config without this entry
        return "unknown"


def describe_machine() -> dict[str, Any]:
    """CPU, cores, memory, load, library versions, BLAS and the pinned settings."""
    import numpy as np

    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:
        usable = os.cpu_count()
    info: dict[str, Any] = {
        "cpu": _cpu_model(),
        "logical_cpus": os.cpu_count(),
        "usable_cpus": usable,
        "memory_gib": _memory_gib(),
        "os": f"{platform.system()} {platform.release()}",
        "python": platform.python_version(),
        "numpy": np.__version__,
        "numpy_blas": _numpy_blas(),
        "load_average": list(os.getloadavg()),
        "pinned_env": dict(PINNED_ENV),
    }
    try:
        torch = pin_torch_threads()
        info["torch"] = torch.__version__
        info["torch_threads"] = torch.get_num_threads()
        info["torch_blas"] = _torch_blas(torch)
    except ImportError:
        info["torch"] = None
    return info


def _torch_blas(torch: Any) -> str:
    config = torch.__config__.show()
    for line in config.splitlines():
        if "BLAS_INFO" in line:
            return line.split("BLAS_INFO=", 1)[1].split(",")[0]
    return "mkldnn" if torch.backends.mkldnn.is_available() else "unknown"


def load_average() -> list[float]:
    """The 1, 5 and 15 minute load averages."""
    return [round(x, 2) for x in os.getloadavg()]


if __name__ == "__main__":
    sys.exit(_child_main(sys.argv[1:]))
