"""The autograd engine against PyTorch eager (CPU) and against hand-written numpy backprop.

Two workloads, both float32 in every implementation and started from the same values:

- a chain of ``n`` operations ``y ← y ∘ w`` (elementwise ``*`` or ``@``) on 8×8 tensors, then
  ``Σ y`` and the backward pass: the per-operation overhead of recording and replaying a graph,
  reported in µs per operation (forward and backward together);
- one training step of a 3-layer MLP ``x → tanh(x W₁ᵀ + b₁) → tanh(· W₂ᵀ + b₂) → · W₃ᵀ + b₃``
  on a batch of 64 with hidden width w and 10 classes: forward, mean cross-entropy, backward,
  SGD update ``θ ← θ − η θ̄``. The hand-written numpy version applies the chain rule by hand:
  ``z̄ = (softmax(z) − onehot(t))/B``, ``W̄ = z̄ᵀ a``, ``ā = z̄ W``, ``h̄ = ā ⊙ (1 − tanh²)``.

All three MLPs take one step from identical weights first and must agree on the loss and the
updated weights (the ``agree`` field), so a benchmark cannot pass by computing something else.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from benchmarks.harness import Row, compare, make_row, median, paired_ratio, pin_torch_threads

DTYPE = np.float32
CLASSES = 10
BATCH = 64
LR = 0.1


# -- the chain of operations -----------------------------------------------------------------


def _chain_operands(kind: str, size: int, rng: np.random.Generator) -> tuple[np.ndarray, ...]:
    """A start value and a factor that keep a long chain's values near 1 in size."""
    x = rng.standard_normal((size, size)).astype(DTYPE)
    if kind == "mul":
        w = (1.0 + 0.01 * rng.standard_normal((size, size))).astype(DTYPE)
    else:  # an orthogonal matrix: ‖y w‖ = ‖y‖ at every step
        w = np.linalg.qr(rng.standard_normal((size, size)))[0].astype(DTYPE)
    return x, w


def engine_chain(kind: str, x0: np.ndarray, w0: np.ndarray, n_ops: int) -> Callable[[], Any]:
    """One forward+backward of the chain in chainrule; returns the gradient of x."""
    from chainrule import Tensor
    from chainrule.engine import ops

    apply = ops.mul if kind == "mul" else ops.matmul
    w = Tensor(w0)

    def step() -> np.ndarray:
        x = Tensor(x0, requires_grad=True)
        y = x
        for _ in range(n_ops):
            y = apply(y, w)
        ops.sum(y).backward()
        return x.grad

    return step


def torch_chain(kind: str, x0: np.ndarray, w0: np.ndarray, n_ops: int) -> Callable[[], Any]:
    """The same chain in PyTorch eager."""
    torch = pin_torch_threads()
    apply = torch.mul if kind == "mul" else torch.matmul
    w = torch.from_numpy(w0.copy())
    x_data = torch.from_numpy(x0.copy())

    def step() -> np.ndarray:
        x = x_data.detach().requires_grad_(True)
        y = x
        for _ in range(n_ops):
            y = apply(y, w)
        y.sum().backward()
        return x.grad.numpy()

    return step


def chain_rows(kind: str, n_ops: int = 100, size: int = 8, repeat: int = 15) -> list[Row]:
    """µs per op of the chain, chainrule against PyTorch (same process, alternating)."""
    x0, w0 = _chain_operands(kind, size, np.random.default_rng(0))
    engine = engine_chain(kind, x0, w0, n_ops)
    torch = torch_chain(kind, x0, w0, n_ops)
    agree = bool(np.allclose(engine(), torch(), rtol=1e-3, atol=1e-4))
    samples = compare({"engine": engine, "torch": torch}, repeat)
    per_op = {name: median(s.wall) / n_ops for name, s in samples.items()}
    return [
        make_row(
            f"engine.chain.{kind}",
            f"{kind} chain, {n_ops} ops on {size}×{size}: time per op (fwd+bwd)",
            per_op["engine"],
            per_op["torch"],
            "PyTorch eager",
            paired_ratio(samples["engine"].wall, samples["torch"].wall),
            cpu_ratio=paired_ratio(samples["engine"].cpu, samples["torch"].cpu),
            agree=agree,
            n_ops=n_ops,
        )
    ]


# -- the MLP training step -------------------------------------------------------------------


def mlp_init(width: int, rng: np.random.Generator) -> list[np.ndarray]:
    """``[W₁, b₁, W₂, b₂, W₃, b₃]`` with PyTorch's default initialisation, float32."""
    shapes = [(width, width), (width, width), (CLASSES, width)]
    params = []
    for out_features, in_features in shapes:
        bound = 1.0 / np.sqrt(in_features)
        params.append(rng.uniform(-bound, bound, (out_features, in_features)).astype(DTYPE))
        params.append(rng.uniform(-bound, bound, out_features).astype(DTYPE))
    return params


def mlp_data(width: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """A batch of inputs (B, width) and integer class targets (B,)."""
    x = rng.standard_normal((BATCH, width)).astype(DTYPE)
    return x, rng.integers(0, CLASSES, BATCH)


class EngineMLP:
    """The step in chainrule: ``chainrule.nn.Linear`` layers, ``ops.cross_entropy``, SGD."""

    def __init__(self, params: list[np.ndarray], x: np.ndarray, t: np.ndarray) -> None:
        from chainrule import Tensor
        from chainrule.engine import layers as nn
        from chainrule.engine import ops, optim

        self._nn, self._ops = optim, ops
        width = params[0].shape[1]
        widths = [width, width, width, CLASSES]
        self.model = nn.MLP(widths, np.random.default_rng(0), activation="tanh", dtype=DTYPE)
        self.params = self.model.parameters()
        for p, value in zip(self.params, params, strict=True):
            p.data = value.copy()
        self.x, self.t = Tensor(x), t

    def step(self) -> float:
        self._nn.zero_grad(self.params)
        loss = self._ops.cross_entropy(self.model(self.x), self.t)
        loss.backward()
        self._nn.sgd_step(self.params, LR)
        return loss.item()

    def weights(self) -> list[np.ndarray]:
        return [p.data for p in self.params]


class TorchMLP:
    """The step in PyTorch eager: ``nn.Linear`` layers, ``F.cross_entropy``, in-place SGD."""

    def __init__(self, params: list[np.ndarray], x: np.ndarray, t: np.ndarray) -> None:
        torch = pin_torch_threads()
        self._torch = torch
        self.layers = []
        for weight, bias in zip(params[::2], params[1::2], strict=True):
            layer = torch.nn.Linear(weight.shape[1], weight.shape[0])
            with torch.no_grad():
                layer.weight.copy_(torch.from_numpy(weight))
                layer.bias.copy_(torch.from_numpy(bias))
            self.layers.append(layer)
        self.params = [p for layer in self.layers for p in (layer.weight, layer.bias)]
        self.x = torch.from_numpy(x.copy())
        self.t = torch.from_numpy(t.astype(np.int64))

    def step(self) -> float:
        torch = self._torch
        for p in self.params:
            p.grad = None
        first, second, third = self.layers
        logits = third(torch.tanh(second(torch.tanh(first(self.x)))))
        loss = torch.nn.functional.cross_entropy(logits, self.t)
        loss.backward()
        with torch.no_grad():
            for p in self.params:
                p.sub_(p.grad, alpha=LR)
        return loss.item()

    def weights(self) -> list[np.ndarray]:
        return [p.detach().numpy() for p in self.params]


class NumpyMLP:
    """The step with the chain rule written out by hand in numpy (no graph at all)."""

    def __init__(self, params: list[np.ndarray], x: np.ndarray, t: np.ndarray) -> None:
        self.params = [p.copy() for p in params]
        self.x, self.t = x, t
        self.rows = np.arange(len(t))

    def step(self) -> float:
        w1, b1, w2, b2, w3, b3 = self.params
        x, t, rows = self.x, self.t, self.rows
        a1 = np.tanh(x @ w1.T + b1)
        a2 = np.tanh(a1 @ w2.T + b2)
        z = a2 @ w3.T + b3
        z -= z.max(axis=1, keepdims=True)
        e = np.exp(z)
        total = e.sum(axis=1, keepdims=True)
        loss = float(np.mean(np.log(total[:, 0]) - z[rows, t]))
        dz = e / total  # softmax(z) - onehot(t), divided by the batch size
        dz[rows, t] -= 1.0
        dz /= len(t)
        dh2 = (dz @ w3) * (1.0 - a2 * a2)
        dh1 = (dh2 @ w2) * (1.0 - a1 * a1)
        grads = (dh1.T @ x, dh1.sum(0), dh2.T @ a1, dh2.sum(0), dz.T @ a2, dz.sum(0))
        for p, g in zip(self.params, grads, strict=True):
            p -= LR * g
        return loss

    def weights(self) -> list[np.ndarray]:
        return self.params


def _agree(steppers: list[Any]) -> bool:
    """One step each from the same weights: equal losses and equal updated weights."""
    losses = [s.step() for s in steppers]
    weights = [s.weights() for s in steppers]
    same_loss = all(np.isclose(loss, losses[0], rtol=1e-4) for loss in losses)
    same_weights = all(
        np.allclose(a, b, rtol=1e-3, atol=1e-5)
        for other in weights[1:]
        for a, b in zip(weights[0], other, strict=True)
    )
    return bool(same_loss and same_weights)


def mlp_rows(width: int, repeat: int = 15) -> list[Row]:
    """One training step at ``width``: chainrule against PyTorch and against numpy."""
    rng = np.random.default_rng(width)
    params = mlp_init(width, rng)
    x, t = mlp_data(width, rng)
    engine, torch, numpy = (cls(params, x, t) for cls in (EngineMLP, TorchMLP, NumpyMLP))
    agree = _agree([engine, torch, numpy])
    samples = compare({"engine": engine.step, "torch": torch.step, "numpy": numpy.step}, repeat)
    times = {name: median(s.wall) for name, s in samples.items()}
    label = f"MLP step, batch {BATCH}, width {width}"
    return [
        make_row(
            f"engine.mlp.{width}.torch",
            label,
            times["engine"],
            times["torch"],
            "PyTorch eager",
            paired_ratio(samples["engine"].wall, samples["torch"].wall),
            cpu_ratio=paired_ratio(samples["engine"].cpu, samples["torch"].cpu),
            agree=agree,
        ),
        make_row(
            f"engine.mlp.{width}.numpy",
            label,
            times["engine"],
            times["numpy"],
            "hand-written numpy",
            paired_ratio(samples["engine"].wall, samples["numpy"].wall),
            cpu_ratio=paired_ratio(samples["engine"].cpu, samples["numpy"].cpu),
            agree=agree,
        ),
    ]


# -- the family ------------------------------------------------------------------------------

WIDTHS = (8, 64, 512)


def measure(quick: bool = False) -> list[Row]:
    """Every engine row (run it in a fresh process: see :func:`benchmarks.harness.run_fresh`)."""
    repeat = 3 if quick else 21
    n_ops = 10 if quick else 100
    widths = (8,) if quick else WIDTHS
    rows = [row for kind in ("mul", "matmul") for row in chain_rows(kind, n_ops, repeat=repeat)]
    for width in widths:
        rows += mlp_rows(width, repeat=repeat)
    return rows
