"""Pipeline parallelism: a model cut into stages, one per rank, fed m micro-batches.

Stage s holds layers of the model; its forward receives the activation of stage s − 1 (stage
0 reads the micro-batch), and sends its output to stage s + 1 (the last stage computes the
loss). Both are rows of the duality table (:func:`~chainrule.parallel.duality.send_to_rank`,
:func:`~chainrule.parallel.duality.recv_from_rank`), so a stage's backward is one call: the
phony of its send (or the last stage's loss) backpropagated receives the gradient of the
stage's output and sends the gradient of its input back.

A **schedule** says in which order each stage runs the forward (F) and backward (B) of each
micro-batch:

- **GPipe**: every forward, then every backward. A stage holds the activations of all m
  micro-batches before its first backward;
- **1F1B**: stage s runs ``P − 1 − s`` forwards to fill the pipeline, then alternates one
  forward and one backward, then drains the remaining backwards. It never holds more than
  ``P − s`` micro-batches' activations.

With one slot per forward and per backward, a stage waits for the message it needs (its
micro-batch's activation from the stage before, its gradient from the stage after):
:func:`timeline` places every action in the earliest slot its stage and its message allow.
Both schedules then take ``2(m + P − 1)`` slots, of which each stage is busy 2m: the idle
share, the **bubble**, is ``(P − 1)/(m + P − 1)``.

The micro-batches' gradients add up in the parameters' ``.grad`` (each micro-batch loss is
divided by m): gradient accumulation, in time, as in lesson 6. The pipelined gradient is the
gradient of the whole batch.

:func:`run_schedule` runs one stage's schedule for any stage forward, the stages being the
ranks of the world or of a group (a pipeline group of a larger grid, whose stages may be
tensor-parallel groups themselves); :func:`run_stage` is it for the tanh MLP of
:func:`random_model`, one stage per rank of the world.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from chainrule import dist
from chainrule.engine.tensor import Tensor
from chainrule.parallel.duality import recv_from_rank, send_to_rank

Kind = Literal["F", "B"]


@dataclass(frozen=True)
class Action:
    """One step of a stage: the forward (``"F"``) or backward (``"B"``) of micro-batch
    ``micro``."""

    kind: Kind
    micro: int

    def __str__(self) -> str:
        return f"{self.kind}{self.micro}"


Schedule = list[list[Action]]
"""Each stage's actions, in the order it runs them: ``schedule[s]``."""


def gpipe(stages: int, micro_batches: int) -> Schedule:
    """Every forward, then every backward, on every stage."""
    _check(stages, micro_batches)
    forwards = [Action("F", i) for i in range(micro_batches)]
    backwards = [Action("B", i) for i in range(micro_batches)]
    return [forwards + backwards for _ in range(stages)]


def one_f_one_b(stages: int, micro_batches: int) -> Schedule:
    """Stage s: ``P − 1 − s`` warm-up forwards, then one forward and one backward in turn, then
    the backwards left."""
    _check(stages, micro_batches)
    schedule = []
    for s in range(stages):
        warmup = min(stages - 1 - s, micro_batches)
        actions = [Action("F", i) for i in range(warmup)]
        for i in range(micro_batches - warmup):
            actions += [Action("F", warmup + i), Action("B", i)]
        actions += [Action("B", i) for i in range(micro_batches - warmup, micro_batches)]
        schedule.append(actions)
    return schedule


SCHEDULES: dict[str, Callable[[int, int], Schedule]] = {"gpipe": gpipe, "1f1b": one_f_one_b}
"""The schedules by name."""


def _check(stages: int, micro_batches: int) -> None:
    if stages < 1 or micro_batches < 1:
        raise ValueError(
            f"a pipeline needs at least one stage and one micro-batch, got P={stages}, "
            f"m={micro_batches}"
        )


def bubble_formula(stages: int, micro_batches: int) -> float:
    """``(P − 1)/(m + P − 1)``: the idle share of a pipeline of P stages and m micro-batches."""
    return (stages - 1) / (micro_batches + stages - 1)


# -- the schedule in time -----------------------------------------------------------------------


@dataclass(frozen=True)
class Timeline:
    """Where each action of a schedule runs: ``slots[s]`` lists stage s's ``(action, start)``
    in its order (an action runs in slots ``start`` to ``start + length − 1``), ``lengths`` the
    slots a forward and a backward take."""

    slots: list[list[tuple[Action, int]]]
    lengths: dict[str, int]

    @property
    def stages(self) -> int:
        return len(self.slots)

    @property
    def makespan(self) -> int:
        """Slots from the first forward's start to the last backward's end."""
        return max(start + self.lengths[a.kind] for row in self.slots for a, start in row)

    def busy(self, stage: int) -> int:
        """Slots stage ``stage`` computes."""
        return sum(self.lengths[a.kind] for a, _ in self.slots[stage])

    @property
    def bubble(self) -> float:
        """The idle share of the stages' slots: ``1 − Σ busy / (P · makespan)``."""
        total = sum(self.busy(s) for s in range(self.stages))
        return 1.0 - total / (self.stages * self.makespan)

    def held(self, stage: int) -> list[int]:
        """How many micro-batches' activations stage ``stage`` holds after each of its actions
        (a forward adds one, a backward frees one)."""
        counts, held = [], 0
        for action, _ in self.slots[stage]:
            held += 1 if action.kind == "F" else -1
            counts.append(held)
        return counts

    def peak_activations(self) -> list[int]:
        """The most micro-batches' activations each stage holds at once."""
        return [max(self.held(s)) for s in range(self.stages)]


def timeline(schedule: Schedule, forward: int = 1, backward: int = 1) -> Timeline:
    """Each action in the earliest slot its stage is free and its message has arrived.

    A forward of micro-batch i on stage s > 0 needs stage s − 1's forward of i to have ended
    (its activation); a backward on stage s < P − 1 needs stage s + 1's backward of i (its
    gradient), and the last stage's backward its own forward. Every stage runs its actions in
    the schedule's order. ``forward``, ``backward``: the slots each takes.
    """
    lengths = {"F": forward, "B": backward}
    P = len(schedule)
    ends: dict[tuple[int, Action], int] = {}
    slots: list[list[tuple[Action, int]]] = [[] for _ in range(P)]
    position, free = [0] * P, [0] * P
    while any(position[s] < len(schedule[s]) for s in range(P)):
        progressed = False
        for s in range(P):
            if position[s] == len(schedule[s]):
                continue
            action = schedule[s][position[s]]
            needs = _needs(s, action, P)
            if needs is not None and needs not in ends:
                continue
            start = max(free[s], ends[needs] if needs is not None else 0)
            ends[(s, action)] = free[s] = start + lengths[action.kind]
            slots[s].append((action, start))
            position[s] += 1
            progressed = True
        if not progressed:
            waiting = {
                s: str(schedule[s][position[s]]) for s in range(P) if position[s] < len(schedule[s])
            }
            raise ValueError(f"the schedule deadlocks: each stage waits, {waiting}")
    return Timeline(slots, lengths)


def _needs(stage: int, action: Action, stages: int) -> tuple[int, Action] | None:
    """The action of another stage (or the same) whose message ``action`` waits for."""
    if action.kind == "F":
        return (stage - 1, action) if stage > 0 else None
    if stage < stages - 1:
        return (stage + 1, action)
    return (stage, Action("F", action.micro))


# -- the runner: one stage per rank -------------------------------------------------------------

Layer = tuple[np.ndarray, np.ndarray]
"""A layer's weight W and bias b: ``x ↦ tanh(x W + b)`` (the model's last layer: ``x W + b``)."""


def forward_layers(layers: Sequence[tuple[Tensor, Tensor]], x: Tensor, last: bool) -> Tensor:
    """The layers in turn; no tanh after the model's very last layer (``last``)."""
    for k, (w, b) in enumerate(layers):
        x = x @ w + b
        if not (last and k == len(layers) - 1):
            x = x.tanh()
    return x


def squared_error(y: Tensor, target: np.ndarray) -> Tensor:
    """``mean((y − t)²)`` over a micro-batch."""
    return ((y - target) ** 2).mean()


@dataclass
class ScheduleRun:
    """What one stage's schedule ran: its actions in order, the loss (the sum of the last
    stage's micro-batch losses; 0 elsewhere) and the most micro-batches' activations it held at
    once."""

    order: list[str]
    loss: float
    peak_activations: int


StageForward = Callable[[int, Tensor | None], Tensor]
"""A stage's forward of micro-batch i: ``forward(i, x)``, ``x`` the activation received from
the stage before (None on the first stage, which reads micro-batch i itself). The last stage
returns micro-batch i's loss, scaled to its share of the batch's (divided by m); every other
stage the activation it sends on."""


def run_schedule(
    forward: StageForward,
    micro_batches: int,
    schedule: str = "1f1b",
    group: dist.Group | None = None,
) -> ScheduleRun:
    """SPMD, on stage s of the P ranks of ``group`` (the world by default; s and P count in
    it): run the ``schedule`` of m = ``micro_batches`` forwards and backwards of this stage.

    A forward receives its activation from stage s − 1 (:func:`recv_from_rank`; stage 0
    receives nothing), runs ``forward`` and sends the output on (:func:`send_to_rank`; the last
    stage keeps the loss), and keeps what its backward needs; a backward backpropagates it,
    which receives the output's gradient and sends the input's back. The gradients of the
    parameters ``forward`` uses add up in their ``.grad`` over the micro-batches.

    A send returns once its recv has met it. In 1F1B's steady state stage s would send the
    activation of a forward while stage s + 1 sends the gradient of a backward: both sending,
    each would wait for the other. So when the next stage runs the backward that follows a
    forward here before it needs that forward's output, the output is sent after the backward
    has received its gradient (pipeline libraries post the two at once instead, with
    torch.distributed's ``batch_isend_irecv``). The computations run in the schedule's order
    either way.
    """
    s, P = dist.rank(group), dist.world_size(group)
    last = s == P - 1
    held: dict[int, Tensor] = {}  # micro-batch -> its loss or phony: its activations, alive
    unsent: tuple[int, Tensor] | None = None  # a forward's output that waits for a backward
    order, peak, loss = [], 0, 0.0
    plans = SCHEDULES[schedule](P, micro_batches)
    for step, action in enumerate(plans[s]):
        i = action.micro
        if action.kind == "F":
            x = None if s == 0 else recv_from_rank(group=group, group_src=s - 1)
            y = forward(i, x)
            if last:
                held[i] = y
                loss += float(y.data)
            elif _send_after_next_backward(plans, s, step):
                unsent = (i, y)  # sent once that backward has received its gradient
            else:
                held[i] = send_to_rank(y, group=group, group_dst=s + 1)
            peak = max(peak, len(held) + (unsent is not None))
        else:
            out = held.pop(i)
            out.backward(None if last else np.zeros(0, out.dtype))
            if unsent is not None:
                held[unsent[0]] = send_to_rank(unsent[1], group=group, group_dst=s + 1)
                unsent = None
        order.append(str(action))
    return ScheduleRun(order, loss, peak)


@dataclass
class StageResult:
    """What one stage (rank) ran: its actions in order, the gradients of its layers' parameters
    (accumulated over the micro-batches), the loss (the last stage's; 0 elsewhere) and the most
    micro-batches' activations it held at once."""

    order: list[str]
    gradients: list[np.ndarray]
    loss: float
    peak_activations: int


def run_stage(
    stage_layers: Sequence[Sequence[Layer]],
    inputs: Sequence[np.ndarray],
    targets: Sequence[np.ndarray],
    schedule: str = "1f1b",
    dtype: Any = np.float64,
) -> StageResult:
    """SPMD, on rank s of P: stage s of the model, its layers ``stage_layers[s]``, runs the
    ``schedule`` over the m micro-batches ``inputs`` (with ``targets``), by
    :func:`run_schedule`: the last stage's forward ends in the micro-batch's loss, divided by m.
    """
    s, P = dist.rank(), dist.world_size()
    m, last = len(inputs), s == P - 1
    layers = [
        (
            Tensor(np.asarray(w, dtype), requires_grad=True),
            Tensor(np.asarray(b, dtype), requires_grad=True),
        )
        for w, b in stage_layers[s]
    ]

    def forward(i: int, x: Tensor | None) -> Tensor:
        y = forward_layers(layers, Tensor(np.asarray(inputs[i], dtype)) if x is None else x, last)
        return squared_error(y, np.asarray(targets[i], dtype)) * (1.0 / m) if last else y

    run = run_schedule(forward, m, schedule)
    gradients = [np.asarray(p.grad) for layer in layers for p in layer]
    return StageResult(run.order, gradients, run.loss, run.peak_activations)


def pipeline_step(
    stage_layers: Sequence[Sequence[Layer]],
    inputs: Sequence[np.ndarray],
    targets: Sequence[np.ndarray],
    schedule: str = "1f1b",
    backend: str = "sim",
    dtype: Any = np.float64,
    trace: dist.Trace | None = None,
) -> list[StageResult]:
    """One pipelined step on ``len(stage_layers)`` ranks: each rank's :class:`StageResult`."""
    return dist.run(
        run_stage,
        len(stage_layers),
        backend=backend,
        args=(stage_layers, inputs, targets, schedule, dtype),
        trace=trace,
    )


def _send_after_next_backward(plans: Schedule, stage: int, step: int) -> bool:
    """Whether stage ``stage``'s forward at ``step`` must send its output after the backward
    that follows it: the next stage runs that backward before the forward it feeds."""
    plan = plans[stage]
    if step + 1 == len(plan) or plan[step + 1].kind != "B":
        return False
    after = plans[stage + 1]
    return after.index(plan[step + 1]) < after.index(plan[step])


def one_process_step(
    stage_layers: Sequence[Sequence[Layer]],
    inputs: Sequence[np.ndarray],
    targets: Sequence[np.ndarray],
) -> tuple[float, list[list[np.ndarray]]]:
    """The same model on one process, the whole batch at once (float64): its loss, the mean of
    the micro-batches' losses, and every stage's gradients."""
    layers = [
        [(Tensor(w, requires_grad=True), Tensor(b, requires_grad=True)) for w, b in stage]
        for stage in stage_layers
    ]
    m, total = len(inputs), None
    for x, t in zip(inputs, targets, strict=True):
        y = Tensor(np.asarray(x, np.float64))
        for k, stage in enumerate(layers):
            y = forward_layers(stage, y, k == len(layers) - 1)
        term = squared_error(y, np.asarray(t, np.float64)) * (1.0 / m)
        total = term if total is None else total + term
    assert total is not None
    total.backward()
    grads = [[np.asarray(p.grad) for layer in stage for p in layer] for stage in layers]
    return float(total.data), grads


def random_model(
    stages: int, layers_per_stage: int, width: int, seed: int = 0
) -> list[list[Layer]]:
    """A tanh MLP of ``stages × layers_per_stage`` square layers, cut into stages."""
    rng = np.random.default_rng(seed)
    scale = 1.0 / np.sqrt(width)
    return [
        [
            (rng.standard_normal((width, width)) * scale, rng.standard_normal(width) * 0.1)
            for _ in range(layers_per_stage)
        ]
        for _ in range(stages)
    ]
