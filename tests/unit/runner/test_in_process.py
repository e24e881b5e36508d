"""hora.runner.in_process: placing ranks that Ray or Spark started, and running a function as one of them."""

from __future__ import annotations

import os

import pytest

import hora
from hora.runner.hosts import RankSlot
from hora.runner.in_process import JobRendezvous, place, rank_env, run_as_rank, traceback_text


def test_place_follows_hora_topology_for_any_order_of_hosts():
    assert place(["a", "a", "b", "b"]) == [
        RankSlot(0, "a", 0, 2, 0, 2), RankSlot(1, "a", 1, 2, 0, 2), RankSlot(2, "b", 0, 2, 1, 2), RankSlot(3, "b", 1, 2, 1, 2),
    ]  # fmt: skip
    # interleaved (Spark's tasks land where the executors are) and uneven: cross counts hosts with that local rank
    assert place(["a", "b", "a"]) == [RankSlot(0, "a", 0, 2, 0, 2), RankSlot(1, "b", 0, 1, 1, 2), RankSlot(2, "a", 1, 2, 0, 1)]
    assert place(["x"]) == [RankSlot(0, "x", 0, 1, 0, 1)]


def test_rank_env_is_the_hora_run_contract_plus_extra():
    slot = place(["a", "a"])[1]
    env = rank_env(slot, 2, ("127.0.0.1", 1234), b"k" * 32, "job", ("127.0.0.1", 99), None, {"MINE": "1"},
                   {"transport": "tcp"})  # fmt: skip
    assert env["HORA_RANK"] == env["RANK"] == env["HOROVOD_RANK"] == "1"
    assert (env["HORA_LOCAL_RANK"], env["HORA_LOCAL_SIZE"], env["HORA_HOSTNAME"]) == ("1", "2", "a")
    assert env["HORA_SECRET"] == (b"k" * 32).hex() and env["HORA_JOB_ID"] == "job"
    assert env["MINE"] == "1" and env["HORA_TRANSPORT"] == "tcp"
    assert "HORA_BIND_ADDR" not in env


def test_run_as_rank_puts_the_environment_back_and_shuts_hora_down(monkeypatch):
    monkeypatch.setenv("OMPI_COMM_WORLD_RANK", "3")  # another launcher's variable would win over hora's: removed
    monkeypatch.delenv("HORA_RANK", raising=False)
    rdv = JobRendezvous()
    addr = rdv.start()
    try:
        env = rank_env(place(["localhost"])[0], 1, addr, rdv.secret, rdv.job_id, ("127.0.0.1", 1))

        def fn(x):
            hora.init()
            return x, os.environ.get("OMPI_COMM_WORLD_RANK"), os.environ["HORA_RANK"]

        assert run_as_rank(env, fn, (7,)) == (7, None, "0")
    finally:
        rdv.shutdown()
    assert not hora.is_initialized()
    assert os.environ["OMPI_COMM_WORLD_RANK"] == "3" and "HORA_RANK" not in os.environ


def test_traceback_text_starts_at_the_users_function():
    def user_fn():
        raise KeyError("missing")

    with pytest.raises(KeyError) as info:
        run_as_rank({}, user_fn)
    text = traceback_text(info.value)
    assert "in user_fn" in text and "run_as_rank" not in text
