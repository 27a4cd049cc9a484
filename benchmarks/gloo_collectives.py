"""The torch backend against raw ``torch.distributed`` on gloo, 2 processes.

Everything runs inside one ``chainrule.dist.run(fn, 2, backend="gloo")`` call, timed inside the
SPMD function on rank 0, with a barrier before each sample; the subjects and the baselines
alternate sample by sample on the same tensors.

- The wrapper against ``torch.distributed.all_reduce(t)`` (in place), float32, sizes 1 KB to
  64 MB, in two forms: in place, ``chainrule.dist.all_reduce(t, out=t)`` (like for like with
  the raw call), and functional, ``chainrule.dist.all_reduce(t)``, which leaves ``t`` alone and
  returns the sum in memory of its own: one copy of ``t`` (``t.clone()``), reduced in place.
  The functional form's baseline is the raw all-reduce plus that one copy, timed together.
  Both forms also pay the ranks' agreement on the call (one all-gather of a few integers)
  before the data moves.
- The differentiable all-reduce of tensor parallelism, ``y = f̄(f(x))`` with
  ``f = copy_to_ranks`` (identity forward, all-reduce backward) and ``f̄ = reduce_from_ranks``
  (all-reduce forward, identity backward) from :mod:`chainrule.duality_torch`: forward and
  backward together carry two all-reduces, so 2× one raw all-reduce is its floor; each
  reduces a copy. ``f̄`` alone (one all-reduce) is reported too.
- Bus bandwidth with nccl-tests' definitions, for the wrapper's and the raw collectives at the
  largest size S (the largest buffer of a rank; all_gather's input is S/n): algbw = S / t,
  busbw = algbw × 2(n−1)/n for all_reduce and × (n−1)/n for all_gather, reduce_scatter and
  all_to_all.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

from benchmarks.harness import Row, make_row, median, paired_ratio

KB = 1 << 10
MB = 1 << 20
WORLD = 2
SIZES = (1 * KB, 64 * KB, 1 * MB, 16 * MB, 64 * MB)
QUICK_SIZES = (1 * KB, 64 * KB)


def size_label(size_bytes: int) -> str:
    """``1KB``, ``64KB``, ``16MB``..."""
    if size_bytes >= MB and size_bytes % MB == 0:
        return f"{size_bytes // MB}MB"
    if size_bytes >= KB and size_bytes % KB == 0:
        return f"{size_bytes // KB}KB"
    return f"{size_bytes}B"


def calls_per_sample(size_bytes: int) -> int:
    """Back-to-back calls in one timed sample: about 2 MB of payload, 1 to 200 calls."""
    return max(1, min(200, (2 * MB) // size_bytes))


def bus_factor(op: str, world: int) -> float:
    """nccl-tests' busbw/algbw: 2(n−1)/n for all_reduce, (n−1)/n for the others here."""
    return 2 * (world - 1) / world if op == "all_reduce" else (world - 1) / world


# -- inside the SPMD function (each gloo worker) -----------------------------------------------


def sample(fn: Callable[[], Any], calls: int) -> float:
    """Seconds per call of ``fn``, over ``calls`` calls after a barrier of all ranks."""
    import torch.distributed as td

    td.barrier()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - start) / calls


def alternate(candidates: dict[str, Callable[[], Any]], calls: int, repeat: int) -> dict:
    """``repeat`` samples of every candidate, taking turns, after one warm-up call each."""
    for fn in candidates.values():  # warm-up: the first call of a size allocates
        fn()
    samples: dict[str, list[float]] = {name: [] for name in candidates}
    for _ in range(repeat):
        for name, fn in candidates.items():
            samples[name].append(sample(fn, calls))
    return samples


def _raw_ops(td: Any, torch: Any, world: int) -> dict[str, Callable[[Any], Any]]:
    """The raw torch.distributed collectives, with their outputs allocated once per size."""

    def all_gather(t: Any) -> Callable[[], Any]:
        parts = [torch.empty_like(t) for _ in range(world)]
        return lambda: td.all_gather(parts, t)

    def reduce_scatter(t: Any) -> Callable[[], Any]:
        chunks = list(t.chunk(world))
        out = torch.empty_like(chunks[0])
        return lambda: td.reduce_scatter(out, chunks)

    def all_to_all(t: Any) -> Callable[[], Any]:
        out = torch.empty_like(t)
        return lambda: td.all_to_all_single(out, t)

    return {
        "all_reduce": lambda t: lambda: td.all_reduce(t),
        "all_gather": all_gather,
        "reduce_scatter": reduce_scatter,
        "all_to_all": all_to_all,
    }


def _check_values(dist: Any, td: Any, torch: Any) -> bool:
    """Wrapper, raw and differentiable all-reduce give the same sums and gradients."""
    from chainrule.parallel.duality_torch import copy_to_ranks, reduce_from_ranks

    P, r = td.get_world_size(), td.get_rank()
    x = torch.arange(8, dtype=torch.float32) + r
    expected = P * torch.arange(8, dtype=torch.float32) + P * (P - 1) / 2
    raw = x.clone()
    td.all_reduce(raw)
    wrapped = dist.all_reduce(x)
    in_place = x.clone()
    returned = dist.all_reduce(in_place, out=in_place)
    leaf = x.clone().requires_grad_(True)
    y = reduce_from_ranks(copy_to_ranks(leaf))
    y.backward(torch.ones_like(y))
    return bool(
        torch.equal(raw, expected)
        and torch.equal(wrapped, expected)
        and returned is in_place
        and torch.equal(in_place, expected)
        and torch.equal(x, torch.arange(8, dtype=torch.float32) + r)  # input left alone
        and torch.equal(y.detach(), expected)
        and torch.equal(leaf.grad, torch.full_like(x, float(P)))
    )


def spmd_measure(sizes: Sequence[int], repeat: int) -> dict[str, Any]:
    """The SPMD body: samples (seconds per call) of every subject and baseline, on rank 0."""
    import torch
    import torch.distributed as td
    from chainrule import dist
    from chainrule.parallel.duality_torch import copy_to_ranks, reduce_from_ranks

    P = td.get_world_size()
    result: dict[str, Any] = {"agree": _check_values(dist, td, torch), "sizes": {}}
    for size in sizes:
        t = torch.zeros(size // 4, dtype=torch.float32)  # zeros: repeated sums stay finite
        leaf = torch.zeros_like(t, requires_grad=True)
        seed = torch.ones_like(t)

        def round_trip(leaf: Any = leaf, seed: Any = seed) -> None:
            reduce_from_ranks(copy_to_ranks(leaf)).backward(seed)
            leaf.grad = None

        def reduce_only(leaf: Any = leaf, seed: Any = seed) -> None:
            reduce_from_ranks(leaf).backward(seed)
            leaf.grad = None

        candidates = {
            "raw": lambda t=t: td.all_reduce(t),
            "raw_and_copy": lambda t=t: (td.all_reduce(t), t.clone()),
            "wrapper": lambda t=t: dist.all_reduce(t),
            "in_place": lambda t=t: dist.all_reduce(t, out=t),
            "round_trip": round_trip,
            "reduce_from_ranks": reduce_only,
        }
        result["sizes"][size] = alternate(candidates, calls_per_sample(size), repeat)
    largest = max(sizes)
    raw_ops = _raw_ops(td, torch, P)
    wrapped_ops = {
        "all_reduce": dist.all_reduce,
        "all_gather": dist.all_gather,
        "reduce_scatter": dist.reduce_scatter,
        "all_to_all": dist.all_to_all,
    }
    result["bandwidth"] = {}
    for op, wrapped in wrapped_ops.items():
        elements = largest // 4 // (P if op == "all_gather" else 1)
        t = torch.zeros(elements, dtype=torch.float32)
        candidates = {"raw": raw_ops[op](t), "wrapper": lambda t=t, w=wrapped: w(t)}
        result["bandwidth"][op] = alternate(candidates, calls_per_sample(largest), repeat)
    return result if td.get_rank() == 0 else {}


# -- in the benchmark process ----------------------------------------------------------------


def best_ratio(subject: list[float], baseline: list[float]) -> float:
    """The fastest subject sample over the fastest baseline sample: the ratio with the least
    interference from other work on the machine."""
    return min(subject) / min(baseline)


def _size_rows(size: int, samples: dict[str, list[float]], agree: bool) -> list[Row]:
    label = size_label(size)
    subjects = [  # (row key, sample, what is measured, baseline sample, baseline)
        ("all_reduce_in_place", "in_place",
         f"all_reduce, 2 ranks, {label}: chainrule.dist wrapper in place (out=t)",
         "raw", "raw torch.distributed.all_reduce (in place)"),
        ("all_reduce", "wrapper",
         f"all_reduce, 2 ranks, {label}: chainrule.dist wrapper, functional (a new tensor)",
         "raw_and_copy", "raw all_reduce + one copy of the result (t.clone())"),
        ("round_trip", "round_trip", f"f̄(f(x)) forward+backward (2 all-reduces), {label}",
         "raw", "one raw all_reduce"),
        ("reduce_from_ranks", "reduce_from_ranks",
         f"f̄(x) forward+backward (1 all-reduce), {label}", "raw", "one raw all_reduce"),
    ]  # fmt: skip
    return [
        make_row(
            f"gloo.{key}.{label}",
            f"gloo {what}",
            median(samples[sample]),
            median(samples[base]),
            baseline,
            paired_ratio(samples[sample], samples[base]),
            best_ratio=best_ratio(samples[sample], samples[base]),
            agree=agree,
        )
        for key, sample, what, base, baseline in subjects
    ]


def _bandwidth_rows(size: int, bandwidth: dict[str, dict[str, list[float]]]) -> list[Row]:
    rows = []
    for op, samples in bandwidth.items():
        raw, wrapper = median(samples["raw"]), median(samples["wrapper"])
        factor = bus_factor(op, WORLD)
        rows.append(
            make_row(
                f"gloo.busbw.{op}",
                f"gloo {op} bus bandwidth, 2 ranks, {size_label(size)}: chainrule.dist wrapper",
                wrapper,
                raw,
                f"raw torch.distributed {op}",
                paired_ratio(samples["wrapper"], samples["raw"]),
                best_ratio=best_ratio(samples["wrapper"], samples["raw"]),
                busbw_gb_s=size / wrapper / 1e9 * factor,
                raw_busbw_gb_s=size / raw / 1e9 * factor,
            )
        )
    return rows


def collect(sizes: Sequence[int], repeat: int) -> list[Row]:
    """Rows for ``sizes`` (bytes) with ``repeat`` samples each, on a gloo pool of 2 workers."""
    from chainrule import dist

    try:
        result = dist.run(
            spmd_measure, WORLD, backend="gloo", args=(tuple(sizes), repeat), timeout=1800
        )[0]
    finally:
        dist.shutdown()
    rows = []
    for size in sizes:
        rows += _size_rows(size, result["sizes"][size], result["agree"])
    return rows + _bandwidth_rows(max(sizes), result["bandwidth"])


def measure(quick: bool = False) -> list[Row]:
    """Every gloo row (run it in a fresh process: the worker pool starts here)."""
    return collect(QUICK_SIZES, 3) if quick else collect(SIZES, 15)
