"""Run the benchmarks and write the Markdown report.

``python -m benchmarks.run --out BENCHMARKS.md [--quick] [--only engine,sim,...] [--runs N]``

Each family's ``measure(quick)`` runs in fresh interpreters (:func:`benchmarks.harness.run_fresh`)
as many times as its ``runs`` says; the rows are the medians over those runs. The raw rows, the
machine and the verdicts also go to ``benchmarks/results/latest.json``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from benchmarks.goals import judge_all
from benchmarks.harness import (
    REPO,
    Row,
    describe_machine,
    load_average,
    run_fresh_repeated,
)
from benchmarks.report import Section, render

RESULTS = REPO / "benchmarks" / "results"
FINDINGS = Path(__file__).with_name("findings.md")


@dataclass(frozen=True)
class Family:
    """A benchmark family: where its ``measure`` lives and how many fresh processes run it."""

    name: str
    title: str
    target: str
    runs: int
    text: str


FAMILIES: tuple[Family, ...] = (
    Family(
        "engine",
        "Engine: chainrule (numpy) against PyTorch eager, CPU, float32",
        "benchmarks.engine:measure",
        5,
        "Forward + backward of a chain of 100 elementwise multiplications or 100 matrix "
        "products on 8×8 tensors, in time per operation, and one training step of a 3-layer "
        "tanh MLP (batch 64, widths w → w → w → 10, mean cross-entropy, backward, SGD), "
        "against PyTorch eager and against the same step with the chain rule written by hand "
        "in numpy. *agree*: the implementations' losses and updated weights after one step "
        "from the same weights match. *cpu ratio*: the same paired ratio on the thread's CPU "
        "time, which leaves out the time spent waiting for a core (steadier when the machine "
        "is loaded). Anchors on this kind of machine: PyTorch 4.8 µs per mul, "
        "6.0 µs per matmul, steps of 0.100 / 0.150 / 4.34 ms at widths 8 / 64 / 512.",
    ),
    Family(
        "sim",
        "Simulated world against the memory limit",
        "benchmarks.sim_collectives:measure",
        3,
        "`chainrule.dist` collectives on a simulated world of P = 4 threads, in units of one "
        "`np.copyto` of 64 MB into an existing array, measured alternately in the same process "
        "(the ratio column is the number of memcpy units). S = 64 MB is the largest buffer of a "
        "rank (all_gather's input is S/4). The *floor* is the copy count of the bytes that must "
        "move: every input read once and every output written once, over the 2S bytes one "
        "memcpy moves: P for all_reduce and all_to_all (P inputs of S read, P outputs of S "
        "written), (P + 1)/2 for all_gather and reduce_scatter. Timed as a loop of calls "
        "after one untimed call (result arrays already mapped, as in a training loop). The "
        "1 KB row is the time per call of a loop of all_reduces: the cost of the rendezvous; "
        "its *cpu per call* is the CPU time of all ranks' threads together per call (what "
        "the calls compute, without the time spent waiting for a core).",
    ),
    Family(
        "gloo",
        "Torch backend against raw torch.distributed (gloo, 2 processes)",
        "benchmarks.gloo_collectives:measure",
        3,
        'Inside one `chainrule.dist.run(fn, 2, backend="gloo")`, timed on rank 0 after a '
        "barrier, subject and baseline alternating on the same float32 tensors. The wrapper "
        "`dist.all_reduce(t)` returns a new tensor (it copies `t`); the raw "
        "`torch.distributed.all_reduce(t)` works in place. `f̄(f(x))` is "
        "`reduce_from_ranks(copy_to_ranks(x))` from `chainrule.duality_torch`, forward and "
        "backward: one all-reduce each way, so 2× is its floor; `f̄(x)` alone carries one. "
        "Bus bandwidth (nccl-tests): algbw = S/t with S the largest buffer of a rank, busbw = "
        "algbw × 2(n−1)/n for all_reduce and × (n−1)/n for all_gather, reduce_scatter and "
        "all_to_all. *best ratio*: the fastest subject sample over the fastest baseline "
        "sample, the view least disturbed by other work on the machine. Anchors: all_reduce "
        "of 1 KB 0.2–0.26 ms, 64 MB at about 1.7 GB/s busbw.",
    ),
    Family(
        "startup",
        "Launcher start-up",
        "benchmarks.startup:measure",
        1,
        "A notebook-like fresh process imports numpy and `chainrule.dist`, defines the SPMD "
        "function in `__main__` (it travels by value) and calls `dist.run(fn, 2, "
        'backend="gloo")`: the first call starts the worker pool (torch imported in the '
        "parent and in each worker, gloo group joined), repeated calls reuse it. Median over "
        "3 processes (repeated: over all their calls). Baseline: a fresh interpreter that only "
        "imports torch (anchor: about 1 s on an idle machine).",
    ),
    Family(
        "grading",
        "Autograding throughput",
        "benchmarks.grading:measure",
        1,
        "In a temporary copy of the course: `check_yourself` generated there, 20 submissions "
        "(3 with `--quick`) with different answers, each batch a fresh `python -m "
        "chainrule.grading batch check_yourself --no-feedback` on its own copy. The batch "
        "row's subject is the sequential batch and its baseline the batch with "
        "`--workers 2`, so its ratio is the speedup. *identical grades*: every student's "
        "per-notebook statuses and scores and total agree between the two batches (and with "
        "the single-student run).",
    ),
)


def code_version() -> str:
    """The commit the library was measured at, and whether ``lib/`` had uncommitted changes."""
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True
        ).stdout.strip()
        changed = subprocess.run(
            ["git", "status", "--porcelain", "--", "lib"], cwd=REPO, capture_output=True, text=True
        ).stdout.splitlines()
    except OSError:
        return "unknown (no git)"
    if not commit:
        return "unknown (not a git checkout)"
    return f"{commit}" + (f" with {len(changed)} uncommitted file(s) in lib/" if changed else "")


def measure_family(family: Family, quick: bool, runs: int | None) -> list[Row]:
    """The family's rows: medians over ``runs`` fresh processes (1 when ``quick``)."""
    count = 1 if quick else (runs or family.runs)
    return run_fresh_repeated(family.target, {"quick": quick}, count, timeout=7200)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.run", description=__doc__)
    parser.add_argument("--out", type=Path, default=REPO / "BENCHMARKS.md")
    parser.add_argument("--quick", action="store_true", help="small sizes, one process each")
    parser.add_argument("--only", default="", help="comma-separated families to run")
    parser.add_argument("--runs", type=int, help="fresh processes per family (default: its own)")
    args = parser.parse_args(argv)
    chosen = [f for f in FAMILIES if not args.only or f.name in args.only.split(",")]
    unknown = set(filter(None, args.only.split(","))) - {f.name for f in FAMILIES}
    if unknown:
        parser.error(
            f"unknown families {sorted(unknown)}; choose from {[f.name for f in FAMILIES]}"
        )

    started = time.perf_counter()
    load_start = load_average()
    machine = describe_machine()
    sections, all_rows = [], []
    for family in chosen:
        print(f"[bench] {family.name} ...", file=sys.stderr, flush=True)
        family_start = time.perf_counter()
        rows = measure_family(family, args.quick, args.runs)
        seconds = time.perf_counter() - family_start
        print(
            f"[bench] {family.name}: {len(rows)} rows in {seconds:.0f} s",
            file=sys.stderr,
            flush=True,
        )
        sections.append(Section(family.title, family.text, rows))
        all_rows += rows
    verdicts = judge_all(all_rows)
    command = "python -m benchmarks.run " + " ".join(argv if argv is not None else sys.argv[1:])
    run_info = {
        "date": datetime.datetime.now().strftime("%Y-%m-%d %H:%M"),
        "command": command.strip(),
        "minutes": (time.perf_counter() - started) / 60,
        "quick": args.quick,
        "code": code_version(),
        "load_start": load_start,
        "load_end": load_average(),
    }
    findings = FINDINGS.read_text() if FINDINGS.exists() and not args.quick else ""
    args.out.write_text(render(sections, verdicts, machine, run_info, findings))
    RESULTS.mkdir(parents=True, exist_ok=True)
    raw = {
        "run": run_info,
        "machine": machine,
        "rows": all_rows,
        "verdicts": [
            {
                **asdict(v.goal),
                "value": v.value,
                "key": v.key,
                "met": v.met,
                "failed_checks": list(v.failed_checks),
            }
            for v in verdicts
        ],
    }
    (RESULTS / ("quick.json" if args.quick else "latest.json")).write_text(
        json.dumps(raw, indent=1)
    )
    for v in verdicts:
        state = {True: "met", False: "MISSED", None: "not measured"}[v.met]
        print(f"[bench] {state:>12}: {v.goal.text}", file=sys.stderr)
    print(f"[bench] wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
