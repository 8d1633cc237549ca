"""ElasticSampler: pure index arithmetic, exactly-once under any resize/batch schedule."""

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from taiji.data.sampler import ElasticSampler, SamplerState, advance, epoch_permutation, global_span, shard


@given(lo=st.integers(0, 1000), length=st.integers(0, 500), size=st.integers(1, 17))
def test_shards_tile_the_span_and_differ_by_at_most_one(lo, length, size):
    hi = lo + length
    spans = [shard(lo, hi, r, size) for r in range(size)]
    assert spans[0][0] == lo and spans[-1][1] == hi
    for (_a, b), (c, _) in zip(spans, spans[1:]):
        assert b == c
    sizes = [b - a for a, b in spans]
    assert max(sizes) - min(sizes) <= 1


def test_permutation_depends_only_on_seed_and_epoch():
    a = epoch_permutation(100, seed=3, epoch=1)
    assert torch.equal(a, epoch_permutation(100, seed=3, epoch=1))
    assert not torch.equal(a, epoch_permutation(100, seed=3, epoch=2))
    assert not torch.equal(a, epoch_permutation(100, seed=4, epoch=1))
    assert sorted(a.tolist()) == list(range(100))
    assert torch.equal(epoch_permutation(5, 0, 0, shuffle=False), torch.arange(5))


@settings(max_examples=200, deadline=None)
@given(
    num_samples=st.integers(1, 300),
    seed=st.integers(0, 2**31),
    schedule=st.lists(st.tuples(st.integers(1, 9), st.integers(1, 64)), min_size=1, max_size=60),
    retries=st.lists(st.booleans(), max_size=60),
)
def test_every_sample_exactly_once_per_epoch_under_any_schedule(num_samples, seed, schedule, retries):
    """Cluster size and global batch change at arbitrary steps; some steps are retried on a
    different cluster size (a failure mid-step): each epoch still sees each index once."""
    sampler = ElasticSampler(num_samples, seed=seed)
    state = SamplerState(batch_size=schedule[0][1])
    seen: dict[int, list[int]] = {}
    for i, (size, batch) in enumerate(schedule * 3):
        state = SamplerState(state.epoch, state.cursor, batch)
        if i < len(retries) and retries[i]:  # the first attempt fails before commit: nothing counts
            [sampler.local_indices(state, r, size + 1) for r in range(size + 1)]
        parts = [sampler.local_indices(state, r, size) for r in range(size)]
        consumed = sum(len(p) for p in parts)
        lo, hi = global_span(state, num_samples)
        assert consumed == hi - lo
        for part in parts:
            seen.setdefault(state.epoch, []).extend(part.tolist())
        state = advance(state, consumed, num_samples)
    for epoch, indices in seen.items():
        if epoch < state.epoch:  # a completed epoch
            assert sorted(indices) == list(range(num_samples)), f"epoch {epoch}"
        else:
            assert len(indices) == len(set(indices)) == state.cursor


def test_last_step_of_epoch_is_short_then_epoch_advances():
    sampler = ElasticSampler(10, seed=0)
    state = SamplerState(batch_size=4)
    sizes = []
    while state.epoch == 0:
        idx = sampler.global_indices(state)
        sizes.append(len(idx))
        state = advance(state, len(idx), 10)
    assert sizes == [4, 4, 2] and state == SamplerState(epoch=1, cursor=0, batch_size=4)
    assert sampler.steps_per_epoch(4) == 3


def test_empty_local_share_when_batch_smaller_than_cluster():
    sampler = ElasticSampler(10)
    state = SamplerState(batch_size=2)
    parts = [sampler.local_indices(state, r, 4) for r in range(4)]
    assert [len(p) for p in parts] == [1, 1, 0, 0]


@settings(max_examples=200, deadline=None)
@given(num=st.integers(1, 50), cuts=st.lists(st.integers(0, 400), max_size=20))
def test_position_segments_cover_each_position_once_and_stay_in_one_epoch(num, cuts):
    from taiji.data.sampler import position_segments

    bounds = sorted(set([0, 400] + cuts))
    covered = []
    for lo, hi in zip(bounds, bounds[1:]):
        for epoch, start, stop in position_segments(lo, hi, num):
            assert 0 <= start < stop <= num
            covered += [epoch * num + i for i in range(start, stop)]
    assert covered == list(range(400))


def test_a_local_share_names_exactly_the_local_indices():
    sampler = ElasticSampler(10, seed=5)
    state = SamplerState(epoch=2, cursor=4, batch_size=5)
    shares = [sampler.local_share(state, r, 3) for r in range(3)]
    assert shares == [(2, 4, 6), (2, 6, 8), (2, 8, 9)]
    for r, share in enumerate(shares):
        assert torch.equal(sampler.indices_of(share), sampler.local_indices(state, r, 3))
