"""The engine: reverse-mode autograd on numpy arrays, one VJP per operation.

:mod:`.tensor` (the tensor and the backward pass), :mod:`.ops` (each forward beside its VJP),
:mod:`.layers` (linear layers and an MLP), :mod:`.optim` (SGD with momentum),
:mod:`.gradcheck` (finite differences and the adjoint test) and :mod:`.interop` (numpy arrays,
engine tensors and torch tensors, told apart and converted). It imports nothing else of chainrule.
"""
