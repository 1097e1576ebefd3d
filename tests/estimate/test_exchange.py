"""The exchange cost model: transfers from fragments, multicast, paired (64-bit) receives."""

import numpy as np

from tileplan.estimate.exchange import fragments_to_transfers, paired_mask, tile_exchange_cycles
from tileplan.target import load_target

TARGET = load_target("ipu21-64")          # 4 B/cycle, paired 8 B/cycle, 2 + 2 control cycles


def multicast(src: int, dsts: list[int], nbytes: int, dst_off: int = 0):
    k = len(dsts)
    return fragments_to_transfers(np.full(k, src), np.zeros(k, np.int64), np.array(dsts), np.full(k, dst_off),
                                  np.full(k, nbytes))


def test_a_multicast_is_one_send_and_complete_pairs_receive_at_the_paired_rate():
    tr = multicast(0, [2, 3, 4, 5], 64)
    assert tr.transfer_count == 1 and paired_mask(tr).all()
    send, recv = tile_exchange_cycles(tr, TARGET)
    assert recv[[2, 3, 4, 5]].tolist() == [64 // 8 + 2] * 4
    # One paired send, charged to the sender and to its partner, whose transmit lane it borrows.
    assert send[0] == send[1] == 64 // 8 + 2 and send[2:].sum() == 0


def test_a_multicast_to_an_incomplete_pair_set_is_split_into_a_paired_and_an_unpaired_send():
    tr = multicast(0, [2, 3, 4, 5, 7], 64)
    assert tr.transfer_count == 2
    paired = paired_mask(tr)
    assert sorted(tr.dst_tile[paired].tolist()) == [2, 3, 4, 5] and tr.dst_tile[~paired].tolist() == [7]
    send, recv = tile_exchange_cycles(tr, TARGET)
    assert recv[[2, 3, 4, 5]].tolist() == [10] * 4 and recv[7] == 64 // 4 + 2
    assert send[0] == (64 // 8 + 2) + (64 // 4 + 2) and send[1] == 64 // 8 + 2


def test_no_pair_or_no_alignment_leaves_one_unpaired_send():
    for tr in (multicast(0, [3, 4, 7], 64), multicast(0, [2, 3, 4, 5, 7], 60), multicast(0, [2, 3, 7], 64, 4)):
        assert tr.transfer_count == 1 and not paired_mask(tr).any()
        send, recv = tile_exchange_cycles(tr, TARGET)
        n = int(tr.nbytes[0])
        assert send[0] == -(-n // 4) + 2 and send[1] == 0
        assert set(recv[tr.dst_tile].tolist()) == {-(-n // 4) + 2}


def test_fragments_continuing_each_other_in_both_memories_merge_into_one_transfer():
    tr = fragments_to_transfers(np.array([0, 0, 0]), np.array([0, 16, 48]), np.array([1, 1, 1]),
                                np.array([100, 116, 148]), np.array([16, 16, 8]))
    assert len(tr) == 2 and sorted(tr.nbytes.tolist()) == [8, 32]


def test_one_tile_twice_is_not_a_pair():
    tr = fragments_to_transfers(np.zeros(2, np.int64), np.zeros(2, np.int64), np.array([4, 4]),
                                np.array([0, 64]), np.full(2, 64))
    assert tr.transfer_count == 1 and not paired_mask(tr).any()
