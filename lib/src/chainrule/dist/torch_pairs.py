"""A send and its recv between two torch.distributed ranks, agreed in the process group's store.

torch.distributed's ``send`` on gloo waits until its ``recv`` is posted, and a ``recv`` whose
send never comes waits forever; neither can be called off. So before any data moves the two
ranks meet in the key-value store the process group was started with (torch.distributed's own
``Store``): each writes its call (op, shape, dtype) under the message's key,
``<run>/<channel>/<src>-<dst>/<k>/send`` or ``.../recv`` (the k-th message from src to dst in
the channel: ``world``, or ``group-0-4`` for a message sent in the group of ranks 0 and 4), and
polls for the other's. Then both check the pair (:func:`~chainrule.dist.calls.agree_pair`) and
one ``torch.distributed.send`` and its ``recv`` move the data, in the message's process group
(``dst`` and ``src`` world ranks, as torch.distributed takes them): both are posted, neither can
hang.

While it waits, a rank has written what it waits for (``<run>/state/<rank>``: its send or recv,
its peer, the key it waits for), and every :data:`CHECK_EVERY` seconds it reads the others' and
asks whether the wait can still end. It cannot when

- its peer returned or raised (:meth:`Pairs.finish` writes that as a rank's function ends);
- it belongs to a **deadlock**: a set of waiting ranks each of which waits for a rank of the set
  (or one that has ended). A written wait is stale once its key exists, and keys are not removed
  within a run, so a wait whose key is still absent after the states were read was real when
  they were read: no rank of the set can write the key another waits for, and the set waits
  forever. A rank waiting in a collective (read from its status file,
  :mod:`chainrule.dist.whereabouts`, in a worker pool) waits for every rank of its group that
  has not reached it: this rank, when it belongs to the group, and any other rank of the group
  whose status shows it waiting elsewhere (a send in a pipeline group against an all-reduce in
  a tensor-parallel group, say).

The words are the simulated world's (:mod:`chainrule.dist.calls`).
"""

from __future__ import annotations

import pickle
import re
import time
from typing import TYPE_CHECKING, Any

from chainrule.dist.calls import (
    SIGNALS,
    Call,
    agree_pair,
    deadlock_message,
    pair_event,
    pair_group,
    pair_name,
    pair_returned_message,
)
from chainrule.dist.world import CollectiveAborted, CollectiveError
from chainrule.engine import interop

if TYPE_CHECKING:
    from chainrule.dist.torch_backend import TorchWorld

CHECK_EVERY = 0.05
"""Seconds between two looks at the other ranks while a send or a recv waits."""

POLL_MAX = 0.002
"""The longest pause, in seconds, between two looks for the peer's key."""

_COLLECTIVE = re.compile(r"^(\w+) #(\d+)(?: \(in the group of ranks \(([\d, ]*)\)\))?$")


class Pairs:
    """The sends and recvs of one torch rank (``world``, the whole default group's)."""

    def __init__(self, world: TorchWorld) -> None:
        self.world = world
        self.store: Any = None
        self.run = 0  # every rank starts its runs in step: the keys' first part
        self.sent: dict[tuple[Any, int], int] = {}  # (group, destination) -> messages sent
        self.received: dict[tuple[Any, int], int] = {}  # (group, source) -> messages received
        self.failure: str | None = None  # a pair that could not agree, in this run

    def start(self) -> None:
        self.run += 1
        self.sent.clear()
        self.received.clear()
        self.failure = None

    def _store(self) -> Any:
        if self.store is None:
            import torch.distributed as td

            default = td.distributed_c10d._get_default_store()
            self.store = td.PrefixStore("chainrule-pairs", default)
        return self.store

    def _key(self, *parts: object) -> str:
        return "/".join(str(p) for p in (self.run, *parts))

    def meet(self, call: Call, data: Any, process_group: Any = None) -> tuple[Any, Call]:
        """This rank's send (``data``: its tensor) or recv (None) ``call``, met with its peer's;
        the received tensor (None for a send) and the sender's call. ``process_group``: the
        torch.distributed group of the call's group (None: the default group)."""
        import torch
        import torch.distributed as td

        world = self.world
        if world.failure is not None or self.failure is not None:
            raise CollectiveAborted(world.failure or self.failure)
        sending = call.op == "send"
        src, dst = call.param("src"), call.param("dst")
        peer = dst if sending else src
        counts = self.sent if sending else self.received
        group = pair_group(call)
        seq = counts.get((group, peer), 0)
        counts[(group, peer)] = seq + 1
        channel = "world" if group is None else "group-" + "-".join(map(str, group))
        base = self._key(channel, f"{src}-{dst}", seq)
        mine, theirs = (f"{base}/send", f"{base}/recv")[:: 1 if sending else -1]
        what = pair_name(call, seq)
        store = self._store()
        waits = ("waits", what, peer, theirs)
        store.multi_set(
            [mine, self._key("state", world.rank)], [pickle.dumps(call), pickle.dumps(waits)]
        )
        if world.status is not None:
            world.status.waiting_in(what)
        try:
            self._wait(theirs, what, peer)
        finally:
            if world.status is not None:
                world.status.waiting_in(None)
        other: Call = pickle.loads(store.get(theirs))
        try:
            lead = agree_pair(*((call, other) if sending else (other, call)), seq)
        except CollectiveError as exc:
            self.failure = str(exc)
            raise
        if sending:
            td.send(data.contiguous(), dst, group=process_group)
            if world.events is not None:
                world.events.append(pair_event(lead, seq, world.backend))
                world.event_times.append(time.monotonic())
            return None, lead
        dtype = interop.torch_dtype(lead.dtype)  # type: ignore[arg-type]
        buffer = torch.empty(lead.shape or (), dtype=dtype, device=world.device)
        td.recv(buffer, src, group=process_group)
        return buffer, lead

    def _wait(self, key: str, what: str, peer: int) -> None:
        """Until ``key`` exists; raise CollectiveError when it never can."""
        store, pause = self.store, 1e-4
        check_at = time.monotonic() + CHECK_EVERY
        while not store.check([key]):
            if time.monotonic() >= check_at:
                self._check(what, peer)
                check_at = time.monotonic() + CHECK_EVERY
            time.sleep(pause)
            pause = min(2 * pause, POLL_MAX)

    def _check(self, what: str, peer: int) -> None:
        """Raise when this rank's wait in ``what`` (for ``peer``) can no longer end.

        The ranks' waits are read twice; a rank counts as waiting only where both reads agree
        (a wait, once left, is never entered again: its message or collective has a number of
        its own), so every wait of the second look was on at a moment between the two."""
        me = self.world.rank
        waits, ended = self._waits(what, peer)
        self._peer_ended(what, peer, ended)
        if me not in _stuck(waits, ended):
            return
        again, ended = self._waits(what, peer)
        # between the reads the peer may have found the same deadlock and raised: its error
        # names the whole set, this rank's would name only what is left
        self._peer_ended(what, peer, ended)
        seen_twice = {r: w for r, w in again.items() if r in waits and waits[r][0] == w[0]}
        stuck = _stuck(seen_twice, ended)
        if me not in stuck:
            return
        raised = sorted(
            p
            for r in stuck
            for p in seen_twice[r][1]
            if p not in stuck and ended.get(p) == "raised"
        )
        if raised:  # a rank of the circle raised first (it found the deadlock, or failed)
            raise CollectiveAborted(f"rank {me} waited in {what}; rank {raised[0]} raised")
        raise CollectiveError(deadlock_message({r: seen_twice[r][0] for r in stuck}))

    def _peer_ended(self, what: str, peer: int, ended: dict[int, str]) -> None:
        """Raise when ``peer``, which this rank waits for, has returned or raised."""
        me = self.world.rank
        if ended.get(peer) == "returned":
            raise CollectiveError(pair_returned_message(me, what, peer))
        if ended.get(peer) == "raised":
            raise CollectiveAborted(f"rank {me} waited in {what} for rank {peer}, which raised")

    def _waits(
        self, what: str, peer: int
    ) -> tuple[dict[int, tuple[str, frozenset[int]]], dict[int, str]]:
        """Every rank's wait (what it waits in, the ranks it waits for) and the ranks whose
        function ended (returned or raised), read from the store and the status files."""
        world, store = self.world, self.store
        me = world.rank
        states: dict[int, tuple[Any, ...]] = {}
        for r in range(world.world_size):
            key = self._key("state", r)
            if r != me and store.check([key]):
                states[r] = pickle.loads(store.get(key))
        waits = {me: (what, frozenset([peer]))}
        ended = {r: state[0] for r, state in states.items() if state[0] in ("returned", "raised")}
        for r, state in states.items():
            if state[0] == "waits" and not store.check([state[3]]):
                waits[r] = (state[1], frozenset([state[2]]))
        texts = self._statuses()
        texts[me] = what
        for r in range(world.world_size):
            if r not in waits and r not in ended:
                collective = self._collective_of(r, texts)
                if collective is not None:
                    waits[r] = collective
        return waits, ended

    def _statuses(self) -> dict[int, str | None]:
        """What each rank's status file says it waits in (a worker pool's; none elsewhere)."""
        status = self.world.status
        if status is None:
            return {}
        from chainrule.dist import whereabouts

        return {r: whereabouts.waits_in(status.folder, r) for r in range(self.world.world_size)}

    def _collective_of(
        self, rank: int, texts: dict[int, str | None]
    ) -> tuple[str, frozenset[int]] | None:
        """The collective ``rank`` waits in and the ranks of its group that have not reached
        it (``texts``: what each rank waits in), or None when it waits in none. This rank, a
        member that has not reached it, waits elsewhere; one that has passed it shows that
        ``rank``'s wait had ended."""
        world = self.world
        text = texts.get(rank)
        match = _COLLECTIVE.match(text or "")
        if match is None or match.group(1) in SIGNALS:  # a send or a recv, or the run's end
            return None
        seq, listed = int(match.group(2)), match.group(3)
        if listed is None:
            members = tuple(range(world.world_size))
        else:
            members = tuple(int(r) for r in listed.replace(",", " ").split())
        if world.rank in members:
            mine = world if listed is None else world.groups.get(members)
            if mine is None or mine.seq > seq:
                return None
        missing = frozenset(m for m in members if m != rank and texts.get(m) != text)
        return (text, missing) if missing else None  # type: ignore[return-value]

    def finish(self, raised: bool) -> None:
        """Tell the ranks that wait in a send or a recv that this rank's function ended."""
        if self.store is None and not self.sent and not self.received:
            try:
                self._store()
            except (RuntimeError, ValueError):
                return  # no default group: nothing to tell
        self.store.set(
            self._key("state", self.world.rank), pickle.dumps(("raised" if raised else "returned",))
        )


def _stuck(waits: dict[int, tuple[str, frozenset[int]]], ended: dict[int, str]) -> set[int]:
    """The waiting ranks that can never go on: a rank goes on once every rank it waits for
    does (one that is not waiting runs its own code and will come; one that ended never
    will), so what is left after freeing those ranks again and again waits forever."""
    stuck = set(waits)
    while True:
        free = {r for r in stuck if not any(p in stuck or p in ended for p in waits[r][1])}
        if not free:
            return stuck
        stuck -= free


__all__ = ["Pairs"]
