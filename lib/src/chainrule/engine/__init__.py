"""The engine (layer 1): reverse-mode autograd on numpy arrays, one VJP per operation: tensor,
ops, layers, optim, gradcheck, interop; recompute (activation checkpointing) and memory (the
activations a graph holds and the operations a pass evaluates). It imports nothing else of
chainrule."""
