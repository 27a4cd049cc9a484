"""Groups of ranks, and the grid of data- and tensor-parallel groups of a 2-D parallel run.

A collective called with ``group=g`` meets only the ranks of ``g``: inside it, ``rank(g)`` is
this rank's index in ``g.ranks`` and ``world_size(g)`` is ``len(g.ranks)``, so the same code
that reduces over the whole world reduces over a group. Disjoint groups run their collectives
independently; ranks of one group must call the same collectives of that group in the same
order, as ranks of a world must. ``send`` and ``recv`` take ``group=`` as torch.distributed's do:
the message travels in the group, its peer named by its world rank (``dst``, ``src``) or by its
rank in the group (``group_dst``, ``group_src``).

:func:`new_group` must be called on every rank of the world, with the same ranks, in the same
order (``torch.distributed.new_group`` creates a process group there, a collective step of
its own), also by ranks that are not members.

A 2-D grid of ``dp × tp`` ranks (picotron's process-group manager, in two dimensions) numbers
rank ``r = d·tp + t``: its tensor-parallel group is the row ``d`` (the ``tp`` consecutive ranks
that share one copy of the model, sharded), its data-parallel group the column ``t`` (the
``dp`` ranks that hold the same shard and see different data)::

    tp →   0  1
    dp 0 [ 0  1 ]      tp groups: (0, 1), (2, 3)
    dp 1 [ 2  3 ]      dp groups: (0, 2), (1, 3)
"""

from __future__ import annotations

from dataclasses import dataclass

from chainrule.dist.world import current_world


@dataclass(frozen=True)
class Group:
    """Some ranks of the world, in order: ``ranks[i]`` is the group's rank i."""

    ranks: tuple[int, ...]

    def __post_init__(self) -> None:
        if not self.ranks:
            raise ValueError("a group needs at least one rank")
        if len(set(self.ranks)) != len(self.ranks):
            raise ValueError(f"a group lists each rank once, got {self.ranks}")

    def __len__(self) -> int:
        return len(self.ranks)

    def index(self, rank: int) -> int:
        """The group rank of the world's ``rank`` (ValueError when it is not a member)."""
        if rank not in self.ranks:
            raise ValueError(f"rank {rank} is not in the group of ranks {self.ranks}")
        return self.ranks.index(rank)


def new_group(ranks: list[int] | tuple[int, ...]) -> Group:
    """A group of ``ranks`` of the current world; call it on every rank, in the same order."""
    world = current_world()
    group = Group(tuple(int(r) for r in ranks))
    outside = [r for r in group.ranks if not 0 <= r < world.world_size]
    if outside:
        raise ValueError(f"ranks {outside} are not ranks of a world of size {world.world_size}")
    world.register_group(group)
    return group


@dataclass(frozen=True)
class Grid:
    """This rank's place in a ``dp × tp`` grid: its coordinates and its two groups."""

    dp: int
    tp: int
    dp_rank: int
    tp_rank: int
    dp_group: Group
    tp_group: Group


def grid(dp: int, tp: int) -> Grid:
    """This rank's :class:`Grid` of a world of ``dp·tp`` ranks (creates every row and column
    group, on every rank, in the same order)."""
    world = current_world()
    if dp < 1 or tp < 1 or dp * tp != world.world_size:
        raise ValueError(
            f"a {dp} × {tp} grid needs {dp * tp} ranks, the world has {world.world_size}"
        )
    rows = [new_group([d * tp + t for t in range(tp)]) for d in range(dp)]
    columns = [new_group([d * tp + t for d in range(dp)]) for t in range(tp)]
    d, t = divmod(world.rank, tp)
    return Grid(dp, tp, d, t, dp_group=columns[t], tp_group=rows[d])
