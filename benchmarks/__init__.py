"""Benchmarks of the course library against its anchors: ``python -m benchmarks.run``.

- :mod:`.harness`: fresh-process runs under one pinned environment, timers, medians, ratios,
  and the description of the machine.
- :mod:`.engine`: the autograd engine against PyTorch eager and hand-written numpy backprop.
- :mod:`.sim_collectives`: the simulated world's collectives against a 64 MB memcpy.
- :mod:`.gloo_collectives`: the torch backend's collectives against raw ``torch.distributed``.
- :mod:`.startup`: the launcher's first and repeated ``run(fn, 2, backend="gloo")``.
- :mod:`.grading`: autograding throughput, sequential against parallel workers.
- :mod:`.goals`: the targets each result is judged against.
- :mod:`.report`: the Markdown report.
"""
