"""Cost models (layer 4): :mod:`.chain_cost` (a Jacobian chain's multiply-adds in either order),
:mod:`.comm_cost` (the bytes and α–β time of a collective) and :mod:`.compute_cost` (arithmetic
intensity, the roofline, and a step's arithmetic against its collectives)."""
