"""The elastic API's state and loop (hora._frontend.elastic; ``hvd.elastic`` of every adapter) on one rank in this
process, as Horovod's test/single/test_elastic*.py check them: the loop's restore-and-reset on a failed collective,
its reset without a restore on a host update (and ``skip_sync``), what it does outside an elastic job, and that a
mismatch is not retried. TorchState and ElasticSampler: test_torch_elastic.py. The multi-rank scenarios (a rank
killed, a host added) need the elastic launcher (issue 26)."""

from __future__ import annotations

import pytest

import hora
import hora.numpy as hvd
from hora._frontend.elastic import HostUpdateResult, notifications
from hora.errors import HostsUpdatedInterrupt, MismatchError, PeerLostError


def test_a_failed_collective_restores_the_last_commit_resets_and_runs_again(one_rank):
    state = hvd.elastic.ObjectState(hvd.broadcast_object, hvd.rank, step=0)
    resets = []
    state.register_reset_callbacks([lambda: resets.append(hvd.is_initialized())])
    calls = []

    @hvd.elastic.run
    def train(state, fail_at):
        calls.append(state.step)
        while state.step < 5:
            state.step += 1
            if state.step == 2:
                state.commit()
            if state.step == fail_at and len(calls) == 1:
                raise PeerLostError("rank 1 died")
        return state.step

    assert train(state, 4) == 5
    assert calls == [0, 2]  # the second run starts from the commit at step 2, not from step 4
    assert resets == [True]  # after the reset, hora is up again


def test_a_host_update_interrupts_at_the_next_commit_and_resets_without_a_restore(one_rank):
    state = hvd.elastic.ObjectState(hvd.broadcast_object, hvd.rank, step=0)
    synced = []
    sync = state.sync
    state.sync = lambda: (synced.append(state.step), sync())  # type: ignore[method-assign]
    calls = []

    @hvd.elastic.run
    def train(state):
        calls.append(state.step)
        while state.step < 4:
            state.step += 1
            if state.step == 2 and len(calls) == 1:
                notifications.handle_hosts_updated(10, HostUpdateResult.removed)
            state.commit()
        return state.step

    assert train(state) == 4
    assert calls == [0, 2]  # no restore: it goes on from where the interrupt came
    assert synced == [0]  # only hosts were removed: skip_sync, no second sync


def test_added_hosts_sync_again_after_the_reset(one_rank):
    state = hvd.elastic.ObjectState(hvd.broadcast_object, hvd.rank, step=0)
    state.on_hosts_updated(5, HostUpdateResult.added)
    with pytest.raises(HostsUpdatedInterrupt) as info:
        state.check_host_updates()
    assert info.value.skip_sync is False
    state.on_hosts_updated(3, HostUpdateResult.removed)  # older than the last one seen: ignored
    state.check_host_updates()


def test_a_mismatch_is_a_bug_in_the_script_and_is_not_retried(one_rank):
    state = hvd.elastic.ObjectState(hvd.broadcast_object, hvd.rank, step=0)
    calls = []

    @hvd.elastic.run
    def train(state):
        calls.append(1)
        state.step = 9
        raise MismatchError("ranks disagree")

    with pytest.raises(MismatchError):
        train(state)
    assert calls == [1] and state.step == 9


def test_outside_an_elastic_job_a_failed_collective_is_raised_after_the_restore(monkeypatch):
    monkeypatch.delenv("HOROVOD_ELASTIC", raising=False)
    hvd.init()
    try:
        state = hvd.elastic.ObjectState(hvd.broadcast_object, hvd.rank, step=0)

        @hvd.elastic.run
        def train(state):
            state.step = 3
            raise PeerLostError("rank 1 died")

        with pytest.raises(PeerLostError, match=r"rank 1 died .*was not started elastic.*--min-np") as info:
            train(state)
        assert isinstance(info.value, hvd.HorovodInternalError)
        assert state.step == 0
    finally:
        hvd.shutdown()


def test_every_adapter_without_a_state_class_of_its_own_shares_hora_elastic():
    assert hvd.elastic is hora.elastic
    assert hora.elastic.__all__ == ["ObjectState", "State", "run"]
