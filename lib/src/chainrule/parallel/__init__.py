"""Parallelism (layer 3) on the engine and on torch, over :mod:`chainrule.dist`: the duality
table, the adjoint test, data, tensor and expert parallelism, placements, ZeRO, a transformer."""
