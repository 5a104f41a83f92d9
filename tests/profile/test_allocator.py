"""The auto_growth replay model (autodl.profile.allocator): best fit, splitting, merging, chunks never returned."""

from __future__ import annotations

from autodl.profile.allocator import replay_auto_growth


def test_a_freed_block_is_reused_by_a_smaller_request():
    r = replay_auto_growth([(1, 1000), (1, -1000), (2, 500)])
    assert r.chunks == 1 and r.peak_reserved == 1024 and r.peak_allocated == 1024


def test_a_request_larger_than_every_free_block_gets_a_new_chunk():
    r = replay_auto_growth([(1, 1000), (2, 1000), (1, -1000), (3, 1500)])
    assert r.chunks == 3 and r.peak_reserved == 1024 + 1024 + 1536
    assert r.peak_allocated == 1024 + 1536


def test_split_blocks_merge_back_within_their_chunk():
    events = [(1, 2048), (1, -2048), (2, 1024), (3, 1024), (2, -1024), (3, -1024), (4, 2048)]
    r = replay_auto_growth(events)
    assert r.chunks == 1 and r.peak_reserved == 2048


def test_best_fit_takes_the_smallest_block_that_fits():
    # free blocks of 4096 and 1024 (separate chunks): a 1000-byte request must not split the 4096 one,
    # so a later 4096 request still fits without a new chunk
    events = [(1, 4096), (2, 1024), (1, -4096), (2, -1024), (3, 1000), (4, 4096)]
    r = replay_auto_growth(events)
    assert r.chunks == 2 and r.peak_reserved == 4096 + 1024


def test_frees_of_allocations_made_before_the_recording_release_preexisting_bytes():
    r = replay_auto_growth([(9, -1024), (1, 1000)], preexisting=[10_240])
    assert r.unmatched_frees == 1
    assert r.peak_allocated == 10_240 and r.peak_reserved == 10_240  # the 1000 B fit the released 1024


def test_an_address_reused_without_its_free_releases_the_stale_allocation_first():
    r = replay_auto_growth([(1, 1000), (1, 500)])
    assert r.chunks == 1 and r.peak_reserved == 1024  # the 512 B request fit the released 1024 B block
    assert r.peak_allocated == 1024


def test_a_chunk_size_flag_reserves_whole_chunks_whose_remainder_serves_later_requests():
    r = replay_auto_growth([(1, 1000), (2, 1000)], chunk_bytes=4096)
    assert r.chunks == 1 and r.peak_reserved == 4096 and r.peak_allocated == 2048


def test_a_zero_byte_event_is_counted_and_changes_no_peak():
    r = replay_auto_growth([(1, 0)])
    assert r.events == 1 and r.chunks == 0 and r.peak_allocated == 0 and r.peak_reserved == 0
