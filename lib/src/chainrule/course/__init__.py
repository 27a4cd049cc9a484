"""What only the lessons and the exercises use (layer 6): checks, the restart hint, the install
check, graph drawing, the DTensor comparison, timing real collectives, widgets."""
