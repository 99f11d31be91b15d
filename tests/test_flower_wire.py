"""The packed records that cross the wire (``fedcf.flower.wire.arrays``/``record_arrays``): a
record is one Flower Array whatever it holds, its arrays come back exactly, and a record a
node or server forged is refused by name, never parsed into something else."""

import json

import numpy as np
import pytest

pytest.importorskip("flwr")

from flwr.app import Array, ArrayRecord  # noqa: E402

from fedcf.flower.wire import PACKED, ReplyError, arrays, record_arrays  # noqa: E402


def _raw(head, body=b""):
    """A packed buffer with the header ``head`` (any JSON) and the bytes ``body``."""
    h = json.dumps(head).encode()
    buf = len(h).to_bytes(8, "little") + h + body
    return ArrayRecord({PACKED: Array(np.frombuffer(buf, np.uint8))})


def test_a_record_is_one_array_and_comes_back_exactly():
    named = {"Q": np.arange(12, dtype=np.float32).reshape(4, 3), "b": np.zeros(4),
             "ids": np.array([7, 2], np.uint64), "empty": np.zeros((0, 5), np.int32),
             "flags": np.array([True, False]), "scalar": np.array(3.5),
             "strided": np.arange(20, dtype=np.int64)[::2]}
    rec = arrays(**named)
    assert list(rec) == [PACKED]  # one Flower object per record, not one per array
    got = record_arrays(rec)
    assert list(got) == list(named)
    for k, v in named.items():
        assert got[k].dtype == v.dtype and got[k].shape == v.shape
        np.testing.assert_array_equal(got[k], v)
        assert got[k].flags.writeable
    got["Q"][0, 0] = -1  # a copy: the record is unchanged
    assert record_arrays(rec)["Q"][0, 0] == 0
    assert list(record_arrays(rec, ("ids", "b"))) == ["b", "ids"]  # just those, in order
    last = record_arrays(arrays(a=np.ones(3), z=np.zeros((2, 0))))  # an empty array at the end
    assert last["z"].shape == (2, 0) and last["a"].tolist() == [1.0, 1.0, 1.0]


@pytest.mark.parametrize("rec, match", [
    (None, "not one 'packed' array"),
    (ArrayRecord({"Q": Array(np.zeros(3))}), "not one 'packed' array"),
    (ArrayRecord({PACKED: Array(np.zeros(3))}), "not a byte buffer"),
    (ArrayRecord({PACKED: Array(np.zeros(3, np.uint8))}), "not a byte buffer"),
    (_raw({"Q": 1}), "header"),
    (_raw([["Q", "<f8"]]), "header"),
    (_raw([["Q", "no-such-dtype", [1]]]), "header"),
    (_raw([["Q", "|O", [1]]], bytes(8)), "only bool, integer and floating"),
    (_raw([["s", "<U3", [1]]], bytes(12)), "only bool, integer and floating"),
    (_raw([["Q", "<f8", [-1]]]), "only bool, integer and floating"),
    (_raw([["Q", "<f8", [1]], ["Q", "<f8", [1]]], bytes(16)), "each named once"),
    (_raw([["Q", "<f8", [2]]], bytes(8)), "runs past the buffer"),
    (_raw([["Q", "<f8", [10**12, 10**12]]], bytes(8)), "runs past the buffer"),
    (_raw([["Q", "<f8", [1]]], bytes(9)), "1 bytes its header does not describe"),
])
def test_a_forged_record_is_refused_by_name(rec, match):
    with pytest.raises(ReplyError, match=match):
        record_arrays(rec)


def test_a_header_length_past_the_buffer_is_refused():
    buf = (10**9).to_bytes(8, "little") + b"[]"
    with pytest.raises(ReplyError, match="header"):
        record_arrays(ArrayRecord({PACKED: Array(np.frombuffer(buf, np.uint8))}))
