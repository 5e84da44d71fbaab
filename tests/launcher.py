"""Run one scenario in N real ranks: ``python -m tests.launcher NAME N OUT [ARGS_JSON]``.

NAME is a function of ``tests/scenarios.py``, or ``module:function`` for another module of ``tests/``.
Each rank calls it as ``fn(rank, world_size, port, out, args)`` and writes what it returns to
``OUT/result.rank<R>.json``; a rank that raises writes its traceback to ``OUT/error.rank<R>.txt``.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import traceback


def _entry(rank: int, name: str, world_size: int, port: int, out: str, args: dict) -> None:
    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        WORLD_SIZE=str(world_size),
        LOCAL_WORLD_SIZE=str(world_size),
    )
    import importlib

    module, _, function = name.rpartition(":")
    scenario = getattr(importlib.import_module(f"tests.{module or 'scenarios'}"), function)
    try:
        result = scenario(rank, world_size, port, out, args)
    except BaseException:
        with open(os.path.join(out, f"error.rank{rank}.txt"), "w") as f:
            f.write(traceback.format_exc())
        raise
    with open(os.path.join(out, f"result.rank{rank}.json"), "w") as f:
        json.dump(result, f, default=str)
    # DDP modules sit in reference cycles that hold their process groups: left to the collection at
    # interpreter exit, a gloo group's destructor joins worker threads that may still need the GIL, and
    # the rank dies of SIGABRT ("terminate called without an active exception"). Collect them now.
    import gc

    del result
    gc.collect()


def main() -> None:
    import torch.multiprocessing as mp

    name, world_size, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    args = json.loads(sys.argv[4]) if len(sys.argv) > 4 else {}
    os.makedirs(out, exist_ok=True)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.start_processes(_entry, args=(name, world_size, port, out, args), nprocs=world_size, start_method="spawn")


if __name__ == "__main__":
    main()
