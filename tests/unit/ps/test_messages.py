"""The typed parameter-server requests (hora.ps.messages): every control request survives its JSON wire form, a
server refuses a wrong field naming it (ValueError/KeyError: the worker gets a refusal, the connection stays) and an
unknown operation drops the connection (ProtocolError); the hot operations keep their wire codes."""

from __future__ import annotations

import json

import numpy as np
import pytest

from hora.errors import ConfigError, ProtocolError
from hora.ps.messages import (
    OPS,
    AttachSegment,
    Layout,
    LayoutReply,
    Load,
    Op,
    Piece,
    Poison,
    Register,
    Reply,
    Save,
    SavedShard,
    SaveReply,
    SegmentReply,
    ShardSource,
    Stats,
    StatsReply,
    VariableLayout,
    parse_control,
)
from hora.ps.protocol import REQUEST, pack_request
from hora.ps.rules import SGD, Adam, Momentum

LAYOUT = VariableLayout((10, 4), "<f4", (0, 5, 10), (1, 0), Adam(lr=0.01), "bounded", 2)
REQUESTS = [
    Register("w", 1, (5, 4), "<f4", Momentum(lr=0.1, nesterov=True), "sync", 0),
    Layout("w", LAYOUT),
    Poison("w", "worker 1 registered it differently"),
    AttachSegment("hora-ps-00ff", 1 << 20),
    AttachSegment("hora-ps-00ff", 1 << 20, pid=1234, token_at=0x7F0000003000),
    Stats(progress=True),
    Save("/ckpt"),
    Load("/ckpt", (ShardSource("w", 0, (Piece("w.shard0.npz", 0, 3, 0), Piece("w.shard1.npz", 0, 2, 3))),)),
]


@pytest.mark.parametrize("request_", REQUESTS, ids=lambda r: f"{r.op}")
def test_every_control_request_survives_its_json_wire_form(request_):
    wire = json.loads(json.dumps({**request_.header(), "nbytes": 0}))  # what crosses the socket
    assert wire["op"] == request_.op
    assert parse_control(wire, "worker 0") == request_


REPLIES = [
    (Register, Reply()),
    (Layout, LayoutReply()),
    (Layout, LayoutReply("register 'w': worker 1 registered it with dtype '<f8'", "w", (0, 1))),
    (AttachSegment, SegmentReply(single_copy=True)),
    (Stats, StatsReply({"server": 0, "bytes_in": 12, "staleness": {"w": 1}})),
    (Save, SaveReply((SavedShard("w", 0, "w.shard0.npz", 1),))),
]


@pytest.mark.parametrize(("kind", "reply"), REPLIES, ids=lambda x: getattr(x, "op", type(x).__name__))
def test_every_reply_survives_its_json_wire_form_as_its_requests_kind(kind, reply):
    wire = json.loads(json.dumps(reply.header()))
    assert wire["ok"] is True
    assert kind.reply.parse(wire) == reply


def test_a_register_carries_its_values_as_the_payload_and_announces_their_length():
    value = np.arange(20, dtype=np.float32).reshape(5, 4)
    request = Register("w", 0, value.shape, value.dtype.str, SGD(), "async", 0, value)
    assert request.payload() == (value,) and request.nbytes == value.nbytes
    parsed = Register.parse(request.header())
    assert parsed.value is None and parsed.nbytes == value.nbytes  # the server reads the payload itself


@pytest.mark.parametrize(
    ("change", "error", "words"),
    [
        ({"dtype": "<i4"}, ValueError, "dtype '<i4' is not supported"),
        ({"shape": []}, ValueError, "must have at least one axis"),
        ({"shape": [3, -1]}, ValueError, "must have at least one axis"),
        ({"rule": {"rule": "rmsprop"}}, ConfigError, "unknown rule 'rmsprop'"),
        ({"rule": {"rule": "sgd", "lr": -1}}, ConfigError, "sgd.lr must be >= 0"),
        ({"consistency": "eventual"}, ValueError, "consistency 'eventual'/0 is not async"),
        ({"staleness": -1}, ValueError, "is not async, bounded"),
        ({"shard": "one"}, ValueError, "invalid literal"),
    ],
)
def test_a_wrong_field_is_refused_naming_it(change, error, words):
    header = {**Register("w", 0, (2,), "<f4", SGD(), "async", 0).header(), **change}
    with pytest.raises(error, match=words):
        parse_control(header, "worker 1")


def test_a_missing_field_or_an_unknown_operation():
    header = Layout("w", LAYOUT).header()
    del header["layout"]["servers"]
    with pytest.raises(KeyError, match="servers"):
        parse_control(header, "worker 1")
    for op in ("drop_table", None, ["stats"]):
        with pytest.raises(ProtocolError, match=r"worker 1 asked for unknown operation"):
            parse_control({"op": op}, "worker 1")


def test_layouts_that_differ_are_named_field_by_field():
    other = VariableLayout((10, 4), "<f8", (0, 5, 10), (1, 0), Adam(lr=0.02), "bounded", 2)
    assert LAYOUT.differences(other, "worker 0") == [
        "dtype '<f8' (worker 0: '<f4')",
        "rule {'rule': 'adam', 'lr': 0.02, 'beta1': 0.9, 'beta2': 0.999, 'epsilon': 1e-08} "
        "(worker 0: {'rule': 'adam', 'lr': 0.01, 'beta1': 0.9, 'beta2': 0.999, 'epsilon': 1e-08})",
    ]
    assert LAYOUT.differences(LAYOUT, "worker 0") == []


def test_the_hot_operations_keep_their_wire_codes():
    assert [(str(op), op.code, op.dense) for op in OPS] == [
        ("push", 1, True),
        ("pull", 2, True),
        ("push_pull", 3, True),
        ("push_rows", 4, False),
        ("pull_rows", 5, False),
    ]
    head = pack_request(Op.PUSH_ROWS, b"emb", 3, rows=7, nbytes=7 * 24)
    assert REQUEST.unpack(head[: REQUEST.size]) == (0xB1, 4, 3, 3, 7, 7 * 24, 0)
    assert head[REQUEST.size :] == b"emb"
