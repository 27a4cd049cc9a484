"""The errors of :mod:`chainrule.dist`: what went wrong, on which rank, in which collective."""

from __future__ import annotations


class CollectiveError(RuntimeError):
    """The ranks could not complete a collective together.

    Raised for ranks that call different collectives at the same step, mismatched shapes or
    dtypes, a rank that returned while others wait for it, and timeouts (the message names the
    ranks that never arrived). A collective numbered ``#k`` is the k-th collective of the run,
    counted from 0, the same number as ``Trace`` events' ``seq``.
    """


class CollectiveAborted(CollectiveError):
    """Raised inside a rank's collective when the run already failed elsewhere (another rank
    raised, or the ranks disagreed): it releases the rank, and is not itself the failure."""


class RankError(RuntimeError):
    """An exception raised by the SPMD function on one rank, re-raised in the caller.

    ``rank`` is the rank that raised, ``exc_type`` the name of the original exception's type and
    ``traceback_text`` its formatted traceback (also part of the message, so that it shows in a
    notebook even when the original exception object could not be brought back).
    """

    def __init__(self, rank: int, exc_type: str, message: str, traceback_text: str) -> None:
        self.rank = rank
        self.exc_type = exc_type
        self.original_message = message
        self.traceback_text = traceback_text
        super().__init__(
            f"rank {rank} raised {exc_type}: {message}\n\n"
            f"Traceback on rank {rank}:\n{traceback_text.rstrip()}"
        )

    def __reduce__(self) -> tuple:
        return (
            type(self),
            (self.rank, self.exc_type, self.original_message, self.traceback_text),
        )


class NoWorldError(RuntimeError):
    """A collective, ``rank()`` or ``world_size()`` was called outside any SPMD function.

    There is no implicit world of one rank: a collective outside ``dist.run`` (or outside a
    process group started by ``dist.init_from_env`` under torchrun) is a mistake worth seeing.
    """
