"""Cost models: :mod:`.chain_cost` (multiply-adds of a Jacobian chain in either order) and
:mod:`.comm_cost` (the bytes and α–β time of a collective, read off its specification)."""
