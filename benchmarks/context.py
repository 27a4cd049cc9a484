"""Ring attention against one process's attention, forward + backward.

**sim**: ``chainrule.parallel.context.ring_attention`` on a simulated world of P ranks (engine,
float64; the P ranks take turns in one thread, so a sample is the work of all of them), against
``chainrule.parallel.context.attention`` over the whole sequence on one process, the two
alternating in the same interpreter (:func:`benchmarks.harness.compare`). The ratio is the
whole ring's cost over one process's: the blocks, the merges and the rows' messages, all ranks
together. **gloo**: ``chainrule.parallel.context_torch.ring_attention`` on P gloo processes
(torch, float32), timed on rank 0 after a barrier, alternating with one process's torch
attention over the whole sequence on rank 0. The ratio is one rank's time for its n/P queries
over one process's for all n: below 1 when the split pays for its messages. *error*: the
largest difference of the output and the gradients of Q, K and V from one process's.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from benchmarks.gloo_collectives import alternate
from benchmarks.harness import Row, compare, make_row, median, paired_ratio

HEADS, WIDTH = 4, 16
CASES = (("plain", False), ("zigzag", True))  # (split, causal)


def _inputs(n: int, dtype: Any = np.float64) -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    return [rng.standard_normal((HEADS, n, WIDTH)).astype(dtype) for _ in range(4)]


# -- the simulated world -------------------------------------------------------------------------


def _ring_rank(q: Any, k: Any, v: Any, g: Any, layout: Any, causal: bool) -> list[np.ndarray]:
    from chainrule import Tensor, dist
    from chainrule.parallel import context as cp

    r, P = dist.rank(), dist.world_size()
    leaves = [Tensor(cp.shard_sequence(x, r, P, layout), requires_grad=True) for x in (q, k, v)]
    out = cp.ring_attention(*leaves, causal=causal, layout=layout)
    out.backward(cp.shard_sequence(g, r, P, layout))
    return [out.data] + [x.grad for x in leaves]


def _one_process(q: Any, k: Any, v: Any, g: Any, causal: bool) -> list[np.ndarray]:
    from chainrule import Tensor
    from chainrule.parallel import context as cp

    leaves = [Tensor(x, requires_grad=True) for x in (q, k, v)]
    out = cp.attention(*leaves, causal=causal)
    out.backward(g)
    return [out.data] + [x.grad for x in leaves]


def sim_rows(world: int, n: int, repeat: int) -> list[Row]:
    from chainrule import dist
    from chainrule.parallel import context as cp

    q, k, v, g = _inputs(n)
    rows = []
    for layout, causal in CASES:
        args = (q, k, v, g, layout, causal)
        per_rank = dist.run(_ring_rank, world, args=args)
        ring = [cp.unshard_sequence([rank[i] for rank in per_rank], layout) for i in range(4)]
        expected = _one_process(q, k, v, g, causal)
        error = max(float(np.abs(a - b).max()) for a, b in zip(ring, expected, strict=True))
        samples = compare(
            {
                "ring": lambda args=args: dist.run(_ring_rank, world, args=args),
                "one": lambda causal=causal: _one_process(q, k, v, g, causal),
            },
            repeat,
        )
        mask = "causal" if causal else "no mask"
        rows.append(
            make_row(
                f"context.sim_{layout}_{'causal' if causal else 'full'}",
                f"ring attention, {layout} split, {mask}, forward + backward, {world} simulated "
                f"ranks (all of them), {HEADS} heads × {n} tokens × {WIDTH}, float64",
                median(samples["ring"].wall),
                median(samples["one"].wall),
                "one process's attention, forward + backward",
                paired_ratio(samples["ring"].wall, samples["one"].wall),
                error=error,
                agree=error < 1e-12,
            )
        )
    return rows


# -- gloo ------------------------------------------------------------------------------------------


def spmd_gloo(n: int, calls: int, repeat: int) -> dict[str, Any]:
    """SPMD body: samples of one rank's ring attention and one process's attention, and the
    errors, for every case (on rank 0)."""
    import torch
    import torch.distributed as td
    from chainrule.parallel import context as cp
    from chainrule.parallel import context_torch as ct

    r, P = td.get_rank(), td.get_world_size()
    q, k, v, g = (torch.from_numpy(x) for x in _inputs(n, np.float32))
    found: dict[str, Any] = {}
    for layout, causal in CASES:

        def ring(layout: Any = layout, causal: bool = causal) -> list[torch.Tensor]:
            leaves = [
                torch.from_numpy(cp.shard_sequence(x.numpy(), r, P, layout)).requires_grad_()
                for x in (q, k, v)
            ]
            out = ct.ring_attention(*leaves, causal=causal, layout=layout)
            out.backward(torch.from_numpy(cp.shard_sequence(g.numpy(), r, P, layout)))
            return [out.detach()] + [x.grad for x in leaves]  # type: ignore[misc]

        def one(causal: bool = causal) -> list[torch.Tensor]:
            leaves = [x.clone().requires_grad_() for x in (q, k, v)]
            out = ct.attention(*leaves, causal=causal)
            out.backward(g)
            return [out.detach()] + [x.grad for x in leaves]  # type: ignore[misc]

        mine = [x.numpy() for x in ring()]
        gathered: list[Any] = [None] * P
        td.all_gather_object(gathered, mine)
        found[f"{layout}|{causal}|parts"] = gathered
        found[f"{layout}|{causal}|one"] = [x.numpy() for x in one()]
        # only rank 0's times are read; the others run the ring with it and idle meanwhile
        candidates = {"ring": ring, "one": one if r == 0 else (lambda: None)}
        found[f"{layout}|{causal}"] = alternate(candidates, calls, repeat)
    return found if r == 0 else {}


def gloo_rows(world: int, n: int, calls: int, repeat: int) -> list[Row]:
    from chainrule import dist
    from chainrule.parallel import context as cp

    try:
        found = dist.run(spmd_gloo, world, backend="gloo", args=(n, calls, repeat), timeout=600)[0]
    finally:
        dist.shutdown()
    rows = []
    for layout, causal in CASES:
        parts = found[f"{layout}|{causal}|parts"]
        ring = [cp.unshard_sequence([rank[i] for rank in parts], layout) for i in range(4)]
        expected = found[f"{layout}|{causal}|one"]
        error = max(float(np.abs(a - b).max()) for a, b in zip(ring, expected, strict=True))
        samples = found[f"{layout}|{causal}"]
        mask = "causal" if causal else "no mask"
        rows.append(
            make_row(
                f"context.gloo_{layout}_{'causal' if causal else 'full'}",
                f"ring attention, {layout} split, {mask}, forward + backward, rank 0 of {world} "
                f"gloo processes, {HEADS} heads × {n} tokens × {WIDTH}, float32",
                median(samples["ring"]),
                median(samples["one"]),
                "one process's attention (torch), forward + backward",
                paired_ratio(samples["ring"], samples["one"]),
                error=error,
                agree=error < 1e-4,
            )
        )
    return rows


def measure(quick: bool = False) -> list[Row]:
    """Every context row (run it in a fresh process: the gloo pool starts here)."""
    if quick:
        return sim_rows(4, 64, 3) + gloo_rows(2, 64, 5, 3)
    return sim_rows(4, 256, 5) + gloo_rows(4, 1024, 5, 5)
