"""Reactive cache-aware baselines: `sglang` (SGLang's cache-aware router) and `preble` (Preble E2).

`sglang`, after sgl-router's cache_aware policy (defaults: cache_threshold 0.5,
balance_abs_threshold 32, balance_rel_threshold 1.0001, the Python launcher's). The router's
later releases (sgl-model-gateway, and vllm-router, which copies it) default to 0.3 / 64 / 1.5;
those made this baseline weaker where it was not already failing (`evaluate --quick --seeds 3`:
whale at 4 gateways 258 req/s against 282; the Mooncake arXiv trace at 16 gateways 4.2 against
3.8, both herding), so the stronger, older settings stay:
  * if the cluster is imbalanced - (max - min in-flight) > abs threshold AND max > rel * min -
    route to the destination with the fewest in-flight requests;
  * else find the destination whose approximate tree matches the longest prefix; if the match
    covers more than `cache_threshold` of the prompt, go there; else go to the destination with the
    smallest tree (the most cache room);
  * either way the prompt is inserted into the chosen destination's tree. The tree is trimmed LRU
    to `max_tree_tokens` (default: the replica's cache size) on insert rather than every 60 s.

`preble`, after Preble's E2 scheduler (Srivatsa et al., ICLR 2025):
  * exploit: if some destination holds more than half of the prompt, send it to the least-loaded
    of those with the longest match - unless that one's load is above `rebalance` x the mean and
    more than `rebalance_s` seconds of work above it (Preble's load rebalancing), then explore;
  * explore: send it where load + the prefill cost of the missing tokens is smallest;
  * load = estimated GPU seconds (prefill of the missing tokens + decode) of the requests sent to
    a destination, decayed with time constant `window_s` (Preble keeps a window of history). The
    decode part charges the *expected* output length - a router cannot know a request's own - as
    an exponentially weighted mean (weight `output_weight`) of the output lengths of the requests
    routed so far, starting from `output_prior` (128 tokens) and updated only after each routing
    decision, so a request's own length never enters its own charge. (A real router learns a
    length when the response completes; `release` does not say which request that was, so the
    mean is fed at routing time instead - it runs slightly ahead of what a router could know.)
  Preble's prefix autoscaling and priority queues are not modelled.
Both use the same router-side `PrefixIndex`; neither sees the replicas' real caches.

Gossip (`--sync-s`, fleet.py): a fleet's gateways each see only their own requests. When they
sync, each one learns the blocks every peer sent to every destination since the last sync
(afterwards all gateways' indexes agree: the fleet keeps one index as of the last sync, and
each gateway a view of it plus what it sent since, `sharedprefixes.py`) and the peers' loads -
in-flight counts for `sglang`, decayed GPU seconds for `preble` - as of the sync (`remote`).
Decisions then use own load (kept live) + remote, as a router whose peers gossip would; Preble's
remote load decays like its own, since the work it stands for gets done between syncs.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from cacheroute.dispatcher.prefixes import PrefixIndex
from cacheroute.replay.baselines import PeerState, peer_load
from cacheroute.replay.policy import Policy, PolicyContext
from cacheroute.replay.sharedprefixes import GatewayPrefixes, SharedPrefixes

__all__ = ["Preble", "SGLang"]


class _PrefixPolicy(Policy):
    def __init__(self, ctx: PolicyContext, tree_tokens: int | None = None) -> None:
        super().__init__(ctx)
        q = ctx.requests
        self.block_tokens = q.block_tokens
        budget = tree_tokens if tree_tokens is not None else ctx.service.cache_tokens
        self.capacity_blocks = budget // q.block_tokens
        self.index: PrefixIndex | GatewayPrefixes = PrefixIndex(
            ctx.destinations, self.capacity_blocks
        )
        """Alone: its own index. In a gossiping fleet: its view of the fleet's (`start_sync`)."""
        self.shared: SharedPrefixes | None = None
        self.offsets: list[int] = q.block_offsets.tolist()
        self.block_ids = q.block_ids
        self.prompt: list[int] = q.prompt_tokens.tolist()
        self.output: list[int] = q.output_tokens.tolist()
        self.remote: list[float] | None = None
        """The peers' load per destination at the last sync (None: no sync yet, or no gossip)."""

    def blocks(self, i: int) -> list[int]:
        out: list[int] = self.block_ids[self.offsets[i] : self.offsets[i + 1]].tolist()
        return out

    def record(self, d: int, blocks: list[int], i: int) -> None:
        """Request i's prompt went to d (journalled for the peers in a gossiping fleet)."""
        index = self.index
        if isinstance(index, GatewayPrefixes):
            index.insert(d, blocks, i)
        else:
            index.insert(d, blocks)

    def own_load(self) -> list[float]:
        """The load this gateway reports to its peers (in-flight requests by default)."""
        return [float(x) for x in self.inflight]

    def start_sync(self, fleet: Sequence[object]) -> None:
        """Use the fleet's shared index (the first gateway makes it) through a view of its own.

        Called before any request, so every gateway's index is still empty.
        """
        leader = fleet[0]
        assert isinstance(leader, _PrefixPolicy)
        if leader.shared is None:
            leader.shared = SharedPrefixes(self.ctx.destinations, self.capacity_blocks)
        self.shared = leader.shared
        self.index = self.shared.join()

    def export_state(self, t: float) -> PeerState:
        """Own load; the blocks sent since the last sync are in this gateway's view, which the
        fleet's shared index merges at the first `merge_state` of the sync."""
        del t
        return PeerState(self.own_load())

    def merge_state(self, others: list[object], *, loads: bool) -> None:
        """Learn the peers' blocks (every gateway's, merged once into the shared index), and
        their load."""
        if self.shared is not None:
            self.shared.merge()
        if loads:
            self.remote = peer_load(others, self.ctx.destinations)


class SGLang(_PrefixPolicy):
    """SGLang's cache-aware router over an approximate per-destination prefix tree."""

    name = "sglang"

    def __init__(
        self,
        ctx: PolicyContext,
        *,
        cache_threshold: float = 0.5,
        balance_abs_threshold: int = 32,
        balance_rel_threshold: float = 1.0001,
        max_tree_tokens: int | None = None,
    ) -> None:
        super().__init__(ctx, max_tree_tokens)
        self.cache_threshold = cache_threshold
        self.abs_threshold = balance_abs_threshold
        self.rel_threshold = balance_rel_threshold
        self.counts = {"balance": 0, "cache_hit": 0, "smallest_tree": 0}

    def route(self, i: int, t: float) -> int:
        own = self.inflight
        remote = self.remote
        # with gossip, the balance check and the tie-break see the peers' requests too
        inflight: Sequence[float] = (
            own if remote is None else [a + b for a, b in zip(own, remote, strict=True)]
        )
        hi, lo = max(inflight), min(inflight)
        blocks = self.blocks(i)
        if hi - lo > self.abs_threshold and hi > self.rel_threshold * lo:
            d = inflight.index(lo)
            self.counts["balance"] += 1
        else:
            lengths = self.index.match(blocks)
            best = max(lengths)
            if best * self.block_tokens > self.cache_threshold * self.prompt[i]:
                d = min(
                    (c for c in range(len(lengths)) if lengths[c] == best),
                    key=inflight.__getitem__,
                )
                self.counts["cache_hit"] += 1
            else:
                sizes = [self.index.size(c) for c in range(len(lengths))]
                d = sizes.index(min(sizes))
                self.counts["smallest_tree"] += 1
        self.record(d, blocks, i)
        own[d] += 1
        return d

    def describe(self) -> dict[str, Any]:
        return {
            "cache_threshold": self.cache_threshold,
            "balance_abs_threshold": self.abs_threshold,
            "balance_rel_threshold": self.rel_threshold,
            "decisions": dict(self.counts),
        }


class Preble(_PrefixPolicy):
    """Preble's E2: exploit long prefix matches, else explore by load + prefill cost."""

    name = "preble"

    def __init__(
        self,
        ctx: PolicyContext,
        *,
        window_s: float = 10.0,
        rebalance: float = 1.5,
        rebalance_s: float = 1.0,
        output_prior: float = 128.0,
        output_weight: float = 0.05,
    ) -> None:
        super().__init__(ctx)
        s = ctx.service
        self.window_s = window_s
        self.rebalance = rebalance
        self.rebalance_s = rebalance_s
        self.output_weight = output_weight
        self.mean_output = output_prior
        """Expected output tokens of the next request (EWMA over the requests routed so far)."""
        self.load = [0.0] * ctx.destinations
        self.last_t = 0.0
        # decode seconds per output token at a typical batch of 16 (profiled in Preble)
        self.decode_token_s = (s.decode_base_s + 16 * s.decode_per_seq_s) / 16
        self.s = s
        self.counts = {"exploit": 0, "explore": 0, "rebalanced": 0}

    def _prefill(self, uncached: int, cached: int) -> float:
        s = self.s
        return (
            s.prefill_fixed_s
            + s.prefill_per_token_s * uncached
            + s.attention_per_pair_s * (uncached * cached + 0.5 * uncached * uncached)
        )

    def _decay(self, t: float) -> None:
        """Age own (and remote) load to time t: the work it stands for gets done."""
        if t > self.last_t:
            f = math.exp(-(t - self.last_t) / self.window_s)
            self.load = [x * f for x in self.load]
            if self.remote is not None:
                self.remote = [x * f for x in self.remote]
            self.last_t = t

    def own_load(self) -> list[float]:
        """Preble's decayed GPU seconds (aged to the sync by `export_state`)."""
        return list(self.load)

    def export_state(self, t: float) -> PeerState:
        """Own load aged to the sync time t, and the blocks sent since the last sync."""
        self._decay(t)
        return super().export_state(t)

    def route(self, i: int, t: float) -> int:
        self._decay(t)
        own = self.load
        remote = self.remote
        load = own if remote is None else [a + b for a, b in zip(own, remote, strict=True)]
        blocks = self.blocks(i)
        lengths = self.index.match(blocks)
        p, bt = self.prompt[i], self.block_tokens
        best = max(lengths)
        d = -1
        if 2 * best * bt > p:
            d = min((c for c in range(len(lengths)) if lengths[c] == best), key=load.__getitem__)
            mean = sum(load) / len(load)
            if load[d] > self.rebalance * mean and load[d] - mean > self.rebalance_s:
                d = -1
                self.counts["rebalanced"] += 1
            else:
                self.counts["exploit"] += 1
        if d < 0:
            best_cost = math.inf
            for c in range(len(load)):
                cached = min(lengths[c] * bt, p - 1)
                cost = load[c] + self._prefill(p - cached, cached)
                if cost < best_cost:
                    best_cost, d = cost, c
            self.counts["explore"] += 1
        cached = min(lengths[d] * bt, p - 1)
        own[d] += self._prefill(p - cached, cached) + self.mean_output * self.decode_token_s
        # only now, after the charge: a request's own length never prices itself (module doc)
        self.mean_output += self.output_weight * (self.output[i] - self.mean_output)
        self.record(d, blocks, i)
        self.inflight[d] += 1
        return d

    def describe(self) -> dict[str, Any]:
        return {
            "window_s": self.window_s,
            "rebalance": self.rebalance,
            "rebalance_s": self.rebalance_s,
            "output_weight": self.output_weight,
            "mean_output_tokens": self.mean_output,
            "decisions": dict(self.counts),
        }
