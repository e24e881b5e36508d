"""hora._frontend.gradients: the one description of a gradient reduction every DistributedOptimizer, Trainer and
Tape consumes (op, predivide factors, groups, strategy), checked in one place."""

from __future__ import annotations

import warnings

import pytest

from hora._dtypes import ReduceOp
from hora._frontend.gradients import describe_gradients, split_list
from hora._frontend.process_set import ProcessSet
from hora._strategy import STRATEGIES
from hora.errors import UnsupportedError


def test_predivide_is_horovods_average_split_around_the_sum():
    r = describe_gradients("opt", gradient_predivide_factor=4.0)
    assert (r.op, r.prescale, r.postscale, r.predivide) == (ReduceOp.AVERAGE, 0.25, 4.0, 4.0)
    plain = describe_gradients("opt", op=ReduceOp.SUM)
    assert (plain.op, plain.prescale, plain.postscale) == (ReduceOp.SUM, 1.0, 1.0)
    with pytest.raises(
        ValueError, match=r"opt: gradient_predivide_factor=2.0 needs op=Average .* got op=Sum"
    ):
        describe_gradients("opt", op=ReduceOp.SUM, gradient_predivide_factor=2.0)
    with pytest.raises(ValueError, match="gradient_predivide_factor must be > 0"):
        describe_gradients("opt", gradient_predivide_factor=0.0)


def test_adasum_is_one_unsupported_error_that_is_also_a_not_implemented_error():
    with pytest.raises(UnsupportedError, match="op=Adasum is not supported") as info:
        describe_gradients("opt", op=ReduceOp.ADASUM)
    assert isinstance(info.value, ValueError) and isinstance(info.value, NotImplementedError)


def test_adasum_refuses_average_aggregated_gradients_with_horovods_value_error():
    assert describe_gradients("opt", op=ReduceOp.ADASUM, adasum=True).op is ReduceOp.ADASUM
    for passes in (1, 2):  # Horovod checks the flag whatever backward_passes_per_step is
        with pytest.raises(ValueError, match=r"^Adasum does not support average_aggregated_gradients == True$") as info:
            describe_gradients(
                "opt", op=ReduceOp.ADASUM, adasum=True, backward_passes_per_step=passes,
                average_aggregated_gradients=True,
            )  # fmt: skip
        assert not isinstance(info.value, NotImplementedError)  # a plain ValueError, as Horovod's
    # an adapter without Adasum says so first; other ops keep average_aggregated_gradients
    with pytest.raises(UnsupportedError, match="op=Adasum is not supported"):
        describe_gradients("opt", op=ReduceOp.ADASUM, average_aggregated_gradients=True)
    assert describe_gradients("opt", op=ReduceOp.SUM, average_aggregated_gradients=True).average_aggregated_gradients
    added = ProcessSet([0])
    added.process_set_id = 1  # as add_process_set leaves it
    with pytest.raises(UnsupportedError, match="Adasum does not support non-global process sets yet"):
        describe_gradients("opt", op=ReduceOp.ADASUM, adasum=True, process_set=added)


def test_a_strategy_the_adapter_lacks_is_refused_with_what_to_use_instead():
    with pytest.raises(UnsupportedError) as info:
        describe_gradients(
            "hora.jax.DistributedOptimizer", strategy="parameter_server", instead="use X instead"
        )
    assert str(info.value) == (
        "hora.jax.DistributedOptimizer does not support strategy='parameter_server': it implements 'allreduce'; "
        "use X instead"
    )
    full = describe_gradients("opt", strategy="hybrid", strategies=STRATEGIES, ps_parameters=[1])
    assert full.strategy == "hybrid"
    assert describe_gradients("opt").strategy == "allreduce"  # not initialized: no HORA_STRATEGY to read
    with pytest.raises(ValueError, match="strategy must be one of 'allreduce', 'parameter_server', 'hybrid'"):
        describe_gradients("opt", strategy="ring")


def test_groups_int_split_like_horovods_split_list_and_explicit_groups_by_identity():
    assert split_list([1, 2, 3, 4, 5], 2) == [[1, 2, 3], [4, 5]]
    r = describe_gradients("opt", groups=2)
    assert r.partition(["a", "b", "c", "d", "e"]) == [["a", "b", "c"], ["d", "e"]]
    assert r.partition(["a"]) == [["a"]] and r.partition([]) == []
    assert describe_gradients("opt").partition([0, 1, 2]) == [[0, 1, 2]]  # no groups: one grouped op
    v = [object() for _ in range(4)]
    explicit = describe_gradients("opt", groups=[[v[2], v[0]], [v[3]]])
    # listed groups in the order given; a variable in no group is reduced on its own (Horovod)
    assert explicit.partition([10, 11, 12, 13], v) == [[12, 10], [13], [11]]
    with pytest.raises(ValueError, match="a variable appears in more than one of the groups"):
        describe_gradients("opt", groups=[[v[0]], [v[0]]])
    with pytest.raises(ValueError, match="groups should be a non-negative integer or a list of lists"):
        describe_gradients("opt", groups=-1)


def test_num_groups_is_the_deprecated_spelling_of_groups():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        r = describe_gradients("opt", num_groups=3)
    assert r.groups == 3 and caught[0].category is DeprecationWarning
    assert describe_gradients("opt", groups=0).groups is None


def test_other_arguments_are_checked_once():
    with pytest.raises(ValueError, match="backward_passes_per_step must be an int >= 1, got 0"):
        describe_gradients("opt", backward_passes_per_step=0)
    with pytest.raises(ValueError, match=r"ProcessSet\(.*\) has not been added"):
        describe_gradients("opt", process_set=ProcessSet([0]))


def test_buckets_fill_in_order_with_a_small_first_one():
    from hora._frontend.gradients import FIRST_BUCKET, buckets

    kib = 1024
    # 200 gradients of 16 KiB: the first bucket holds 1 MiB (64), the next 25 MiB worth (the other 136)
    assert [len(b) for b in buckets([16 * kib] * 200, 25 << 20)] == [FIRST_BUCKET // (16 * kib), 136]
    # a gradient larger than the cap is a bucket of its own; order is kept; the cap bounds the first bucket too
    assert buckets([10, 300, 10, 10], cap=100, first=50) == [[0], [1], [2, 3]]
    assert buckets([40, 40, 40], cap=50) == [[0], [1], [2]]
    assert buckets([], 100) == []
    # kinds (dtypes) never share a bucket, each kind with its own small first bucket: a bucket is one flat buffer
    assert buckets([10, 10, 10, 10, 10], cap=25, first=15, kinds="abaab") == [[0], [1], [2, 3], [4]]
    assert buckets([10, 10, 10], cap=100, kinds="aba") == [[0, 2], [1]]


def test_buckets_go_beside_the_backward_pass_only_where_a_core_or_an_accelerator_is_free_for_them():
    from hora._frontend.gradients import FIRST_BUCKET, beside_backward, first_bucket

    # a core left for each rank's engine thread beside its compute threads
    assert beside_backward(False, compute_threads=1, ranks_here=2, cpus=4)
    assert beside_backward(False, compute_threads=3, ranks_here=2, cpus=8)
    # the ranks' compute threads fill the cores (hora run's default)
    assert not beside_backward(False, compute_threads=1, ranks_here=2, cpus=2)
    assert not beside_backward(False, compute_threads=4, ranks_here=2, cpus=8)
    # gradients on an accelerator communicate beside the backward pass whatever the host's cores
    assert beside_backward(True, compute_threads=1, ranks_here=8, cpus=2)
    # beside it, DDP's small first bucket starts communication early; else the first is as large as the others
    cap = 25 << 20
    assert first_bucket(cap, beside=True) == FIRST_BUCKET
    assert first_bucket(cap, beside=False) == cap
    # the cap bounds the first bucket too
    assert first_bucket(512 << 10, beside=True) == 512 << 10
