"""Cost models (layer 4): :mod:`.chain_cost` (a Jacobian chain's multiply-adds in either order)
and :mod:`.comm_cost` (the bytes and α–β time of a collective)."""
