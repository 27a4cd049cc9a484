"""Run the benchmarks and write the Markdown report.

``python -m benchmarks.run --out BENCHMARKS.md [--quick] [--only engine,sim,...] [--runs N]``

Each family's ``measure(quick)`` runs in fresh interpreters (:func:`benchmarks.harness.run_fresh`)
as many times as its ``runs`` says; the rows are the medians over those runs. The raw rows and
the machine also go to ``benchmarks/results/latest.json`` (``quick.json`` for ``--quick``,
``partial.json`` for ``--only``), from
which ``--render-from`` rewrites the report without measuring again. The hand-written analysis in
``benchmarks/findings.md`` is appended to a full run's report.
"""

from __future__ import annotations

import argparse
import datetime
import json
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from benchmarks.goals import Verdict, judge_all
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
        "`chainrule.dist` collectives on a simulated world of P = 4 ranks (greenlets taking "
        "turns in one thread; each collective one numpy computation of every rank's result "
        "into new arrays), in units of one "
        "`np.copyto` of 64 MB into an existing array, measured alternately in the same process "
        "(the ratio column is the number of memcpy units). S = 64 MB is the largest buffer of a "
        "rank (all_gather's input is S/4). The *floor* is the copy count of the bytes that must "
        "move: every input read once and every output written once, over the 2S bytes one "
        "memcpy moves: P for all_reduce and all_to_all (P inputs of S read, P outputs of S "
        "written), (P + 1)/2 for all_gather and reduce_scatter. Timed as a loop of calls "
        "after one untimed call. The "
        "1 KB row is the time per call of a loop of all_reduces: the cost of the rendezvous; "
        "its *cpu per call* is the CPU time of the process's threads per call (what the "
        "calls compute, without the time spent waiting for a core).",
    ),
    Family(
        "gloo",
        "Torch backend against raw torch.distributed (gloo, 2 processes)",
        "benchmarks.gloo_collectives:measure",
        5,  # the noisiest rows (gloo's latency jitters by 15–30% here), two goals near limits
        'Inside one `chainrule.dist.run(fn, 2, backend="gloo")`, timed on rank 0 after a '
        "barrier, subject and baseline alternating on the same float32 tensors. The raw "
        "`torch.distributed.all_reduce(t)` works in place, and so does the wrapper called as "
        "`dist.all_reduce(t, out=t)` (the like-for-like row the goal reads); the functional "
        "`dist.all_reduce(t)` returns a new tensor and leaves `t` alone: it reduces one copy "
        "of `t`, so its baseline is the raw all-reduce plus `t.clone()`, timed together. Both "
        "forms first agree with the other ranks on the call (one all-gather of a few "
        "integers), which is what catches mismatched dtypes, shapes, ops and collectives. "
        "`f̄(f(x))` is "
        "`reduce_from_ranks(copy_to_ranks(x))` from `chainrule.duality_torch`, forward and "
        "backward: one all-reduce each way, so 2× is its floor; each reduces a copy (of `x`, "
        "then of the incoming gradient). `f̄(x)` alone carries one, "
        "and its backward hands the caller's seed to `x.grad`, which torch then copies into "
        "fresh memory (it never takes a gradient that someone else holds). "
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
        'backend="gloo")`: the first call starts the worker pool (one launcher interpreter '
        "imports torch and forks both ranks, whether or not the caller imported torch), both "
        "join the gloo group; repeated calls reuse it. "
        "Median over "
        "3 processes (repeated: over all their calls). Baseline: a fresh interpreter that only "
        "imports torch (anchor: about 1 s on an idle machine), timed alongside each; the "
        "first-call goal reads the ratio to it.",
    ),
    Family(
        "grading",
        "Autograding: where the time goes, and a class's throughput",
        "benchmarks.grading:measure",
        1,
        "In temporary copies of the course. *parts*: one instructor submission of each "
        "assignment graded by a fresh `python -m chainrule.grading batch <assignment> "
        "--no-feedback`; its time is the student's wall time in the batch, split (from the "
        "batch's summary) into the sandbox's start (of which its zygote's imports of numpy, "
        "torch and the course library), and over the notebooks the kernels' starts (forked by "
        "the zygote), the student's cells, the judge's own work, the kernel's answers to the "
        "judge's requests (less the gloo worlds they started: *gloo world starts*, each "
        "world's processes and process group), nbgrader's steps (reading, restoring, the "
        "gradebook, writing), and "
        "what lies outside any notebook (the grading child, the snapshot); *cpu in the sandbox* "
        "is the student's control group's CPU time. Its baseline is the floor: one fresh "
        "interpreter running every code cell of the instructor's notebooks once (solutions, "
        "helpers and tests, hidden ones included). *batch*: 8 `check_yourself` submissions "
        "(3 with `--quick`) with different answers, sequential, then the same sequential "
        "batch with `--no-sandbox` (the sandbox row), then with 2 workers, each on its own copy; "
        "*identical grades*: every student's per-notebook statuses and scores agree between the "
        "three. *machine two processes* (before the sequential batch, after the 2-worker one): "
        "how much more pure-Python CPU work two processes do at once than one on this machine, "
        "the ceiling of any 2-worker speedup beside it (2 on two free cores; less where they "
        "are hyperthreads of one core or the host takes its share). *class*: the 2-worker "
        "batch's time per student, times 1,000.",
    ),
    Family(
        "queue",
        "Grading on the task queue: one and two workers against the batch grader",
        "benchmarks.queue:measure",
        1,
        "In a temporary class with its own PostgreSQL and Redis. The *grading* family's "
        "`check_yourself` submissions (8, 3 with `--quick`), graded on the queue "
        "(`python -m chainrule.classroom grade`, PostgreSQL gradebook) by one and then two "
        "worker processes on this machine, each against the one-machine batch grader on the "
        "same submissions (sequential, and `--workers 2`; SQLite gradebook). Times are the "
        "batch's wall time from sending the jobs to the summary (the workers are started "
        "before); *per minute* is submissions graded per minute; *identical grades*: every "
        "student's per-notebook statuses and scores agree with the batch grader. *class*: "
        "1,000 submissions at the 2-worker queue's rate on one machine like this one (2 cores), "
        "and in `extra` the hours on 1, 2, 4, 8 and 16 such machines: the workers share only "
        "the broker and the gradebook, whose work per submission is small next to grading it.",
    ),
    Family(
        "training",
        "Training steps: the capstone on a 2 × 2 grid, and data parallelism from scratch",
        "benchmarks.training:measure",
        3,
        "Lesson 15's transformer (`chainrule.transformer`: 2 layers, width 32, 8 sequences of "
        "16 characters per step), in time per training step (forward, backward, the gradient "
        "average and the SGD step), each sample a whole run of 20 steps. The simulated 2 × 2 "
        "grid (float64) alternates with one process in the same interpreter; the 4 gloo "
        "processes (float32) are timed on rank 0 between two barriers, after a warm-up run, "
        "alternating with one process in float32. On 2 cores 4 processes share the machine, "
        "and each step waits for 10 collectives of the rows and columns. *agree*: the grid's "
        "loss curve equals one process's (1e-10 in float64, within four times float32's own "
        "rounding on gloo). Then the solution of the exercise `training/ex1_ddp_buckets` (its "
        "`source/` cells as they stand) against `torch.nn.parallel.DistributedDataParallel` "
        "with the same bucket size (1 MiB), on 2 gloo processes: one sample is 5 training "
        "steps (forward, mean squared error, backward, the wait for the gradients, SGD) of "
        "the same 4-layer MLP of width 1024, alternating on rank 0 after a barrier; *agree*: "
        "both end with the same parameters.",
    ),
    Family(
        "pipeline",
        "Pipeline parallelism: the pipelined step against one process, and the bubble",
        "benchmarks.pipeline:measure",
        1,  # one process of repeated, alternating samples: the family stays under a minute
        "A tanh MLP of square layers cut into P stages (`chainrule.pipeline`), one step = the "
        "forward and backward of m micro-batches in the 1F1B order, one stage per rank, against "
        "the same step on one process: lesson 6's loop, one backward per micro-batch into the "
        "same `.grad` (the pipeline's arithmetic), alternating sample by sample. On the "
        "simulated world (P = 2, 4, float64) the ranks take turns in one thread, so the ratio is "
        "what the send/recv rows and the runner add; *agree*: the gradients equal one process's "
        "within 1e-12 of each gradient's largest entry. On gloo (P = 2, float32) rank 0's step "
        "is timed between two barriers; *agree*: within 1e-5 of the float64 gradients. A step "
        "sends 2(P − 1)m messages; the message row times one (half a ping-pong of a small "
        "float32 tensor): `chainrule.dist.send`/`recv`, which first agree on the pair in the "
        "process group's store, against raw `torch.distributed.send`/`recv`. The bubble rows "
        "(2 gloo stages, wider layers, m = 1, 4, 8) measure the idle share from the wall clock: "
        "with T₁ the whole step on one process and T the pipelined step, *bubble measured* is "
        "1 − T₁/(P·T) (messages and any other load on the machine included), against *bubble "
        "formula* (P − 1)/(m + P − 1); *bubble slots* is the bubble of the order the runner ran, "
        "each forward and backward one slot (`pipeline.timeline`).",
    ),
    Family(
        "redistribute",
        "Redistribution against PyTorch's DTensor (gloo, 2 processes)",
        "benchmarks.redistribute:measure",
        3,
        'Inside one `chainrule.dist.run(fn, 2, backend="gloo")`, timed on rank 0 after a '
        "barrier, subject and baseline alternating. One sample is a forward and a backward "
        "redistribution of a float32 tensor of S bytes: `chainrule.sharded.redistribute` on an "
        "engine tensor (numpy; each transition one row of the duality table, its collectives "
        "through `chainrule.dist`) against `DTensor.redistribute` and `backward` on a DTensor of "
        "the same placement, on the same process group. Shard(0) → Replicate is an all-gather "
        "forward and a split backward, Partial → Replicate an all-reduce and the identity, "
        "Partial → Shard(0) a reduce-scatter and an all-gather. *agree*: both give the same "
        "outputs and input gradients for every pair of placements.",
    ),
    Family(
        "context",
        "Context parallelism: ring attention against one process's attention",
        "benchmarks.context:measure",
        1,
        "Forward + backward of attention (4 heads of width 16) on the sequence split across P "
        "ranks: `chainrule.parallel.context.ring_attention` (the key/value blocks passed "
        "around the ring by the send and recv rows, partial softmaxes merged by their "
        "log-sum-exp; no hand-written backward), a plain split without mask and a zig-zag split "
        "with the causal mask. *sim*: the engine on 4 simulated ranks (float64, 256 tokens; 64 "
        "with `--quick`) taking turns in one thread, so a sample is all the ranks' work, against "
        "the engine's one-process attention over the whole sequence, alternating in the same "
        "interpreter. *gloo*: the torch version on 4 gloo processes (float32, 1024 tokens; 2 "
        "processes and 64 tokens with `--quick`), timed on rank 0 after a barrier, against one "
        "process's torch attention over the whole sequence on rank 0: one rank's n/P queries "
        "against all n on one process. *error*: the largest difference of the output and of "
        "the gradients of Q, K and V from one process's.",
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


def sections_of(rows: Sequence[Row]) -> list[Section]:
    """The report's sections: each family's rows (a row's key starts with its family's name)."""
    sections = []
    for family in FAMILIES:
        mine = [r for r in rows if r["key"].split(".")[0] == family.name]
        if mine:
            sections.append(Section(family.title, family.text, mine))
    return sections


def write_report(out: Path, raw: dict) -> list[Verdict]:
    """Judge the rows of ``raw`` (as saved in the results JSON) and write the report."""
    rows, run_info = raw["rows"], raw["run"]
    verdicts = judge_all(rows)
    findings = FINDINGS.read_text() if FINDINGS.exists() and not run_info["quick"] else ""
    out.write_text(render(sections_of(rows), verdicts, raw["machine"], run_info, findings))
    return verdicts


def measure_all(families: Sequence[Family], quick: bool, runs: int | None, command: str) -> dict:
    """Run ``families``; the raw results: run information, machine, rows."""
    started = time.perf_counter()
    load_start = load_average()
    machine = describe_machine()
    rows: list[Row] = []
    for family in families:
        print(f"[bench] {family.name} ...", file=sys.stderr, flush=True)
        family_start = time.perf_counter()
        mine = measure_family(family, quick, runs)
        seconds = time.perf_counter() - family_start
        print(f"[bench] {family.name}: {len(mine)} rows in {seconds:.0f} s", file=sys.stderr)
        rows += mine
    run_info = {
        "date": datetime.datetime.now().strftime("%Y-%m-%d %H:%M"),
        "command": command,
        "minutes": (time.perf_counter() - started) / 60,
        "quick": quick,
        "code": code_version(),
        "load_start": load_start,
        "load_end": load_average(),
    }
    return {"run": run_info, "machine": machine, "rows": rows}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.run", description=__doc__)
    parser.add_argument("--out", type=Path, default=REPO / "BENCHMARKS.md")
    parser.add_argument("--quick", action="store_true", help="small sizes, one process each")
    parser.add_argument("--only", default="", help="comma-separated families to run")
    parser.add_argument("--runs", type=int, help="fresh processes per family (default: its own)")
    parser.add_argument(
        "--render-from",
        type=Path,
        metavar="JSON",
        help="measure nothing: write the report from saved results (e.g. after editing "
        "benchmarks/findings.md)",
    )
    args = parser.parse_args(argv)
    if args.render_from:
        write_report(args.out, json.loads(args.render_from.read_text()))
        print(f"[bench] wrote {args.out} from {args.render_from}", file=sys.stderr)
        return 0
    chosen = [f for f in FAMILIES if not args.only or f.name in args.only.split(",")]
    unknown = set(filter(None, args.only.split(","))) - {f.name for f in FAMILIES}
    if unknown:
        parser.error(
            f"unknown families {sorted(unknown)}; choose from {[f.name for f in FAMILIES]}"
        )
    command = "python -m benchmarks.run " + " ".join(argv if argv is not None else sys.argv[1:])
    raw = measure_all(chosen, args.quick, args.runs, command.strip())
    RESULTS.mkdir(parents=True, exist_ok=True)
    name = "quick" if args.quick else "partial" if args.only else "latest"
    saved = RESULTS / f"{name}.json"
    saved.write_text(json.dumps(raw, indent=1))
    verdicts = write_report(args.out, raw)
    for v in verdicts:
        state = {True: "met", False: "MISSED", None: "not measured"}[v.met]
        print(f"[bench] {state:>12}: {v.goal.text}", file=sys.stderr)
    print(f"[bench] wrote {args.out} (raw results: {saved})", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
