"""Format and length rewards: tiny pure functions over strings (``None`` = not scorable).

- ``tag_format_reward``: 1.0 when the completion is exactly ``<think>…</think>`` then
  ``<answer>…</answer>`` (whitespace between and around allowed, each block non-blank), else 0.0
  (DeepSeek-R1's format reward, as most open reproductions write it).
- ``tag_count_reward``: partial credit, 1/(2·len(tags)) for each opening and closing tag that
  appears exactly once (open-r1's ``tag_count_reward`` generalised to any tag list); a tag whose
  last closing has no opening before it (reversed) or only blank text since it earns nothing.
- ``extract_tag``: the text inside the last ``<tag>…</tag>``.

Model text is hostile: these scan with ``str`` methods only (``find``/``rfind``/``count``), linear
in the completion's length, so no completion can stall them.
- ``length_reward``: 1 at the target length, falling linearly to 0 at ``|n - target| = tolerance``
  (a length-control reward in the spirit of L1/LCPO; ``n`` in whatever unit the caller counts).
- ``length_penalty``: 0 up to ``max_length``, then −(excess/``buffer``) down to −1 (a character- or
  token-count penalty; the token-level DAPO overlong shaping lives in ``rlvr.algos.shaping``).
"""

from __future__ import annotations

__all__ = ["tag_format_reward", "tag_count_reward", "extract_tag", "length_reward", "length_penalty"]


def _skip_space(text: str, pos: int) -> int:
    return len(text) - len(text[pos:].lstrip())


def tag_format_reward(completion: str, tags: tuple[str, ...] = ("think", "answer")) -> float:
    """1.0 if the completion is exactly the tagged blocks in order, each non-blank (no nesting, no
    extra text).

    >>> [tag_format_reward(c) for c in ("<think>a</think>\\n<answer>4</answer>", "<answer>4</answer>",
    ...                                  "<think>a</think><answer>4</answer> extra",
    ...                                  "<think><think>a</think><answer>4</answer>",
    ...                                  "<think> </think><answer>4</answer>")]
    [1.0, 0.0, 0.0, 0.0, 0.0]
    """
    pos = _skip_space(completion, 0)
    for tag in tags:
        opening, closing = f"<{tag}>", f"</{tag}>"
        if not completion.startswith(opening, pos):
            return 0.0
        end = completion.find(closing, pos + len(opening))
        body = completion[pos + len(opening):end]
        if end < 0 or opening in body or not body.strip():
            return 0.0
        pos = _skip_space(completion, end + len(closing))
    return 1.0 if pos == len(completion) else 0.0


def _tag_credit(completion: str, tag: str) -> int:
    """0, 1 or 2: the tag's opening and closing each present exactly once; 0 when its last closing
    has no opening before it or only blank text since that opening."""
    opening, closing = f"<{tag}>", f"</{tag}>"
    close = completion.rfind(closing)
    if close >= 0:
        opened = completion.rfind(opening, 0, close)
        if opened < 0 or not completion[opened + len(opening):close].strip():
            return 0
    return (completion.count(opening) == 1) + (completion.count(closing) == 1)


def tag_count_reward(completion: str, tags: tuple[str, ...] = ("think", "answer")) -> float:
    """1/(2·len(tags)) per opening or closing tag present exactly once; none for a reversed or empty block.

    >>> (tag_count_reward("<think>a</think><answer>4</answer>"), tag_count_reward("<think>a</think>"),
    ...  tag_count_reward("<think><think>"), tag_count_reward("</think>a<think><answer></answer>"))
    (1.0, 0.5, 0.0, 0.0)
    """
    return sum(_tag_credit(completion, t) for t in tags) / (2 * len(tags))


def extract_tag(completion: str, tag: str = "answer") -> str | None:
    """Content of the last ``<tag>…</tag>``, stripped; None when absent.

    >>> extract_tag("<answer> 1 </answer><answer>42</answer>"), extract_tag("42")
    ('42', None)
    """
    close = completion.rfind(f"</{tag}>")
    opened = completion.rfind(f"<{tag}>", 0, close) if close >= 0 else -1
    return completion[opened + len(tag) + 2:close].strip() if opened >= 0 else None


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
