"""Student-t quantiles against published table values; CI and area hand-computed."""

import math

import pytest

from rlvr.tracking.stats import mean_ci, normalized_auc, t_cdf, t_quantile


@pytest.mark.parametrize("df, expected", [(1, 12.706204736), (2, 4.302652730), (4, 2.776445105),
                                          (9, 2.262157163), (30, 2.042272456), (1000, 1.962339081)])
def test_t_quantile_975_matches_tables(df, expected):
    assert t_quantile(0.975, df) == pytest.approx(expected, abs=1e-8)


def test_t_cdf_is_symmetric_and_inverts():
    assert t_cdf(0.0, 3) == pytest.approx(0.5)
    assert t_cdf(-1.3, 5) == pytest.approx(1 - t_cdf(1.3, 5))
    assert t_cdf(t_quantile(0.9, 7), 7) == pytest.approx(0.9, abs=1e-10)


def test_mean_ci_by_hand():
    # values 0.2, 0.4, 0.9: mean 0.5, sample std sqrt(((-.3)^2+(-.1)^2+.4^2)/2) = sqrt(0.13)
    mean, half = mean_ci([0.2, 0.4, 0.9])
    assert mean == pytest.approx(0.5)
    assert half == pytest.approx(4.302652730 * math.sqrt(0.13) / math.sqrt(3))
    assert math.isnan(mean_ci([0.7])[1]) and mean_ci([0.7])[0] == 0.7
    assert mean_ci([0.3, 0.3, 0.3]) == (pytest.approx(0.3), 0.0)


def test_normalized_auc_uneven_steps():
    # trapezoids: [0,10] avg 0.5 -> 5; [10,40] avg 1.0 -> 30; total 35 over 40 steps
    assert normalized_auc([0, 10, 40], [0.0, 1.0, 1.0]) == pytest.approx(35 / 40)
    assert normalized_auc([5], [0.25]) == 0.25


def test_accuracy_intervals_are_clipped_to_the_unit_interval():
    from rlvr.tracking.runs import Cell
    from rlvr.tracking.stats import clipped_interval, mean_ci, metric_bounds

    # two seeds at 0.0 and 0.1: 0.05 ± t(0.975, 1) · 0.0707 / √2 = 0.05 ± 12.706 · 0.05 = 0.05 ± 0.635
    mean, half = mean_ci([0.0, 0.1])
    assert round(half, 3) == 0.635
    assert clipped_interval(mean, half, metric_bounds("eval/heldout_accuracy")) == (0.0, pytest.approx(0.685, abs=1e-3))
    assert clipped_interval(0.98, 0.1, (0.0, 1.0)) == (pytest.approx(0.88), 1.0)
    assert clipped_interval(mean, half, metric_bounds("reward/mean"))[0] == pytest.approx(-0.585, abs=1e-3)  # unbounded
    assert [metric_bounds(m) for m in ("reward/accuracy", "response/truncation_rate", "actor/clip_frac_low",
                                       "agent/success", "loss/policy")] == [(0.0, 1.0)] * 4 + [None]
    assert Cell([0.0, 0.1], mean, half, (0.0, 1.0)).text() == "0.050 [0.000, 0.685]"
    assert Cell([0.0, 0.1], mean, half).text() == "0.050 ± 0.635"
