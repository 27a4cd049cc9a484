"""Numpy arrays, engine Tensors and torch tensors: telling them apart and converting between them.

The library accepts three kinds of values wherever it moves numbers: numpy arrays (and Python
numbers or lists, which become arrays), :class:`chainrule.Tensor` (the engine's tensor, whose
values are the numpy array ``.data``) and torch tensors. This module is the one place that
converts between them; torch is never imported here unless a value already is a torch tensor
or a torch result is asked for.

>>> import numpy as np
>>> kind_of(np.ones(2)), kind_of(3.0), dtype_name(np.ones(2, np.float32))
('numpy', 'numpy', 'float32')
"""

from __future__ import annotations

import functools
import sys
from typing import Any, Literal, cast

import numpy as np

from chainrule.engine.tensor import Tensor

Kind = Literal["numpy", "engine", "torch"]
"""What a value is: a numpy array (or a Python number or list), an engine Tensor, a torch tensor."""

Framework = Literal["engine", "torch"]
"""Which autograd a computation runs on: the engine's or torch's."""


def is_torch(x: Any) -> bool:
    """Whether ``x`` is a torch tensor (False without importing torch when torch is not loaded)."""
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(x, torch.Tensor)


def kind_of(x: Any) -> Kind:
    """``"engine"`` for a Tensor, ``"torch"`` for a torch tensor, ``"numpy"`` for anything else."""
    if isinstance(x, Tensor):
        return "engine"
    return "torch" if is_torch(x) else "numpy"


def dtype_name(x: Any) -> str:
    """The dtype of ``x`` by name: ``"float32"``, ``"int64"``, ``"bfloat16"``..."""
    if is_torch(x):
        return str(x.dtype).removeprefix("torch.")
    return numpy_dtype_name(to_numpy(x).dtype)


@functools.cache
def numpy_dtype_name(dtype: np.dtype) -> str:
    """``dtype.name``, remembered (numpy computes it anew each time)."""
    return dtype.name


@functools.cache
def numpy_kind(dtype: str) -> str:
    """numpy's kind letter of a dtype name: ``"f"``, ``"i"``, ``"u"``, ``"b"`` or ``"c"``."""
    return "f" if dtype == "bfloat16" else np.dtype(dtype).kind


def itemsize(dtype: str) -> int:
    """Bytes per element of a dtype name (bfloat16, which numpy lacks, included)."""
    return 2 if dtype == "bfloat16" else np.dtype(dtype).itemsize


def to_numpy(x: Any) -> np.ndarray:
    """The values of ``x`` as a numpy array, without a copy where possible.

    A torch tensor is detached and brought to the CPU; bfloat16, which numpy lacks, becomes
    float32. Anything that is not numbers (text, objects) is a TypeError.
    """
    if isinstance(x, Tensor):
        return x.data
    if is_torch(x):
        t = x.detach().cpu()
        if str(t.dtype) == "torch.bfloat16":
            t = t.float()
        return cast(np.ndarray, t.resolve_conj().resolve_neg().numpy())
    array = np.asarray(x)
    if array.dtype.kind not in "biufc":
        raise TypeError(
            f"collectives move numbers; got a value of type {type(x).__name__} "
            f"(numpy dtype {array.dtype})"
        )
    return array


def to_torch(x: Any, device: Any = None) -> Any:
    """``x`` as a contiguous torch tensor on ``device`` (no copy where possible, no graph)."""
    import torch

    if is_torch(x):
        t = x.detach()
        if device is not None and t.device != torch.device(device):
            t = t.to(device)
        return t.contiguous()
    array = to_numpy(x)
    if not (array.flags.c_contiguous and array.flags.writeable):
        array = np.array(array, order="C")
    t = torch.from_numpy(array)
    return t if device is None else t.to(device)


def torch_dtype(dtype: str) -> Any:
    """The torch dtype of a dtype name."""
    import torch

    return getattr(torch, dtype)


def restore(result: Any, kind: Kind, dtype: str, device: Any = None) -> Any:
    """``result`` (a numpy array or a torch tensor) as a value of ``kind`` and ``dtype``.

    ``device``: where a torch result goes (None: where ``result`` is, or the CPU).
    """
    if kind == "torch":
        if not is_torch(result):
            import torch

            result = torch.from_numpy(result)
        if str(result.dtype).removeprefix("torch.") != dtype or device is not None:
            result = result.to(device=device, dtype=torch_dtype(dtype))
        return result
    array = to_numpy(result)
    return Tensor(array, dtype=array.dtype) if kind == "engine" else array


def check_writable(out: Any, what: str) -> None:
    """Raise TypeError unless ``out`` is an array, a Tensor or a torch tensor, ValueError if it
    is a read-only array. ``what`` names the function in the message."""
    if is_torch(out):
        return
    if not isinstance(out, np.ndarray | Tensor):
        raise TypeError(
            f"{what}: out must be a numpy array, a chainrule Tensor or a torch tensor, "
            f"not {type(out).__name__}"
        )
    if not to_numpy(out).flags.writeable:
        raise ValueError(f"{what}: out is a read-only array")


def copy_into(out: Any, result: Any) -> None:
    """Write ``result`` (a numpy array or torch tensor of out's shape) into ``out``."""
    if is_torch(out):
        out.detach().copy_(to_torch(result))  # (to out's device and dtype)
    else:
        np.copyto(to_numpy(out), to_numpy(result))


def torch_view(x: Any, device: Any) -> Any:
    """A torch tensor on ``device`` on all of x's memory, contiguous, or None where there is
    none (x strided, read-only or elsewhere)."""
    import torch

    if is_torch(x):
        t = x.detach()
    else:
        array = to_numpy(x)
        if not (array.flags.c_contiguous and array.flags.writeable):
            return None
        t = torch.from_numpy(array)
    return t if t.is_contiguous() and t.device == torch.device(device) else None


def shares_memory(a: Any, b: Any) -> bool:
    """Whether two torch tensors are the same elements of the same memory."""
    return bool(
        a.device == b.device
        and a.data_ptr() == b.data_ptr()
        and a.shape == b.shape
        and a.stride() == b.stride()
    )


# -- leaves and gradients, for code that runs on either autograd -----------------------------


def leaf(array: Any, framework: Framework) -> Any:
    """A float64 leaf that requires a gradient: an engine Tensor or a torch tensor."""
    if framework == "engine":
        return Tensor(np.array(array, dtype=np.float64), requires_grad=True)
    import torch

    return torch.tensor(np.asarray(array), dtype=torch.float64, requires_grad=True)


def gradient(x: Any) -> np.ndarray:
    """The gradient of a leaf as a numpy array (zeros where none arrived)."""
    return np.zeros(to_numpy(x).shape) if x.grad is None else to_numpy(x.grad)
