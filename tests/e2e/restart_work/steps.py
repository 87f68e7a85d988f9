"""A node's work for the restart tests: ten steps, checkpointed after each, resumed from the
checkpoint (as a BackupAndRestore or CheckpointManager run does).

``steps.py DIR [--hold-at N]``: worker 1 of generation 0 stops at step N and writes its pid
into the FIFO ``DIR/hold`` (the test reads it and kills the process), then blocks; every
other run goes through to step 10 and prints where it started.
"""

import json
import os
import sys
from pathlib import Path

root = Path(sys.argv[1])
hold_at = int(sys.argv[3]) if len(sys.argv) > 3 and sys.argv[2] == "--hold-at" else -1
task = json.loads(os.environ["TF_CONFIG"])["task"]
generation = int(os.environ["TFCOORD_RESTARTS"])
ckpt = root / f"ckpt-{task['type']}-{task['index']}"
start = int(ckpt.read_text()) if ckpt.exists() else 0
for step in range(start, 10):
    tmp = ckpt.with_suffix(".tmp")
    tmp.write_text(str(step + 1))
    tmp.replace(ckpt)  # a checkpoint is whole or absent
    if step + 1 == hold_at and generation == 0 and task["index"] == 1:
        with open(root / "hold", "w") as fifo:  # blocks until the test reads: it is waiting
            fifo.write(str(os.getpid()))
        os.read(os.open(root / "never", os.O_RDONLY), 1)  # a FIFO no one writes: wait to be killed
print(f"generation {generation}: resumed at step {start}, finished step 10", flush=True)
