"""Parallelism on the engine and on torch, over the collectives of :mod:`chainrule.dist`.

:mod:`.duality` and :mod:`.duality_torch` (the duality table: differentiable collectives whose
VJP is the row's backward collective), :mod:`.dist_adjoint` (the adjoint test and the
one-process reference), :mod:`.data_parallel`, :mod:`.tensor_parallel`, :mod:`.expert`
(experts on P ranks, tokens dispatched by all-to-all), :mod:`.placement` and :mod:`.sharded`
(tensors placed on P ranks, moved by rows of the table), :mod:`.zero` (ZeRO stages 0-3) and
:mod:`.transformer` (a small language model on a dp × tp grid of ranks).
"""
