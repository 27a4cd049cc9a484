"""Computations behind the lessons' interactive widgets, with thin ipywidgets views on top.

Each module holds plain, tested functions that compute what a widget shows, and one
``build_*_widget`` function that wraps them in ipywidgets controls. Import the module you
need directly, e.g. ``from chainrule.widgets.chain_cost import build_chain_cost_widget``;
this package imports nothing, so the modules stay independent of each other.

- :mod:`.chain_cost`: the two association orders of the Jacobian chain (lesson 1).
- :mod:`.averaging`: averaging shard gradients versus the full batch (lesson 3).
- :mod:`.exactness`: where the exactness of data parallelism breaks (lesson 4).
- :mod:`.accumulation`: gradient accumulation, float16 overflow, no-sync traffic (lesson 5).
- :mod:`.duality`: each duality row routed rank by rank (lesson 6).
- :mod:`.distributed_graph`: the global graph of a data-parallel step (lesson 7).
- :mod:`.live`: the thin live view shared by those widgets.
"""
