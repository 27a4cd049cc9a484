"""chainrule: a readable reverse-mode autograd engine and the collectives of distributed training.

The engine
    :mod:`chainrule.tensor` (the tensor and the backward pass), :mod:`chainrule.ops` (every op's
    forward beside its VJP), :mod:`chainrule.nn`, :mod:`chainrule.gradcheck` (finite differences
    and the adjoint test), :mod:`chainrule.chain_cost`, :mod:`chainrule.graph` (drawing graphs),
    :mod:`chainrule.interop` (numpy arrays, engine tensors and torch tensors, told apart and
    converted).
Distributed training
    :mod:`chainrule.dist` (collectives with one API on a simulated world of P ranks or on
    torch.distributed), :mod:`chainrule.duality` and :mod:`chainrule.duality_torch` (the duality
    table as differentiable collectives), :mod:`chainrule.data_parallel`,
    :mod:`chainrule.tensor_parallel`, :mod:`chainrule.expert` (experts on P ranks, tokens
    dispatched by all-to-all); :mod:`chainrule.placement` and :mod:`chainrule.sharded`
    (tensors placed on P ranks, redistributed by rows of the duality table),
    :mod:`chainrule.placement_dtensor` (the same against PyTorch's DTensor),
    :mod:`chainrule.comm_cost` (the bytes and time of a collective), :mod:`chainrule.zero`
    (ZeRO stages 0-3: optimizer state, gradients and parameters sharded),
    :mod:`chainrule.transformer` (a small language model trained on a dp × tp grid of ranks).
The course
    :mod:`chainrule.widgets` (the lessons' interactive views), :mod:`chainrule.grading`
    (autograding the exercises), :mod:`chainrule.checks`.
"""

from chainrule.tensor import Tensor, as_tensor, is_grad_enabled, no_grad, tensor

__all__ = ["Tensor", "as_tensor", "is_grad_enabled", "no_grad", "tensor"]
__version__ = "0.1.0"
