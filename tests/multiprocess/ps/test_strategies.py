"""One line switches strategy: Keras ``fit`` on parameter servers (by the job's setting, no code change, and by
argument), the torch hybrid mode (sparse embeddings on the servers, dense layers on allreduce), and the errors."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest

from support.harness import run_ranks


def _need(*modules: str) -> None:
    """Skip without importing (TensorFlow's threads would outlive the test in this process)."""
    for m in modules:
        if importlib.util.find_spec(m) is None:
            pytest.skip(f"{m} is not installed")


def test_keras_fit_on_parameter_servers_by_the_jobs_setting_matches_plain_keras():
    _need("keras", "sklearn")
    from workers.ps_strategies import keras_ps_worker

    steps = 4
    results = run_ranks(keras_ps_worker, 2, steps, timeout=300, num_ps=2, strategy="parameter_server",
                        ps_consistency="sync")  # fmt: skip
    for r in results:
        assert r["class"] == "SGD" and r["config_equal"] and r["iterations"] == steps, r
        assert r["explicit_allreduce"], "strategy='allreduce' must win over HORA_STRATEGY"
        assert r["adam_finite"] and r["adam_names"], r
        assert r["adam_staleness"] <= 1, r["adam_staleness"]
    for a, b in zip(results[0]["weights"], results[1]["weights"]):
        np.testing.assert_array_equal(a, b)  # sync: every worker pulls the same values
    for got, ref in zip(results[0]["weights"], results[0]["reference"]):
        # Keras' momentum (velocity) form vs the servers' PyTorch form: the same update, rounded differently
        np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-6)
    # hybrid: only the Embedding table on the servers; ranks equal; close to plain Keras (Adagrad's epsilon placement)
    r0 = results[0]
    assert r0["hybrid_on_servers"] == ["keras/sequential_2/embedding/embeddings"], r0["hybrid_on_servers"]
    for r in results:
        assert r["hybrid_server_equal"], "the local table must equal the servers' after sync steps"
        for a, b in zip(r["hybrid"], r0["hybrid"]):
            np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(r0["hybrid"][0][40:], r0["hybrid_start"][0][40:])  # rows nobody touched
    assert not np.array_equal(r0["hybrid"][0][:40], r0["hybrid_start"][0][:40])
    for got, ref in zip(r0["hybrid"], r0["hybrid_reference"]):
        np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-6)
    # what the servers cannot do is refused when the optimizer is wrapped, naming what to change
    errors = r0["errors"]
    assert errors["keras_rmsprop"].startswith("UnsupportedError: strategy='parameter_server' runs the update on the "
                                              "servers, which know SGD (momentum, Nesterov), Adagrad and Adam; "
                                              "RMSprop is not one of them"), errors  # fmt: skip
    assert errors["keras_schedule"].startswith("UnsupportedError: SGD has a learning-rate schedule"), errors
    assert errors["keras_clipnorm"].startswith(
        "UnsupportedError: Adam(clipnorm=1.0) has no parameter-server rule"
    ), errors
    assert errors["keras_hybrid_dense_model"].startswith(
        "ValueError: ps_parameters: dense_only has no keras.layers.Embedding"
    ), errors
    # adapters without a parameter-server form refuse the job's setting instead of silently allreducing
    for key, what in [
        ("tape_by_setting", "hora.tensorflow.DistributedGradientTape"),
        ("tf1_by_setting", "hora.tensorflow.DistributedOptimizer"),
        ("jax_by_setting", "hora.jax.DistributedOptimizer"),
    ]:
        assert errors[key].startswith(
            f"UnsupportedError: {what} does not support HORA_STRATEGY=parameter_server (hora run --strategy "
            "parameter_server): it implements 'allreduce'; "
        ), errors[key]


def test_torch_hybrid_embedding_on_servers_dense_on_allreduce():
    _need("torch")
    from workers.ps_strategies import EMB_ROWS, torch_hybrid_reference, torch_hybrid_worker

    steps, workers = 3, 2
    keras_steps = 3 if importlib.util.find_spec("keras") and importlib.util.find_spec("sklearn") else 0
    results = run_ranks(torch_hybrid_worker, workers, steps, keras_steps, timeout=180, num_ps=2,
                        env={"KERAS_BACKEND": "torch"})  # fmt: skip
    ref = torch_hybrid_reference(steps, workers)
    r0 = results[0]
    # the table spans both servers
    assert [s for _, _, s in r0["placement"]] in ([0, 1], [1, 0]), r0["placement"]
    assert r0["fc_on_servers"] == [], "the dense layer must stay on allreduce"
    assert r0["bounded_error"].startswith("ConfigError: strategy='hybrid' with consistency bounded(1)"), r0
    for r in results:
        assert r["server_equal"], "the local table must equal the servers' after sync steps"
        np.testing.assert_array_equal(r["start"], ref["start"])  # every worker started from worker 0's table
        np.testing.assert_array_equal(r["emb"], r0["emb"])
        for a, b in zip(r["fc"], r0["fc"]):
            np.testing.assert_array_equal(a, b)  # allreduce: bitwise equal on every rank
    untouched = np.r_[1000:2048, 3000:EMB_ROWS]
    np.testing.assert_array_equal(r0["emb"][untouched], ref["start"][untouched])  # rows nobody touched
    assert not np.array_equal(r0["emb"][:1000], ref["start"][:1000])
    np.testing.assert_allclose(r0["emb"], ref["emb"], rtol=1e-5, atol=1e-6)
    for got, want in zip(r0["fc"], ref["fc"]):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    # async: every push applied on arrival; after the last step's pull every worker holds the servers' table
    a0 = r0["async"]
    for r in results:
        np.testing.assert_array_equal(r["async"]["emb"], r["async"]["server"])
        np.testing.assert_array_equal(r["async"]["emb"], a0["emb"])
        np.testing.assert_array_equal(r["async"]["start"], a0["start"])  # worker 0's table, from the servers
        for a, b in zip(r["async"]["fc"], a0["fc"]):
            np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(a0["emb"][untouched], a0["start"][untouched])
    touched = np.r_[0:1000, 2048:3000]
    changed = (a0["emb"][touched] != a0["start"][touched]).any(axis=1)
    assert changed.sum() >= 20, changed.sum()  # the rows of the batches moved
    # Keras on the torch backend, strategy="parameter_server": the servers' Nesterov vs Keras' own
    if keras_steps:
        assert r0["keras"]["backend"] == "torch"
        for a, b in zip(r0["keras"]["weights"], results[1]["keras"]["weights"]):
            np.testing.assert_array_equal(a, b)
        for got, want in zip(r0["keras"]["weights"], r0["keras"]["reference"]):
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_without_servers_or_with_an_unsupported_optimizer_the_torch_wrappers_say_what_to_change():
    _need("torch")
    from workers.ps_strategies import no_servers_worker

    (notes,) = run_ranks(no_servers_worker, 1, timeout=120)
    no_servers = "ConfigError: this job has no parameter servers: start it with 'hora run -np N --num-ps S"
    assert notes["torch_hybrid"].startswith(no_servers), notes
    assert notes["torch_ps"].startswith(no_servers), notes
    assert notes["torch_hybrid_dense_model"].startswith(
        "ValueError: ps_parameters: the Linear has no nn.Embedding"
    ), notes
    assert notes["torch_rmsprop"].startswith("UnsupportedError: strategy='parameter_server' runs the update on the "
                                             "servers, which know SGD (momentum, Nesterov), Adagrad, Adam and "
                                             "SparseAdam; RMSprop is not one of them"), notes  # fmt: skip
