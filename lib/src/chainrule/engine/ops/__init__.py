"""The operations of the engine, each one function with its forward beside its VJP.

- :mod:`.arithmetic`: add, sub, mul, div, neg, pow, matmul (broadcasting, gradients un-broadcast)
- :mod:`.elementwise`: exp, log, tanh, relu, sigmoid
- :mod:`.reduction`: sum, mean
- :mod:`.shape`: reshape, transpose, getitem, concat, split, stack
- :mod:`.nn`: softmax, log_softmax, cross_entropy, mse_loss, layer_norm, rms_norm, batch_norm
"""

from chainrule.engine.ops.arithmetic import add, div, matmul, mul, neg, pow, sub
from chainrule.engine.ops.elementwise import exp, log, relu, sigmoid, tanh
from chainrule.engine.ops.nn import (
    batch_norm,
    cross_entropy,
    layer_norm,
    log_softmax,
    mse_loss,
    rms_norm,
    softmax,
)
from chainrule.engine.ops.reduction import mean, sum
from chainrule.engine.ops.shape import concat, getitem, reshape, split, stack, transpose

__all__ = [
    "add",
    "batch_norm",
    "concat",
    "cross_entropy",
    "div",
    "exp",
    "getitem",
    "layer_norm",
    "log",
    "log_softmax",
    "matmul",
    "mean",
    "mse_loss",
    "mul",
    "neg",
    "pow",
    "relu",
    "reshape",
    "rms_norm",
    "sigmoid",
    "softmax",
    "split",
    "stack",
    "sub",
    "sum",
    "tanh",
    "transpose",
]
