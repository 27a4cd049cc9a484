"""The launcher's start-up: ``dist.run(fn, 2, backend="gloo")`` from a notebook-like process.

Each measurement is a new interpreter that imports numpy and ``chainrule.dist``, defines the
SPMD function in ``__main__`` (as a notebook cell does, so it travels by value), and times

- the first call: the parent starts one launcher process, which imports torch and forks the
  two ranks; both join the gloo group, then the function runs (the parent itself does not
  import torch);
- the same first call when the process had already imported torch (as a notebook that used
  torch earlier would have): the ranks start the same way, from a launcher of their own;
- repeated calls: the median of further calls on the live worker pool.

The function does one 1 KB all-reduce and returns the sum. The baseline of the first call is
a fresh interpreter that only imports torch, timed from the same benchmark process.
"""

from __future__ import annotations

import json

from benchmarks.harness import REPO, Row, fresh_python, make_row, median

NOTEBOOK = """
import json, sys, time
start = time.perf_counter()
if sys.argv[1] == "torch-first":
    import torch
import numpy as np
from chainrule import dist
imported = time.perf_counter()

def spmd():
    return float(dist.all_reduce(np.ones(256, dtype=np.float32)).sum())

t0 = time.perf_counter()
first = dist.run(spmd, 2, backend="gloo")
t1 = time.perf_counter()
repeated = []
for _ in range(int(sys.argv[2])):
    t = time.perf_counter()
    again = dist.run(spmd, 2, backend="gloo")
    repeated.append(time.perf_counter() - t)
print(json.dumps({
    "import_s": imported - start, "first_s": t1 - t0, "repeated_s": repeated,
    "correct": first == [512.0, 512.0] and again == first,
}))
dist.shutdown()
"""

IMPORT_TORCH = "import torch, torch.distributed"


def _python(code: str, *args: str) -> tuple[float, str]:
    """Wall seconds of a fresh ``python -c code args`` (pinned environment) and its stdout."""
    return fresh_python(code, *args, cwd=REPO, what="start-up benchmark")


def notebook_run(mode: str, repeated: int) -> dict:
    """One notebook-like process (``mode``: "cold" or "torch-first"); its timings."""
    _, out = _python(NOTEBOOK, mode, str(repeated))
    return json.loads(out.strip().splitlines()[-1])


def measure(
    quick: bool = False, processes: int | None = None, repeated: int | None = None
) -> list[Row]:
    """First and repeated calls, median over fresh processes, against a bare torch import.

    ``processes``: notebook-like processes of each kind (default 3, 1 when ``quick``);
    ``repeated``: further calls in each (default 50, 5 when ``quick``).
    """
    processes = processes or (1 if quick else 3)
    repeated = repeated or (5 if quick else 50)
    cold, warm, imports = [], [], []
    for _ in range(processes):
        imports.append(_python(IMPORT_TORCH)[0])
        cold.append(notebook_run("cold", repeated))
        warm.append(notebook_run("torch-first", repeated))
    correct = all(r["correct"] for r in cold + warm)
    torch_import = median(imports)
    first_cold = [r["first_s"] for r in cold]
    first_warm = [r["first_s"] for r in warm]
    return [
        make_row(
            "startup.first",
            "first dist.run(fn, 2, 'gloo') in a fresh process",
            median(first_cold),
            torch_import,
            "fresh interpreter importing torch",
            median(c / i for c, i in zip(first_cold, imports, strict=True)),
            correct=correct,
            import_chainrule_s=median(r["import_s"] for r in cold),
        ),
        make_row(
            "startup.first_torch_imported",
            "first dist.run(fn, 2, 'gloo'), torch already imported",
            median(first_warm),
            torch_import,
            "fresh interpreter importing torch",
            median(c / i for c, i in zip(first_warm, imports, strict=True)),
            correct=correct,
        ),
        make_row(
            "startup.repeated",
            "repeated dist.run(fn, 2, 'gloo') on the live pool",
            median(t for r in cold + warm for t in r["repeated_s"]),
            correct=correct,
            calls=repeated * len(cold + warm),
        ),
    ]
