import math

import pytest

from rlvr.builder.build import lr_factor


def test_warmup_then_constant():
    assert [lr_factor(i, warmup_steps=4) for i in (0, 1, 3, 100)] == [0.25, 0.5, 1.0, 1.0]


def test_cosine_decays_to_min_ratio_at_the_last_step():
    # warmup 10, total 110: after warmup, progress p = (i + 1 - 10) / 100, factor = m + (1 - m)(1 + cos(pi p)) / 2
    kw = dict(warmup_steps=10, total_steps=110, schedule="cosine", min_ratio=0.1)
    assert lr_factor(9, **kw) == 1.0
    assert lr_factor(59, **kw) == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 0.5)))
    assert lr_factor(109, **kw) == pytest.approx(0.1)
    assert lr_factor(500, **kw) == pytest.approx(0.1)
