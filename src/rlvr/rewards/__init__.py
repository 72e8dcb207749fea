"""Verifiers and reward plumbing (no torch, no trainer imports: a test checks it; the learned
rewards are the one exception, imported only when named: ``reward_model``).

- ``math``: final-answer equivalence (``math_reward``, ``math_equal``); ``answers``: extraction,
  normalisation, bounded number parsing and hedge detection, all linear in the completion.
- ``format``: tag-format and length rewards.
- ``combine``: weighted sums and per-reward group ("decoupled") normalisation.
- ``forms``: the call forms (per-sample, batched, TRL's ``fn(completions, **kwargs)``), by signature.
- ``runner``: ``load_reward_fn("file.py:name")``, ``RewardRunner`` (per-sample error capture,
  batched and async forms, ``None``/dict rewards, non-finite rewards and ``SystemExit`` counted as
  errors, samples past ``timeout_s`` or a worker's memory scored 0 and counted, ``RewardError`` when
  a whole step raises) and ``RewardSum`` (several functions, weighted; ``load_reward_spec`` reads
  ``reward.fn``'s form).
- ``workers``: the worker processes that run reward calls, each sample under its own deadline;
  ``math_pool``: the symbolic math checks' pool.
- ``reward_model``: ``RewardModel``, a sequence-classification reward model as a batched reward
  function (its own tokenizer and chat template, batch whitening, clipping); ``reward.fn`` names
  one by its folder, and ``task`` names the task's verifier to weigh against it;
  ``ProcessRewardModel`` scores each step's prefix and aggregates the step scores.
- ``process``: step splitting and the step-score aggregations (min, last, mean, the clipped
  and delta refinements), pure functions.
- ``sandbox`` / ``code``: run model-written programs isolated; grade them from outside
  (``uids``: the host-wide registry that gives every sandbox its own slot uids).
"""

from rlvr.rewards.combine import decoupled_normalize, group_normalize, weighted_sum
from rlvr.rewards.format import extract_tag, length_penalty, length_reward, tag_count_reward, tag_format_reward
from rlvr.rewards.math import extract_answer, math_equal, math_reward, normalize_answer
from rlvr.rewards.runner import RewardBatch, RewardRunner, RewardSum, batched, load_reward_fn, load_reward_spec

__all__ = [
    "decoupled_normalize", "group_normalize", "weighted_sum",
    "extract_tag", "length_penalty", "length_reward", "tag_count_reward", "tag_format_reward",
    "extract_answer", "math_equal", "math_reward", "normalize_answer",
    "RewardBatch", "RewardRunner", "RewardSum", "batched", "load_reward_fn", "load_reward_spec",
]
