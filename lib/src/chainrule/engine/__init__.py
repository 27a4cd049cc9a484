"""The engine (layer 1): reverse-mode autograd on numpy arrays, one VJP per operation: tensor,
ops, layers, optim, gradcheck, interop. It imports nothing else of chainrule."""
