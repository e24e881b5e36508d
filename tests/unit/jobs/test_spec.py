"""Job spec validation: every problem is found before anything starts, in one error."""

from __future__ import annotations

import pytest

from hora.jobs import Estimator, SpecError, load_spec, parse_spec
from hora.jobs.spec import spec_from_dict


@pytest.fixture
def code(tmp_path):
    (tmp_path / "train.py").write_text("print('hi')\n")
    (tmp_path / "data").mkdir()
    return tmp_path


def problems(data, base) -> list[str]:
    with pytest.raises(SpecError) as info:
        parse_spec(data, base_dir=base)
    assert str(info.value).count("\n  - ") == len(info.value.problems)
    return info.value.problems


def test_a_full_spec_parses(code):
    spec = parse_spec(
        {
            "entry_point": "train.py",
            "hyperparameters": {"epochs": 3, "lr": 0.1},
            "instance_count": 2,
            "distribution": {"mpi": {"enabled": True, "processes_per_host": 2,
                                     "custom_mpi_options": "--fusion-threshold-mb 8 --transport tcp"}},
            "inputs": {"training": "data", "eval": {"uri": "s3://bucket/eval", "input_mode": "Pipe",
                                                   "distribution": "ShardedByS3Key"}},
            "output_path": "out",
            "checkpoint_path": "s3://bucket/ckpt",
            "metric_definitions": [{"Name": "loss", "Regex": "loss=([0-9.]+)"}],
            "max_run": 60,
            "max_retry_attempts": 2,
            "environment": {"A": 1, "B": True},
            "job_name": "my-job-1",
        },
        base_dir=code,
    )
    assert (spec.instance_count, spec.processes_per_host, spec.world_size, spec.strategy) == (2, 2, 4, "mpi")
    assert spec.run_settings == {"fusion_threshold": 8 * 1024 * 1024, "transport": "tcp"}
    assert spec.source_dir == str(code) and spec.entry_point == "train.py"
    training, ev = spec.inputs
    assert training.uri == str(code / "data") and training.input_mode == "File"
    assert (ev.uri, ev.input_mode, ev.distribution, ev.is_s3) == ("s3://bucket/eval", "Pipe", "ShardedByS3Key", True)
    assert spec.output_path == str(code / "out") and spec.checkpoint_path == "s3://bucket/ckpt"
    assert spec.environment == {"A": "1", "B": "true"}
    assert spec_from_dict(spec.to_dict()) == spec


def test_every_problem_is_reported_at_once(code):
    found = problems(
        {
            "entry_point": "missing.py",
            "instance_cout": 2,
            "processes_per_host": -1,
            "max_retry_attempts": "3",
            "max_run": -5,
            "inputs": {"training": "nowhere/"},
            "hyperparameters": ["not", "a", "mapping"],
            "metric_definitions": [{"Name": "loss", "Regex": "(unclosed"}],
        },
        code,
    )
    text = "\n".join(found)
    assert "unknown field 'instance_cout'; did you mean 'instance_count'?" in text
    assert "entry_point 'missing.py' does not exist" in text
    assert "processes_per_host must be >= 1, got -1" in text
    assert "max_retry_attempts must be a whole number >= 0, got '3' (str)" in text
    assert "max_run must be > 0 seconds, got -5" in text
    assert "channel 'training': the path 'nowhere/' does not exist" in text
    assert "hyperparameters must be a mapping" in text
    assert "Regex '(unclosed' does not compile" in text
    assert len(found) == 8, found


def test_missing_entry_point_and_nested_unknown_keys(code):
    found = problems({"inputs": {"training": {"uri": "data", "input_mod": "Pipe"}},
                      "distribution": {"mpi": {"enabeld": True}}}, code)
    assert "entry_point is missing: name the training script, e.g. entry_point: train.py" in found
    assert "unknown field 'input_mod' in channel 'training'; did you mean 'input_mode'?" in found
    assert "unknown field 'enabeld' in distribution.mpi; did you mean 'enabled'?" in found


def test_parameter_server_is_a_distribution(code):
    spec = parse_spec({"entry_point": "train.py", "distribution": {"parameter_server": {"enabled": True}}}, base_dir=code)
    assert spec.strategy == "parameter_server"  # the forms and their errors: test_parameter_server.py
    assert parse_spec({"entry_point": "train.py", "distribution": "parameter_server"}, base_dir=code).strategy == spec.strategy


def test_wrong_types_and_values(code):
    found = problems(
        {"entry_point": "train.py", "instance_count": 1.5, "input_mode": "Stream", "distribution": "horovod",
         "environment": {"X": [1]}, "job_name": "bad name!", "stop_grace": "soon",
         "inputs": {"training": {"uri": "data", "distribution": "Sharded"}}},
        code,
    )
    text = "\n".join(found)
    assert "instance_count must be a whole number >= 1, got 1.5 (float)" in text
    assert "input_mode 'Stream' must be File or Pipe" in text
    assert "distribution 'horovod' is not one of none, mpi, allreduce, parameter_server" in text
    assert "environment variable X must be a string or number" in text
    assert "job_name 'bad name!' must be 1-63 letters" in text
    assert "stop_grace must be a number of seconds > 0, got 'soon' (str)" in text
    assert "distribution 'Sharded' must be FullyReplicated or ShardedByS3Key" in text


def test_custom_mpi_options_are_checked_with_hora_runs_parser(code):
    found = problems({"entry_point": "train.py", "distribution": {"mpi": {"custom_mpi_options": "--fusion-mb 3"}}}, code)
    assert len(found) == 1 and "custom_mpi_options '--fusion-mb 3' are not valid hora run options" in found[0]
    found = problems({"entry_point": "train.py", "distribution": {"mpi": {"custom_mpi_options": "-np 8"}}}, code)
    assert found == ["custom_mpi_options may not set np: hora job sets the ranks and hosts itself"]


def test_custom_mpi_options_export_variables_with_mpiruns_x(code, monkeypatch):
    monkeypatch.setenv("HORA_TEST_EXPORTED", "from-here")
    options = ("-x HOROVOD_TIMELINE=/opt/ml/output/data/timeline.json --fusion-threshold-mb 8 -x HOROVOD_AUTOTUNE=1 "
               "-x HORA_TEST_EXPORTED -x EMPTY=")
    spec = parse_spec({"entry_point": "train.py", "distribution": {"mpi": {"custom_mpi_options": options}}}, code)
    assert spec.mpi_exports == {"HOROVOD_TIMELINE": "/opt/ml/output/data/timeline.json", "HOROVOD_AUTOTUNE": "1",
                                "HORA_TEST_EXPORTED": "from-here", "EMPTY": ""}
    assert spec.run_settings == {"fusion_threshold": 8 << 20}
    assert spec_from_dict(spec.to_dict()) == spec
    monkeypatch.delenv("HORA_TEST_EXPORTED")
    found = problems({"entry_point": "train.py", "distribution": {"mpi": {
        "custom_mpi_options": "-x 1BAD=2 -x HORA_TEST_EXPORTED -x"}}}, code)
    assert found == [
        "custom_mpi_options: -x '1BAD=2' does not start with a variable name (NAME=VALUE or NAME)",
        "custom_mpi_options: -x HORA_TEST_EXPORTED exports HORA_TEST_EXPORTED from this environment, where it is not set",
        "custom_mpi_options: -x needs NAME=VALUE or NAME after it",
    ]


def test_exported_paths_land_in_the_hosts_tree():
    from pathlib import Path

    from hora.jobs._entry import on_host_tree

    tree = Path("/tmp/job/hosts/algo-1")
    assert on_host_tree("/opt/ml/output/data/t.json", tree) == "/tmp/job/hosts/algo-1/output/data/t.json"
    assert on_host_tree("/opt/ml", tree) == "/tmp/job/hosts/algo-1"
    assert on_host_tree("/opt/mlx/a", tree) == "/opt/mlx/a"
    assert on_host_tree("1", tree) == "1"
    assert on_host_tree("/opt/ml/output/x", Path("/opt/ml")) == "/opt/ml/output/x"


def test_conflicting_processes_per_host(code):
    found = problems({"entry_point": "train.py", "processes_per_host": 2,
                      "distribution": {"allreduce": {"processes_per_host": 3}}}, code)
    assert found == ["processes_per_host is 2 but distribution.allreduce.processes_per_host is 3; give one"]


def test_yaml_paths_are_relative_to_the_file(code, tmp_path_factory):
    spec_file = code / "job.yaml"
    spec_file.write_text("entry_point: train.py\ninputs:\n  training: data\ninstance_count: 2\n")
    spec = load_spec(spec_file)
    assert spec.source_dir == str(code) and spec.inputs[0].uri == str(code / "data")
    assert spec.job_name.startswith("train-")
    spec_file.write_text("entry_point: [oops\n")
    with pytest.raises(SpecError, match="not valid YAML"):
        load_spec(spec_file)


def test_estimator_validates_before_fit(code, monkeypatch):
    monkeypatch.chdir(code)
    with pytest.raises(SpecError) as info:
        Estimator(entry_point="train.py", instance_count=0, hyperparams={"a": 1}, home=str(code / "home"))
    assert info.value.problems == [
        "unknown field 'hyperparams'; did you mean 'hyperparameters'?",
        "instance_count must be >= 1, got 0",
    ]


def test_public_names_are_pinned_and_import_is_light():
    import subprocess
    import sys

    import hora.jobs

    assert sorted(hora.jobs.__all__) == [
        "CategoricalParameter", "ChannelSpec", "ContinuousParameter", "Estimator", "HyperbandStrategyConfig",
        "HyperparameterTuner", "HyperparameterTuningJobAnalytics", "IntegerParameter", "JobRecord", "JobSpec",
        "JobStore", "MXNet", "MetricDefinition", "PyTorch", "SpecError", "StrategyConfig", "TensorBoardOutputConfig",
        "TensorFlow", "TrainingJob", "TuningJobCompletionCriteriaConfig", "UnexpectedStatusException", "WarmStartConfig",
        "WarmStartTypes",
        "load_spec", "parse_spec", "start_job", "stop_job", "wait_job",
    ]
    assert all(hasattr(hora.jobs, n) for n in hora.jobs.__all__)
    out = subprocess.run(
        [sys.executable, "-c", "import hora.cli, hora.jobs, sys; "
         "print(sorted(m for m in ('yaml', 'matplotlib', 'torch', 'boto3', 'tensorboard', 'mlflow', 'optuna', "
         "'pandas') if m in sys.modules))"],
        capture_output=True, text=True, timeout=120, check=True,
    ).stdout
    assert out.strip() == "[]"


def test_values_no_process_can_be_given_are_spec_errors(code):
    """Issue 19, item 6: they used to pass validation and then fail at start, blamed on the script."""
    found = problems({"entry_point": "train.py", "hyperparameters": {
        "a=b": 1, "nul": "x\0y", "big": "v" * 700_000,
    }, "environment": {"BAD\0NAME": "1", "HUGE": "v" * 200_000, "NUL": "a\0b"}}, code)
    text = "\n".join(found)
    assert "hyperparameter name 'a=b' cannot be passed to a process" in text
    assert "hyperparameter 'nul' holds a NUL byte" in text
    assert "hyperparameters take 7000" in text and "Linux passes at most 128 KiB in one" in text
    assert "environment variable name 'BAD\\x00NAME' is not valid" in text
    assert "environment variable HUGE cannot be passed to a process" in text
    assert "environment variable NUL cannot be passed to a process" in text


def test_an_absurd_process_count_is_refused_unless_allowed(code, monkeypatch):
    """Issue 27, item 4: processes_per_host 4096 started thousands of processes on a 2-core machine."""
    monkeypatch.delenv("HORA_OVERSUBSCRIBE", raising=False)
    monkeypatch.setattr("hora.runner.limits.usable_cpus", lambda: 2)
    [problem] = problems({"entry_point": "train.py", "processes_per_host": 4096}, code)
    assert problem.startswith("instance_count 1 x processes_per_host 4096: the job would start 4096 processes")
    assert "more than 16 per CPU (32 here)" in problem and "HORA_OVERSUBSCRIBE=1" in problem
    [problem] = problems({"entry_point": "train.py", "instance_count": 3, "processes_per_host": 11}, code)
    assert "would start 33 processes" in problem
    assert parse_spec({"entry_point": "train.py", "instance_count": 2, "processes_per_host": 16}, base_dir=code)
    allowed = {"entry_point": "train.py", "processes_per_host": 4096, "environment": {"HORA_OVERSUBSCRIBE": "1"}}
    assert parse_spec(allowed, base_dir=code).processes_per_host == 4096
    flagged = {"entry_point": "train.py", "processes_per_host": 64,
               "distribution": {"mpi": {"enabled": True, "custom_mpi_options": "--oversubscribe"}}}  # fmt: skip
    assert parse_spec(flagged, base_dir=code).processes_per_host == 64
    monkeypatch.setenv("HORA_OVERSUBSCRIBE", "1")  # the supervisor's environment
    assert parse_spec({"entry_point": "train.py", "processes_per_host": 64}, base_dir=code).processes_per_host == 64


def test_a_spec_files_code_paths_stay_in_its_tree_unless_absolute(tmp_path):
    """Issue 27, item 11: ``entry_point: ../../../etc/passwd`` copied /etc (shadow included) into the job."""
    from hora.jobs import load_spec

    spec_dir = tmp_path / "specs"
    (spec_dir / "code").mkdir(parents=True)
    (spec_dir / "code" / "train.py").write_text("print(1)\n")
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "train.py").write_text("print(2)\n")

    def load(text: str):
        (spec_dir / "job.yaml").write_text(text)
        return load_spec(spec_dir / "job.yaml")

    with pytest.raises(SpecError, match=r"entry_point '\.\./\.\./\.\./\.\./\.\./etc/passwd' resolves to /etc/passwd, "
                                        r"outside the spec's directory"):
        load("entry_point: ../../../../../etc/passwd\n")
    with pytest.raises(SpecError, match=r"source_dir '\.\./elsewhere' resolves to .*, outside the spec's directory"):
        load("entry_point: train.py\nsource_dir: ../elsewhere\n")
    with pytest.raises(SpecError, match=r"entry_point '\.\./\.\./elsewhere/train.py' leaves source_dir"):
        load("entry_point: ../../elsewhere/train.py\nsource_dir: code\n")
    assert load("entry_point: code/train.py\n").source_dir == str(spec_dir / "code")
    deliberate = load(f"entry_point: train.py\nsource_dir: {tmp_path / 'elsewhere'}\n")  # absolute: meant
    assert deliberate.source_dir == str(tmp_path / "elsewhere")


def test_a_channel_that_is_a_symlink_loop_is_a_spec_problem_not_a_traceback(code):
    """Issue 27, item 11: a symlink loop raised a raw RuntimeError (exit 1) instead of a spec error (exit 2)."""
    (code / "loop").symlink_to(code / "loop")
    [problem] = problems({"entry_point": "train.py", "inputs": {"train": "loop"}}, code)
    assert problem == f"channel 'train': the path 'loop' is a symlink loop or a broken symlink (looked at {code / 'loop'})"
