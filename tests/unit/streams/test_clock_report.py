"""Who reports a skewed clock: the worker's choice of trusted clock, and `cacheroute doctor`'s
reading of the dead-letter headers the worker writes (pure parts, no broker)."""

from __future__ import annotations

from cacheroute.doctor import GatewayClock, check_clocks, tally_clock_headers
from cacheroute.streams.app import LOG_APPEND_TIME, trusted_clock

NOW = 1_800_000_000_000


def test_broker_append_time_is_trusted_alone() -> None:
    assert trusted_clock(1_800_000_600.0, LOG_APPEND_TIME, NOW) == (
        1_800_000_600_000,
        "broker timestamp",
    )


def test_create_time_is_bounded_by_the_worker_clock() -> None:
    assert trusted_clock(1_799_999_999.5, 0, NOW) == (1_799_999_999_500, "Kafka timestamp")
    # the producer's own clock is 10 min ahead: it cannot vouch for its records
    assert trusted_clock(1_800_000_600.0, 0, NOW) == (NOW, "worker clock")


def test_no_timestamp_falls_back_to_the_worker_clock() -> None:
    assert trusted_clock(None, None, NOW) == (NOW, "worker clock")
    assert trusted_clock(-0.001, 0, NOW) == (NOW, "worker clock")


def _h(**kv: str) -> list[tuple[str, bytes | None]]:
    return [(f"cacheroute.{k}", v.encode()) for k, v in kv.items()]


def test_tally_sums_events_per_gateway_and_skips_other_dead_letters() -> None:
    records = [
        _h(reason="negative prompt_tokens", gateway="gw-0"),  # not a clock problem
        _h(reason="x", clock="ahead", gateway="gw-fast", events="1", skew_ms="600000"),
        _h(reason="x", clock="ahead", gateway="gw-fast", events="1", skew_ms="600250"),
        _h(reason="x", clock="ahead", gateway="gw-2100", events="0", skew_ms="2338000000000"),
        _h(reason="x", clock="late", gateway="gw-slow", events="40", skew_ms="598000"),
        _h(reason="x", clock="late", gateway="gw-slow", events="2", skew_ms="601000"),
        _h(reason="unknown format marker"),
    ]
    got = tally_clock_headers(records)
    assert got == {
        "gw-fast": GatewayClock(ahead_events=2, max_ahead_ms=600_250),
        "gw-2100": GatewayClock(ahead_empty=1, max_ahead_ms=2_338_000_000_000),
        "gw-slow": GatewayClock(late_events=42, max_behind_ms=601_000),
    }


def test_check_clocks_names_gateways_worst_first() -> None:
    gateways = {
        "gw-fast": GatewayClock(ahead_events=2, max_ahead_ms=600_250),
        "gw-2100": GatewayClock(ahead_empty=1, max_ahead_ms=2_338_000_000_000),
        "gw-slow": GatewayClock(late_events=42, max_behind_ms=601_000),
    }
    recent = check_clocks(gateways, topic="dlq", window_min=10)
    assert recent.check == "gateway-clocks"
    assert recent.status == "fail"
    assert recent.message == (
        "3 gateway(s) with clock trouble on dlq in the last 10 min: "
        "gw-slow: 42 late event(s) (up to 601.0 s behind the watermark); "
        "gw-fast: 2 future-dated event(s) (up to 600.2 s ahead); "
        "gw-2100: 1 future-dated empty batch(es) (up to 2.34e+09 s ahead)"
    )
    assert "NTP" in recent.fix
    assert recent.detail["gateways"]["gw-slow"]["late_events"] == 42
    retained = check_clocks(gateways, topic="dlq")
    assert retained.status == "warn"  # may be old and fixed: as for the dead-letter check
    assert retained.message.startswith("3 gateway(s) with clock trouble on dlq: ")


def test_check_clocks_shows_the_worst_few_and_counts_the_rest() -> None:
    gateways = {f"gw-{i}": GatewayClock(late_events=i + 1) for i in range(7)}
    finding = check_clocks(gateways, topic="dlq", window_min=5, show=2)
    assert finding.message == (
        "7 gateway(s) with clock trouble on dlq in the last 5 min: "
        "gw-6: 7 late event(s) (up to 0.0 s behind the watermark); "
        "gw-5: 6 late event(s) (up to 0.0 s behind the watermark); and 5 more"
    )
    assert check_clocks({}, topic="dlq").status == "ok"
