"""The operations of the engine, each one function with its forward beside its VJP.

- :mod:`.arithmetic`: add, sub, mul, div, neg, pow, matmul (broadcasting, gradients un-broadcast)
- :mod:`.elementwise`: exp, log, tanh, relu, sigmoid
- :mod:`.reduction`: sum, mean
- :mod:`.shape`: reshape, transpose, getitem, concat, split, stack
"""

from chainrule.ops.arithmetic import add, div, matmul, mul, neg, pow, sub
from chainrule.ops.elementwise import exp, log, relu, sigmoid, tanh
from chainrule.ops.reduction import mean, sum
from chainrule.ops.shape import concat, getitem, reshape, split, stack, transpose

__all__ = [
    "add",
    "concat",
    "div",
    "exp",
    "getitem",
    "log",
    "matmul",
    "mean",
    "mul",
    "neg",
    "pow",
    "relu",
    "reshape",
    "sigmoid",
    "split",
    "stack",
    "sub",
    "sum",
    "tanh",
    "transpose",
]
