"""The elastic API's state and loop (hora._frontend.elastic, hora.torch.elastic) on one rank in this process, as
Horovod's test/single/test_torch_elastic.py checks them: commit, restore and sync of every kind of state; the loop's
restore-and-reset on a failed collective, its reset without a restore on a host update (and ``skip_sync``); what it
does outside an elastic job; the sampler's repartition of the unprocessed samples. The multi-rank scenarios (a rank
killed, a host added) need the elastic launcher: tests/multiprocess/elastic/."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import hora.torch as hvd  # noqa: E402
from hora._frontend.elastic import HostUpdateResult, notifications  # noqa: E402
from hora.errors import HostsUpdatedInterrupt, MismatchError, PeerLostError  # noqa: E402
from hora.torch.elastic import sampler as sampler_module  # noqa: E402


@pytest.fixture
def one_rank(monkeypatch):
    monkeypatch.setenv("HOROVOD_ELASTIC", "1")
    hvd.init()
    yield
    hvd.shutdown()


def _model():
    torch.manual_seed(0)
    return torch.nn.Linear(3, 2)


def test_torch_state_commits_restores_and_syncs_models_optimizers_samplers_and_objects(one_rank):
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    sampler = hvd.elastic.ElasticSampler(list(range(10)), shuffle=False)
    state = hvd.elastic.TorchState(model, opt, sampler=sampler, epoch=0, batch=3)
    committed = {k: v.clone() for k, v in model.state_dict().items()}
    model(torch.ones(4, 3)).sum().backward()
    opt.step()
    state.epoch, state.batch = 1, 7
    sampler.record_batch(0, 2)
    state.restore()
    assert all(torch.equal(model.state_dict()[k], v) for k, v in committed.items())
    assert opt.state_dict()["state"] == {} and (state.epoch, state.batch) == (0, 3)
    assert sampler.processed_num == 0
    # a commit keeps what was done
    model(torch.ones(4, 3)).sum().backward()
    opt.step()
    state.epoch = 2
    state.commit()
    stepped = {k: v.clone() for k, v in model.state_dict().items()}
    state.epoch = 5
    state.restore()
    assert state.epoch == 2 and all(torch.equal(model.state_dict()[k], v) for k, v in stepped.items())
    assert "momentum_buffer" in opt.state_dict()["state"][0]
    state.sync()  # one rank: its own state, unchanged
    assert state.epoch == 2


def test_assigning_a_handled_attribute_replaces_what_is_kept(one_rank):
    state = hvd.elastic.TorchState(_model(), None)
    other = torch.nn.Linear(3, 2)
    state.model = other
    assert state.model is other and state._handlers["model"].value is other


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


def test_the_sampler_repartitions_only_the_unprocessed_samples(one_rank, monkeypatch):
    data = list(range(10))
    at = {"rank": 0, "size": 2}
    monkeypatch.setattr(sampler_module, "rank", lambda: at["rank"])
    monkeypatch.setattr(sampler_module, "size", lambda: at["size"])
    s = hvd.elastic.ElasticSampler(data, shuffle=False)
    assert list(s) == [0, 2, 4, 6, 8] and len(s) == 5
    s.record_batch(0, 2)  # two samples on each of two ranks
    assert s.state_dict() == {"epoch": 0, "processed_num": 4}
    at.update(rank=1, size=3)  # a reset: rank 1 of 3
    s.load_state_dict(s.state_dict())
    assert s.remaining_indices == [4, 5, 6, 7, 8, 9] and list(s) == [5, 8]
    s.set_epoch(1)
    assert s.processed_num == 0 and len(s.remaining_indices) == 10
    shuffled = hvd.elastic.ElasticSampler(data, seed=3)
    assert sorted(shuffled.remaining_indices) == data and shuffled.remaining_indices != data
