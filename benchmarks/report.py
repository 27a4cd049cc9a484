"""The Markdown report: method, goals and verdicts, machine, one table per benchmark family."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from benchmarks.goals import Verdict
from benchmarks.harness import Row

INTRO = """\
# Benchmarks

What the course library costs against the baselines it should be measured by: the autograd
engine against PyTorch eager and against backprop written by hand in numpy; the simulated
world's collectives against the memory limit (a memcpy); the torch backend against raw
`torch.distributed`; the launcher's start-up; the autograding pipeline's throughput;
redistributing placed tensors against PyTorch's DTensor; and training steps: the capstone's
transformer on a 2 × 2 grid against one process, and the data-parallel exercise's solution against
PyTorch's DistributedDataParallel. Every family but the last two has a goal; the table below says
whether it is met.

**Method.** Every family runs in fresh interpreters (nothing warm from another benchmark),
several times where that is affordable; each number is the median over those processes, and
inside a process the median over samples. A subject and its baseline are measured in the same
process, alternating sample by sample, and the *ratio* is the median of those paired ratios:
ratios are what to read, since absolute times move with the machine's load. Every process
(and every process it starts) runs with BLAS and OpenMP pinned to one thread
(`OMP_NUM_THREADS`, `OPENBLAS_NUM_THREADS`, `MKL_NUM_THREADS` = 1, `torch.set_num_threads(1)`)
and identical glibc allocator settings (`MALLOC_MMAP_THRESHOLD_` = 32 MiB, the largest glibc
allows, and `MALLOC_TRIM_THRESHOLD_` = 1 GiB), so that no implementation pays page faults for
its large temporaries while another does not. *spread* is the largest over the smallest time of
the subject across processes. Regenerate with `make bench` (`python -m benchmarks.run --out
BENCHMARKS.md`; `--quick` for a smoke run at small sizes); the raw numbers go to
`benchmarks/results/latest.json` (not committed), from which `python -m benchmarks.run
--render-from benchmarks/results/latest.json` rewrites this file without measuring again.
"""


@dataclass(frozen=True)
class Section:
    """One benchmark family's part of the report."""

    title: str
    text: str
    rows: Sequence[Row]


def fmt_time(seconds: float | None) -> str:
    """``12.3 µs``, ``4.56 ms``, ``1.23 s`` (``—`` for nothing)."""
    if seconds is None or not math.isfinite(seconds):
        return "—"
    if seconds < 1e-3:
        return f"{seconds * 1e6:.1f} µs"
    if seconds < 1:
        return f"{seconds * 1e3:.2f} ms"
    return f"{seconds:.2f} s"


def fmt_ratio(ratio: float | None) -> str:
    return "—" if ratio is None else f"{ratio:.2f}×"


def fmt_extra(name: str, value: Any) -> str:
    """One extra field as ``name value`` with its unit."""
    label = name.replace("_", " ")
    if isinstance(value, bool):
        return f"{label}: {'yes' if value else 'NO'}"
    if name.endswith("_gb_s"):
        return f"{label.removesuffix(' gb s')} {value:.2f} GB/s"
    if name.endswith("_s"):
        return f"{label.removesuffix(' s')} {fmt_time(value)}"
    if isinstance(value, float):
        return f"{label} {value:.3g}"
    return f"{label} {value}"


def _escape(text: str) -> str:
    return str(text).replace("|", "\\|")


def rows_table(rows: Sequence[Row]) -> list[str]:
    """A Markdown table of result rows."""
    lines = [
        "| measured | subject | baseline | baseline time | ratio | runs | spread | details |",
        "|---|---:|---|---:|---:|---:|---:|---|",
    ]
    for row in rows:
        extras = ", ".join(fmt_extra(k, v) for k, v in row["extra"].items() if v is not None)
        spread = row.get("spread")
        cells = [
            _escape(row["label"]),
            fmt_time(row["seconds"]),
            _escape(row["baseline"] or "—"),
            fmt_time(row["baseline_seconds"]),
            fmt_ratio(row["ratio"]),
            str(row.get("runs", 1)),
            "—" if spread is None else f"{spread:.2f}",
            _escape(extras),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def _verdict_value(verdict: Verdict) -> str:
    if verdict.value is None:
        return "—"
    if verdict.unit == "seconds":
        shown = fmt_time(verdict.value)
    else:
        shown = fmt_ratio(verdict.value)
    where = (
        verdict.key if verdict.field in ("seconds", "ratio") else f"{verdict.key}, {verdict.field}"
    )
    return f"{shown} (`{where}`)"


def _verdict_word(verdict: Verdict) -> str:
    if verdict.met is None:
        return "not measured"
    if verdict.met:
        return "**met**"
    if verdict.failed_checks:
        return "**missed** (check failed: " + ", ".join(verdict.failed_checks) + ")"
    return "**missed**"


def goals_table(verdicts: Sequence[Verdict]) -> list[str]:
    lines = ["| family | goal | measured (worst case) | verdict |", "|---|---|---|---|"]
    for v in verdicts:
        cells = [v.goal.family, _escape(v.goal.text), _verdict_value(v), _verdict_word(v)]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def machine_table(machine: Mapping[str, Any]) -> list[str]:
    names = {
        "cpu": "CPU",
        "logical_cpus": "logical CPUs",
        "usable_cpus": "CPUs this process may use",
        "memory_gib": "memory",
        "os": "OS",
        "python": "Python",
        "numpy": "numpy",
        "numpy_blas": "numpy's BLAS",
        "torch": "torch",
        "torch_blas": "torch's BLAS",
        "torch_threads": "torch threads",
    }
    lines = ["| | |", "|---|---|"]
    for key, name in names.items():
        value = machine.get(key)
        if key == "memory_gib" and value is not None:
            value = f"{value:.1f} GiB"
        lines.append(f"| {name} | {_escape(value)} |")
    pinned = ", ".join(f"`{k}={v}`" for k, v in machine.get("pinned_env", {}).items())
    lines.append(f"| environment of every process | {pinned} |")
    return lines


def render(
    sections: Sequence[Section],
    verdicts: Sequence[Verdict],
    machine: Mapping[str, Any],
    run_info: Mapping[str, Any],
    findings: str = "",
) -> str:
    """The whole report."""
    load_start, load_end = run_info["load_start"], run_info["load_end"]
    out = [INTRO]
    out.append(
        f"Generated {run_info['date']} by `{run_info['command']}` in "
        f"{run_info['minutes']:.1f} min, the library at commit {run_info.get('code', 'unknown')}."
    )
    if run_info.get("quick"):
        out.append(
            "\n**This is a `--quick` run**: small sizes and few samples, to check that the "
            "benchmarks work. Its numbers say nothing about the goals."
        )
    # At the end the 1-minute load counts the benchmark's own processes (the grading batch
    # with 2 workers): only the load before the run tells of other work.
    busy = load_start[0] > 0.75 * (machine.get("usable_cpus") or 1)
    load_text = (
        f"Load average (1, 5, 15 min) at the start: {', '.join(map(str, load_start))}; "
        f"at the end (the benchmark's own processes included): "
        f"{', '.join(map(str, load_end))}, on {machine.get('usable_cpus')} CPUs."
    )
    if busy:
        load_text += (
            " **The machine was shared with other work during this run**: absolute times are "
            "inflated and noisy, the paired ratios less so; where a goal is close to its limit, "
            "rerun on an idle machine before concluding."
        )
    out += ["", load_text, "", "## Goals", "", *goals_table(verdicts), ""]
    for number, section in enumerate(sections, 1):
        out += [f"## {number}. {section.title}", "", section.text.strip(), ""]
        out += [*rows_table(section.rows), ""]
    if findings.strip():
        out += [findings.strip(), ""]
    out += ["## Machine", "", *machine_table(machine), ""]
    return "\n".join(out)
