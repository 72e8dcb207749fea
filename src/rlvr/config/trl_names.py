"""TRL's `GRPOConfig` names, accepted as aliases of the rlvr fields with the same meaning.

A bare TRL name on the command line, in `Trainer(overrides=...)` or at the top of a recipe
(`rlvr train num_generations=8 beta=0.04 loss_type=dr_grpo`) is rewritten to the rlvr field(s)
before the config is built, so everything after (checks, `config.yaml`, `--explain`) sees rlvr's
names. A TRL name whose values map to a choice (`loss_type`, `scale_rewards`) sets every field
that choice takes; one without an rlvr equivalent is refused with the reason and what to use.
`TRL_NAMES` is the table of `docs/migrating-from-trl.md` (`rlvr.config.reference.trl_markdown`; a
test keeps the page current and checks each row against TRL's own `GRPOConfig` defaults).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from rlvr.errors import ConfigError


@dataclass(frozen=True)
class TrlName:
    """One `GRPOConfig` field and what it is in rlvr."""

    trl: str
    trl_default: Any
    key: str = ""
    """The rlvr field taking the value as is ("" = the value picks `choices`, or no equivalent)."""
    choices: Mapping[Any, Mapping[str, Any]] = field(default_factory=dict)
    """TRL value -> the rlvr fields and values it means."""
    note: str = ""
    """How the meaning differs, or (with no `key` and no `choices`) why rlvr has no such field."""

    def fields(self) -> list[str]:
        return [self.key] if self.key else sorted({k for fields in self.choices.values() for k in fields})


_AGGREGATION = "algo.aggregation"
TRL_NAMES: dict[str, TrlName] = {t.trl: t for t in (
    TrlName("num_generations", 8, "rollout.group_size", note="completions per prompt"),
    TrlName("max_completion_length", 512, "rollout.max_new_tokens"),
    TrlName("temperature", 1.0, "rollout.temperature"),
    TrlName("top_p", 1.0, "rollout.top_p"),
    TrlName("top_k", 0, "rollout.top_k"),
    TrlName("min_p", None, "rollout.min_p", note="TRL's None is rlvr's 0 (off)"),
    TrlName("repetition_penalty", 1.0, "rollout.repetition_penalty", note=(
        "the torch sampler records log-probs before the penalty, so its samples train as on-policy (TRL "
        "without vLLM); vLLM's are after it, reweighted by rollout correction (TRL with vLLM)")),
    TrlName("learning_rate", 1e-6, "optim.lr"),
    TrlName("beta", 0.0, "algo.kl_coef", note="the k3 estimator in the loss, as TRL (`algo.kl_estimator`, "
                                              "`algo.kl_placement` choose others)"),
    TrlName("epsilon", 0.2, "algo.clip_low", note="also sets `algo.clip_high` unless `epsilon_high` is given, "
                                                  "as TRL does"),
    TrlName("epsilon_high", None, "algo.clip_high"),
    TrlName("num_iterations", 1, "trainer.ppo_epochs", note="passes over each rollout batch"),
    TrlName("steps_per_generation", None, "trainer.minibatches", note="optimizer steps per rollout batch"),
    TrlName("loss_type", "dapo", choices={
        "grpo": {_AGGREGATION: "seq_mean_token_mean"},
        "dr_grpo": {_AGGREGATION: "seq_mean_token_sum_norm"},
        "dapo": {_AGGREGATION: "token_mean"},
        "bnpo": {_AGGREGATION: "token_mean"},
        "cispo": {"algo.objective": "cispo", _AGGREGATION: "token_mean"},
        "sapo": {"algo.objective": "sapo", _AGGREGATION: "token_mean"},
    }, note="rlvr keeps the objective and its aggregation apart; token counts are always global, so bnpo is dapo"),
    TrlName("scale_rewards", "group", choices={
        "group": {"algo.std_normalize": True}, True: {"algo.std_normalize": True},
        "none": {"algo.std_normalize": False}, False: {"algo.std_normalize": False},
        "batch": {"algo.advantage": "lite_ppo"},
    }, note="`batch` is LitePPO's group mean over the batch std"),
    TrlName("importance_sampling_level", "token", choices={
        "token": {}, "sequence": {"algo.objective": "gspo"}}, note="`sequence` is GSPO"),
    TrlName("multi_objective_aggregation", "sum_then_normalize", choices={
        "sum_then_normalize": {}, "normalize_then_sum": {"algo.advantage": "gdpo"}},
        note="`normalize_then_sum` is GDPO"),
    TrlName("mask_truncated_completions", False, "algo.overlong_filter"),
    TrlName("entropy_coef", 0.0, "algo.entropy_coef"),
    TrlName("sapo_temperature_pos", 1.0, "algo.tau_pos", note="with `algo.objective=sapo`"),
    TrlName("sapo_temperature_neg", 1.05, "algo.tau_neg", note="with `algo.objective=sapo`"),
    TrlName("use_vllm", False, choices={True: {"rollout.engine": "vllm"}, False: {"rollout.engine": "torch"}}),
    TrlName("max_steps", -1, "trainer.steps", note="rlvr counts rollout batches; each is `trainer.minibatches` "
                                                   "optimizer steps"),
    TrlName("warmup_steps", 0, "optim.warmup_steps"),
    TrlName("seed", 42, "seed"),
    TrlName("weight_decay", 0.0, "optim.weight_decay"),
    TrlName("adam_beta1", 0.9, "optim.beta1"),
    TrlName("adam_beta2", 0.999, "optim.beta2"),
    TrlName("max_grad_norm", 1.0, "optim.grad_clip"),
    TrlName("lr_scheduler_type", "linear", choices={
        "constant": {"optim.schedule": "constant"}, "cosine": {"optim.schedule": "cosine"}}),
    TrlName("gradient_checkpointing", True, "trainer.gradient_checkpointing"),
    TrlName("bf16", None, choices={True: {"model.dtype": "bfloat16"}, False: {"model.dtype": "float32"}}),
    TrlName("save_steps", 500, "trainer.save_every"),
    TrlName("eval_steps", None, "trainer.eval_every"),
    TrlName("output_dir", None, "trainer.out_dir", note="rlvr's holds one directory per run"),
    TrlName("report_to", "none", choices={
        "none": {"trainer.trackers": ""}, "wandb": {"trainer.trackers": "wandb"},
        "tensorboard": {"trainer.trackers": "tensorboard"}, "mlflow": {"trainer.trackers": "mlflow"}}),
    TrlName("gradient_accumulation_steps", 1, note=(
        "rlvr accumulates by itself: each optimizer step takes rollout.prompts_per_step x rollout.group_size / "
        "trainer.minibatches completions, and trainer.micro_batch_size splits the forwards for memory only; "
        "`--from-trl` and `args=` convert it with the batch sizes")),
    TrlName("per_device_train_batch_size", 8, note=(
        "rlvr counts prompts: set rollout.prompts_per_step (= TRL's batch of completions / num_generations), and "
        "trainer.micro_batch_size for memory; `--from-trl` and `args=` convert it with num_generations")),
    TrlName("num_train_epochs", 3.0, note="rlvr runs trainer.steps rollout batches; set trainer.steps"),
    TrlName("generation_batch_size", None, note=(
        "set rollout.prompts_per_step (prompts per rollout batch) and trainer.minibatches; `--from-trl` and "
        "`args=` convert it")),
)}


def _pairs(name: str, value: Any, given: set[str]) -> list[tuple[str, Any]]:
    t = TRL_NAMES[name]
    if t.key:
        pairs = [(t.key, value)]
        if name == "epsilon" and "epsilon_high" not in given:
            pairs.append(("algo.clip_high", value))
        return pairs
    if not t.choices:
        raise ConfigError(f"{name} (TRL's GRPOConfig) has no rlvr field: {t.note}")
    for option, fields in t.choices.items():
        if option == value and type(option) is type(value):
            return list(fields.items())
    valid = ", ".join(repr(option) for option in t.choices)
    raise ConfigError(f"{name}={value!r} (TRL's GRPOConfig) has no rlvr equivalent; valid: {valid}")


def translate(pairs: Iterable[tuple[str, Any]]) -> list[list[tuple[str, Any]]]:
    """Each (key, value) as the rlvr (key, value) pairs it means: a bare TRL name becomes its
    fields, anything else stays as it is (one list per input pair, in order)."""
    pairs = list(pairs)
    given = {key for key, _ in pairs}
    _refuse_both(given, "on the command line")
    return [_pairs(key, value, given) if key in TRL_NAMES else [(key, value)] for key, value in pairs]


def trl_tree(tree: dict) -> list[tuple[str, Any]]:
    """The bare TRL names at the top of a recipe tree, taken out of it, as rlvr (key, value) pairs."""
    names = [key for key in tree if key in TRL_NAMES]
    _refuse_both({*names, *(f"{section}.{k}" for section, body in tree.items() if isinstance(body, dict)
                            for k in body)}, "in the recipe")
    return [pair for group in translate((key, tree.pop(key)) for key in names) for pair in group]


def _refuse_both(given: set[str], where: str) -> None:
    """A TRL name and the rlvr field it sets, both given in one place: one would silently win."""
    for name in sorted(given & TRL_NAMES.keys()):
        both = [key for key in TRL_NAMES[name].fields() if key in given and key != name]
        if both:
            raise ConfigError(f"{name}: given {where} beside {both[0]}, which it sets (TRL's name for it); "
                              f"keep one of the two")


def alias_hint(full: str) -> str | None:
    """For an unknown dotted key whose last part is a TRL name (`algo.beta`): the rlvr field(s)
    meant, or why rlvr has none."""
    t = TRL_NAMES.get(full.rsplit(".", 1)[-1])
    if t is None:
        return None
    if not t.fields():
        return f"; TRL's {t.trl} has no rlvr field: {t.note}"
    shown = " / ".join(f"'{k}'" for k in t.fields())
    return f"; did you mean {shown} (TRL's {t.trl}; the bare name {t.trl}=... is accepted too)?"
