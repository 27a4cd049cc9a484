"""``chainrule.sharded.redistribute`` against DTensor's ``redistribute``, on 2 gloo processes.

Everything runs inside one ``chainrule.dist.run(fn, 2, backend="gloo")`` call, timed on rank 0
after a barrier, subject and baseline alternating sample by sample. One sample is a forward
*and* backward redistribution of a float32 tensor of S bytes (the global tensor): the library's
on an engine tensor (numpy, its collectives through ``chainrule.dist``'s torch backend, each
the row of the duality table the transition needs) and DTensor's on a torch DTensor of the
same placement (``DTensor.redistribute`` and ``backward``, its collectives straight on
``torch.distributed``). The pairs are the three collectives a placement change runs:
Shard(0) → Replicate (all-gather forward, a split backward), Partial → Replicate (all-reduce,
identity) and Partial → Shard(0) (reduce-scatter, all-gather). *agree*: both give the same
outputs and input gradients on every rank, for every pair of placements
(:func:`chainrule.placement_dtensor.compare_with_dtensor`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from benchmarks.gloo_collectives import alternate, calls_per_sample, size_label
from benchmarks.harness import Row, make_row, median, paired_ratio

WORLD = 2
SIZES = (64 << 10, 1 << 20, 16 << 20)
QUICK_SIZES = (64 << 10,)
PAIRS = {  # (source, target): the row key's name
    ("Shard(0)", "Replicate()"): "shard0_to_replicate",
    ("Partial()", "Replicate()"): "partial_to_replicate",
    ("Partial()", "Shard(0)"): "partial_to_shard0",
}


def _candidates(source: str, target: str, size: int) -> dict[str, Callable[[], None]]:
    """The library's and DTensor's forward + backward redistribution of an S-byte tensor."""
    import numpy as np
    import torch
    from chainrule import dist
    from chainrule.course.placement_dtensor import device_mesh, torch_placement
    from chainrule.engine.tensor import Tensor
    from chainrule.parallel import sharded
    from chainrule.parallel.placement import parse_placement
    from torch.distributed import tensor as dtensor

    P, rank = dist.world_size(), dist.rank()
    src, dst = parse_placement(source), parse_placement(target)
    rows = max(P, size // 4 // 256 // P * P)  # a (rows, 256) float32 tensor of about S bytes
    whole = np.zeros((rows, 256), dtype=np.float32)
    local = whole if src != parse_placement("Shard(0)") else np.split(whole, P)[rank]
    mesh = device_mesh(P)
    out_shape = sharded.redistribute(sharded.from_local(local, src), dst).local.shape
    grad = np.ones(out_shape, dtype=np.float32)
    torch_grad = torch.from_numpy(grad)

    def ours() -> None:
        x = sharded.from_local(Tensor(local, requires_grad=True), src)
        sharded.redistribute(x, dst).local.backward(grad)

    def theirs() -> None:
        x = dtensor.DTensor.from_local(
            torch.from_numpy(local), mesh, [torch_placement(src)], run_check=False
        ).requires_grad_(True)
        y = x.redistribute(mesh, [torch_placement(dst)])
        g = dtensor.DTensor.from_local(torch_grad, mesh, [torch_placement(dst)], run_check=False)
        y.backward(g)

    return {"ours": ours, "dtensor": theirs}


def spmd_measure(sizes: Sequence[int], repeat: int) -> dict[str, Any]:
    """SPMD body: samples of both candidates for every pair and size, on rank 0."""
    import torch.distributed as td

    found: dict[str, Any] = {}
    for source, target in PAIRS:
        for size in sizes:
            candidates = _candidates(source, target, size)
            calls = max(1, calls_per_sample(size) // 4)
            found[f"{source}|{target}|{size}"] = alternate(candidates, calls, repeat)
    return found if td.get_rank() == 0 else {}


def collect(sizes: Sequence[int], repeat: int) -> list[Row]:
    """Rows for ``sizes`` (bytes) with ``repeat`` samples each, on a gloo pool of 2 workers."""
    from chainrule import dist
    from chainrule.course.placement_dtensor import compare_with_dtensor

    try:
        agree = all(
            a.output_error < 1e-12 and a.gradient_error < 1e-12 for a in compare_with_dtensor(WORLD)
        )
        result = dist.run(
            spmd_measure, WORLD, backend="gloo", args=(tuple(sizes), repeat), timeout=1800
        )[0]
    finally:
        dist.shutdown()
    rows = []
    for source, target in PAIRS:
        for size in sizes:
            samples = result[f"{source}|{target}|{size}"]
            rows.append(
                make_row(
                    f"redistribute.{PAIRS[(source, target)]}.{size_label(size)}",
                    f"redistribute {source} → {target}, forward + backward, 2 ranks, "
                    f"{size_label(size)}: chainrule.sharded",
                    median(samples["ours"]),
                    median(samples["dtensor"]),
                    "DTensor.redistribute, forward + backward",
                    paired_ratio(samples["ours"], samples["dtensor"]),
                    best_ratio=min(samples["ours"]) / min(samples["dtensor"]),
                    agree=agree,
                )
            )
    return rows


def measure(quick: bool = False) -> list[Row]:
    """Every redistribute row (run it in a fresh process: the worker pool starts here)."""
    return collect(QUICK_SIZES, 3) if quick else collect(SIZES, 15)
