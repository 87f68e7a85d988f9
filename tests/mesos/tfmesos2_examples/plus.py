# tfmesos2's examples/plus.py, written as its README runs it: the Mesos settings are exported
# (MESOS_MASTER, MESOS_SSL, MESOS_USERNAME, MESOS_PASSWORD) instead of assigned in the program,
# and client_ip names this test site's address. Nothing else differs.
from __future__ import print_function

import json
import os
import tensorflow as tf
from tfmesos2 import cluster


def main():
    jobs_def = [
        {
            "name": "ps",
            "num": 1
        },
        {
            "name": "worker",
            "num": 2
        },
    ]

    client_ip = "127.0.0.1"

    with cluster(jobs_def, client_ip=client_ip) as c:
        os.environ["TF_CONFIG"] = json.dumps({"cluster": c.cluster_def})

        print(os.environ["TF_CONFIG"])

        cluster_resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()

        strategy = tf.distribute.ParameterServerStrategy(cluster_resolver)

        with strategy.scope():
            constant_a = tf.constant(10)
            constant_b = tf.constant(32)

            op = constant_a + constant_b

        result = op.numpy()
        print("Result is: ")
        print(result)

if __name__ == '__main__':
    main()
