"""The states of a job, as SageMaker's DescribeTrainingJob names them (``TrainingJobStatus`` and
``SecondaryStatus``), and how a job moves through them::

    InProgress / Starting ─► InProgress / Downloading ─► InProgress / Training ─► InProgress / Uploading ─┐
          │                        │                          │   (retries stay in Training)              │
          │                        │                          └─► InProgress / Stopping (stop, max_run)   │
          └────────────────────────┴─────────────── a failure before training ──────────────────────────► │
                                                                                                          ▼
                              Completed / Completed   |   Failed / Failed   |   Stopped / Stopped or MaxRuntimeExceeded
                                                                                       or MaxWaitTimeExceeded

A managed spot job (spot.py) also goes Training ─► Interrupted ─► Restarting ─► Training when it is reclaimed.

Every job ends in one of the three terminal statuses; the artifacts are archived (Uploading) whatever the outcome.
A job whose supervisor died is marked Failed by the next command that looks at it.
"""

from __future__ import annotations

import enum

__all__ = ["TERMINAL", "JobStatus", "SecondaryStatus"]


class JobStatus(str, enum.Enum):
    InProgress = "InProgress"
    Completed = "Completed"
    Failed = "Failed"
    Stopped = "Stopped"

    def __str__(self) -> str:
        return self.value


class SecondaryStatus(str, enum.Enum):
    Starting = "Starting"
    Downloading = "Downloading"
    Training = "Training"
    Uploading = "Uploading"
    Stopping = "Stopping"
    Completed = "Completed"
    Failed = "Failed"
    Stopped = "Stopped"
    MaxRuntimeExceeded = "MaxRuntimeExceeded"
    Interrupted = "Interrupted"  # managed spot: the instances were reclaimed (spot.py)
    Restarting = "Restarting"  # managed spot: capacity is back, the job starts again from its checkpoints
    MaxWaitTimeExceeded = "MaxWaitTimeExceeded"  # managed spot: the job took longer than max_wait

    def __str__(self) -> str:
        return self.value


TERMINAL = (JobStatus.Completed, JobStatus.Failed, JobStatus.Stopped)
