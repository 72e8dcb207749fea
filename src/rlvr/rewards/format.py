"""Format and length rewards: tiny pure functions over strings (``None`` = not scorable).

- ``tag_format_reward``: 1.0 when the completion is exactly ``<think>…</think>`` then
  ``<answer>…</answer>`` (whitespace between and around allowed), else 0.0 (DeepSeek-R1's format
  reward, as most open reproductions write it).
- ``tag_count_reward``: partial credit, 1/(2·len(tags)) for each opening and closing tag that
  appears exactly once (open-r1's ``tag_count_reward`` generalised to any tag list).
- ``extract_tag``: the text inside the last ``<tag>…</tag>``.
- ``length_reward``: 1 at the target length, falling linearly to 0 at ``|n - target| = tolerance``
  (a length-control reward in the spirit of L1/LCPO; ``n`` in whatever unit the caller counts).
- ``length_penalty``: 0 up to ``max_length``, then −(excess/``buffer``) down to −1 (a character- or
  token-count penalty; the token-level DAPO overlong shaping lives in ``rlvr.algos.shaping``).
"""

from __future__ import annotations

import re

__all__ = ["tag_format_reward", "tag_count_reward", "extract_tag", "length_reward", "length_penalty"]


def _tag_pattern(tags: tuple[str, ...]) -> re.Pattern:
    body = r"\s*".join(rf"<{t}>(?:(?!<{t}>|</{t}>).)*?</{t}>" for t in tags)
    return re.compile(rf"^\s*{body}\s*$", re.DOTALL)


def tag_format_reward(completion: str, tags: tuple[str, ...] = ("think", "answer")) -> float:
    """1.0 if the completion is exactly the tagged blocks in order (no nesting, no extra text).

    >>> [tag_format_reward(c) for c in ("<think>a</think>\\n<answer>4</answer>", "<answer>4</answer>",
    ...                                  "<think>a</think><answer>4</answer> extra",
    ...                                  "<think><think>a</think><answer>4</answer>")]
    [1.0, 0.0, 0.0, 0.0]
    """
    return 1.0 if _tag_pattern(tuple(tags)).match(completion) else 0.0


def tag_count_reward(completion: str, tags: tuple[str, ...] = ("think", "answer")) -> float:
    """1/(2·len(tags)) per opening or closing tag present exactly once.

    >>> (tag_count_reward("<think>a</think><answer>4</answer>"), tag_count_reward("<think>a</think>"),
    ...  tag_count_reward("<think><think>"))
    (1.0, 0.5, 0.0)
    """
    marks = [m for t in tags for m in (f"<{t}>", f"</{t}>")]
    return sum(completion.count(m) == 1 for m in marks) / len(marks)


def extract_tag(completion: str, tag: str = "answer") -> str | None:
    """Content of the last ``<tag>…</tag>``, stripped; None when absent.

    >>> extract_tag("<answer> 1 </answer><answer>42</answer>"), extract_tag("42")
    ('42', None)
    """
    found = re.findall(rf"<{tag}>(.*?)</{tag}>", completion, re.DOTALL)
    return found[-1].strip() if found else None


def length_reward(length: int, *, target: int, tolerance: int) -> float:
    """max(0, 1 − |length − target| / tolerance).

    >>> [length_reward(n, target=100, tolerance=50) for n in (100, 75, 150, 200)]
    [1.0, 0.5, 0.0, 0.0]
    """
    if tolerance <= 0:
        raise ValueError(f"length_reward: tolerance must be > 0, got {tolerance}")
    return max(0.0, 1.0 - abs(length - target) / tolerance)


def length_penalty(length: int, *, max_length: int, buffer: int) -> float:
    """0 up to max_length, then −(length − max_length)/buffer, floored at −1.

    >>> [length_penalty(n, max_length=100, buffer=20) for n in (50, 100, 110, 120, 500)]
    [0.0, 0.0, -0.5, -1.0, -1.0]
    """
    if buffer <= 0:
        raise ValueError(f"length_penalty: buffer must be > 0, got {buffer}")
    return -min(1.0, (length - max_length) / buffer) if length > max_length else 0.0
