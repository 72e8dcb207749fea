"""Vision-language models: the tiny Idefics3 saves and reloads through the Auto classes, the
sampler's behaviour log-probs equal the trainer's with images in both, micro-batches give the
same log-probs as the whole batch, and only completion tokens are scored."""

from __future__ import annotations

import pytest
import torch

from rlvr.batch import TrainBatch
from rlvr.engines.torch_vlm import generate_vlm
from rlvr.errors import ConfigError
from rlvr.models.vlm import VisionPrompts, freeze_vision, image_token_id, is_vlm_dir, load_vlm, tiny_vlm
from rlvr.models.vlm_policy import VisionPolicy
from rlvr.tasks.visual.shapes import CountShapes
from rlvr.types import Example


@pytest.fixture(scope="module")
def tiny():
    model, processor = tiny_vlm(seed=0, hidden_size=64, intermediate_size=128, num_layers=2, vision_layers=2)
    return model, VisionPrompts(processor)


@pytest.fixture(scope="module")
def rolled(tiny):
    model, prompts = tiny
    examples = CountShapes(heldout_size=0, seed=1).sample(3, None)
    group = [ex for ex in examples for _ in range(2)]
    ids, mask, extras = prompts.encode_examples(group)
    seeds = torch.arange(len(group))
    out = generate_vlm(model, ids, mask, seeds, image_id=image_token_id(model), max_new_tokens=6,
                       eos_id=prompts.eos_token_id, pad_id=prompts.pad_token_id, temperature=1.0, **extras)
    return out


def _batch(out) -> TrainBatch:
    return TrainBatch(out.prompt_ids, out.prompt_mask, out.completion_ids, out.completion_mask,
                      advantages=torch.zeros_like(out.completion_mask), vision=out.vision)


def test_saves_and_reloads_through_auto_classes(tiny, tmp_path):
    model, prompts = tiny
    model.save_pretrained(tmp_path)
    prompts.save_pretrained(tmp_path)
    assert is_vlm_dir(tmp_path)
    again, again_prompts = load_vlm(str(tmp_path), tmp_path)
    ex = CountShapes(heldout_size=0, seed=2).sample(1, None)
    a, b = prompts.encode_examples(ex), again_prompts.encode_examples(ex)
    assert torch.equal(a[0], b[0])
    kw = a[2]["vision"].forward_kwargs()
    with torch.no_grad():
        torch.testing.assert_close(model(input_ids=a[0], **kw).logits, again(input_ids=b[0], **kw).logits)


def test_prompt_expands_one_placeholder_into_the_image_tokens(tiny):
    _, prompts = tiny
    ex = Example("<image>red?", "1", {"images": CountShapes(heldout_size=0).sample(1, None)[0].meta["images"]})
    ids, mask, extras = prompts.encode_examples([ex, ex])
    image = prompts.convert_tokens_to_ids("<image>")
    assert int((ids[0] == image).sum()) == 16  # (64 / 8)² patches / 2² pixel shuffle
    assert ids[0, 0] == prompts.bos_token_id and prompts.decode(ids[0, -4:]) == "red?"
    assert extras["vision"].forward_kwargs()["pixel_values"].shape == (2, 1, 3, 64, 64)
    assert extras["vision"].rows[0] is extras["vision"].rows[1]  # a group shares one encoding


def test_sampler_logprobs_equal_trainer_logprobs(tiny, rolled):
    model, _ = tiny
    policy = VisionPolicy(model, image_id=image_token_id(model))
    with torch.no_grad():
        logp, entropy = policy.batch_logprobs(_batch(rolled), with_entropy=True)
    keep = rolled.completion_mask > 0
    assert keep.sum() > 6
    torch.testing.assert_close(logp[keep], rolled.logprobs[keep], atol=2e-5, rtol=0)
    assert torch.all(logp[~keep] == 0) and torch.isfinite(entropy).all()


def test_micro_batches_give_the_whole_batch_logprobs_and_gradients(tiny, rolled):
    model, _ = tiny
    policy = VisionPolicy(model, image_id=image_token_id(model))
    batch = _batch(rolled)
    model.zero_grad()
    whole, _ = policy.batch_logprobs(batch)
    whole.sum().backward()
    grad_whole = [p.grad.clone() for p in model.parameters() if p.grad is not None]
    model.zero_grad()
    parts = []
    for rows in (slice(0, 1), slice(1, 4), slice(4, 6)):
        part, _ = policy.batch_logprobs(batch.select(rows))
        part.sum().backward()
        parts.append(part.detach())
    grad_parts = [p.grad.clone() for p in model.parameters() if p.grad is not None]
    width = whole.shape[1]
    stacked = torch.cat([torch.nn.functional.pad(p, (0, width - p.shape[1])) for p in parts])
    torch.testing.assert_close(stacked, whole.detach(), atol=1e-5, rtol=0)
    assert len(grad_parts) == len(grad_whole)
    for a, b in zip(grad_parts, grad_whole):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)
    model.zero_grad()


def test_image_and_prompt_tokens_are_not_scored(tiny, rolled):
    """The scored positions are the completion's: changing the image changes the log-probs
    (the image reaches them), but no output exists for prompt or image positions."""
    model, prompts = tiny
    policy = VisionPolicy(model, image_id=image_token_id(model))
    batch = _batch(rolled)
    with torch.no_grad():
        logp, _ = policy.batch_logprobs(batch)
        other = [{k: v.flip(-1) if k == "pixel_values" else v for k, v in row.items()} for row in batch.vision.rows]
        flipped, _ = policy.batch_logprobs(TrainBatch(**{**batch.__dict__, "vision": type(batch.vision)(other)}))
    assert logp.shape == batch.completion_ids.shape
    assert not torch.allclose(logp, flipped)


def test_vision_tower_frozen_by_default(tiny):
    model, _ = tiny
    freeze_vision(model)
    frozen = {n for n, p in model.named_parameters() if not p.requires_grad}
    assert frozen and all("vision_model" in n or "connector" in n for n in frozen)
    assert any("text_model" in n for n, p in model.named_parameters() if p.requires_grad)
    model.requires_grad_(True)


def test_a_text_only_row_is_refused_naming_row_and_field(tiny):
    _, prompts = tiny
    with pytest.raises(ValueError, match=r"row 0: .* field 'images'"):
        prompts.encode_examples([Example("red?", "1", {})])


def test_a_text_only_directory_is_refused_by_family(tmp_path):
    assert not is_vlm_dir(tmp_path)
    with pytest.raises(ConfigError, match="model.path"):
        load_vlm(str(tmp_path), tmp_path)


def test_micro_groups_give_each_row_its_own_images_and_reassemble_them():
    from rlvr.batch import Rollouts
    from rlvr.multimodal import VisionRows
    from rlvr.trainer.collect import generate

    rows = VisionRows([{"pixel_values": torch.full((1, 1), float(i))} for i in range(4)])

    def engine(ids, mask, seeds, *, temperature, vision):
        assert [float(r["pixel_values"]) for r in vision.rows] == ids[:, 0].float().tolist()  # row i, image i
        return Rollouts(ids, mask, ids.clone(), torch.ones(ids.shape), torch.zeros(ids.shape),
                        torch.zeros(len(ids), dtype=torch.bool), vision=vision)

    ids = torch.arange(4)[:, None]
    out = generate(engine, ids, torch.ones_like(ids), torch.arange(4), 1.0, group_size=2, micro_group_size=1,
                   pad_id=0, extras={"vision": rows})
    assert [float(r["pixel_values"]) for r in out.vision.rows] == [0.0, 1.0, 2.0, 3.0]
    assert out.completion_ids[:, 0].tolist() == [0, 1, 2, 3]
