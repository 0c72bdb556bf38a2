import time

import pytest

from nsqpy.nsqd.guid import TWEPOCH, GUIDFactory


def test_ids_are_hex_increasing_and_unique():
    f = GUIDFactory(7)
    ids = f.new_ids(10000) + f.new_ids(10000)
    assert all(len(i) == 16 and int(i, 16) >= 0 for i in ids)
    ints = [int(i, 16) for i in ids]
    assert ints == sorted(ints)
    assert len(set(ints)) == len(ints)


def test_layout_matches_nsq():
    f = GUIDFactory(1023)
    before = time.time_ns() >> 20
    v = int(f.new_id(), 16)
    after = time.time_ns() >> 20
    assert (v >> 12) & 0x3FF == 1023
    assert before - TWEPOCH <= v >> 22 <= after - TWEPOCH
    assert v & 0xFFF == 0


def test_node_id_range():
    with pytest.raises(ValueError):
        GUIDFactory(1024)
