"""Decoding rollouts into the answer text the verifier sees."""

import pytest
import torch

from rlvr.batch import Rollouts
from rlvr.codec import decode_completions
from rlvr.models.tokenizer import char_tokenizer


def _rollouts(rows, lengths):
    ids = torch.tensor(rows)
    mask = (torch.arange(ids.shape[1])[None] < torch.tensor(lengths)[:, None]).float()
    empty = torch.zeros(len(rows), 1, dtype=torch.long)
    return Rollouts(empty, empty, ids, mask, torch.zeros_like(mask), torch.zeros(len(rows), dtype=torch.bool))


def test_answer_ends_at_the_first_eos_even_when_the_window_goes_on():
    tok = char_tokenizer()
    eos, pad = tok.eos_token_id, tok.pad_token_id
    enc = lambda text: tok(text, add_special_tokens=False).input_ids  # noqa: E731
    full_window = enc("3+5") + [eos] + enc("7") + [eos]      # diffusion `full`: post-EOS token committed
    causal = enc("3*5") + [eos] + [pad] * 2                   # autoregressive: length stops at the EOS
    truncated = enc("1+2+3+")                                 # no EOS at all
    got = decode_completions(tok, _rollouts([full_window, causal, truncated], [6, 4, 6]))
    assert got == ["3+5", "3*5", "1+2+3+"]


def test_sampled_accuracy_averages_k_seeded_samples_per_problem():
    from rlvr.tasks.countdown import Countdown
    from rlvr.trainer.evaluate import sampled_scores

    tok = char_tokenizer()
    task = Countdown()
    examples = task.heldout()[:3]
    calls = []

    def engine(ids, mask, seeds, *, temperature):
        # Correct on even seeds, a wrong-but-parseable "1" on odd ones: avg@k must be exactly 1/2.
        calls.append((len(seeds), temperature))
        prompts = tok.batch_decode(ids, skip_special_tokens=True)
        by_prompt = {ex.prompt: ex.answer for ex in examples}
        texts = [by_prompt[p] if int(s) % 2 == 0 else "1" for p, s in zip(prompts, seeds.tolist())]
        rows = [tok(t, add_special_tokens=False).input_ids + [tok.eos_token_id] for t in texts]
        width = max(map(len, rows))
        return _rollouts([r + [tok.pad_token_id] * (width - len(r)) for r in rows], [len(r) for r in rows])

    assert sampled_scores(engine, tok, task, examples, agent=False, samples=4, temperature=0.7, batch_size=5)[0] == 0.5
    assert calls == [(5, 0.7), (5, 0.7), (2, 0.7)]  # 12 rows in batches of 5, at the asked temperature


def test_pass_at_k_counts_problems_with_any_right_sample():
    from rlvr.tasks.countdown import Countdown
    from rlvr.trainer.evaluate import sampled_scores

    tok = char_tokenizer()
    task = Countdown()
    examples = task.heldout()[:3]
    by_prompt = {ex.prompt: ex.answer for ex in examples}
    solvable = {examples[0].prompt: {1_000_002}, examples[2].prompt: {1_000_008, 1_000_009, 1_000_010}}

    def engine(ids, mask, seeds, *, temperature):
        # k = 4 rows per problem, seeds 1,000,000 + row: problem 0 right once (row 2), problem 1 never,
        # problem 2 three times (rows 8-10). avg@4 = 4/12, pass@4 = 2/3.
        prompts = tok.batch_decode(ids, skip_special_tokens=True)
        texts = [by_prompt[p] if int(s) in solvable.get(p, ()) else "1" for p, s in zip(prompts, seeds.tolist())]
        rows = [tok(t, add_special_tokens=False).input_ids + [tok.eos_token_id] for t in texts]
        width = max(map(len, rows))
        return _rollouts([r + [tok.pad_token_id] * (width - len(r)) for r in rows], [len(r) for r in rows])

    avg, passed = sampled_scores(engine, tok, task, examples, agent=False, samples=4, temperature=1.0, batch_size=5)
    assert avg == pytest.approx(4 / 12) and passed == pytest.approx(2 / 3)


def test_paired_sign_test_vectors():
    import importlib.util
    from pathlib import Path

    spec = importlib.util.spec_from_file_location("paired",
                                                  Path(__file__).resolve().parents[2] / "bench/paired_heldout.py")
    paired = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(paired)
    assert paired.sign_test(0, 0) == 1.0
    assert paired.sign_test(3, 0) == 1 / 8  # all three discordant problems fixed
    assert paired.sign_test(2, 1) == 4 / 8  # C(3,2) + C(3,3) of 8
    assert abs(paired.sign_test(63, 45) - 0.0506) < 5e-4  # docs/results/dllm.md §4b, three 1-thread runs


def test_accuracy_by_source_groups_verdicts_by_bucket():
    from rlvr.trainer.evaluate import accuracy_by_source
    from rlvr.types import Example

    exs = [Example(p, "", {"source": s}) for p, s in (("a", "d2"), ("b", "d3"), ("c", "d2"), ("d", "d2"))]
    assert accuracy_by_source(exs, [True, False, False, True]) == {"d2": 2 / 3, "d3": 0.0}
    assert accuracy_by_source([Example("a", "")], [True]) == {}  # no sources: no per-source keys
