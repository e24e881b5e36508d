"""Every environment variable hora reads that is not a setting (:mod:`.settings`) or a launcher's (:mod:`.launchers`,
:mod:`.worker_env`), declared once with its meaning, and the one way to read them. Reading a name that is not
declared here is a bug (``KeyError``), so grep for a variable finds its declaration and its readers.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

__all__ = ["VARIABLES", "Variable", "environment", "read", "sm_channel_dir"]


@dataclass(frozen=True)
class Variable:
    name: str  # a name ending in '*' declares a family (SM_CHANNEL_*)
    meaning: str


VARIABLES: tuple[Variable, ...] = (
    Variable(
        "HOROVOD_ELASTIC",
        "1 when an elastic launcher started the rank (Horovod's variable): hvd.elastic.run then resets after a "
        "failed collective instead of re-raising it",
    ),
    Variable(
        "HORA_ELASTIC_SLOT",
        "set by the elastic launcher: the worker's slot, host:index, the same for its whole life",
    ),
    Variable("HORA_ELASTIC_ROUND", "set by the elastic launcher: the round (set of ranks) the worker was started for"),
    Variable(
        "HORA_ELASTIC_MAX_NP", "set by the elastic launcher when --max-np is given: hvd.max_size() of every rank"
    ),
    Variable(
        "HORA_STACKS_DIR",
        "set by hora run for its local ranks: the private directory where a rank dumps its threads' stacks on SIGUSR1 "
        "(read by hora run before it stops or kills a rank)",
    ),
    Variable(
        "HOROVOD_SPARK_START_TIMEOUT",
        "Horovod's: seconds hora.spark.run_elastic waits for its Spark tasks to start when start_timeout is not given",
    ),
    Variable(
        "SPARK_LOCAL_DIRS",
        "set by Spark for its Python workers: the executor's scratch directories (run_elastic's tasks work there)",
    ),
    Variable(
        "HORA_OVERSUBSCRIBE",
        "the oversubscribe setting, read by hora job for its spec's process count before the job's settings exist",
    ),
    Variable("HORA_JOB_HOME", "where hora job keeps its jobs (default ~/.hora)"),
    Variable(
        "HORA_DASHBOARD_TOKEN",
        "the token hora dashboard requires of every request (default: none on a loopback address, a random one "
        "printed at start on any other)",
    ),
    Variable("HORA_JOB_ATTEMPT", "set by hora job for a job's ranks: the attempt (1, 2, ... with retries)"),
    Variable(
        "HORA_JOB_CONNECT_TIMEOUT",
        "seconds the master host of a hora job keeps trying to reach another host's agent (default: the job's "
        "master_timeout)",
    ),
    Variable("HORA_S3_ENDPOINT_URL", "S3 endpoint of hora job's channels and artifacts (before AWS_ENDPOINT_URL_S3)"),
    Variable("AWS_ENDPOINT_URL_S3", "the AWS SDKs' S3 endpoint variable, honoured by hora job"),
    Variable("AWS_ENDPOINT_URL", "the AWS SDKs' endpoint for every service, honoured by hora job after the two above"),
    Variable("MLFLOW_TRACKING_URI", "MLflow's tracking URI: hora job exports each job as an MLflow run there"),
    Variable(
        "JOB_COMPLETION_INDEX",
        "set by Kubernetes in each pod of an Indexed Job: the pod's index, read by hora job manifest's entry point "
        "(hora.jobs.k8s_entry; index i is host algo-(i+1))",
    ),
    Variable("SM_CHANNEL_*", "SageMaker: the directory of an input channel (read by hora.data.PipeDataset)"),
    Variable("SM_INPUT_DIR", "SageMaker: the job's input directory (default /opt/ml/input)"),
)
_NAMES = {v.name for v in VARIABLES}
_FAMILIES = tuple(v.name[:-1] for v in VARIABLES if v.name.endswith("*"))


def read(name: str, env: Mapping[str, str] | None = None) -> str | None:
    """The value of the declared variable ``name`` in ``env`` (default: this process's environment), or None."""
    if name not in _NAMES and not name.startswith(_FAMILIES):
        raise KeyError(f"{name} is not declared in hora.config.variables")
    return (os.environ if env is None else env).get(name)


def sm_channel_dir(channel: str, env: Mapping[str, str] | None = None) -> str | None:
    """``SM_CHANNEL_<CHANNEL>``: where SageMaker (and hora job) put the channel's data, or None."""
    return read(f"SM_CHANNEL_{channel.upper()}", env)


def environment() -> dict[str, str]:
    """A copy of this process's environment, to start a child process with (after changes of its own)."""
    return dict(os.environ)
