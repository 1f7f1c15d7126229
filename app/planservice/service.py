"""The planner service: rates in, plan versions out, one active instance at a time.

One thread runs the loop; each step:
  1. leadership: poll the group (`Leadership`); on becoming active, start a publisher (which fences
     any older instance and recovers the next version and the live plan) and plan at once; on
     losing the partition, step down to standby;
  2. rates: read a batch of KeyRate records (active and standby alike, so a standby has warm
     state), keep the latest per (key, window), fold complete windows into the EWMA;
  3. when active and a control interval has passed: build with the live plan as `prev`
     (churn-aware), ask the publish advisor, publish or skip, and count and log why;
  4. when active: look at what landed on the plans topic (`PlanPublisher.watch`); a foreign record
     under a key of the live version (a tombstone under `header`, say) is counted and logged, and
     the live version is re-published over it (`repair`, at most once a second), because
     compaction would otherwise erase the live plan for every gateway that starts afterwards.

A live plan stamped in the future of this planner's clock (by a planner with a fast clock) is
re-published with this clock's time at the next tick: gateways treat a plan from the future as
stale, and it would otherwise never age into a refresh.

The planner core is pure; this shell owns the clocks, Kafka and the metrics. A planner error keeps
the live plan; a publish that fails leaves the previous version live (the transaction is aborted);
being fenced means another instance is active, so this one steps down.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Iterable

from confluent_kafka import KafkaException, Producer

from cacheroute.errors import CacheRouteError
from cacheroute.kafkaio import producer_config
from cacheroute.planner import Plan, PlannerError, advise, build_plan, plan_diff
from cacheroute.planner.smoothing import RateSmoother, RatesSnapshot, Rejection
from cacheroute.planner.work import planning_rates
from cacheroute.planservice.config import PlannerServiceConfig
from cacheroute.planservice.leader import Leadership
from cacheroute.planservice.metrics import PlannerMetrics
from cacheroute.planservice.publisher import FencedError, ForeignRecord, PlanPublisher, Recovery
from cacheroute.planservice.rates import RatesBatch, RatesSource
from cacheroute.schemas import KeyRate
from cacheroute.settings import Settings
from cacheroute.topics import make_admin

__all__ = ["PlannerService", "refresh_reason"]

log = logging.getLogger(__name__)

_RATES_BATCH = 5000
_RETRY_S = 2.0
_REPAIR_SPACING_S = 1.0
"""At most one repair a second: a flood of foreign tombstones must not turn into a flood of
transactions; compaction needs far longer than this (a closed segment, then the cleaner)."""
FUTURE_TOLERANCE_S = 1.0
"""A live plan created further than this ahead of the planner's clock is re-published at once."""


def refresh_reason(created_ms: int, now_ms: int, max_age_s: float) -> str | None:
    """Why the live plan must be re-published with the current time, or None.

    `max_age_s` <= 0 turns the age rule off; a plan from the future is refreshed regardless,
    because gateways treat it as stale and it would not reach the age limit until the clocks meet.
    """
    ahead_s = (created_ms - now_ms) / 1000.0
    if ahead_s > FUTURE_TOLERANCE_S:
        return (
            f"was created {ahead_s:.0f} s in the future of this planner's clock; gateways treat "
            "it as stale"
        )
    if max_age_s > 0 and now_ms - created_ms >= max_age_s * 1000:
        return f"is older than {max_age_s:g}s"
    return None


class PlannerService:
    """One planner instance (see the module docstring). `run(stop)` until `stop` is set."""

    def __init__(
        self,
        settings: Settings,
        config: PlannerServiceConfig,
        *,
        metrics: PlannerMetrics | None = None,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
        on_chunk: Callable[[int, int], None] | None = None,
    ) -> None:
        self.settings = settings
        self.config = config
        self.metrics = metrics or PlannerMetrics.create()
        self.planner_id = config.planner_id or "planner"
        self._clock = clock
        self._mono = monotonic
        self._on_chunk = on_chunk
        self._leadership: Leadership | None = None
        self._rates: RatesSource | None = None
        self._smoother: RateSmoother | None = None
        self._publisher: PlanPublisher | None = None
        self._dead_letters: Producer | None = None
        self._live: Plan | None = None
        self._active = False
        self._next_tick = float("inf")
        self._retry_at = 0.0
        self._last_lag_check = 0.0
        self._windows_planned = -1
        self._repair_at = 0.0
        self._last_foreign_log = float("-inf")
        self._foreign_unlogged = 0

    # ------------------------------------------------------------------------- lifecycle
    @property
    def active(self) -> bool:
        """Whether this instance is the one publishing."""
        return self._active

    @property
    def live(self) -> Plan | None:
        """The live plan as this instance knows it (the last one it published or recovered)."""
        return self._live

    def open(self) -> None:
        """Connect: rates from the look-back point, then join the planner group."""
        plans = self.settings.topics["plans"]
        try:
            present = plans in make_admin(self.settings).list_topics(timeout=30).topics
        except KafkaException as exc:
            raise CacheRouteError(
                f"no Kafka broker answers at {self.settings.bootstrap} ({exc})", retriable=True
            ) from exc
        if not present:  # the group would wait for the topic forever, silently
            raise CacheRouteError(
                f"topic {plans} does not exist; create the topics with `cacheroute topics ensure`"
            )
        start_ms = self._now_ms() - round(self.config.lookback_s * 1000)
        self._rates = RatesSource(
            self.settings, start_ms=start_ms, client_id=f"cacheroute-planner[{self.planner_id}]"
        )
        self._smoother = RateSmoother(self.config.smoothing, self._rates.partitions)
        self._dead_letters = Producer(producer_config(self.settings))
        self._leadership = Leadership(
            self.settings,
            group_id=self.config.group_id(self.settings.topic_prefix),
            member=self.planner_id,
            session_timeout_ms=self.config.session_timeout_ms,
        )
        log.warning(
            "planner %s started: %d destinations, q_cap %g, W %d, interval %gs, EWMA alpha %g; "
            "reading %s (%d partitions) from %gs back; waiting for the %s group to pick the "
            "active instance",
            self.planner_id,
            len(self.config.destinations),
            self.config.params.q_cap,
            self.config.params.warm_slots,
            self.config.interval_s,
            self.config.smoothing.alpha,
            self._rates.topic,
            self._rates.partitions,
            self.config.lookback_s,
            self.config.group_id(self.settings.topic_prefix),
        )

    def close(self) -> None:
        """Leave the group first (a standby takes over at once), then close the clients."""
        if self._leadership is not None:
            self._leadership.close()
        self._step_down(None)
        if self._rates is not None:
            self._rates.close()
            self._rates = None
        if self._dead_letters is not None:
            self._dead_letters.flush(5)
            self._dead_letters = None

    def run(self, stop: threading.Event) -> None:
        """Open, loop until `stop` is set, close (also on errors)."""
        try:
            self.open()
            while not stop.is_set():
                self.step()
        finally:
            self.close()
            log.warning("planner %s stopped", self.planner_id)

    # ------------------------------------------------------------------------------ loop
    def step(self) -> None:
        """One iteration: leadership, a batch of rates, and a plan when one is due."""
        assert self._leadership is not None
        leader = self._leadership.poll()
        now = self._mono()
        if leader and not self._active and now >= self._retry_at:
            self._activate()
        elif not leader and self._active:
            self._step_down("another instance holds the plans partition now")
        self._read_rates(0.05 if self._active else 0.2)
        if self._active and self._mono() >= self._next_tick:
            self._next_tick = self._mono() + self.config.interval_s
            self._tick()
        if self._active:
            self._guard()

    def _activate(self) -> None:
        log.warning(
            "planner %s is now the active instance: fencing older ones and recovering the plans "
            "topic",
            self.planner_id,
        )
        publisher = PlanPublisher(
            self.settings,
            transactional_id=self.config.transactional_id(self.settings.topic_prefix),
            planner_id=self.planner_id,
            max_chunk_bytes=self.config.max_chunk_bytes,
            transaction_timeout_ms=self.config.transaction_timeout_ms,
            on_chunk=self._on_chunk,
        )
        try:
            recovery = publisher.start()
        except CacheRouteError as exc:
            publisher.close()
            self._retry_at = self._mono() + _RETRY_S
            log.error("could not become active: %s; retrying in %gs", exc, _RETRY_S)
            return
        self._publisher = publisher
        self._live = recovery.live.plan if recovery.live is not None else None
        self._active = True
        self._windows_planned = -1
        self._next_tick = self._mono()  # plan at once: the old active one may be long gone
        self.metrics.active.set(1)
        self.metrics.takeovers.inc()
        if self._live is not None:
            self._plan_gauges(self._live)
        log.warning(
            "recovered %s in %.2fs: live version %s, next version %d (%d records read)",
            self.settings.topics["plans"],
            recovery.seconds,
            "none" if recovery.live is None else recovery.live.version,
            recovery.next_version,
            recovery.records,
        )
        self._recovery_findings(recovery)

    def _recovery_findings(self, recovery: Recovery) -> None:
        """Log loudly what recovery did not trust, and what it will repair."""
        plans = self.settings.topics["plans"]
        for reason, count in recovery.ignored.items():
            self.metrics.plan_records_ignored.labels(reason).inc(count)
        if recovery.ignored.get("implausible-version"):
            log.error(
                "%d header/chunk record(s) on %s carry a version above %d (the highest: %s), far "
                "above the newest verified version %s: not written by a planner (forged or "
                "corrupt). Their versions are ignored and publishing continues at %d; readers "
                "never apply such a version without its complete, checksummed chunks",
                recovery.ignored["implausible-version"],
                plans,
                recovery.ceiling,
                recovery.highest_ignored,
                "none" if recovery.live is None else recovery.live.version,
                recovery.next_version,
            )
        if recovery.ignored.get("out-of-range"):
            log.error(
                "%d header/chunk record(s) on %s break the protocol's bounds (version, chunk or "
                "key count): ignored",
                recovery.ignored["out-of-range"],
                plans,
            )
        if recovery.damaged:
            log.warning(
                "the newest record under %s on %s is not live version %s's (a foreign tombstone "
                "or value; compaction would erase the live plan): re-publishing it",
                _keys(recovery.damaged),
                plans,
                "none" if recovery.live is None else recovery.live.version,
            )

    def _step_down(self, reason: str | None) -> None:
        if self._publisher is not None:
            self._publisher.close()
            self._publisher = None
        if self._active and reason is not None:
            log.warning("planner %s steps down to standby: %s", self.planner_id, reason)
        self._active = False
        self._next_tick = float("inf")
        self.metrics.active.set(0)

    # ----------------------------------------------------------------------------- rates
    def _read_rates(self, timeout: float) -> None:
        assert self._rates is not None
        assert self._smoother is not None
        batch = self._rates.poll(_RATES_BATCH, timeout)
        now_ms = self._now_ms()
        outcomes = {"accepted": 0, "replaced": 0, "late": 0, "invalid": 0, "error": 0}
        before = dict(self._smoother.rejections)
        clamped, scaled = self._smoother.clamped, self._smoother.scaled
        failed: tuple[int, KeyRate, BaseException] | None = None
        for partition, rate, stamp in batch.rates:
            try:
                outcomes[self._smoother.add(rate, partition, now_ms, stamp)] += 1
            except Exception as exc:  # one record must not drop the rest
                # An unforeseen bug or value in one record: skip it, keep the batch's others
                # (they are already consumed; re-raising would lose them for good).
                outcomes["error"] += 1
                failed = failed or (partition, rate, exc)
        for outcome, count in outcomes.items():
            if count:
                self.metrics.rates_records.labels(outcome).inc(count)
        if outcomes["invalid"]:
            self._log_rejections(before)
        if failed is not None:
            bad_partition, bad_rate, error = failed
            log.error(
                "%d KeyRate record(s) could not be handled; each is skipped, the records after "
                "it are not; e.g. key %r window %d from partition %d: %s: %s",
                outcomes["error"],
                str(bad_rate.key)[:64],
                bad_rate.window_start_ms,
                bad_partition,
                type(error).__name__,
                error,
                exc_info=error,
            )
        if batch.garbage:
            self._garbage(batch)
        folded = self._smoother.advance(now_ms)
        if self._smoother.clamped > clamped:
            self.metrics.rates_records.labels("clamped").inc(self._smoother.clamped - clamped)
        if self._smoother.scaled > scaled:
            self.metrics.rates_records.labels("scaled").inc(self._smoother.scaled - scaled)
        self._log_limits()
        if folded:
            self.metrics.windows_folded.inc(len(folded))
            log.info(
                "folded %d rate window(s) ending %s: %d keys tracked",
                len(folded),
                time.strftime("%H:%M:%S", time.gmtime(self._smoother.newest_end_ms / 1000)),
                self._smoother.tracked_keys,
            )
        self.metrics.tracked_keys.set(self._smoother.tracked_keys)
        if self._smoother.newest_end_ms:
            lag = max(0.0, (now_ms - self._smoother.newest_end_ms) / 1000)
            self.metrics.input_lag_seconds.set(lag)
        mono = self._mono()
        if mono - self._last_lag_check >= 5.0:
            self._last_lag_check = mono
            self.metrics.rates_lag_records.set(self._rates.lag())

    def _log_limits(self) -> None:
        """One warning per folded window whose rates were cut to plausible ones, with why."""
        assert self._smoother is not None
        params = self._smoother.params
        limits = self._smoother.limits
        while limits:
            lim = limits.popleft()
            ref = (
                "the window's key count x its median key rate (no smoothed total yet)"
                if lim.first
                else "the smoothed cluster total"
            )
            log.warning(
                "rate window %s: reported a total of %.4g requests/s, folded as %.4g; "
                "reference total %.4g/s (%s): %d key rate(s) clamped to max_surge %g x "
                "max(it, max_key_rate / 1000), %d key rate(s) scaled down to keep the window's "
                "total within max_total_growth %g x max(it, total_floor %g/s); largest cut: key "
                "%s. Real traffic does not grow that fast: check the streams worker and whoever "
                "writes to the rates topic",
                time.strftime("%H:%M:%S", time.gmtime(lim.window_start_ms / 1000)),
                lim.reported,
                lim.folded,
                lim.reference,
                ref,
                lim.clamped,
                params.max_surge,
                lim.scaled,
                params.max_total_growth,
                params.total_floor,
                lim.largest,
            )

    def _log_rejections(self, before: dict[Rejection, int]) -> None:
        """One warning per poll that rejected records: counts per reason, an example each."""
        assert self._smoother is not None
        hints = {
            "malformed": "impossible values",
            "future": "from the future: a streams worker's or producer's clock is ahead, or a "
            "forged record",
            "implausible": "rate above max_key_rate",
        }
        for reason, total in self._smoother.rejections.items():
            new = total - before.get(reason, 0)
            if new:
                log.warning(
                    "%d KeyRate record(s) ignored, %s; e.g. %s",
                    new,
                    hints[reason],
                    self._smoother.last_rejection.get(reason, "?"),
                )

    def _garbage(self, batch: RatesBatch) -> None:
        self.metrics.rates_records.labels("garbage").inc(len(batch.garbage))
        for value, key, reason, where in batch.garbage:
            log.warning("undecodable record %s: %s", where, reason)
            if self._active and self._dead_letters is not None:  # standbys count, not re-send
                self._dead_letters.produce(
                    self.settings.topics["dead_letter"],
                    value=value,
                    key=key,
                    headers=[
                        ("cacheroute.reason", reason.encode()),
                        ("cacheroute.source", where.encode()),
                        ("cacheroute.stage", b"planner"),
                    ],
                )
                self._dead_letters.poll(0)

    # ------------------------------------------------------------------------------ plan
    def _tick(self) -> None:
        assert self._smoother is not None
        assert self._publisher is not None
        snap = self._smoother.snapshot()
        now_ms = self._now_ms()
        live = self._live
        stale = (
            None
            if live is None
            else refresh_reason(live.created_ms, now_ms, self.config.plan_max_age_s)
        )
        refresh = stale is not None
        if len(snap) == 0:
            if stale is not None and live is not None:
                self._refresh(live, now_ms, snap, stale)
            else:
                self._skip("no-rates", "no complete rate window yet")
            return
        if live is not None and snap.windows == self._windows_planned and not refresh:
            self._skip(
                "no-new-rates", f"no rate window completed since the last plan ({snap.windows})"
            )
            return
        self._windows_planned = snap.windows
        tokens = snap.prefix_tokens if self.config.params.admission == "bytes" else None
        rates = planning_rates(snap, self.config.work_unit_tokens)
        started = time.perf_counter()
        try:
            candidate = build_plan(
                snap.keys,
                rates,
                self.config.destinations,
                self.config.params,
                prev=live,
                prefix_tokens=tokens,
                version=self._publisher.next_version,
                created_ms=now_ms,
            )
            candidate.validate()
        except PlannerError as exc:
            self._skip("build-failed", f"{exc}; the live plan stays")
            log.error("building a plan failed: %s; version %s stays live", exc, _v(live))
            return
        self.metrics.build_seconds.observe(time.perf_counter() - started)
        advice = advise(
            live,
            candidate,
            snap.keys,
            rates,
            prefix_tokens=tokens,
            rewarm_s=self.config.rewarm_s,
        )
        if advice.publish:
            self._publish(candidate, "advisor", "; ".join(advice.reasons), snap)
        elif stale is not None and live is not None:
            self._refresh(live, now_ms, snap, stale)
        else:
            self._skip("advisor", advice.reasons[0])

    def _refresh(self, live: Plan, now_ms: int, snap: RatesSnapshot, why: str) -> None:
        assert self._publisher is not None
        again = dataclasses.replace(live, version=self._publisher.next_version, created_ms=now_ms)
        self._publish(again, "refresh", f"live plan v{live.version} {why}; same routing", snap)

    def _publish(self, plan: Plan, kind: str, why: str, snap: RatesSnapshot) -> None:
        assert self._publisher is not None
        prev = self._live
        try:
            result = self._publisher.publish(plan, inputs_until_ms=snap.newest_end_ms)
        except CacheRouteError as exc:
            if not isinstance(exc, FencedError):
                self._skip("publish-failed", str(exc))
            self._write_failed(exc)
            return
        self._live = plan
        self.metrics.publishes.labels(kind).inc()
        self.metrics.publish_seconds.observe(result.seconds)
        self.metrics.publish_bytes.set(result.bytes)
        self.metrics.publish_chunks.set(result.chunks)
        moved = plan_diff(prev, plan).changed_rate_fraction if prev is not None else 1.0
        self.metrics.moved_rate_fraction.set(moved)
        self._plan_gauges(plan)
        log.warning(
            "published plan v%d (%s: %s): %d admitted keys, sum k %d/%d, max/mean %.3f, moved "
            "rate %.1f%%; %d chunks, %d tombstones, %d bytes in %.2fs",
            plan.version,
            kind,
            why,
            plan.n_admitted,
            plan.slots_used,
            plan.params.capacity_slots(len(plan.destinations)),
            plan.max_over_mean(),
            100 * moved,
            result.chunks,
            result.tombstones,
            result.bytes,
            result.seconds,
        )

    def _write_failed(self, exc: CacheRouteError) -> None:
        """A publish or repair failed: step down when fenced or when the publisher is unusable."""
        if isinstance(exc, FencedError):
            self.metrics.fenced.inc()
            log.error("%s; stepping down to standby", exc)
            self._step_down("fenced by a newer instance")
            assert self._leadership is not None
            self._leadership.rejoin()
            return
        log.error("%s", exc)
        if self._publisher is not None and not self._publisher.usable:
            self._step_down("the publisher cannot continue; re-activating")
            self._retry_at = self._mono() + _RETRY_S

    # ------------------------------------------------------------------------- the topic
    def _guard(self) -> None:
        """Count and log foreign records on the plans topic; re-publish what they shadow."""
        publisher = self._publisher
        if publisher is None:
            return
        try:
            foreign = publisher.watch()
        except Exception:  # watching is a safeguard: it must never stop planning
            log.exception("reading the plans topic back failed; retrying")
            return
        if foreign:
            self._foreign(foreign)
        if not publisher.damaged or self._mono() < self._repair_at:
            return
        self._repair_at = self._mono() + _REPAIR_SPACING_S
        damaged = publisher.damaged
        try:
            result = publisher.repair()
        except CacheRouteError as exc:
            self._write_failed(exc)
            return
        if result is None:
            return
        self.metrics.repairs.inc()
        log.warning(
            "re-published plan v%d (%d chunk(s) and its header, byte for byte) over foreign "
            "records under %s in %.2fs, so compaction keeps the live plan",
            result.version,
            result.chunks,
            _keys(damaged),
            result.seconds,
        )

    def _foreign(self, records: list[ForeignRecord]) -> None:
        """Count every foreign record; log at most one line a second (a flood is one line)."""
        for record in records:
            self.metrics.foreign_records.labels(record.kind).inc()
        self._foreign_unlogged += len(records)
        mono = self._mono()
        if mono - self._last_foreign_log < 1.0:
            return
        self._last_foreign_log = mono
        last = records[-1]
        log.warning(
            "%d record(s) on %s that this planner did not write, the last a %s under %r at %s%s",
            self._foreign_unlogged,
            self.settings.topics["plans"],
            "tombstone" if last.tombstone else "value",
            last.key.decode(errors="replace"),
            last.where,
            "; the live version is re-published over those that shadow it"
            if any(r.damaging for r in records)
            else "",
        )
        self._foreign_unlogged = 0

    def _plan_gauges(self, plan: Plan) -> None:
        self.metrics.version.set(plan.version)
        self.metrics.admitted_keys.set(plan.n_admitted)
        self.metrics.slots_used.set(plan.slots_used)
        self.metrics.imbalance.set(plan.max_over_mean())

    def _skip(self, reason: str, detail: str) -> None:
        self.metrics.skips.labels(reason).inc()
        log.info("not publishing (%s): %s", reason, detail)

    def _now_ms(self) -> int:
        return int(self._clock() * 1000)


def _v(plan: Plan | None) -> str:
    return "none" if plan is None else str(plan.version)


def _keys(keys: Iterable[bytes]) -> str:
    names = sorted(k.decode(errors="replace") for k in keys)
    return ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")
