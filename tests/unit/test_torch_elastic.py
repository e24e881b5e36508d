"""hora.torch.elastic's state classes on one rank in this process, as Horovod's test/single/test_torch_elastic.py
checks them: TorchState's commit, restore and sync of models, optimizers, samplers and plain objects, and
ElasticSampler's repartition of the unprocessed samples after a reset."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import hora.torch as hvd  # noqa: E402
from hora.torch.elastic import sampler as sampler_module  # noqa: E402


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
