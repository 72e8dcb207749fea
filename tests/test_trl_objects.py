"""TRL's objects through `rlvr.Trainer`: TRL's GRPO quickstart as TRL's docs write it, with only the
import changed, on TRL's own `GRPOConfig`, peft's `LoraConfig` and a `transformers.TrainerCallback`;
what they convert to, and one-line refusals of what rlvr does not do."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

import rlvr
from rlvr.errors import ConfigError

trl = pytest.importorskip("trl")
peft = pytest.importorskip("peft")
datasets = pytest.importorskip("datasets")

MODEL = str(Path(rlvr.__file__).parent / "assets" / "countdown-warmstart")  # a local checkpoint directory


def _dataset():
    """Stands for TRL's ``load_dataset("trl-lib/tldr", split="train")``: a `datasets.Dataset` of prompts."""
    return datasets.Dataset.from_list([{"prompt": f"{a} {a + 1} 1>{2 * a + 2}:"} for a in range(1, 41)])


def test_trls_grpo_quickstart_runs_with_only_the_import_changed(tmp_path):
    from peft import LoraConfig
    from transformers import TrainerCallback
    from trl import GRPOConfig

    from rlvr import Trainer as GRPOTrainer  # the one change: was `from trl import GRPOTrainer`

    events = []

    class Watch(TrainerCallback):
        def on_train_begin(self, args, state, control, **kwargs):
            events.append(("begin", state.global_step, state.max_steps, args.output_dir))

        def on_step_end(self, args, state, control, **kwargs):
            events.append(("step", state.global_step))

        def on_log(self, args, state, control, logs=None, **kwargs):
            events.append(("log", state.global_step, logs["reward"], logs["rewards/user/mean"]))

        def on_save(self, args, state, control, **kwargs):
            events.append(("save", state.global_step))

        def on_train_end(self, args, state, control, **kwargs):
            events.append(("end", state.global_step, len(state.log_history)))

    # TRL's quickstart, as its docs write it, with a tiny model and a few short steps
    dataset = _dataset()

    def reward_len(completions, **kwargs):
        return [-abs(20 - len(completion)) for completion in completions]

    training_args = GRPOConfig(output_dir=str(tmp_path / "Qwen2-0.5B-GRPO"), max_steps=3, num_generations=4,
                               per_device_train_batch_size=8, max_completion_length=8, logging_steps=1,
                               report_to="none", bf16=False, use_cpu=True)
    trainer = GRPOTrainer(
        model=MODEL,
        reward_funcs=reward_len,
        args=training_args,
        train_dataset=dataset,
        peft_config=LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM"),
        callbacks=[Watch()],
    )
    trainer.train()

    run = trainer.run_dir
    assert run.parent == tmp_path / "Qwen2-0.5B-GRPO"  # TRL's output_dir holds the run
    config = yaml.safe_load((run / "config.yaml").read_text())
    # TRL's numbers: 8 completions per device batch / 4 generations = 2 prompts a step; TRL's default lr
    assert (config["rollout"]["prompts_per_step"], config["rollout"]["group_size"]) == (2, 4)
    assert config["optim"]["lr"] == 1e-6 and config["rollout"]["max_new_tokens"] == 8
    assert config["model"]["lora"] == {"r": 4, "alpha": 8.0, "dropout": 0.0, "target_modules": ["q_proj", "v_proj"]}
    assert (run / "checkpoints" / "step_000003" / "adapter_config.json").is_file()  # only the adapter trained
    lines = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in lines] == [0, 1, 2, 3]
    # TRL has no group filter: every group trains, a zero-variance one too
    assert config["algo"]["dynamic_sampling"] is False
    assert all(m["reward/mean"] == m["reward/generated_mean"] for m in lines[1:])  # the trained batch is all
    assert events[0] == ("begin", 0, 3, str(tmp_path / "Qwen2-0.5B-GRPO"))
    assert [e[1] for e in events if e[0] == "step"] == [1, 2, 3]
    logs = [e for e in events if e[0] == "log"]  # TRL's `reward` is over every completion generated
    assert [(e[1], e[2], e[3]) for e in logs] == [(m["step"], m["reward/generated_mean"], m["reward/user/mean"])
                                                  for m in lines[1:]]
    assert all(e[2] <= 0 for e in logs)  # reward_len peaks at 0
    assert ("save", 3) in events and events[-1] == ("end", 3, 5)  # 3 logs, the warm-start and final evaluations


def test_epochs_batch_sizes_and_stopping_as_trl_means_them(tmp_path):
    from transformers import TrainerCallback
    from trl import GRPOConfig

    from rlvr import Trainer

    class StopAtTwo(TrainerCallback):
        def on_init_end(self, args, state, control, **kwargs):
            self.inited = state.max_steps

        def on_step_end(self, args, state, control, **kwargs):
            control.should_training_stop = state.global_step == 2

    stop = StopAtTwo()
    args = GRPOConfig(output_dir=str(tmp_path), num_train_epochs=1, per_device_train_batch_size=4,
                      gradient_accumulation_steps=2, num_generations=2, max_completion_length=6, bf16=False,
                      use_cpu=True, report_to="none")
    trainer = Trainer(MODEL, lambda completions, **kw: [float(len(c) % 2) for c in completions], _dataset(),
                      args=args, callbacks=[stop], overrides={"trainer.threads": 1}, echo=lambda *a: None)
    # 4 x 2 accumulated = 8 completions / 2 generations = 4 prompts a step; one epoch of 40 rows = 10 steps
    assert (trainer.config.rollout.prompts_per_step, trainer.config.trainer.steps) == (4, 10)
    assert stop.inited == 10  # on_init_end at construction, with the run's numbers
    assert trainer.config.trainer.out_dir == str(tmp_path) and trainer.config.seed == 42  # TRL's seed
    final = trainer.train()
    assert final["step"] == 2  # control.should_training_stop stopped it, with a final checkpoint
    assert (trainer.run_dir / "checkpoints" / "step_000002").is_dir()
    as_dict = Trainer(MODEL, lambda completions, **kw: [0.0] * len(completions), _dataset(),
                      args={"num_generations": 4, "max_steps": 5, "learning_rate": 3e-6}, echo=lambda *a: None)
    assert (as_dict.config.rollout.group_size, as_dict.config.trainer.steps, as_dict.config.optim.lr) == (4, 5, 3e-6)


def test_overrides_win_over_args_and_unconverted_names_are_said(tmp_path):
    from trl import GRPOConfig

    from rlvr import Trainer

    said = []
    trainer = Trainer(MODEL, lambda completions, **kw: [0.0] * len(completions), _dataset(),
                      args=GRPOConfig(output_dir=str(tmp_path), max_steps=4, num_generations=4, bf16=False,
                                      use_cpu=True, lr_scheduler_type="polynomial"),
                      overrides={"rollout.group_size": 2, "rollout.prompts_per_step": 3}, echo=said.append)
    assert (trainer.config.rollout.group_size, trainer.config.rollout.prompts_per_step) == (2, 3)
    assert said == ["note: args: lr_scheduler_type='polynomial': has no rlvr equivalent; valid: 'constant', 'cosine'"]


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"optimizers": (None, None)}, "optimizers: not an rlvr.Trainer argument; rlvr builds the optimizer"),
    ({"peft_config": "lora"}, "peft_config: rlvr's adapters are LoRA; pass peft.LoraConfig"),
    ({"args": 3}, "args: expected TRL's GRPOConfig or a dict of its fields, got int"),
    ({"processing_class": object()}, "processing_class: with a model directory rlvr uses the tokenizer saved"),
])
def test_what_rlvr_does_not_take_is_one_line(kwargs, message):
    from rlvr import Trainer

    with pytest.raises(ConfigError) as err:
        Trainer(MODEL, lambda completions, **kw: [0.0] * len(completions), _dataset(), echo=lambda *a: None,
                **kwargs)
    assert str(err.value).startswith(message) and "\n" not in str(err.value)


def test_lora_settings_rlvr_lacks_callback_hooks_it_never_calls_and_args_in_the_dataset_place():
    from peft import LoraConfig
    from transformers import AutoTokenizer, TrainerCallback
    from trl import GRPOConfig

    from rlvr import Trainer

    def make(*args, **kwargs):
        return Trainer(MODEL, lambda completions, **kw: [0.0] * len(completions), *args, echo=lambda *a: None,
                       **kwargs)

    with pytest.raises(ConfigError, match=r"^peft_config.use_dora=True: rlvr's adapters take r, lora_alpha"):
        make(_dataset(), peft_config=LoraConfig(use_dora=True))

    class EveryMicroBatch(TrainerCallback):
        def on_substep_end(self, args, state, control, **kwargs):
            pass

    with pytest.raises(ConfigError, match=r"^callbacks\[0\]: EveryMicroBatch.on_substep_end is a hook rlvr never "
                                          r"calls; a TrainerCallback here can have on_init_end, on_train_begin"):
        make(_dataset(), callbacks=[EveryMicroBatch])  # a class, as TRL takes it too
    with pytest.raises(ConfigError, match=r"^train_dataset: got a GRPOConfig; pass it as args="):
        make(GRPOConfig(output_dir="x", bf16=False, use_cpu=True))
    own = AutoTokenizer.from_pretrained(MODEL)  # the directory's own tokenizer: what rlvr loads anyway
    assert make(_dataset(), processing_class=own)._tokenizer is None
