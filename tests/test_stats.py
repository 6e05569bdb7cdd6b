"""The planned-comparison statistics (stats.py): Holm and the planner against hand-computed values,
and the whole procedure calibrated by simulating many suites from known distributions (no training):
under the null the family-wise rate of better/worse verdicts stays at alpha, and an effect of
min_effect is found at least 80% of the time with the seeds the planner asks for."""
import gc
import math

import numpy as np
import pytest
from scipy import stats as scipy_stats

import stats

ALPHA = 0.05


@pytest.fixture(autouse=True)
def no_garbage_collection_per_holm_call(monkeypatch):
    """statsmodels' multipletests runs gc.collect() on every call: negligible once per report, most of
    the time of a simulation that calls it thousands of times."""
    monkeypatch.setattr(gc, "collect", lambda *args: 0)


def test_holm_matches_the_hand_computation_of_the_ra_twin():
    # Raw p of learn, early, all, late in the RA twin's report; Holm multiplies the i-th smallest by
    # (k - i + 1) and keeps the sequence monotone: 4 x 0.0095, 3 x 0.045 -> 0.135, max(0.135, 2 x 0.048), 1 x 0.30.
    assert stats.holm([0.0095, 0.045, 0.048, 0.30], ALPHA) == pytest.approx([0.038, 0.135, 0.135, 0.30])
    assert stats.holm([0.30, None, 0.01], ALPHA) == pytest.approx([0.30, None, 0.02])


def test_the_planner_matches_the_power_formula_and_the_research_notes():
    # RESEARCH.md: paired sd 0.012, n = 3 sees ~0.04; 0.01 needs ~15 seeds (~21 with Holm over 4); 0.02 ~6.
    one = stats.plan_seeds(0.012, 3, 1, ALPHA, 0.01)
    assert one["detectable"] == pytest.approx(0.039, abs=0.002) and one["underpowered"]
    assert 13 <= one["seeds_needed"] <= 15
    assert 19 <= stats.plan_seeds(0.012, 3, 4, ALPHA, 0.01)["seeds_needed"] <= 21
    assert stats.plan_seeds(0.012, 3, 1, ALPHA, 0.02)["seeds_needed"] == 6
    # The noncentral-t power at the planned n really is 80% (scipy, independent of statsmodels' solver).
    n, level = one["seeds_needed"], ALPHA
    crit = scipy_stats.t.ppf(1 - level / 2, n - 1)
    nc = 0.01 / 0.012 * math.sqrt(n)
    power = scipy_stats.nct.sf(crit, n - 1, nc) + scipy_stats.nct.cdf(-crit, n - 1, nc)
    assert power >= 0.8 and stats.detectable_effect(0.012, n, level) <= 0.01
    text = stats.describe_plan(one)
    assert "warning: underpowered" in text and "needs 14 seeds" in text


def simulate(k, n, effects, sd_diff, min_effect, suites, rng):
    """Verdict counts over simulated suites: k variants against one baseline over n paired seeds.
    Variants share the baseline run of each seed, so their differences are correlated, as in a suite."""
    level = stats.family_level(ALPHA, k)
    words = []
    for _ in range(suites):
        base = rng.normal(0.0, sd_diff / math.sqrt(2), size=n)
        diffs = [rng.normal(effects[i], sd_diff / math.sqrt(2), size=n) - base for i in range(k)]
        tests = [stats.paired_test(d, level, min_effect) for d in diffs]
        adjusted = stats.holm([t["p"] for t in tests], ALPHA)
        words.append([stats.verdict(t, p, ALPHA, level, "lower", min_effect)[0] for t, p in zip(tests, adjusted)])
    return words


def test_under_the_null_the_family_wise_rate_of_verdicts_stays_at_alpha():
    rng = np.random.default_rng(20)
    suites = 2000
    words = simulate(k=4, n=3, effects=[0.0] * 4, sd_diff=0.012, min_effect=0.01, suites=suites, rng=rng)
    rate = np.mean([any(w in ("better", "worse") for w in family) for family in words])
    monte_carlo = 3 * math.sqrt(ALPHA * (1 - ALPHA) / suites)
    assert rate <= ALPHA + monte_carlo, rate
    # Without Holm the same tests would claim far more: each at 0.05, four of them.
    raw = np.mean([any(stats.paired_test(rng.normal(0, 0.012, 3), ALPHA)["p"] < ALPHA for _ in range(4))
                   for _ in range(1000)])
    assert raw > ALPHA + monte_carlo


def test_an_effect_of_min_effect_is_found_with_the_seeds_the_planner_asks_for():
    rng = np.random.default_rng(21)
    k, sd, min_effect = 4, 0.012, 0.01
    seeds = stats.plan_seeds(sd, 3, k, ALPHA, min_effect)["seeds_needed"]
    suites = 800
    words = simulate(k=k, n=seeds, effects=[-min_effect, 0.0, 0.0, 0.0], sd_diff=sd, min_effect=min_effect,
                     suites=suites, rng=rng)
    found = np.mean([family[0] == "better" for family in words])
    assert found >= 0.8 - 3 * math.sqrt(0.16 / suites), found
    # and with the three seeds of today's suites it would mostly be missed: inconclusive, not "no effect"
    words = simulate(k=k, n=3, effects=[-min_effect, 0, 0, 0], sd_diff=sd, min_effect=min_effect, suites=300, rng=rng)
    assert np.mean([family[0] == "better" for family in words]) < 0.3
    assert np.mean([family[0] == "inconclusive" for family in words]) > 0.7


def test_equivalence_is_claimed_rarely_when_the_true_effect_sits_on_the_margin():
    """TOST at the family level: with the true difference exactly at min_effect, 'equivalent' may be
    said at most at the per-comparison level (alpha / k)."""
    rng = np.random.default_rng(22)
    k, suites = 4, 1000
    words = simulate(k=k, n=20, effects=[0.01] * k, sd_diff=0.012, min_effect=0.01, suites=suites, rng=rng)
    rate = np.mean([family[0] == "equivalent" for family in words])
    level = ALPHA / k
    assert rate <= level + 3 * math.sqrt(level * (1 - level) / suites), rate
    # while a true null with enough seeds is shown equivalent most of the time
    words = simulate(k=k, n=20, effects=[0.0] * k, sd_diff=0.012, min_effect=0.01, suites=300, rng=rng)
    assert np.mean([family[0] == "equivalent" for family in words]) > 0.5
