"""DPO: parity with TRL's DPOTrainer loss on the same batch (DPO and IPO), and `rlvr dpo` end to
end: pairs from the verifier, a run directory with metrics, checkpoints and an export."""

from __future__ import annotations

import json

import pytest

from rlvr.algos.preference import dpo_loss
from rlvr.models.causal_lm import tiny_llama
from rlvr.models.policy import CausalPolicy
from rlvr.models.tokenizer import char_tokenizer
from rlvr.preference.dpo import pair_batch, sequence_logprobs
from rlvr.preference.pairs import Pair

PAIRS = [Pair("3 5 2>13:", "3+5*2", "3*5+2"), Pair("1 2>3:", "1+2", "2-1+7")]
TINY = ["preference.steps=4", "preference.pairs=32", "preference.heldout_pairs=16", "preference.batch_size=4",
        "preference.eval_every=2", "trainer.threads=1", "task.heldout_size=20"]


def _model(seed):
    return tiny_llama(100, hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64, max_seq_len=64, seed=seed)


@pytest.mark.parametrize("loss_type", ["sigmoid", "ipo"])
def test_loss_equals_trl_dpo_trainer_on_the_same_batch(tmp_path, loss_type):
    pytest.importorskip("trl")
    from datasets import Dataset
    from trl import DPOConfig, DPOTrainer

    tokenizer = char_tokenizer()
    model, ref = _model(0), _model(1)
    # TRL adds no BOS with this tokenizer; rlvr prepends it: the prompt text carries it on TRL's side.
    rows = [{"prompt": "<bos>" + p.prompt, "chosen": p.chosen, "rejected": p.rejected} for p in PAIRS]
    args = DPOConfig(output_dir=str(tmp_path), per_device_train_batch_size=2, beta=0.3, loss_type=[loss_type],
                     report_to=[], use_cpu=True, max_length=None)
    trainer = DPOTrainer(model=model, ref_model=ref, args=args, train_dataset=Dataset.from_list(rows),
                         processing_class=tokenizer)
    trl_loss = float(trainer.compute_loss(trainer.model, next(iter(trainer.get_train_dataloader()))).detach())

    batch = pair_batch(tokenizer, PAIRS)
    tokens = batch.completion_mask.sum(-1)
    for fast, tolerance in ((False, 1e-6), (True, 1e-4)):  # the fused fast path: the same to float rounding
        policy_logp = sequence_logprobs(CausalPolicy(model, fast=fast), batch)
        ref_logp = sequence_logprobs(CausalPolicy(ref, fast=fast), batch)
        ours, _ = dpo_loss(policy_logp[:2], ref_logp[:2], policy_logp[2:], ref_logp[2:], beta=0.3,
                           loss_type=loss_type, chosen_tokens=tokens[:2], rejected_tokens=tokens[2:])
        assert float(ours.detach()) == pytest.approx(trl_loss, rel=tolerance, abs=tolerance), fast


def test_pair_batch_stacks_chosen_then_rejected_with_eos():
    tokenizer = char_tokenizer()
    batch = pair_batch(tokenizer, PAIRS)
    texts = [tokenizer.decode(row[mask.bool()]) for row, mask in zip(batch.completion_ids, batch.completion_mask)]
    assert texts == ["3+5*2<eos>", "1+2<eos>", "3*5+2<eos>", "2-1+7<eos>"]
    firsts = [row[mask.bool()][0].item() for row, mask in zip(batch.prompt_ids, batch.prompt_mask)]
    assert firsts == [tokenizer.bos_token_id] * 4  # left-padded prompts, each opened by BOS


def test_the_defaults_are_the_measured_setting_and_lr_is_each_commands_own():
    from rlvr.config import load_config
    from rlvr.config.commands_schema import preference_lr

    p = load_config(None).preference
    assert (p.beta, p.lr, preference_lr(p, "dpo"), preference_lr(p, "rm")) == (1.0, None, 2e-5, 1e-4)
    given = load_config(None, ["preference.lr=3e-4"]).preference
    assert preference_lr(given, "dpo") == preference_lr(given, "rm") == 3e-4


def test_rlvr_dpo_writes_a_run_that_exports(tmp_path, capsys, monkeypatch):
    from rlvr.builder import build
    from rlvr.cli import main

    rates, build_optimizer = [], build.build_optimizer
    monkeypatch.setattr(build, "build_optimizer", lambda *a, **kw: rates.append(kw["lr"]) or build_optimizer(*a, **kw))
    assert main(["dpo", *TINY, f"trainer.out_dir={tmp_path}"]) == 0
    assert rates == [2e-5]  # `rlvr dpo`'s own learning rate, preference.lr left null
    run = tmp_path / "dpo_countdown_s0"
    lines = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in lines] == [0, 1, 2, 3, 4]
    assert {"eval/heldout_pair_accuracy", "eval/heldout_accuracy"} <= set(lines[0]) <= set(lines[4])
    assert all(0 <= m["dpo/accuracy"] <= 1 and m["dpo/loss"] > 0 for m in lines[1:])
    assert lines[1]["dpo/margin"] == pytest.approx(0.0, abs=1e-6)  # step 1: policy = reference
    manifest = json.loads((run / "run.json").read_text())
    assert manifest["status"] == "finished" and manifest["trainer"] == "dpo" and manifest["final"] == lines[-1]
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["step_000004"]
    assert main(["export", str(run), str(tmp_path / "hf")]) == 0
    assert (tmp_path / "hf" / "config.json").is_file()
    assert "done: step 4" in capsys.readouterr().out


def test_rlvr_dpo_on_a_pairs_file_and_its_errors(tmp_path, capsys):
    from rlvr.cli import main

    data = tmp_path / "pairs.jsonl"
    data.write_text("".join(json.dumps({"prompt": p.prompt, "chosen": p.chosen, "rejected": p.rejected}) + "\n"
                            for p in PAIRS * 4))
    assert main(["dpo", *TINY, f"preference.data={data}", "preference.loss=ipo", f"trainer.out_dir={tmp_path}"]) == 0
    lines = [json.loads(x) for x in (tmp_path / "dpo_countdown_s0" / "metrics.jsonl").read_text().splitlines()]
    assert "eval/heldout_accuracy" not in lines[-1] and "eval/heldout_pair_accuracy" in lines[-1]
    data.write_text('{"prompt": "q", "chosen": "a"}\n')
    assert main(["dpo", *TINY, f"preference.data={data}", f"trainer.out_dir={tmp_path}"]) == 2
    assert main(["dpo", *TINY, "preference.loss=hinge", f"trainer.out_dir={tmp_path}"]) == 2
    err = capsys.readouterr().err
    assert "preference.data: " in err and "pairs.jsonl:1 lacks" in err and "lacks string field(s) rejected" in err
    assert "preference.loss: unknown 'hinge'; choose one of sigmoid, ipo" in err


def test_rlvr_dpo_on_a_diffusion_model_is_vrpo_with_shared_masks(tmp_path):
    """The reference's ELBO estimates use the policy's mask seed (common random numbers): at step 1,
    policy = reference, so every margin is exactly 0 and the loss exactly log 2."""
    import math

    from rlvr.cli import main

    tiny = [a for a in TINY if not a.startswith(("preference.steps=", "preference.eval_every="))]
    args = ["dpo", *tiny, "model.kind=diffusion", "model.path=", "rollout.max_new_tokens=16",
            "rollout.diffusion_steps=4", "rollout.block_length=8", "estimator.name=elbo_mc", "estimator.n=2",
            "preference.steps=2", "preference.eval_every=0", f"trainer.out_dir={tmp_path}"]
    assert main(args) == 0
    lines = [json.loads(x) for x in (tmp_path / "dpo_countdown_s0" / "metrics.jsonl").read_text().splitlines()]
    assert lines[1]["dpo/margin"] == 0.0 and lines[1]["dpo/loss"] == pytest.approx(math.log(2), abs=1e-6)
    assert lines[1]["actor/grad_norm"] > 0  # the ELBO estimate still carries the policy's gradient
    assert lines[2]["dpo/margin"] != 0.0
