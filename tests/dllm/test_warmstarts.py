"""The packaged dLLM warm starts load by their `rlvr:` names and decode answers in the task's format."""

import pytest
import torch

from rlvr.builder import build
from rlvr.codec import decode_completions, encode_prompts
from rlvr.config import load_config

RECIPES = {"countdown": "recipes/dllm_diffu_grpo_countdown.yaml", "sudoku": "recipes/dllm_diffu_grpo_sudoku.yaml"}


@pytest.mark.parametrize("task", sorted(RECIPES))
def test_packaged_warm_start_loads_and_decodes(task):
    from pathlib import Path

    recipe = Path(__file__).resolve().parents[2] / RECIPES[task]
    config = load_config(recipe, ["trainer.threads=1"])
    assert config.model.path.startswith("rlvr:") and "dllm-warmstart" in config.model.path
    model, tokenizer = build.build_model(config)
    assert model.mask_token_id == tokenizer.mask_token_id
    examples = build.build_task(config, tokenizer).heldout()[:16]
    engine = build.build_engine(config, model, tokenizer)
    ids, mask = encode_prompts(tokenizer, [e.prompt for e in examples])
    texts = decode_completions(tokenizer, engine(ids, mask, torch.zeros(len(examples), dtype=torch.long),
                                                 temperature=0.0))
    assert len(texts) == len(examples)
    task_obj = build.build_task(config, tokenizer)
    rewards = [task_obj.reward(e.prompt, t, answer=e.answer, meta=e.meta) for t, e in zip(texts, examples)]
    assert sum(r > 0 for r in rewards) >= 4, (texts, rewards)  # a trained start, not a random model


def test_countdown_warm_start_cannot_read_a_masked_prompt_so_the_recipe_does_not_mask_prompts():
    # d1 masks prompt tokens w.p. 0.15 in its mean-field estimator; LLaDA saw masked prompts in
    # pre-training, our warm start (response-only SFT) never did. Masking the prompt digit that
    # the completion's first token copies takes that token's log-prob from about -0.2 to below
    # uniform over the 9 digits (log 1/9 = -2.2; measured -6.1): out of distribution, which is
    # why dllm_diffu_grpo_countdown.yaml sets estimator.p_mask_prompt: 0 (docs/results/dllm.md §4c).
    from pathlib import Path

    from rlvr.models.likelihood import Corruptor, row_hash
    from rlvr.sft.diffusion import encode_windows

    recipe = Path(__file__).resolve().parents[2] / RECIPES["countdown"]
    config = load_config(recipe, ["trainer.threads=1"])
    assert config.estimator.name == "mean_field" and config.estimator.p_mask_prompt == 0.0
    model, tokenizer = build.build_model(config)
    examples = [e for e in build.build_task(config, tokenizer).heldout() if "(" not in e.answer][:32]
    ids, mask = encode_prompts(tokenizer, [e.prompt for e in examples])
    window = encode_windows(tokenizer, [e.answer for e in examples], config.rollout.max_new_tokens)
    ctx = Corruptor(model=model, prompt_ids=ids, prompt_mask=mask, completion_ids=window,
                    valid=torch.ones_like(window, dtype=torch.bool), keys=row_hash(ids, mask, window, 0),
                    mask_id=tokenizer.mask_token_id)
    first_number = mask.cumsum(-1) == 2  # BOS, then the first number (one digit, the answer's first token)
    assert all(tokenizer.decode(row[m]) == e.answer[0] for row, m, e in zip(ids, first_number, examples))
    everything = torch.ones_like(window, dtype=torch.bool)
    with torch.no_grad():
        clean, _ = ctx.denoise(everything)
        hidden, _ = ctx.denoise(everything, first_number)
    assert float(clean[:, 0].mean()) > -0.5
    assert float(hidden[:, 0].mean()) < -3.0


def test_bench_rejects_an_override_swallowed_by_recipes():
    """`--recipes spg trainer.threads=1` would make the override a recipe name: one-line error, no run."""
    import subprocess
    import sys
    from pathlib import Path

    bench = Path(__file__).resolve().parents[2] / "bench/dllm.py"
    done = subprocess.run([sys.executable, str(bench), "--steps", "1", "--recipes", "spg", "trainer.threads=1"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert "put key=value overrides before --recipes" in done.stderr.splitlines()[-1]
