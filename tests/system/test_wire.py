"""Tests for the wire codec: round trips, zero copy over real sockets, strict decoding, fuzzing."""

from __future__ import annotations

import multiprocessing
import os

import msgpack
import numpy as np
import pytest
import torch
import zmq

from api.namedarray import NamedArray, namedarray
from system.errors import WireError
from system.streams import transport, wire

TIMEOUT_MS = 5000


def roundtrip(body, *, copy=False):
    return wire.decode(wire.encode("test", body), copy=copy).body


def header(**fields) -> bytes:
    base = {"v": 1, "k": "test", "b": None}
    base.update(fields)
    return msgpack.packb({k: v for k, v in base.items() if v is not ...}, use_bin_type=True)


def assert_same_array(got, expected):
    assert isinstance(got, np.ndarray)
    assert got.dtype == expected.dtype
    assert got.shape == expected.shape
    np.testing.assert_array_equal(got, expected)


# ----------------------------------------------------------------------------------- round trips
def test_plain_values_round_trip():
    body = {
        "none": None,
        "flags": [True, False],
        "ints": [0, -1, 2**63 - 1, -(2**63), 2**64 - 1],
        "floats": [0.5, -1e300, float("inf")],
        "text": "héllo",
        "raw": b"\x00\xff",
        "nested": {"a": [{"b": [[], {}]}], "t": (1, "two", (3.0,))},
    }
    assert roundtrip(body) == body
    assert isinstance(roundtrip(body)["nested"]["t"], tuple)


def test_nan_round_trips():
    assert np.isnan(roundtrip({"x": float("nan")})["x"])


DTYPES = ["?", "i1", "u1", "<i2", ">u2", "i4", "<u4", "i8", "u8", "f2", "<f4", ">f4", "f8"]
DTYPES += ["c8", "c16", "S3", "U2"]
SHAPES = [(), (0,), (1,), (5,), (2, 3), (0, 4), (3, 0), (2, 1, 3), (1, 1, 1, 1)]


def _example(dtype: str, shape: tuple, rng: np.random.Generator) -> np.ndarray:
    dt = np.dtype(dtype)
    if dt.kind == "S":
        return np.asarray(rng.choice(np.array([b"", b"a", b"xyz"], dtype=dt), size=shape))
    if dt.kind == "U":
        return np.asarray(rng.choice(np.array(["", "é", "ok"], dtype=dt), size=shape))
    return np.asarray(rng.standard_normal(shape) * 10).astype(dt)


@pytest.mark.parametrize("dtype", DTYPES)
def test_arrays_of_every_dtype_and_shape_round_trip(dtype):
    rng = np.random.default_rng(0)
    arrays = {f"a{i}": _example(dtype, shape, rng) for i, shape in enumerate(SHAPES)}
    got = roundtrip(arrays)
    for name, expected in arrays.items():
        assert_same_array(got[name], expected)


def test_non_contiguous_arrays_are_sent_contiguous():
    base = np.arange(60, dtype=np.float32).reshape(3, 4, 5)
    views = [base[:, ::2], base.T, np.asfortranarray(base), base[..., 1], base[::-1]]
    got = roundtrip(views)
    for g, v in zip(got, views):
        assert_same_array(g, v)
        assert g.flags.c_contiguous


def test_numpy_scalars_keep_their_type():
    scalars = [np.float32(1.5), np.int64(-3), np.bool_(True), np.uint8(255), np.complex64(1j)]
    got = roundtrip(scalars)
    for g, s in zip(got, scalars):
        assert type(g) is type(s)
        assert g == s


def test_namedarray_nested_with_none_fields():
    @namedarray
    class State:
        hx: np.ndarray

    @namedarray
    class Step:
        obs: np.ndarray
        state: State | None = None
        extra: np.ndarray | None = None

    value = Step(obs=np.ones((4, 3), np.float32), state=State(hx=np.zeros((4, 8))))
    got = roundtrip({"step": value, "empty": NamedArray(a=None)})
    step = got["step"]
    assert type(step) is NamedArray  # generic: no class is looked up by a peer's word
    assert step.keys() == ["obs", "state", "extra"]
    assert step.extra is None
    assert type(step.state) is NamedArray
    assert_same_array(step.obs, value.obs)
    assert_same_array(step.state.hx, value.state.hx)
    assert got["empty"].keys() == ["a"]
    assert got["empty"].a is None


def test_torch_tensors_arrive_as_numpy():
    weight = torch.randn(3, 4, requires_grad=True)
    body = {"w": weight, "t": weight.detach().t(), "i": torch.arange(5), "s": torch.tensor(2.0)}
    got = roundtrip(body)
    assert_same_array(got["w"], weight.detach().numpy())
    assert_same_array(got["t"], weight.detach().numpy().T)
    assert_same_array(got["i"], np.arange(5, dtype=np.int64))
    assert_same_array(got["s"], np.array(2.0, np.float32))


def test_decoded_arrays_are_read_only_views_unless_copied():
    frames = wire.encode("test", {"x": np.arange(4.0)})
    view = wire.decode(frames).body["x"]
    assert not view.flags.writeable
    with pytest.raises(ValueError):
        view[0] = 1.0
    owned = wire.decode(frames, copy=True).body["x"]
    owned[0] = 10.0
    assert view[0] == 0.0


def test_small_arrays_travel_inside_the_header_within_a_budget():
    small = {"obs": np.ones((8, 4), np.float32), "done": np.zeros((8, 1), bool)}
    assert len(wire.encode("test", small)) == 1
    assert len(wire.encode("test", small, inline_budget=0)) == 3
    # Past the budget, arrays take frames again, so a header never swells with data.
    many = {f"a{i}": np.zeros(1024, np.float32) for i in range(10)}
    per_array = 4096
    frames = wire.encode("test", many)
    assert len(frames) == 1 + 10 - wire.INLINE_BUDGET_BYTES // per_array
    got = wire.decode(frames).body
    assert all(np.array_equal(got[k], many[k]) for k in many)


def test_large_arrays_are_encoded_without_a_copy():
    big = np.ones(1 << 20, np.float32)
    frames = wire.encode("test", {"big": big})
    assert len(frames) == 2
    assert np.shares_memory(frames[1], big)


# ------------------------------------------------------------------------------ encode refusals
@pytest.mark.parametrize(
    ("body", "message"),
    [
        (np.array([object()]), "cannot encode body: dtype object is not allowed on the wire"),
        (
            {"t": np.array(["2020"], "datetime64[D]")},
            r"cannot encode body\['t'\]: dtype datetime64",
        ),
        ({"x": [1, {2, 3}]}, r"cannot encode body\['x'\]\[1\]: values of type set cannot go"),
        ({1: "a"}, "cannot encode body: dict keys must be str, got 1"),
        ({"__nd__": 1}, "cannot encode body: dict key '__nd__' is reserved by the wire codec"),
        (2**64, "cannot encode body: integer 18446744073709551616 does not fit in 64 bits"),
        (torch.zeros(2, dtype=torch.bfloat16), "cannot encode body: tensor has no numpy"),
    ],
)
def test_encode_refuses_what_cannot_travel(body, message):
    with pytest.raises(WireError, match=message):
        wire.encode("test", body)


def test_encode_refuses_deep_and_cyclic_bodies():
    deep: list = []
    for _ in range(wire.MAX_DEPTH + 1):
        deep = [deep]
    with pytest.raises(WireError, match="nesting deeper than 32 levels"):
        wire.encode("test", deep)
    cyclic: dict = {}
    cyclic["self"] = cyclic
    with pytest.raises(WireError, match="nesting deeper than 32 levels"):
        wire.encode("test", cyclic)


def test_encode_needs_a_kind():
    with pytest.raises(WireError, match="message kind must be a non-empty str, got ''"):
        wire.encode("", {})


# ------------------------------------------------------------------------------- strict decoding
def _nd(index=1, dtype="<f4", shape=(2,)):
    return {"__nd__": index, "dtype": dtype, "shape": list(shape)}


STRICT_CASES = [
    ([], "empty message: no header frame"),
    ([b"\xc1"], "header is not valid msgpack"),
    ([header() + b"\x00"], "header is not valid msgpack"),
    ([msgpack.packb([1, 2])], "header is not a map but list"),
    ([header(v=...)], "header has no protocol version 'v'"),
    ([header(v=True)], "header has no protocol version 'v'"),
    ([header(v=2)], r"protocol version 2 is not supported \(this side speaks 1\)"),
    ([header(k=...)], "header has no message kind 'k'"),
    ([header(k=7)], "header has no message kind 'k'"),
    ([header(b=...)], "header has no body 'b'"),
    ([header(x=1)], r"header has unknown keys \['x'\]"),
    ([header(b=_nd(index=1))], "array refers to frame 1, message has 1 frames"),
    ([header(b=_nd()), b"\x00" * 7], r"frame 1 holds 7 bytes, dtype <f4 shape \(2,\) needs 8"),
    ([header(b=_nd(dtype="|O8")), b"\x00" * 16], "dtype '|O8' is not allowed on the wire"),
    ([header(b=_nd(dtype="|V8")), b"\x00" * 16], "dtype '|V8' is not allowed on the wire"),
    ([header(b=_nd(dtype="<M8[s]")), b"\x00" * 16], "dtype '<M8\\[s\\]' is not allowed"),
    ([header(b=_nd(dtype="<i3")), b"\x00" * 6], "dtype '<i3' is not a valid numpy dtype"),
    ([header(b=_nd(dtype="f4,i4")), b"\x00" * 16], "dtype 'f4,i4' is not allowed"),
    ([header(b=_nd(shape=(-1,))), b""], "has a size that is not a non-negative int"),
    ([header(b=_nd(dtype="|b1", shape=(2,))), b"\x00\x02"], "bool array holds bytes other"),
    ([header(b=_nd(dtype="<U1", shape=(1,))), b"\xff" * 4], "unicode array holds invalid code"),
    ([header(b=None), b"extra"], r"frames \[1\] are not referenced by the header"),
    ([header(b=[_nd(shape=(0,)), _nd(shape=(0,))]), b""], "frame 1 is referenced twice"),
    ([header(b={"__nd__": 1, "dtype": "<f4"}), b""], "'__nd__' entry has keys"),
    ([header(b={"__na__": {"_data": None}})], "NamedArray field name '_data' is not allowed"),
    ([header(b={"__tu__": 3})], "'__tu__' entry holds int, not list"),
    ([header(b={"__sc__": b"\x00", "dtype": "<f4"})], "scalar of dtype <f4 needs 4 bytes, has 1"),
    ([header(b={b"raw": 1})], "dict key b'raw' is not a str"),
    ([header(b=msgpack.ExtType(3, b"x"))], "msgpack extension type 3 is not allowed"),
    ([header(b=msgpack.Timestamp(1))], "value of type Timestamp is not allowed in a body"),
    ([msgpack.packb({1: 2})], "header is not valid msgpack"),  # strict_map_key
    (["text"], "undecodable message: TypeError"),
    (b"not a list", "frames must be a list, got bytes"),
]


@pytest.mark.parametrize(("frames", "message"), STRICT_CASES)
def test_decode_is_strict(frames, message):
    with pytest.raises(WireError, match=message):
        wire.decode(frames)


def test_decode_refuses_deep_bodies():
    deep: list = []
    for _ in range(wire.MAX_DEPTH + 2):
        deep = [deep]
    with pytest.raises(WireError, match="body nested deeper than 32 levels"):
        wire.decode([header(b=deep)])


# ------------------------------------------------------------------------------------- sockets
@pytest.fixture
def ctx():
    return transport.context()


@pytest.fixture
def pair(ctx):
    a = transport.socket_options(ctx.socket(zmq.PAIR))
    b = transport.socket_options(ctx.socket(zmq.PAIR))
    port = a.bind_to_random_port("tcp://127.0.0.1")
    b.connect(f"tcp://127.0.0.1:{port}")
    yield a, b
    a.close(linger=0)
    b.close(linger=0)


def test_context_is_one_per_process():
    assert transport.context() is transport.context()


def _report_context(queue) -> None:
    inherited = transport._context
    queue.put(transport.context() is not inherited and transport.context() is transport.context())


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_gets_its_own_context():
    transport.context()
    mp = multiprocessing.get_context("fork")
    queue = mp.Queue()
    child = mp.Process(target=_report_context, args=(queue,))
    child.start()
    try:
        assert queue.get(timeout=TIMEOUT_MS / 1000) is True
    finally:
        child.join(TIMEOUT_MS / 1000)
    assert child.exitcode == 0


def test_large_array_round_trip_over_pair(pair):
    a, b = pair
    big = np.random.default_rng(1).standard_normal((1024, 1024)).astype(np.float32)
    transport.send(a, "weights", {"w": big, "step": 7})
    got = transport.recv(b, timeout_ms=TIMEOUT_MS)
    assert got is not None
    envelope, message = got
    assert envelope == []
    assert message.kind == "weights"
    assert message.body["step"] == 7
    assert_same_array(message.body["w"], big)
    assert not message.body["w"].flags.writeable


def test_dealer_router_round_trip_with_envelope(ctx):
    router = transport.socket_options(ctx.socket(zmq.ROUTER))
    dealer = transport.socket_options(ctx.socket(zmq.DEALER))
    try:
        port = router.bind_to_random_port("tcp://127.0.0.1")
        dealer.connect(f"tcp://127.0.0.1:{port}")
        obs = np.arange(12, dtype=np.uint8).reshape(3, 4)
        transport.send(dealer, "rollout", {"obs": obs, "state": NamedArray(h=None)})
        envelope, message = transport.recv(router, timeout_ms=TIMEOUT_MS)
        assert len(envelope) == 1 and envelope[0]
        assert_same_array(message.body["obs"], obs)
        transport.send(router, "result", {"action": obs[:, 0]}, envelope=envelope)
        reply_envelope, reply = transport.recv(dealer, timeout_ms=TIMEOUT_MS, copy=True)
        assert reply_envelope == []
        assert_same_array(reply.body["action"], obs[:, 0])
        assert reply.body["action"].flags.writeable
    finally:
        router.close(linger=0)
        dealer.close(linger=0)


def test_recv_times_out_with_none(pair):
    assert transport.recv(pair[1], timeout_ms=10) is None


def test_recv_refuses_a_message_without_delimiter_and_goes_on(pair):
    a, b = pair
    a.send_multipart([wire.encode("test", 1)[0]])
    with pytest.raises(WireError, match="message of 1 frames has no empty delimiter frame"):
        transport.recv(b, timeout_ms=TIMEOUT_MS)
    transport.send(a, "test", 2)
    assert transport.recv(b, timeout_ms=TIMEOUT_MS)[1].body == 2


def test_recv_needs_a_timeout(pair):
    with pytest.raises(ValueError, match="every receive needs a timeout"):
        transport.recv(pair[1], timeout_ms=-1)


# ------------------------------------------------------------------------------------- fuzzing
def decodes_or_wire_error(frames) -> bool:
    """True if the frames decoded; False if WireError. Anything else fails the test."""
    try:
        wire.decode(frames)
    except WireError:
        return False
    return True


def _valid_messages() -> list[list[bytes]]:
    rng = np.random.default_rng(7)
    bodies = [
        {"obs": rng.standard_normal((4, 3)).astype(np.float32), "done": np.zeros(4, bool)},
        [np.int64(3), (1, 2), {"x": b"y", "z": None}],
        NamedArray(a=np.arange(6).reshape(2, 3), b=None, c=NamedArray(d=np.array(["ab"]))),
        {"e": np.zeros((0, 5)), "s": np.array(1.5), "c": np.ones(3, np.complex64)},
    ]
    # Each body twice: small arrays inline in the header, and every array in a frame of its own.
    return [
        [bytes(f) for f in wire.encode("kind", b, inline_budget=budget)]
        for b in bodies
        for budget in (wire.INLINE_BUDGET_BYTES, 0)
    ]


def test_fuzz_random_bytes():
    rng = np.random.default_rng(12345)
    for i in range(3000):
        n_frames = 1 + int(rng.integers(0, 4)) if i % 2 else 1
        frames = [rng.bytes(int(rng.integers(0, 64))) for _ in range(n_frames)]
        decodes_or_wire_error(frames)


def test_fuzz_random_bytes_behind_a_msgpack_map_prefix():
    # Random bytes rarely even start a map; these start one so the decoder gets further in.
    rng = np.random.default_rng(54321)
    for _ in range(3000):
        head = bytes([0x80 | int(rng.integers(0, 16))]) + rng.bytes(int(rng.integers(0, 48)))
        decodes_or_wire_error([head, rng.bytes(int(rng.integers(0, 16)))])


def test_fuzz_truncated_and_extended_frames():
    rng = np.random.default_rng(99)
    for frames in _valid_messages():
        assert decodes_or_wire_error(frames)
        for index, frame in enumerate(frames):
            for cut in range(len(frame)):
                assert not decodes_or_wire_error(
                    [*frames[:index], frame[:cut], *frames[index + 1 :]]
                )
            extended = frame + rng.bytes(int(rng.integers(1, 9)))
            assert not decodes_or_wire_error([*frames[:index], extended, *frames[index + 1 :]])
        assert not decodes_or_wire_error([*frames, b"\x00" * 8])
        if len(frames) > 1:
            assert not decodes_or_wire_error(frames[:-1])


def test_fuzz_mutated_headers():
    rng = np.random.default_rng(2024)
    for frames in _valid_messages():
        head = bytearray(frames[0])
        for _ in range(1000):
            mutated = bytearray(head)
            for _ in range(int(rng.integers(1, 4))):
                mutated[int(rng.integers(0, len(mutated)))] = int(rng.integers(0, 256))
            decodes_or_wire_error([bytes(mutated), *frames[1:]])


ODD_VALUES = [None, True, -1, 0, 1, 2, 2**64 - 1, 1.5, "", "<f4", "|O8", "V8", "U999999999", b"x"]
ODD_VALUES += [[], [1], [-1], [2**62, 2**62], {}, {"__nd__": 1}, {"__sc__": b"\x00" * 4}]


def _mutate(node, rng: np.random.Generator):
    """A copy of a decoded header tree with one value somewhere replaced by an odd one."""
    if isinstance(node, dict) and node and rng.random() < 0.85:
        key = list(node)[int(rng.integers(0, len(node)))]
        return {**node, key: _mutate(node[key], rng)}
    if isinstance(node, list) and node and rng.random() < 0.85:
        i = int(rng.integers(0, len(node)))
        return [*node[:i], _mutate(node[i], rng), *node[i + 1 :]]
    return ODD_VALUES[int(rng.integers(0, len(ODD_VALUES)))]


def test_fuzz_structurally_mutated_headers():
    rng = np.random.default_rng(31337)
    for frames in _valid_messages():
        tree = msgpack.unpackb(frames[0], raw=False)
        for _ in range(500):
            mutated = msgpack.packb(_mutate(tree, rng), use_bin_type=True)
            decodes_or_wire_error([mutated, *frames[1:]])
