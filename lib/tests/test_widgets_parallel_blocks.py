"""Pictures of parallel blocks: the stages' placements read from placed tensors."""

import numpy as np
from chainrule import dist
from chainrule.course.widgets import parallel_blocks as pb
from chainrule.course.widgets.live_widget import figure_png, smallest_text_px
from chainrule.parallel import sharded as sh
from chainrule.parallel.placement import Partial, Replicate, Shard


def test_stages_name_the_placements_of_placed_tensors():
    def spmd():
        x = sh.distribute(np.ones((4, 4)), Replicate())
        return [
            pb.stage("x", x).placement,
            pb.stage("f", sh.fan_out(x)).placement,
            pb.stage("s", sh.distribute(np.ones((4, 4)), Shard(1))).placement,
            pb.stage("p", sh.from_local(np.ones(2), Partial())).placement,
        ]

    assert dist.run(spmd, 2)[0] == ["Replicate", "Replicate, fanned out", "Shard(1)", "Partial"]


def test_block_and_memory_pictures_are_readable():
    stages = [
        pb.Stage("X", "Replicate", "f: identity", "all-reduce"),
        pb.Stage("H", "Shard(1)"),
        pb.Stage("Z", "Partial", "f̄: all-reduce", "identity"),
        pb.Stage("Y", "Replicate"),
    ]
    figure = pb.plot_block({"MLP": stages, "attention": stages + [pb.Stage("Y", "Replicate")]})
    texts = {t.get_text() for t in figure.axes[0].texts}
    assert {"f: identity", "all-reduce", "Partial", "MLP"} <= texts
    assert smallest_text_px(figure, figure_png(figure)) >= 9
    memory = pb.plot_memory({"a": {1: 6.0, 2: 6.0}, "b": {1: 6.0, 2: 3.0}})
    assert smallest_text_px(memory, figure_png(memory)) >= 9
