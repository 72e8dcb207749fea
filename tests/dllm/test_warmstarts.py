"""The packaged dLLM warm starts load by their `rlvr:` names and decode answers in the task's format."""

import pytest
import torch

from rlvr.config import load_config
from rlvr.trainer import build
from rlvr.trainer.evaluate import decode_completions, encode_prompts

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
