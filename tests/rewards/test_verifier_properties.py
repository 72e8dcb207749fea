"""Every packaged text verifier against random and adversarial completions (hypothesis, bounded).

Properties: no completion up to 1 MB makes a verifier raise or take more than `BOUND_S`; a final
answer that is wrong, or that hedges between a wrong and the right value, never passes; and the
longest time the GIL is held during a reward call (a ticker thread that sleeps 1 ms and records
its largest gap) stays under 0.1 s for the shapes that used to hold it for seconds.

The math verifier's symbolic worker is replaced by a stub that records what it is handed: what is
tested here is the parsing in the trainer's own process (the worker runs in a child process with
its own time limit).
"""

from __future__ import annotations

import threading
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rlvr.agents.envs.calculator import Calculator, calc
from rlvr.agents.tools import ToolRegistry, parse_action
from rlvr.rewards import answers
from rlvr.rewards import format as fmt
from rlvr.rewards import math as m
from rlvr.tasks.arithmetic import Arithmetic
from rlvr.tasks.countdown import Countdown
from rlvr.tasks.sudoku import Sudoku4

BOUND_S = 0.5  # per call on a 1 MB completion; honest calls take microseconds
MB = 1_000_000
FRAGMENTS = ["<answer>", "</answer>", "\\boxed{", "\\fbox{", "{", "}", "answer:", "The answer is ", "\n", " ",
             "1", "9", "1e", "e9", ".", ",", "-", "\u2212", "\u0664", "####", "$", "\\frac{", "\\pm", " or ", "=",
             "<think>", "</think>", "(", ")", "3+5*2", "\\text{", "x = ", "%", "\\left(", "\t"]
SETTINGS = settings(max_examples=40, deadline=None, database=None, derandomize=True,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])


@pytest.fixture(autouse=True)
def stub_worker(monkeypatch):
    handed: list[tuple[str, str]] = []

    def equal(pred: str, gold: str, timeout_s: float) -> bool:
        handed.append((pred, gold))
        return False
    monkeypatch.setattr(m, "symbolic_equal", equal)  # the pool is bounded on its own: here, what reaches it
    return handed


_COUNTDOWN, _COUNTDOWN_STEPS = Countdown(), Countdown(show_work=True)
_SUDOKU, _ARITH, _AGENT = Sudoku4(), Arithmetic(), Calculator()
VERIFIERS = {
    "math lenient": lambda c: m.math_reward("q", c, answer="#### 72"),
    "math strict": lambda c: m.math_reward("q", c, answer="\\frac{1}{2}", strict=True),
    "math choice": lambda c: m.math_reward("q", c, answer="C"),
    "tag format": fmt.tag_format_reward,
    "tag count": fmt.tag_count_reward,
    "extract tag": fmt.extract_tag,
    "countdown": lambda c: _COUNTDOWN.reward("3 5 2>13:", c),
    "countdown steps": lambda c: _COUNTDOWN_STEPS.reward("3 5 2>13:", c),
    "sudoku4": lambda c: _SUDOKU.reward("1234341221434301:", c),
    "arithmetic": lambda c: _ARITH.reward("47+385=", c, answer="432"),
    "agent answer": lambda c: _AGENT.reward("q", c, answer="42"),
}


def _adversarial():
    """A fragment repeated to up to 1 MB, with a random prefix and suffix."""
    return st.builds(lambda head, frag, n, tail: head + frag * n + tail, st.text(max_size=40),
                     st.sampled_from(FRAGMENTS), st.integers(1, MB // 8), st.text(max_size=40))


def _timed(fn, text):
    start = time.perf_counter()
    fn(text)
    return time.perf_counter() - start


@pytest.mark.parametrize("name", sorted(VERIFIERS))
@SETTINGS
@given(text=st.one_of(st.text(max_size=2000), _adversarial()))
def test_never_raises_and_is_bounded(name, text, stub_worker):
    assert _timed(VERIFIERS[name], text) < BOUND_S
    assert all(len(p) <= answers.MAX_ANSWER_CHARS for p, _ in stub_worker)


HEDGES = ["x = {w} \\text{{ or }} x = {r}", "{w} or {r}", "{r}, {w}", "\\pm {r}", "[{w}, {r}]", "\\{{{r}, {w}\\}}",
          "{w} = {r}", "{r} = {w}", "{w}; {r}", "{w} \\quad {r}", "{r} \\text{{ and }} {w}", "{w} \\le x \\le {r}"]
WRAPS = ["\\boxed{{{h}}}", "<answer>{h}</answer>", "#### {h}", "The answer is {h}.", "\\boxed{{{w}}} \\boxed{{{r}}}"]
PADDING = st.text(alphabet="abcdefgh xyz.,:;()+-*=\n0123456789", max_size=300)


@SETTINGS
@given(r=st.integers(-10**9, 10**9), w=st.integers(-10**9, 10**9), hedge=st.sampled_from(HEDGES),
       wrap=st.sampled_from(WRAPS), padding=PADDING)
def test_a_hedge_never_passes(r, w, hedge, wrap, padding):
    if r == w:
        w += 1
    h = hedge.format(r=r, w=w)
    completion = padding + "\n" + wrap.format(h=h, r=r, w=w)
    assert m.math_reward("q", completion, answer=str(r)) == 0.0
    assert m.math_reward("q", completion, answer=f"#### {w}") == 0.0


@SETTINGS
@given(r=st.integers(-10**7, 10**7), delta=st.sampled_from(["1", "0.0001", "-0.0001", "-1", "10"]),
       wrap=st.sampled_from(WRAPS[:4]), padding=PADDING, sep=st.booleans())
def test_a_near_miss_never_passes(r, delta, wrap, padding, sep):
    from fractions import Fraction

    wrong = Fraction(r) + Fraction(delta)
    shown = f"{wrong.numerator}" if wrong.denominator == 1 else f"{float(wrong):.4f}"
    if sep and wrong.denominator == 1:
        shown = f"{wrong.numerator:,}"
    completion = padding + "\n" + wrap.format(h=shown)
    assert m.math_reward("q", completion, answer=str(r)) == 0.0
    assert m.math_reward("q", completion.replace(shown, str(r)), answer=str(r)) == 1.0


SHAPES = {  # the completions that used to hold the GIL for seconds, and their neighbours, at 1 MB
    "sci-exponent": "\\boxed{1e999999999}",
    "digit-run": "\\boxed{" + "1" * MB + "x}",
    "open-tags": "<answer>" * (MB // 8),
    "answer-newlines": "answer:" + "\n" * MB,
    "nested-boxes": "\\boxed{" * (MB // 7),
    "braces": "{" * MB,
    "answer-words": "the answer is " * (MB // 14),
    "hashes": "####" * (MB // 4),
    "commas": "1," * (MB // 2),
    "think-tags": "<think>" * (MB // 7) + "</think>",
    "tool-calls": "<calc>" * (MB // 6) + "<tool_call>" * 1000,
}


def _longest_gil_hold(fn) -> float:
    gaps, stop = [0.0], threading.Event()

    def tick():
        last = time.perf_counter()
        while not stop.is_set():
            time.sleep(0.001)
            now = time.perf_counter()
            gaps[0] = max(gaps[0], now - last)
            last = now
    ticker = threading.Thread(target=tick, daemon=True)
    ticker.start()
    time.sleep(0.01)
    try:
        fn()
    finally:
        time.sleep(0.01)
        stop.set()
        ticker.join()
    return gaps[0]


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_no_reward_call_holds_the_gil(shape):
    text = SHAPES[shape]

    registry = ToolRegistry.of(calc)

    def score_everywhere():
        for fn in VERIFIERS.values():
            fn(text)
        parse_action(text, registry)  # the agent loop's parser: linear, though pure Python (not under BOUND_S)
    hold = min(_longest_gil_hold(score_everywhere) for _ in range(2))  # the better of two: a busy host adds noise
    assert hold < 0.1, f"{shape}: the GIL was held {hold:.3f} s"


def test_the_ticker_sees_a_held_gil():
    """The canary: a C call that holds the GIL (an int power of ten) is seen by the ticker."""
    assert _longest_gil_hold(lambda: 10 ** 800_000 % 7) > 0.1
