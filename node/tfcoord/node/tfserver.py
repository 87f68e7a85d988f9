"""Server mode: a ``tf.distribute.Server`` for this node's role, until the node is stopped.

tfmesos2's model, kept for its users: every task of the cluster only serves, and a client
outside it (a ParameterServerStrategy coordinator, a between-graph session) drives the
work over gRPC. The node runner starts this module as its command
(``python -m tfcoord.node.tfserver``) with ``TF_CONFIG`` set; once the server listens it
writes a line on the descriptor named by ``TFCOORD_READY_FD``, so the node reports RUNNING
only when it can actually be dialled. The runner terminates it when the coordinator says
stop. TensorFlow is imported here and nowhere else on the node's path.
"""

from __future__ import annotations

import json
import os
import sys

from .runner import READY_FD_ENV, READY_LINE


def main() -> int:
    try:
        config = json.loads(os.environ["TF_CONFIG"])
        cluster, task = config["cluster"], config["task"]
        role, index = task["type"], int(task["index"])
    except (KeyError, ValueError, TypeError) as e:
        print(f"tfcoord server mode: TF_CONFIG is missing or malformed ({e!r})", file=sys.stderr)
        return 2
    import tensorflow as tf  # only now: seconds of import, hundreds of MB

    server = tf.distribute.Server(
        tf.train.ClusterSpec(cluster), job_name=role, task_index=index, protocol="grpc", start=True
    )
    print(f"tfcoord: serving /job:{role}/task:{index} at {server.target}", file=sys.stderr, flush=True)
    ready_fd = os.environ.get(READY_FD_ENV)
    if ready_fd:
        with os.fdopen(int(ready_fd), "wb") as ready:
            ready.write(READY_LINE)
    server.join()  # until the runner terminates us
    return 0


if __name__ == "__main__":
    sys.exit(main())
