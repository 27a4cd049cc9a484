"""Data-parallel training of a linear model: one SPMD function for every backend.

Each rank draws its own mini-batches, computes the gradient of its mean squared error with
the chainrule engine, and the ranks average their gradients with one all-reduce per step,
so every replica of the weights takes the same step: the gradient of the mean loss over all
ranks' batches, ∇L = (1/P) Σ_r ∇L_r.

    torchrun --nproc-per-node=2 lib/examples/torchrun_data_parallel.py     # gloo (or NCCL)
    python lib/examples/torchrun_data_parallel.py --world-size 4          # simulated world
    python lib/examples/torchrun_data_parallel.py --backend gloo          # a gloo process pool

Rank 0 prints the final loss and weights, and ``RESULT {json}`` for scripts to read.
See lib/examples/README.md for several machines.
"""

from __future__ import annotations

import argparse
import json
import os

import numpy as np
from chainrule import dist, tensor

TRUE_WEIGHTS = np.array([2.0, -1.0, 0.5, 3.0])


def train(steps: int = 200, batch: int = 16, lr: float = 0.05, seed: int = 0) -> dict:
    """Train w in y ≈ X w on this rank's batches; every rank returns the same weights."""
    r = dist.rank()
    rng = np.random.default_rng([seed, r])  # a different data stream on every rank
    # Rank 0 initialises, everyone starts from its copy.
    w0 = np.random.default_rng(seed).standard_normal(TRUE_WEIGHTS.size) if r == 0 else None
    w = dist.broadcast(w0, src=0)
    loss = np.nan
    for _ in range(steps):
        X = rng.standard_normal((batch, w.size))
        y = X @ TRUE_WEIGHTS + 0.01 * rng.standard_normal(batch)
        w_t = tensor(w, requires_grad=True)
        local = ((tensor(X) @ w_t - tensor(y)) ** 2).mean()
        local.backward()
        grad = dist.all_reduce(w_t.grad, op=dist.ReduceOp.AVG)  # the one collective per step
        w = w - lr * grad
        loss = float(dist.all_reduce(local.data, op=dist.ReduceOp.AVG))
    replicas = dist.all_gather(w[None, :])  # every rank's weights, to check they agree
    return {
        "rank": r,
        "world_size": dist.world_size(),
        "loss": loss,
        "weights": w.tolist(),
        "replicas_agree": bool(np.all(replicas == replicas[0])),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--backend", default=None, help="torchrun: auto|gloo|nccl; otherwise sim|gloo|nccl|auto"
    )
    parser.add_argument("--world-size", type=int, default=2, help="ranks without torchrun")
    args = parser.parse_args()
    options = {"steps": args.steps, "batch": args.batch, "lr": args.lr, "seed": args.seed}

    if "RANK" in os.environ:  # started by torchrun: this process is one rank
        dist.init_from_env(args.backend or "auto")
        result = train(**options)
        dist.shutdown()
    else:  # one process: run every rank with dist.run
        results = dist.run(train, args.world_size, backend=args.backend or "sim", kwargs=options)
        result = results[0]
    if result["rank"] == 0:
        print(f"world size {result['world_size']}: loss {result['loss']:.6f}")
        print("weights", np.round(result["weights"], 4), "true", TRUE_WEIGHTS)
        print("RESULT " + json.dumps(result))


if __name__ == "__main__":
    main()
