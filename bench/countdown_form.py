"""A verifiable form constraint for Countdown, blind to correctness: 1.0 when the completion parses
under the task's grammar and uses exactly the given numbers, each once; 0.0 otherwise. Whether its
value hits the target is not looked at.

`bench/reward_hacking.py`'s `form_gated` condition adds it to the learned reward with a weight above
that reward's range, so the reward model's score only ranks completions of the form it was trained
on (expressions over the problem's numbers) and nothing malformed can outscore them.
"""

from rlvr.tasks.countdown import Countdown

_NUMBERS_USED = Countdown(partial_credit="numbers", heldout_size=0)  # 0.1 needs the given numbers


def score(prompt: str, completion: str, **example) -> float:
    return float(_NUMBERS_USED.reward(prompt, completion, **example) > 0.0)
