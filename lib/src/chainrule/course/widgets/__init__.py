"""Computations behind the lessons' interactive widgets and figures, with thin ipywidgets views.

Each module holds plain, tested functions that compute what a widget or a figure shows, and,
where the lesson has a widget, one ``build_*_widget`` function that wraps them in controls.
Import the module you need directly, e.g.
``from chainrule.course.widgets.chain_cost import build_chain_cost_widget``; this package imports
nothing, so the modules stay independent of each other.

- :mod:`.chain_cost`: the two association orders of the Jacobian chain (lesson 1).
- :mod:`.averaging`: averaging shard gradients versus the full batch (lesson 3).
- :mod:`.exactness`: where exactness breaks in the loss and the data (lesson 4).
- :mod:`.replicas`: clipping, missing ranks and reduction order (lesson 5).
- :mod:`.accumulation`: gradient accumulation, float16 overflow, no-sync traffic (lesson 6).
- :mod:`.duality`: each duality row routed rank by rank (lesson 7).
- :mod:`.distributed_graph`: the global graph of a distributed step (lessons 3 and 8).
- :mod:`.sharded_matmul`: the placements and collectives of a sharded matrix product (lesson 9).
- :mod:`.parallel_blocks`: a parallel block's placements and collectives, and its activation
  memory (lessons 10 and 11).
- :mod:`.comm_cost`: measured collectives against the α–β model, bytes per step (lesson 12).
- :mod:`.zero_memory`: memory per rank and traffic per step of the ZeRO stages (lesson 13).
- :mod:`.expert_routing`: expert loads against capacity, drops, padding, bytes (lesson 14).
- :mod:`.grid_traffic`: one traced step of the capstone on a dp × tp grid (lesson 15).
- :mod:`.pipeline_schedule`: a pipeline schedule as stages × slots, its bubble and activations.
- :mod:`.ring_attention`: which pairs of chunks each rank computes at each step of ring
  attention, plain and zig-zag splits, and the time the ranks wait (lesson 17).
- :mod:`.live_widget`: the thin live view shared by those widgets.
- :mod:`.tables`: tables and numbers as the lessons print them.
- :mod:`.source`: a library function's source, shown on the page.
"""
