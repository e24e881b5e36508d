"""The coordinator's negotiation (pure logic) and the control-message wire format."""

from __future__ import annotations

import json

import pytest

from hora._dtypes import ReduceOp
from hora._engine.messages import Kind, Request, Response, decode, encode
from hora._engine.negotiation import Coordinator, format_ranks


def ar(name: str = "g", **kw) -> Request:
    return Request(Kind.ALLREDUCE, name, **{"dtype": "float32", "shape": (4, 3), **kw})


def submit_all(coord: Coordinator, per_rank: dict[int, Request]) -> list[Response]:
    for rank, req in per_rank.items():
        coord.submit(rank, [req])
    return coord.take()


def only_error(responses: list[Response]) -> str:
    assert len(responses) == 1
    assert responses[0].error is not None
    return responses[0].error


def test_format_ranks():
    assert format_ranks([3]) == "rank 3"
    assert format_ranks([2, 0, 1]) == "ranks 0, 1, 2"


# -- matching -----------------------------------------------------------------------------------------------------
def test_response_only_when_every_rank_submitted():
    coord = Coordinator(3)
    coord.submit(0, [ar()])
    coord.submit(2, [ar()])
    assert coord.take() == []
    assert coord.pending()["g"][1] == [0, 2]
    coord.submit(1, [ar()])
    [resp] = coord.take()
    assert resp.error is None
    assert resp.request == ar()
    assert resp.joined == []
    assert coord.pending() == {}
    assert coord.take() == []


def test_single_rank_completes_immediately():
    coord = Coordinator(1)
    coord.submit(0, [ar("a"), ar("b")])
    assert [r.request.name for r in coord.take()] == ["a", "b"]


def test_different_submission_orders_give_one_response_per_name():
    coord = Coordinator(3)
    names = {0: ["a", "b", "c", "d"], 1: ["d", "c", "b", "a"], 2: ["b", "d", "a", "c"]}
    for rank, order in names.items():
        coord.submit(rank, [ar(n) for n in order])
    responses = coord.take()
    assert sorted(r.request.name for r in responses) == ["a", "b", "c", "d"]
    assert all(r.error is None for r in responses)
    assert coord.pending() == {}
    # the last rank to submit decides the order: completion follows its submission order
    assert [r.request.name for r in responses] == ["b", "d", "a", "c"]


def test_interleaved_batches_from_ranks():
    coord = Coordinator(2)
    coord.submit(0, [ar("a")])
    coord.submit(1, [ar("b")])
    assert coord.take() == []
    coord.submit(1, [ar("a")])
    coord.submit(0, [ar("b")])
    assert [r.request.name for r in coord.take()] == ["a", "b"]


def test_name_can_be_reused_after_completion():
    coord = Coordinator(2)
    submit_all(coord, {0: ar(), 1: ar()})
    responses = submit_all(coord, {0: ar(), 1: ar()})
    assert len(responses) == 1 and responses[0].error is None


def test_pending_reports_waiting_ranks():
    coord = Coordinator(4)
    coord.submit(3, [ar("x")])
    coord.submit(1, [ar("x")])
    seconds, ranks = coord.pending()["x"]
    assert ranks == [1, 3]
    assert seconds >= 0


# -- mismatches ---------------------------------------------------------------------------------------------------
def test_shape_mismatch_message():
    coord = Coordinator(3)
    error = only_error(submit_all(coord, {0: ar(shape=(4, 3)), 1: ar(shape=(4, 2)), 2: ar(shape=(4, 3))}))
    assert (
        error
        == "allreduce 'g' has shape (4, 3) on ranks 0, 2 but (4, 2) on rank 1; all ranks must submit the same shape."
    )


def test_mismatch_response_kind_and_request():
    coord = Coordinator(2)
    [resp] = submit_all(coord, {0: ar(shape=(4, 3)), 1: ar(shape=(4, 2))})
    assert resp.error_kind == "mismatch"
    assert resp.request.name == "g"
    assert coord.pending() == {}


def test_shape_mismatch_one_dimensional_and_three_groups():
    coord = Coordinator(3)
    error = only_error(submit_all(coord, {0: ar(shape=(5,)), 1: ar(shape=(6,)), 2: ar(shape=())}))
    assert error == (
        "allreduce 'g' has shape (5,) on rank 0 but (6,) on rank 1 and () on rank 2; "
        "all ranks must submit the same shape."
    )


def test_grouped_request_sizes_mismatch_names_the_sizes_before_the_total_shape():
    """A grouped allreduce travels as one request (its tensors' sizes in ``splits``): equal totals with other
    sizes, or a grouped request against a plain one, are mismatches that name the sizes."""
    coord = Coordinator(3)
    per_rank = {0: ar("g.0", shape=(5,), splits=(2, 3)), 1: ar("g.0", shape=(5,), splits=(3, 2)),
                2: ar("g.0", shape=(5,), splits=(2, 3))}  # fmt: skip
    error = only_error(submit_all(coord, per_rank))
    assert error == (
        "allreduce 'g.0' has grouped tensor sizes (elements per tensor) [2, 3] on ranks 0, 2 but [3, 2] on rank 1; "
        "all ranks must submit the same grouped tensor sizes."
    )
    error = only_error(submit_all(Coordinator(2), {0: ar("g.0", shape=(5,), splits=(2, 3)), 1: ar("g.0", shape=(2,))}))
    assert "[2, 3] on rank 0 but none (not a grouped call) on rank 1" in error
    assert submit_all(Coordinator(2), {r: ar("g.0", shape=(5,), splits=(2, 3)) for r in range(2)})[0].error is None


def test_dtype_mismatch_message():
    coord = Coordinator(2)
    error = only_error(submit_all(coord, {0: ar(dtype="float32"), 1: ar(dtype="float64")}))
    assert (
        error
        == "allreduce 'g' has dtype float32 on rank 0 but float64 on rank 1; all ranks must submit the same dtype."
    )


def test_dtype_is_checked_before_shape():
    coord = Coordinator(2)
    error = only_error(submit_all(coord, {0: ar(dtype="int8", shape=(1,)), 1: ar(dtype="int16", shape=(2,))}))
    assert error.startswith("allreduce 'g' has dtype int8 on rank 0 but int16 on rank 1")


def test_op_mismatch_message():
    coord = Coordinator(2)
    error = only_error(submit_all(coord, {0: ar(op=ReduceOp.SUM), 1: ar(op=ReduceOp.AVERAGE)}))
    assert (
        error
        == "allreduce 'g' has op Sum on rank 0 but Average on rank 1; all ranks must submit the same op."
    )


def test_unknown_op_is_shown_as_a_number():
    coord = Coordinator(2)
    error = only_error(submit_all(coord, {0: ar(op=ReduceOp.MAX), 1: ar(op=42)}))
    assert error == "allreduce 'g' has op Max on rank 0 but 42 on rank 1; all ranks must submit the same op."


def test_prescale_mismatch_message():
    coord = Coordinator(2)
    error = only_error(submit_all(coord, {0: ar(prescale=1.0), 1: ar(prescale=0.5)}))
    assert error == (
        "allreduce 'g' has prescale_factor 1.0 on rank 0 but 0.5 on rank 1; "
        "all ranks must submit the same prescale_factor."
    )


def test_postscale_mismatch_message():
    coord = Coordinator(3)
    error = only_error(submit_all(coord, {0: ar(postscale=2.0), 1: ar(postscale=2.0), 2: ar(postscale=0.25)}))
    assert error == (
        "allreduce 'g' has postscale_factor 2.0 on ranks 0, 1 but 0.25 on rank 2; "
        "all ranks must submit the same postscale_factor."
    )


def test_reducescatter_checks_like_allreduce():
    coord = Coordinator(2)
    reqs = {
        r: Request(Kind.REDUCESCATTER, "rs", "float32", (8,), ReduceOp.SUM if r == 0 else ReduceOp.MIN)
        for r in (0, 1)
    }
    error = only_error(submit_all(coord, reqs))
    assert (
        error
        == "reducescatter 'rs' has op Sum on rank 0 but Min on rank 1; all ranks must submit the same op."
    )


def test_root_mismatch_message():
    coord = Coordinator(2)
    reqs = {r: Request(Kind.BROADCAST, "w", "float32", (3,), root=r) for r in (0, 1)}
    error = only_error(submit_all(coord, reqs))
    assert (
        error
        == "broadcast 'w' has root_rank 0 on rank 0 but 1 on rank 1; all ranks must submit the same root_rank."
    )


def test_broadcast_shape_mismatch_message():
    coord = Coordinator(2)
    reqs = {r: Request(Kind.BROADCAST, "w", "float32", (3 + r,), root=0) for r in (0, 1)}
    error = only_error(submit_all(coord, reqs))
    assert (
        error
        == "broadcast 'w' has shape (3,) on rank 0 but (4,) on rank 1; all ranks must submit the same shape."
    )


@pytest.mark.parametrize("root", [2, 5, -1])
def test_broadcast_root_out_of_range(root):
    coord = Coordinator(2)
    reqs = {r: Request(Kind.BROADCAST, "w", "float32", (3,), root=root) for r in (0, 1)}
    error = only_error(submit_all(coord, reqs))
    assert error == f"broadcast 'w' has root_rank {root}, but there are only 2 ranks (0..1)."


def test_broadcast_ok():
    coord = Coordinator(2)
    [resp] = submit_all(coord, {r: Request(Kind.BROADCAST, "w", "float32", (3,), root=1) for r in (0, 1)})
    assert resp.error is None and resp.request.root == 1


def test_collective_kind_mismatch_message():
    coord = Coordinator(3)
    reqs = {0: ar(), 1: Request(Kind.BROADCAST, "g", "float32", (4, 3), root=0), 2: ar()}
    error = only_error(submit_all(coord, reqs))
    assert error == (
        "collective 'g' has operation allreduce on ranks 0, 2 but broadcast on rank 1; "
        "all ranks must submit the same operation."
    )


def test_allgather_allows_different_first_dimensions():
    coord = Coordinator(3)
    reqs = {r: Request(Kind.ALLGATHER, "x", "int64", (d, 3)) for r, d in {0: 2, 1: 5, 2: 0}.items()}
    [resp] = submit_all(coord, reqs)
    assert resp.error is None
    assert resp.first_dims == [2, 5, 0]


def test_allgather_scalar_counts_as_one_row():
    coord = Coordinator(2)
    [resp] = submit_all(
        coord, {0: Request(Kind.ALLGATHER, "x", "int64", ()), 1: Request(Kind.ALLGATHER, "x", "int64", (3,))}
    )
    assert resp.error is None
    assert resp.first_dims == [1, 3]


def test_allgather_trailing_dimension_mismatch_message():
    coord = Coordinator(2)
    reqs = {
        0: Request(Kind.ALLGATHER, "x", "int64", (2, 3)),
        1: Request(Kind.ALLGATHER, "x", "int64", (2, 4)),
    }
    error = only_error(submit_all(coord, reqs))
    assert error == (
        "allgather 'x' has trailing dimensions (all but the first) (3,) on rank 0 but (4,) on rank 1; "
        "all ranks must submit the same trailing dimensions."
    )


def test_allgather_ndim_mismatch_message():
    coord = Coordinator(2)
    reqs = {
        0: Request(Kind.ALLGATHER, "x", "int64", (2, 3)),
        1: Request(Kind.ALLGATHER, "x", "int64", (2, 3, 1)),
    }
    error = only_error(submit_all(coord, reqs))
    assert error == (
        "allgather 'x' has number of dimensions 2 on rank 0 but 3 on rank 1; "
        "all ranks must submit the same number of dimensions."
    )


def test_alltoall_collects_every_ranks_splits():
    coord = Coordinator(2)
    reqs = {
        0: Request(Kind.ALLTOALL, "t", "float32", (3, 2), splits=(1, 2)),
        1: Request(Kind.ALLTOALL, "t", "float32", (5, 2), splits=(4, 1)),
    }
    [resp] = submit_all(coord, reqs)
    assert resp.error is None
    assert resp.splits == [[1, 2], [4, 1]]


def test_alltoall_splits_count_message():
    coord = Coordinator(3)
    reqs = {
        0: Request(Kind.ALLTOALL, "t", "float32", (3,), splits=(1, 1, 1)),
        1: Request(Kind.ALLTOALL, "t", "float32", (3,), splits=(2, 1)),
        2: Request(Kind.ALLTOALL, "t", "float32", (3,), splits=(1, 1, 1, 0)),
    }
    error = only_error(submit_all(coord, reqs))
    assert (
        error == "alltoall 't' needs 3 splits per rank, one per destination; ranks 1, 2 gave another number."
    )


def test_barrier():
    coord = Coordinator(2)
    [resp] = submit_all(coord, {0: Request(Kind.BARRIER, "b"), 1: Request(Kind.BARRIER, "b")})
    assert resp.error is None


def test_duplicate_submission_is_an_error_and_the_first_stays_pending():
    coord = Coordinator(2)
    coord.submit(0, [ar(), ar()])
    [dup] = coord.take()
    assert dup.error_kind == "duplicate"
    assert dup.error == (
        "allreduce 'g' was submitted twice by rank 0 before it completed; "
        "names must be unique among pending collectives."
    )
    assert coord.pending()["g"][1] == [0]
    coord.submit(1, [ar()])
    [resp] = coord.take()
    assert resp.error is None


# -- join ---------------------------------------------------------------------------------------------------------
def test_joined_ranks_count_as_present_for_allreduce():
    coord = Coordinator(3)
    coord.submit(2, [Request(Kind.JOIN, "join")])
    assert coord.take() == []
    coord.submit(0, [ar()])
    assert coord.take() == []
    coord.submit(1, [ar()])
    [resp] = coord.take()
    assert resp.error is None
    assert resp.joined == [2]


def test_join_response_comes_after_pending_tensors():
    coord = Coordinator(3)
    coord.submit(0, [ar("a")])
    coord.submit(1, [ar("a"), ar("b")])
    coord.submit(0, [Request(Kind.JOIN, "join")])
    coord.submit(1, [Request(Kind.JOIN, "join")])
    assert coord.take() == []  # rank 2 has neither submitted nor joined
    coord.submit(2, [Request(Kind.JOIN, "join")])
    responses = coord.take()
    assert [r.request.kind for r in responses] == [Kind.ALLREDUCE, Kind.ALLREDUCE, Kind.JOIN]
    assert [r.request.name for r in responses] == ["a", "b", "join"]
    assert responses[0].joined == [2]
    assert responses[1].joined == [0, 2]
    assert all(r.error is None for r in responses)
    assert responses[2].last_joined == 2


def test_join_last_joined_is_the_last_rank_to_join():
    coord = Coordinator(3)
    for rank in (2, 0, 1):
        coord.submit(rank, [Request(Kind.JOIN, "join")])
    [resp] = coord.take()
    assert resp.request.kind is Kind.JOIN
    assert resp.last_joined == 1
    assert resp.error is None


def test_join_resets_after_everyone_joined():
    coord = Coordinator(2)
    for rank in (0, 1):
        coord.submit(rank, [Request(Kind.JOIN, "join")])
    assert len(coord.take()) == 1
    coord.submit(0, [ar()])
    assert coord.take() == []  # rank 1 is no longer joined: it must submit
    coord.submit(1, [ar()])
    [resp] = coord.take()
    assert resp.joined == []


def test_joining_twice_counts_once():
    coord = Coordinator(2)
    coord.submit(0, [Request(Kind.JOIN, "join")])
    coord.submit(0, [Request(Kind.JOIN, "join")])
    assert coord.take() == []


@pytest.mark.parametrize(
    "request_",
    [
        Request(Kind.BROADCAST, "w", "float32", (3,), root=0),
        Request(Kind.ALLGATHER, "w", "float32", (3,)),
        Request(Kind.ALLTOALL, "w", "float32", (3,), splits=(1, 1, 1)),
        Request(Kind.REDUCESCATTER, "w", "float32", (3,)),
        Request(Kind.BARRIER, "w"),
    ],
    ids=lambda r: r.kind.value,
)
def test_only_allreduce_runs_while_ranks_are_joined(request_):
    coord = Coordinator(3)
    coord.submit(1, [Request(Kind.JOIN, "join")])
    coord.submit(0, [request_])
    coord.submit(2, [request_])
    [resp] = coord.take()
    assert resp.error_kind == "join"
    assert resp.error == (
        f"{request_.kind.value} 'w' cannot run: rank 1 already called join(); "
        "while ranks are joined only allreduce can run."
    )


def test_collective_pending_when_a_rank_joins_fails_with_join_error():
    coord = Coordinator(2)
    coord.submit(0, [Request(Kind.BROADCAST, "w", "float32", (3,), root=0)])
    coord.submit(1, [Request(Kind.JOIN, "join")])
    [resp] = coord.take()
    assert resp.error_kind == "join"
    assert "rank 1 already called join()" in resp.error


# -- wire format --------------------------------------------------------------------------------------------------
def test_request_round_trip():
    req = Request(
        Kind.ALLTOALL, "layer.3/grad", "bfloat16", (4, 3, 2), ReduceOp.AVERAGE, 1, 0.5, 2.0, (1, 3), 7
    )
    wire = req.to_wire()
    assert Request.from_wire(json.loads(json.dumps(wire))) == req
    assert Request.from_wire(wire) == req


def test_request_round_trip_defaults():
    req = Request(Kind.BARRIER, "b")
    back = Request.from_wire(json.loads(json.dumps(req.to_wire())))
    assert back == req
    assert back.splits is None and back.shape == ()


def test_response_round_trip():
    resp = Response(
        ar("x", shape=(2,)),
        error="boom 'x'",
        error_kind="shutdown",
        first_dims=[2, 0],
        splits=[[1, 1], [0, 2]],
        joined=[1],
        last_joined=1,
    )
    back = Response.from_wire(json.loads(json.dumps(resp.to_wire())))
    assert back == resp


def test_encode_decode_round_trip():
    payload = [ar().to_wire(), Request(Kind.JOIN, "join").to_wire()]
    kind, back = decode(encode("req", payload))
    assert kind == "req"
    assert [Request.from_wire(w) for w in back] == [ar(), Request(Kind.JOIN, "join")]


def test_encode_is_json_not_pickle():
    frame = encode("bye", ["rank 1 shut down"])
    assert frame == b'["bye",["rank 1 shut down"]]'


@pytest.mark.parametrize(
    "frame",
    [
        b"",
        b"not json",
        b"\x80\x04\x95pickle",
        b"{}",
        b"[]",
        b'["req"]',
        b'["req", [], 1]',
        b"[1, []]",
        b'["req", {}]',
        b'["req", "x"]',
        b"\xff\xfe\xfd",
        b"null",
    ],
)
def test_decode_rejects_malformed_frames(frame):
    with pytest.raises(ValueError):
        decode(frame)
