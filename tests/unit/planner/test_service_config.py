"""`planner run` configuration: TOML file < flags, validated once, errors name the key."""

from __future__ import annotations

from pathlib import Path

import pytest

from cacheroute.errors import ConfigError
from cacheroute.planner import Destination
from cacheroute.planservice.config import load_service_config


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "planner.toml"
    path.write_text(text, encoding="utf-8")
    return path


def test_file_then_flags(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """
q_cap = 8.0
warm_slots = 100
interval_s = 30
ewma_alpha = 0.25
settle_s = 1.5
destinations = [{name = "a", capacity = 2.0}, "b"]
max_plan_age_s = 0
""",
    )
    config = load_service_config(path, {"warm_slots": 7, "hysteresis": None})
    assert config.destinations == (Destination("a", 2.0), Destination("b", 1.0))
    assert config.params.q_cap == 8.0
    assert config.params.warm_slots == 7  # the flag wins
    assert config.params.hysteresis == 0.2  # None flags do not override
    assert config.interval_s == 30.0
    assert config.smoothing.alpha == 0.25
    assert config.smoothing.settle_ms == 1500
    assert config.plan_max_age_s == 0.0
    assert config.lookback_s == 90.0
    assert config.transactional_id("t.") == "t.cacheroute-planner"


def test_defaults_and_counted_destinations() -> None:
    config = load_service_config(None, {"destinations": 3, "q_cap": 1.0, "warm_slots": 2})
    assert [d.name for d in config.destinations] == ["d0", "d1", "d2"]
    assert config.plan_max_age_s == 120.0  # 2 intervals: below the dispatcher staleness limit
    assert config.metrics_port is None
    assert config.work_unit_tokens == 512  # plans on work in the gateways' unit by default


def test_work_unit_tokens_zero_plans_on_request_counts() -> None:
    base = {"destinations": 3, "q_cap": 1.0, "warm_slots": 2}
    assert load_service_config(None, {**base, "work_unit_tokens": 0}).work_unit_tokens is None
    assert load_service_config(None, {**base, "work_unit_tokens": 64}).work_unit_tokens == 64
    with pytest.raises(ConfigError, match="work_unit_tokens"):
        load_service_config(None, {**base, "work_unit_tokens": -1})
    assert (
        load_service_config(None, {**base, "max_prompt_tokens": 9}).smoothing.max_prompt_tokens == 9
    )


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("q_cap = 1.0\nwarm_slots = 1\n", "'destinations' is missing"),
        ("destinations = 2\nwarm_slots = 1\n", "'q_cap' is missing"),
        ("destinations = 2\nq_cap = 1.0\nwarm_slots = 1\nq_cpa = 3\n", "unknown keys q_cpa"),
        ("destinations = 2\nq_cap = -1.0\nwarm_slots = 1\n", "q_cap must be"),
        ("destinations = 2\nq_cap = 1.0\nwarm_slots = 1.5\n", "must be an integer"),
        ("destinations = 0\nq_cap = 1.0\nwarm_slots = 1\n", "at least one destination"),
        ('destinations = ["a", "a"]\nq_cap = 1.0\nwarm_slots = 1\n', "duplicate destination"),
        ("destinations = 2\nq_cap = 1.0\nwarm_slots = 1\newma_alpha = 2\n", "alpha"),
        ('destinations = 2\nq_cap = 1.0\nwarm_slots = 1\nadmission = "x"\n', "rate or bytes"),
        ("destinations = 2\nq_cap = 1.0\nwarm_slots = 1\nmax_chunk_bytes = 10\n", "max_chunk"),
        ("destinations = [\n", "not valid TOML"),
    ],
)
def test_errors_name_the_key(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_service_config(write(tmp_path, text))


def test_planner_extensions_are_on_by_default_and_can_be_turned_off(tmp_path: Path) -> None:
    base = {"destinations": 4, "q_cap": 8.0, "warm_slots": 10}
    deployed = load_service_config(None, base)
    assert (deployed.params.fair_share, deployed.params.group_separator) == (0.5, "/")
    paper = load_service_config(None, base | {"fair_share": 0.0, "group_separator": ""})
    assert (paper.params.fair_share, paper.params.group_separator) == (None, None)
    path = write(
        tmp_path, 'q_cap = 8.0\nwarm_slots = 10\ndestinations = 2\ngroup_separator = ":"\n'
    )
    assert load_service_config(path).params.group_separator == ":"
    with pytest.raises(ConfigError, match="group_separator"):
        load_service_config(None, base | {"group_separator": 3})
    with pytest.raises(ConfigError, match="fair_share"):
        load_service_config(None, base | {"fair_share": -1.0})
