"""chainrule: a readable reverse-mode autograd engine and the collectives of distributed training.

- :mod:`chainrule.tensor` and :mod:`chainrule.ops`: the engine (every op's forward beside its VJP).
- :mod:`chainrule.dist`: collectives with one API on a simulated world of P ranks or torch.distributed.
- :mod:`chainrule.duality`: the duality table as differentiable collectives.
"""

from chainrule.tensor import Tensor, as_tensor, is_grad_enabled, no_grad, tensor

__all__ = ["Tensor", "as_tensor", "is_grad_enabled", "no_grad", "tensor"]
__version__ = "0.1.0"
