"""A gossiping fleet's prefix indexes: one shared index plus a view per gateway
(`replay/sharedprefixes.py`) give the answers of gateways that each keep and merge a whole index."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from cacheroute.dispatcher.prefixes import PrefixIndex
from cacheroute.replay.sharedprefixes import SharedPrefixes


class WholeIndexGateway:
    """The reference: a gateway with its own `PrefixIndex`, journalling what it sends and
    replaying every gateway's journal (its own among them) at a sync."""

    def __init__(self, destinations: int, capacity: int) -> None:
        self.index = PrefixIndex(destinations, capacity)
        self.journal: list[dict[int, int]] = [{} for _ in range(destinations)]

    def insert(self, d: int, blocks: list[int], seq: int) -> int:
        for k, b in enumerate(reversed(blocks)):
            self.journal[d][b] = seq * (1 << 24) + k
        return self.index.insert(d, blocks)


def test_after_a_sync_every_view_holds_the_latest_blocks_within_the_budget() -> None:
    # three gateways, a 3-block budget: each sent other blocks to destination 0 (hand-derived)
    shared = SharedPrefixes(2, 3)
    views = [shared.join() for _ in range(3)]
    assert views[0].insert(0, [1, 2], seq=0) == 2
    assert views[1].insert(0, [3], seq=1) == 1
    assert views[2].insert(0, [4, 5], seq=2) == 2  # the latest: 4 (its first block) most recent
    assert views[0].insert(1, [9], seq=3) == 1
    assert views[1].match([1, 2]) == [0, 0]  # before the sync: gateway 1 never sent them
    shared.merge()
    assert list(shared.index.lru[0]) == [3, 5, 4]  # 1 and 2 (the oldest) trimmed to the budget
    for view in views:
        assert view.match([4, 5]) == [2, 0]
        assert view.match([1]) == [0, 0]
        assert view.match([9]) == [0, 1]
        assert (view.size(0), view.size(1)) == (3, 1)
        assert view.journal == [{}, {}]  # a new interval starts
    # after the sync, gateway 0 sends 6 to d0: its view drops the shared index's oldest (3)
    assert views[0].insert(0, [6], seq=4) == 1
    assert views[0].match([3]) == [0, 0]
    assert views[1].match([3]) == [1, 0]  # the others still hold it until they learn of 6
    # sending a held block again moves it, adds nothing: 5 is now newer than 4 and 6
    assert views[0].insert(0, [5], seq=5) == 0
    assert views[0].insert(0, [7, 8], seq=6) == 2  # drops the two oldest: 4, then 6
    assert views[0].match([5]) == [1, 0]
    assert views[0].match([4]) == views[0].match([6]) == [0, 0]
    assert views[0].size(0) == 3


_STEP: st.SearchStrategy[tuple[str, int, int, list[int]]] = st.one_of(
    st.tuples(
        st.just("insert"),
        st.integers(0, 2),  # gateway
        st.integers(0, 2),  # destination
        st.lists(st.integers(0, 11), min_size=1, max_size=6, unique=True),
    ),
    st.tuples(st.just("sync"), st.just(0), st.just(0), st.just([])),
)


@settings(max_examples=400, deadline=None)
@given(capacity=st.integers(1, 6), steps=st.lists(_STEP, max_size=60))
def test_views_answer_as_gateways_that_each_keep_and_merge_a_whole_index(
    capacity: int, steps: list[tuple[str, int, int, list[int]]]
) -> None:
    gateways, destinations = 3, 3
    reference = [WholeIndexGateway(destinations, capacity) for _ in range(gateways)]
    shared = SharedPrefixes(destinations, capacity)
    views = [shared.join() for _ in range(gateways)]
    probes = [[b] for b in range(12)] + [[0, 1, 2], [3, 4], [5, 6, 7, 8]]
    for seq, (kind, g, d, blocks) in enumerate(steps):
        if kind == "sync":
            journals = [r.journal for r in reference]
            for r in reference:
                r.index.merge(journals)
            for r in reference:
                r.journal = [{} for _ in range(destinations)]
            shared.merge()
        else:
            assert views[g].insert(d, blocks, seq) == reference[g].insert(d, blocks, seq)
        for view, ref in zip(views, reference, strict=True):
            for probe in probes:
                assert view.match(probe) == ref.index.match(probe)
            assert [view.size(c) for c in range(destinations)] == [
                ref.index.size(c) for c in range(destinations)
            ]
