"""distinct_forward: rows with identical inputs share one forward, values and gradients unchanged."""

import torch
from _tiny import MASK, PROMPT, enumerable_model

from rlvr.codec import encode_prompts
from rlvr.engines.torch_diffusion import generate_diffusion
from rlvr.models.diffusion_lm import load_diffusion_lm
from rlvr.models.diffusion_policy import DiffusionPolicy
from rlvr.models.likelihood import distinct_forward


class _RowCounter(torch.nn.Module):
    """Wraps a model and records how many rows each forward was given."""

    def __init__(self, model):
        super().__init__()
        self.inner, self.config, self.rows = model, model.config, []

    def forward(self, ids, attention, positions):
        self.rows.append(ids.shape[0])
        return self.inner(ids, attention, positions)


def _inputs():
    """6 rows, 3 distinct: rows 0, 2, 5 equal, rows 1, 4 equal, row 3 alone."""
    ids = torch.tensor([[1, 2, MASK, MASK], [2, 1, MASK, MASK], [1, 2, MASK, MASK], [1, 2, 0, MASK],
                        [2, 1, MASK, MASK], [1, 2, MASK, MASK]])
    attention = torch.ones_like(ids)
    return ids, attention, (attention.cumsum(-1) - 1)


def test_duplicate_rows_run_once_and_get_the_plain_logits():
    model = _RowCounter(enumerable_model())
    ids, attention, positions = _inputs()
    plain = model(ids, attention, positions)
    shared = distinct_forward(model, ids, attention, positions)
    assert model.rows == [6, 3]
    torch.testing.assert_close(shared, plain, rtol=0, atol=1e-6)


def test_gradients_of_shared_rows_sum_to_the_plain_gradients():
    targets = torch.tensor([[0, 1, 2, 3], [3, 2, 1, 0], [2, 2, 2, 2], [1, 0, 3, 2], [0, 0, 1, 1], [3, 3, 0, 1]])
    weights = torch.linspace(-1.0, 1.5, 6)[:, None]
    grads = []
    for call in (lambda m, *a: m(*a), distinct_forward):
        model = enumerable_model()
        logp = call(model, *_inputs()).log_softmax(-1).gather(-1, targets[..., None]).squeeze(-1)
        (weights * logp).sum().backward()
        grads.append([p.grad.clone() for p in model.parameters()])
    for plain, shared in zip(*grads):
        torch.testing.assert_close(shared, plain, rtol=1e-5, atol=1e-6)


def test_rows_not_wanted_are_skipped_and_zero():
    model = _RowCounter(enumerable_model())
    ids, attention, positions = _inputs()
    wanted = torch.tensor([True, False, True, True, False, False])
    out = distinct_forward(model, ids, attention, positions, rows=wanted)
    assert model.rows == [2]  # rows 0 and 2 are one input, row 3 another
    plain = model.inner(ids, attention, positions)
    torch.testing.assert_close(out[wanted], plain[wanted], rtol=0, atol=1e-6)
    assert bool((out[~wanted] == 0).all())


def test_mean_field_of_a_group_costs_one_row_per_prompt():
    """Completion all masked, prompt unmasked: a group's inputs coincide whatever its completions."""
    model = _RowCounter(enumerable_model())
    completions = torch.tensor([[0, 1, 2], [1, 1, 3], [2, 0, 1], [3, 3, 3]])
    prompt = PROMPT.expand(4, -1)
    policy = DiffusionPolicy(model, "mean_field", window="full", p_mask_prompt=0.0)
    values, _ = policy.token_logprobs(prompt, torch.ones_like(prompt), completions)
    assert model.rows == [1]
    direct = model.inner(torch.cat([prompt, torch.full_like(completions, MASK)], 1), torch.ones(4, 5, dtype=torch.long),
                         torch.arange(5).expand(4, -1))[:, 2:].clone()
    direct[..., MASK] = float("-inf")
    expected = direct.log_softmax(-1).gather(-1, completions[..., None]).squeeze(-1)
    torch.testing.assert_close(values, expected, rtol=0, atol=1e-6)


def test_an_empty_row_selection_is_an_error():
    ids, attention, positions = _inputs()
    try:
        distinct_forward(enumerable_model(), ids, attention, positions, rows=torch.zeros(6, dtype=torch.bool))
    except ValueError as err:
        assert "selects no row" in str(err)
    else:
        raise AssertionError("expected a ValueError")


class _InputRecorder(_RowCounter):
    def forward(self, ids, attention, positions):
        self.inputs = getattr(self, "inputs", []) + [ids.clone()]
        return super().forward(ids, attention, positions)


def test_sampler_forwards_only_distinct_unfinished_rows():
    model, tok = load_diffusion_lm(None, seed=0, hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64)
    recorder = _InputRecorder(model)
    ids, mask = encode_prompts(tok, ["3 5 2>13:", "1 2>3:"])
    group = 4
    # one block, and a threshold low enough for this random model that rows finish at different steps
    settings = dict(gen_length=8, steps=0, block_length=8, threshold=0.01, mask_id=tok.mask_token_id,
                    eos_id=tok.eos_token_id)
    seeds = torch.arange(2 * group)
    out = generate_diffusion(recorder, ids.repeat_interleave(group, 0), mask.repeat_interleave(group, 0), seeds,
                             **settings)
    assert recorder.rows[0] == 2  # the first step: every row of a group is the prompt plus masks
    for step in recorder.inputs:  # a finished row (no mask left) is never forwarded, duplicates never twice
        assert bool((step == tok.mask_token_id).any(-1).all())
        assert torch.unique(step, dim=0).shape[0] == step.shape[0]
    assert min(recorder.rows[1:]) < 2 * group and out.forwards > 2
    for row in (0, group - 1, group, 2 * group - 1):  # each row as if decoded alone (no batch neighbours)
        alone = generate_diffusion(model, ids[row // group:row // group + 1], mask[row // group:row // group + 1],
                                   seeds[row:row + 1], **settings)
        assert torch.equal(alone.completion_ids[0], out.completion_ids[row])
        assert torch.equal(alone.trace[0], out.trace[row])
