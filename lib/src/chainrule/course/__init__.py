"""What only the lessons and the exercises use.

:mod:`.checks` (the exercises' checks), :mod:`.restart_hint` (the NameError hint after a kernel
restart), :mod:`.install_check`, :mod:`.graph` (drawing computation graphs),
:mod:`.placement_dtensor` (placements against PyTorch's DTensor), :mod:`.timing` (timing
torch.distributed's own collectives) and :mod:`.widgets` (the lessons' interactive views).
"""
