"""The engine's policies, without processes: stopping rules, DoP control, verification."""

from __future__ import annotations

import json
import math
import random

import pytest

from measure.dop import DopController, Verification, modified_z_scores, pick_for_verification
from measure.timing import TimingPolicy, should_stop


def test_repeats_stop_when_the_fastest_run_is_confirmed():
    policy = TimingPolicy(min_repeats=3, agree=0.03, confirmations=3)
    assert should_stop([1.0, 1.001], policy, None, 0.0) is None  # below the minimum
    assert should_stop([1.0, 1.001, 0.999, 1.0], policy, None, 0.0) == "confirmed"
    # a burst of interference: the slow runs do not count, three runs near the fastest do
    bursty = [1.4, 1.0, 1.5, 1.3, 1.01]
    assert should_stop(bursty, policy, None, 0.0) is None
    assert should_stop(bursty + [1.02], policy, None, 0.0) == "confirmed"
    assert should_stop(bursty, policy, None, policy.max_seconds) == "time"
    assert should_stop([1.0, 2.0] * 10, policy, None, 0.0) == "repeats"


def test_a_timing_is_its_fastest_run():
    from measure.engine import Measurement

    assert Measurement(run_secs=(1.4e-3, 1.0e-3, 1.5e-3)).latency == 1.0e-3
    assert Measurement(run_secs=(1.0e-3, math.nan)).latency == math.inf  # garbage is a failure, not a value


def test_a_candidate_clearly_slower_than_the_best_stops_early():
    policy = TimingPolicy(slower_than_best=0.2)
    slow = [1.5, 1.6]
    assert should_stop(slow, policy, best_s=1.0, spent_s=0.0) == "slower"
    assert should_stop(slow, policy, best_s=1.4, spent_s=0.0) is None  # within 20%: keep timing
    assert should_stop(slow, policy.isolated(), best_s=1.0, spent_s=0.0) is None  # isolation never cuts short


def test_controller_grows_while_error_is_low_and_cuts_on_a_bad_round():
    dop = DopController(max_level=8)
    assert dop.level == 0 and not dop.overlap_builds
    assert dop.update(None, 0, 10) == 1  # an isolated round is good by definition
    assert dop.update(0.01, 0, 10) == 2
    assert dop.update(0.02, 0, 10) == 4
    assert dop.update(0.20, 0, 10) == 3  # floor(4 * 0.8), ceiling 4 * 1.8 / 2 = 3.6
    assert dop.ceiling == pytest.approx(3.6)
    for _ in range(dop.hold_rounds - 1):
        assert dop.update(0.01, 0, 10) == 3  # at the ceiling: hold a few good rounds
    assert dop.update(0.01, 0, 10) == 4  # then probe past it once
    assert dop.update(0.01, 3, 10) == 3  # too many timeouts count as a bad round
    assert [h["level"] for h in dop.history] == [0, 1, 2, 4, 3, 3, 3, 3, 4]


def test_controller_never_leaves_its_range():
    dop = DopController(max_level=1)
    for _ in range(5):
        dop.update(0.0, 0, 10)
    assert dop.level == 1
    dop.update(0.5, 0, 10)
    assert dop.level == 0
    fixed = DopController(max_level=2, level=2, fixed=True)
    fixed.update(0.9, 5, 10)
    assert fixed.level == 2


def test_timeouts_at_level_0_say_nothing_about_parallelism():
    """A kernel that hangs when timed alone is the kernel's fault: slow start goes on as after a clean round, and a
    ceiling found before stays."""
    dop = DopController(max_level=8)
    dop.update(None, 1, 10)
    for _ in range(3):
        dop.update(0.01, 0, 10)
    assert [h["level"] for h in dop.history] == [0, 1, 2, 4] and dop.level == 8 and dop.ceiling is None
    calibrated = DopController(max_level=8, ceiling=3.0)
    calibrated.update(None, 2, 10)
    assert calibrated.level == 1 and calibrated.ceiling == 3.0


def test_a_parallel_round_that_verified_nothing_holds_the_level():
    """Every candidate failed to build or run, or the round was empty: nothing to grow on, and no good round
    towards probing past the ceiling."""
    assert DopController(max_level=8, level=2).update(None, 0, 0) == 2
    dop = DopController(max_level=8, level=3, ceiling=3.0)
    for _ in range(2 * dop.hold_rounds):
        assert dop.update(None, 0, 10) == 3
    for _ in range(dop.hold_rounds - 1):
        assert dop.update(0.01, 0, 10) == 3
    assert dop.update(0.01, 0, 10) == 4  # only the verified rounds counted towards the probe


def test_controller_starts_from_a_calibration():
    curve = [{"level": 0, "error": 0.01}, {"level": 1, "error": 0.02}, {"level": 2, "error": 0.04},
             {"level": 3, "error": 0.12}]
    dop = DopController.from_calibration(curve, max_level=4)
    assert dop.level == 2 and dop.ceiling == 2
    assert DopController.from_calibration(curve, max_level=1).level == 1


def test_outliers_and_the_contenders_for_the_best_are_always_verified():
    latencies = {i: 1.0 + 0.01 * i for i in range(20)}
    latencies[7] = 30.0  # an outlier in log space
    picked = pick_for_verification(latencies, random.Random(0))
    assert picked == [0, 1, 2, 3, 7]  # the four fastest (all within 15% of the best) and the outlier
    wide = {i: 1.0 + 0.1 * i for i in range(40)}
    picked = pick_for_verification(wide, random.Random(0))
    assert {0, 1} <= set(picked) and len(picked) == math.ceil(0.2 * 40)  # two contenders, and a 20% sample
    spread = {i: 1.0 + 0.5 * i for i in range(20)}  # nothing near the fastest: it alone is a contender
    picked = pick_for_verification(spread, random.Random(0), share=0.0)
    assert picked == [0]
    assert modified_z_scores([1.0, 1.0, 1.0]) == [0.0, 0.0, 0.0]


def test_verification_measures_error_and_removes_bias():
    check = Verification.compare([(1.1, 1.0), (2.2, 2.0)])  # parallel 10% slow
    assert check.error == pytest.approx(0.1)
    assert check.corrected(3.3) == pytest.approx(3.0, rel=1e-2)
    big = Verification.compare([(2.0, 1.0)])  # 50% bias: too large to trust a correction
    assert big.corrected(4.0) == 4.0


class _Engine:
    """Calibration's view of an engine: fixed values alone and at each level."""

    def __init__(self, alone: list[float], by_level: dict[int, list[float]]) -> None:
        from collections import Counter

        from measure.slots import cpu_slots

        self.alone, self.by_level, self.counts, self.slots = alone, by_level, Counter(), cpu_slots(2)

    def measure_isolated(self, target, device_type, candidates):
        from measure.engine import Measurement

        return [Measurement(run_secs=(v,)) for v in self.alone]

    def measure_at(self, level, target, candidates):
        from measure.engine import Measurement

        return [Measurement(run_secs=(v,)) for v in self.by_level[level]]


def test_calibration_bounds_the_mean_error_the_controller_bounds(tmp_path, monkeypatch):
    """Level 1 is right for 8 of 10 candidates and 100% off for 2: its median error is 0, its mean 20%,
    and a tuning round there would fail verification, so calibration does not choose it."""
    import json

    from measure.calibration import calibrate, calibration_path, load_calibration, save_calibration
    from measure.slots import cpu_slots

    engine = _Engine([1.0] * 10, {0: [1.01] * 10, 1: [1.0] * 8 + [2.0] * 2})
    result = calibrate(engine, None, [None] * 10, [0, 1])
    level1 = result["curve"][1]
    assert level1["median_error"] == 0.0 and level1["error"] == pytest.approx(0.2)
    assert result["chosen_level"] == 0
    monkeypatch.setenv("AUTOTUNE_CACHE_DIR", str(tmp_path))
    slot = cpu_slots(2)[0]
    path = save_calibration(result, calibration_path(slot, 2))
    assert load_calibration(slot, 2) == result["curve"]
    stale = {k: v for k, v in result.items() if k != "error_statistic"}  # a curve of medians, saved before
    path.write_text(json.dumps(stale))
    assert load_calibration(slot, 2) is None


def test_a_calibration_is_saved_through_a_fresh_temporary_file_not_a_link_planted_beside_it(tmp_path):
    """Another user who can write the folder plants ``<name>.tmp`` as a link to a victim file: saving must
    neither write through it nor leave a temporary file behind."""
    from measure.calibration import save_calibration

    victim = tmp_path / "victim"
    victim.write_text("precious")
    (tmp_path / "cal.tmp").symlink_to(victim)
    save_calibration({"curve": {}}, tmp_path / "cal.json")
    assert victim.read_text() == "precious"
    assert json.loads((tmp_path / "cal.json").read_text()) == {"curve": {}}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cal.json", "cal.tmp", "victim"]


def test_the_final_ranking_re_times_at_most_k_more_candidates_each_time():
    """In a slow spell every re-timed value rises above the tuning values: the next turn takes the next k, not 2k."""
    from autotune.session import next_to_retime

    values = {i: 1.0 + i / 100 for i in range(20)}  # tuning values, 0 fastest
    first = next_to_retime(values, set(), 3)
    assert first == [0, 1, 2]
    values.update({i: 2.0 for i in first})  # re-timed 2x slower, now behind everything
    assert next_to_retime(values, set(first), 3) == [3, 4, 5]
    values[3] = 0.5  # re-timed and still the fastest: done
    assert next_to_retime(values, {0, 1, 2, 3, 4, 5}, 3) == []
    assert next_to_retime({0: float("inf")}, set(), 3) == []
