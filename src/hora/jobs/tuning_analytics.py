"""The SDK's ``HyperparameterTuningJobAnalytics`` (``sagemaker.analytics``): a tuning job's trials as a pandas
DataFrame, from this machine's jobs home."""

from __future__ import annotations

from typing import Any

from hora.errors import ConfigError
from hora.jobs.store import JobStore
from hora.jobs.tuning_describe import describe_tuning_job, training_job_summaries
from hora.jobs.tuning_store import TuningStore

__all__ = ["HyperparameterTuningJobAnalytics"]


class HyperparameterTuningJobAnalytics:
    """The SDK's ``HyperparameterTuningJobAnalytics``: the trials of a tuning job as a pandas DataFrame."""

    def __init__(self, hyperparameter_tuning_job_name: str, sagemaker_session: Any = None,
                 home: str | None = None) -> None:
        self._tstore = TuningStore(JobStore(home))
        self._tuning_job_name = hyperparameter_tuning_job_name
        self.clear_cache()

    @property
    def name(self) -> str:
        return self._tuning_job_name

    def __repr__(self) -> str:
        return f"<hora.jobs.HyperparameterTuningJobAnalytics for {self.name}>"

    def clear_cache(self) -> None:
        self._dataframe: Any = None
        self._description: dict[str, Any] | None = None
        self._summaries: list[dict[str, Any]] | None = None

    def description(self, force_refresh: bool = False) -> dict[str, Any]:
        if force_refresh:
            self.clear_cache()
        if self._description is None:
            self._description = describe_tuning_job(self._tstore, self.name)
        return self._description

    def training_job_summaries(self, force_refresh: bool = False) -> list[dict[str, Any]]:
        if force_refresh:
            self.clear_cache()
        if self._summaries is None:
            self._summaries = training_job_summaries(self._tstore, self.name)
        return self._summaries

    @property
    def tuning_ranges(self) -> dict[str, Any]:
        ranges = self.description()["HyperParameterTuningJobConfig"]["ParameterRanges"]
        return {p["Name"]: p for group in ranges.values() for p in group}

    def dataframe(self, force_refresh: bool = False) -> Any:
        if force_refresh:
            self.clear_cache()
        if self._dataframe is None:
            self._dataframe = self._fetch_dataframe()
        return self._dataframe

    def export_csv(self, filename: str) -> None:
        self.dataframe().to_csv(filename)

    def _fetch_dataframe(self) -> Any:
        try:
            import pandas as pd
        except ImportError:
            raise ConfigError("analytics().dataframe() needs pandas: pip install -c constraints.txt -e '.[tuning]' "
                              "in hora's checkout") from None

        def reshape(summary: dict[str, Any]) -> dict[str, Any]:  # the SDK's, column for column
            out: dict[str, Any] = {}
            for k, v in summary["TunedHyperParameters"].items():
                try:
                    v = float(v)
                except (TypeError, ValueError):
                    pass
                out[k] = v
            out["TrainingJobName"] = summary["TrainingJobName"]
            out["TrainingJobStatus"] = summary["TrainingJobStatus"]
            out["FinalObjectiveValue"] = summary.get("FinalHyperParameterTuningJobObjectiveMetric", {}).get("Value")
            start, end = summary.get("TrainingStartTime"), summary.get("TrainingEndTime")
            out["TrainingStartTime"] = start
            out["TrainingEndTime"] = end
            if start and end:
                out["TrainingElapsedTimeSeconds"] = (end - start).total_seconds()
            return out

        return pd.DataFrame([reshape(s) for s in self.training_job_summaries()])
