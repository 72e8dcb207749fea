"""IGPO: hint windows and replacements by hand, the sampler's inpainting, and a tiny run's rescued groups."""

import json

import pytest
import torch
from _tiny import enumerable_model

from rlvr.algos.igpo import hint_windows, replacements, signal_groups, zero_signal_groups
from rlvr.cli import main
from rlvr.config import load_config
from rlvr.engines.torch_diffusion import generate_diffusion
from rlvr.errors import ConfigError


def test_hint_windows_are_reference_prefixes():
    refs = [[5, 6, 7, 8, 9], [1, 2], [4]]
    out = hint_windows(refs, torch.tensor([0.5, 1.0, 0.9]), gen_length=6)
    # ⌈0.5·5⌉ = 3 tokens; ⌈1.0·2⌉ = 2 clamped to n − 1 = 1 (the model writes the rest); a 1-token reference: no hint
    assert out.tolist() == [[5, 6, 7, -1, -1, -1], [1, -1, -1, -1, -1, -1], [-1] * 6]
    assert hint_windows([[3, 3, 3, 3]], torch.tensor([0.0]), gen_length=2).tolist() == [[3, -1]]  # at least one


def test_replacements_fill_only_groups_without_a_correct_completion():
    correct = torch.tensor([0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0.])  # G = 4: groups 0 and 2 found nothing
    hinted = torch.tensor([[1, 0, 1], [1, 1, 1], [0, 0, 0.]]).repeat(1, 1)  # (P = 3, k = 3) verdicts
    assert zero_signal_groups(correct, 4).tolist() == [True, False, True]
    # group 0: hinted rows 0 and 2 are correct -> batch rows 0, 1; group 1 has a correct row: untouched;
    # group 2: no hinted row is correct -> nothing to put in
    assert replacements(correct, hinted, 4, max_replace=3) == [(0, 0), (1, 2)]
    assert replacements(correct, hinted, 4, max_replace=1) == [(0, 0)]
    rewards = torch.tensor([0.1, 0.1, 0.1, 0.1, 0.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0, float("nan")])
    assert signal_groups(rewards, 4) == 1  # only group 1 varies (NaN counts as 0)


def test_the_sampler_keeps_fixed_tokens_and_decodes_around_them():
    model = enumerable_model()
    prompt = torch.tensor([[1, 2], [1, 2]])
    common = dict(gen_length=4, steps=4, mask_id=4, eos_id=3, temperature=1.0, window="full")
    seeds = torch.tensor([7, 8])
    fixed = torch.tensor([[2, 0, -1, -1], [-1] * 4])
    out = generate_diffusion(model, prompt, torch.ones_like(prompt), seeds, fixed=fixed, **common)
    assert out.completion_ids[0, :2].tolist() == [2, 0] and out.trace[0, :2].tolist() == [-1, -1]
    assert out.logprobs[0, :2].tolist() == [0.0, 0.0] and bool((out.trace[0, 2:] >= 0).all())
    assert bool((out.completion_ids != 4).all())  # every free position decoded
    free = generate_diffusion(model, prompt, torch.ones_like(prompt), seeds, **common)
    assert torch.equal(out.completion_ids[1], free.completion_ids[1])  # an all-free row samples as without `fixed`


def test_igpo_config_needs_a_diffusion_model():
    with pytest.raises(ConfigError, match="rollout.igpo"):
        load_config(None, ["rollout.igpo=true"])
    with pytest.raises(ConfigError, match="rollout.igpo_hint_low"):
        load_config("recipes/dllm_igpo_countdown.yaml", ["rollout.igpo_hint_low=0.9"])


def _steps(run):
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()][1:]


@pytest.mark.slow
def test_igpo_recipe_rescues_groups_with_no_correct_completion(tmp_path, capsys):
    args = ["train", "recipes/dllm_igpo_countdown.yaml", "trainer.steps=3", "trainer.threads=1", "trainer.save_every=0",
            "trainer.eval_samples=0", "trainer.eval_every=0", f"trainer.out_dir={tmp_path}"]
    assert main([*args, "trainer.name=igpo"]) == 0, capsys.readouterr().err
    steps = _steps(tmp_path / "igpo")
    assert sum(s["igpo/zero_signal_groups"] for s in steps) > 0  # the warm start fails whole groups
    assert sum(s["igpo/replaced_rows"] for s in steps) > 0
    for s in steps:
        assert s["igpo/signal_groups_after"] >= s["igpo/signal_groups_before"]
        assert s["igpo/replaced_rows"] <= 4 * s["igpo/zero_signal_groups"]  # ⌊λG⌋ = 4 per such group
    assert sum(s["igpo/signal_groups_after"] - s["igpo/signal_groups_before"] for s in steps) > 0
    assert main([*args, "trainer.name=plain", "rollout.igpo=false"]) == 0, capsys.readouterr().err
    assert not any(k.startswith("igpo/") for k in _steps(tmp_path / "plain")[0])
