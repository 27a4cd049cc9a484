"""chainrule: a readable reverse-mode autograd engine and the collectives of distributed training.

The folders are the layers, lowest first; a module imports only from its own layer and the
layers under it (``lib/tests/test_layers.py`` checks every import):

1. :mod:`chainrule.engine`: the tensor and the backward pass, the ops (each forward beside its
   VJP), layers, the optimizer, gradcheck, and interop (numpy arrays, engine tensors and torch
   tensors, told apart and converted). This package's own names (``Tensor``, ``tensor``,
   ``no_grad``...) are the engine's.
2. :mod:`chainrule.dist`: collectives with one API on a simulated world of P ranks or on
   torch.distributed: the world at the bottom, one specification per collective, the
   backends, the worker pools.
3. :mod:`chainrule.parallel`: the duality table as differentiable collectives (engine and
   torch), the adjoint test, data, tensor and expert parallelism, placements and the sharded
   product, ZeRO, and a transformer trained on a grid of ranks.
4. :mod:`chainrule.costs`: the cost models (the Jacobian chain's multiply-adds; the bytes and
   time of a collective).
5. :mod:`chainrule.judging`: the grader's side of a student's kernel (the cell parser, the
   judge, the source scan).
6. :mod:`chainrule.course`: what only the lessons and the exercises use: the checks, the
   restart hint, the install check, graph drawing, the DTensor comparison, timing real
   collectives, the widgets.
7. :mod:`chainrule.grading`: autograding the exercises with nbgrader.
8. :mod:`chainrule.classroom`: the course for a class: JupyterHub, the exchange, a PostgreSQL
   gradebook and grading over a task queue.
"""

from chainrule.engine.tensor import Tensor, as_tensor, is_grad_enabled, no_grad, tensor

__all__ = ["Tensor", "as_tensor", "is_grad_enabled", "no_grad", "tensor"]
__version__ = "0.1.0"
