"""TensorFlow's parameter-server task of one host of a ``parameter_server`` job:
``python -m hora.jobs._tf_ps CLUSTER_JSON TASK_INDEX``.

What SageMaker's TensorFlow container does in ``_run_ps``: a ``tf.distribute.Server`` for job ``ps`` of the job's
cluster (``master``, ``worker`` and ``ps`` tasks), task index = the host's index, with no GPU (several TensorFlow
processes must not share one), serving until it is stopped. The host's rank wrapper (:mod:`hora.jobs._entry`)
starts it beside the script and stops it with SIGTERM when the job ends on its host.
"""

from __future__ import annotations

import json
import signal
import sys


def main() -> None:
    cluster = json.loads(sys.argv[1])
    index = int(sys.argv[2])
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # stopped by the wrapper: end at once, nothing to clean up
    try:
        import tensorflow as tf
    except ImportError as exc:
        sys.stderr.write(
            f"hora job: distribution parameter_server starts TensorFlow's parameter-server task on every host, as "
            f"SageMaker's TensorFlow container does, but tensorflow cannot be imported here ({exc}); install "
            "tensorflow in the job's environment (requirements.txt)\n"
        )
        sys.exit(1)
    no_gpu = tf.compat.v1.ConfigProto(device_count={"GPU": 0})
    server = tf.distribute.Server(tf.train.ClusterSpec(cluster), job_name="ps", task_index=index, config=no_gpu)
    print(f"hora job: TensorFlow parameter server ps:{index} serving at {cluster['ps'][index]} ({server.target})",
          flush=True)
    server.join()


if __name__ == "__main__":
    main()
