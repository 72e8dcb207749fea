"""Every check of a resolved config, in one place: the schema's declared ranges, what each chosen
entry requires of the rest of the config, the options of entries that are not chosen, and the
rules that span fields, by subject (model, rollout, algorithm, expert rows, trainer, task and
reward, optimizer).

What a method needs is stated once, on its entry: an objective, advantage, aggregation or
likelihood estimator carries `@requires(Requirement(...))` (`rlvr.algos._registry`), an engine its
`EngineKind` (`rlvr.engines.kinds`: `requires`, `options`). `validate` walks the entries the
config chooses (`chosen_entries`, the list `rlvr config --explain` shows and the builder binds)
and refuses the first unmet requirement with its one line; a new method adds no line here.
What only the built run knows (the number of learner processes, the device) is checked by
`check_learners` and `check_fsdp_options`, which the builder calls.

Every refusal is one line: `<field>: <what is wrong and the fix>`.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Iterator, Mapping
from typing import Any, Protocol

from rlvr.algos._registry import requirements_of  # torch-free: the declarations, not the math
from rlvr.config.ranges import allowed, range_of
from rlvr.config.registries import REGISTRIES, REGISTRY, _get, chosen_entries, engine_kind
from rlvr.config.schema import Config
from rlvr.errors import ConfigError

Check = tuple[bool, str, str]
"""(ok, field, fix): refused as `<field>: <fix>` when not ok."""

TRACKERS = ("jsonl", "tensorboard", "wandb", "mlflow")

BACKEND_OPTIONS = {  # option -> (the field choosing its backend, the value that uses it)
    "trainer.rollout_workers": ("trainer.backend", "ray"), "trainer.reward_workers": ("trainer.backend", "ray"),
    "trainer.ray_address": ("trainer.backend", "ray"), "trainer.ray_learners": ("trainer.backend", "ray"),
}
"""Options read only by one backend: set to anything but their default under another, they would be
ignored. (An engine's own options are declared on its `EngineKind`.)"""


def validate(config: Config) -> None:
    """The schema's declared ranges and choices (``ranged``, ``choice``), then the rules by subject,
    then what the chosen entries require and the options of entries not chosen: the first failure
    is a one-line ConfigError."""
    errors = _range_errors(config)
    if errors:
        raise ConfigError(errors[0])
    for ok, name, fix in (*_model(config), *_rollout(config), *_algo(config), *_expert(config),
                          *_entry_requirements(config), *_trainer(config), *_task_and_reward(config),
                          *_optim(config), *_unchosen_options(config)):
        if not ok:
            raise ConfigError(f"{name}: {fix}")


def validate_blocks(config: Config, block_size: int) -> None:
    """`validate` with model.block_size=`block_size`: a checkpoint that names its own block size is a block
    model though model.block_size is left 0, and meets the same checks (named as the checkpoint's)."""
    if config.model.block_size or not block_size:
        return  # set: validated already, and the loader refuses a size other than the checkpoint's
    try:
        validate(dataclasses.replace(config, model=dataclasses.replace(config.model, block_size=block_size)))
    except ConfigError as err:
        raise ConfigError(f"{err} (model.path's config.json names blocks of {block_size})") from None


def _range_errors(node: Any, prefix: str = "") -> list[str]:
    """Every field given a range in the schema (``ranged``) whose value, when not null, is outside it."""
    errors = []
    for f in dataclasses.fields(node):
        value = getattr(node, f.name)
        if dataclasses.is_dataclass(value):
            errors += _range_errors(value, f"{prefix}{f.name}.")
        elif (rule := range_of(f)) is not None and value is not None and not allowed(f, value):
            inside = "in " if rule[0] in "[(" else ""
            big = isinstance(value, int) and abs(value) >= 10**24  # shown as a power of ten, not 400 digits
            got = f"~1e+{value.bit_length() * 30103 // 100000}" if big else repr(value)
            errors.append(f"{prefix}{f.name}: must be {inside}{rule}, got {got}; "
                          "fix the value in the recipe or override")
    return errors


def _entry_requirements(config: Config) -> Iterator[Check]:
    """Each requirement an entry the config chooses declares (`Requirement`), the engine's included."""
    entries = [(c.key, c.name, c.entry) for c in chosen_entries(config)]
    entries.append(("rollout.engine", config.rollout.engine, engine_kind(config)))
    for key, name, entry in entries:
        for need in requirements_of(entry):
            yield need.met(lambda dotted: _get(config, dotted)), need.field or key, need.fix.replace("{name}", name)


def _unchosen_options(config: Config) -> Iterator[Check]:
    """A backend's or an entry's own option (`BACKEND_OPTIONS`, an `EngineKind`'s `options`) set away
    from its default while another is chosen: it would be ignored."""
    owners = {key: (chooser, [value]) for key, (chooser, value) in BACKEND_OPTIONS.items()}
    for reg in REGISTRIES:
        entries = reg.entries()
        for name, entry in entries.items() if isinstance(entries, Mapping) else ():
            for key in getattr(entry, "options", ()):
                owners.setdefault(key, (reg.key, []))[1].append(name)
    for key, (chooser, names) in owners.items():
        chosen = _get(config, chooser)
        yield (chosen in names or _get(config, key) == _default(config, key), key,
               f"only read with {chooser}={names[0]} ({chooser} is '{chosen}'); set {chooser}={names[0]} or remove it")


def _default(config: Config, dotted: str) -> Any:
    """The schema's default of the field `dotted` (`rollout.vllm_block_size`)."""
    section, name = dotted.rsplit(".", 1)
    field = {f.name: f for f in dataclasses.fields(_get(config, section))}[name]
    return field.default if field.default is not dataclasses.MISSING else field.default_factory()


def _model(config: Config) -> list[Check]:
    m = config.model
    causal = m.kind == "causal"
    return [
        (m.kind in ("causal", "diffusion"), "model.kind", "must be 'causal' or 'diffusion'"),
        (bool(m.path) or m.hidden_size % m.num_heads == 0, "model.num_heads",
         f"must divide model.hidden_size ({m.hidden_size}) for a fresh tiny model"),
        (m.dtype == "float32" or causal, "model.dtype", f"{m.dtype} is implemented for model.kind=causal only; "
         "use float32"),
        (not m.teacher_path or m.lora.r == 0, "model.teacher_path",
         "a teacher replaces the LoRA base as the reference; set model.lora.r=0 or drop the teacher"),
        (bool(m.lora.target_modules), "model.lora.target_modules",
         "must name modules, e.g. [q_proj, v_proj] or all-linear"),
        (not m.lora.r or causal, "model.lora.r", "LoRA is implemented for model.kind=causal only; set it to 0"),
        # a block diffusion model: a masked-diffusion model whose window is whole blocks, sampled in blocks of its size
        (not m.block_size or m.kind == "diffusion", "model.block_size",
         "block diffusion needs model.kind=diffusion; or set 0"),
        (not m.block_size or config.rollout.max_new_tokens % m.block_size == 0, "model.block_size",
         f"must divide rollout.max_new_tokens ({config.rollout.max_new_tokens}): the window is whole blocks"),
    ]


def _rollout(config: Config) -> list[Check]:
    """The samplers' settings: truncation, temperature, groups, the diffusion sampler's window and
    schedule (CJ-GRPO's ascending steps, EOSER), IGPO's inpainting and SPEC-RL's drafts."""
    m, r, t = config.model, config.rollout, config.trainer
    diffusion = m.kind == "diffusion"
    greedy_varies = diffusion and r.remasking == "random"
    window = r.block_length or m.block_size
    blocks = r.max_new_tokens // window if window and r.max_new_tokens % window == 0 else 1
    steps = r.diffusion_steps or r.max_new_tokens
    ascending, eoser = r.step_schedule == "ascending", r.eoser_gamma is not None
    block = r.block_length or m.block_size or r.max_new_tokens
    per_block = (r.diffusion_steps or r.max_new_tokens) // max(r.max_new_tokens // block, 1)
    untruncated = r.top_p == 1.0 and r.top_k == 0 and r.min_p == 0.0 and r.repetition_penalty == 1.0
    spec = r.speculative
    return [
        (m.kind == "causal" or not (r.top_k or r.min_p), "rollout.top_k",
         "top_k and min_p truncate the causal samplers only (the diffusion sampler unmasks by confidence); set 0"),
        (r.temperature > 0 or greedy_varies, "rollout.temperature",
         "0 (greedy) gives every completion of a group the same text, so every group's rewards tie, its "
         "advantages are 0 and nothing trains; use a temperature > 0, e.g. 1.0"),
        (r.micro_group_size >= 0 and (r.micro_group_size == 0 or r.group_size % r.micro_group_size == 0),
         "rollout.micro_group_size", "must be 0 (one pass) or divide rollout.group_size"),
        (r.vllm_block_size >= 0 and r.vllm_block_size % 16 == 0, "rollout.vllm_block_size",
         "must be 0 (vLLM's default) or a multiple of 16 (32 on CPU)"),
        (not r.server_urls or (r.servers == 1 and r.server_port == 0), "rollout.server_urls",
         "attaches to running servers (one per address): leave rollout.servers and rollout.server_port unset"),
        (r.engine != "vllm_server" or t.backend == "local", "trainer.backend",
         "rollout.engine=vllm_server runs its servers from this process (Ray rollout workers would each start "
         "their own); use trainer.backend=local, or rollout.engine=vllm on Ray"),
        (not r.greedy_in_group or diffusion, "rollout.greedy_in_group",
         "is implemented for model.kind=diffusion only; set it to false"),
        (not r.igpo or diffusion and r.engine == "torch", "rollout.igpo",
         "inpaints the diffusion sampler's window; set model.kind=diffusion (torch engine) or false"),
        (not r.igpo or not m.block_size, "rollout.igpo",
         f"inpaints a bidirectional model's whole window; a block model (blocks of {m.block_size}) samples block "
         f"by block: set rollout.igpo=false, or train a bidirectional checkpoint (model.block_size=0)"),
        (r.igpo_hint_low <= r.igpo_hint_high, "rollout.igpo_hint_low", "must be <= rollout.igpo_hint_high"),
        (not diffusion or not r.block_length or r.max_new_tokens % r.block_length == 0, "rollout.block_length",
         f"must divide rollout.max_new_tokens ({r.max_new_tokens}), or be 0 (the whole window)"),
        (not m.block_size or r.block_length in (0, m.block_size), "rollout.block_length",
         f"a block model samples blocks of model.block_size ({m.block_size}); set 0 or {m.block_size}"),
        (not diffusion or r.threshold is not None or steps % blocks == 0 and steps >= blocks, "rollout.diffusion_steps",
         f"must be a multiple of the number of blocks ({blocks} = max_new_tokens / block_length), or 0"),
        (not diffusion or r.repetition_penalty == 1, "rollout.repetition_penalty", "the causal samplers only; set 1"),
        (diffusion or not (ascending or eoser), "rollout.step_schedule",
         "ascending steps and rollout.eoser_gamma schedule the diffusion sampler; set model.kind=diffusion"),
        (r.threshold is None or not (ascending or eoser), "rollout.threshold",
         "decodes by confidence, without a step schedule; set null for rollout.step_schedule=ascending or eoser_gamma"),
        (not eoser or r.remasking == "low_confidence", "rollout.eoser_gamma",
         f"scales a probability: set rollout.remasking=low_confidence (not {r.remasking!r}) or eoser_gamma=null"),
        (not ascending or block >= 2 ** per_block, "rollout.diffusion_steps",
         f"ascending steps double: a block of {block} tokens fits at most {block.bit_length() - 1} steps, "
         f"not {per_block}"),
        # SPEC-RL verifies drafts with the trainer's own causal model, one completion per row, under the
        # distribution the torch sampler samples from
        (not spec or r.engine == "torch", "rollout.speculative",
         "verifies drafts on the torch engine; set rollout.engine=torch"),
        (not spec or m.kind == "causal", "rollout.speculative",
         "drafts are verified token by token left to right: set model.kind=causal, or rollout.speculative=false"),
        (not spec or not config.task.name.startswith("agent_"), "rollout.speculative",
         "multi-turn episodes have no single completion to draft; set rollout.speculative=false"),
        (not spec or untruncated, "rollout.speculative",
         "the acceptance rule needs the policy's distribution: set top_p=1, top_k=0, min_p=0, repetition_penalty=1"),
        (not spec or r.micro_group_size == 0, "rollout.micro_group_size",
         "must be 0 with rollout.speculative (whole groups)"),
        (not spec or t.max_staleness is None and t.backend == "local", "rollout.speculative",
         "implemented for the synchronous local loop; unset trainer.max_staleness and use trainer.backend=local"),
        # a draft is the previous completion of the same prompt: a procedural task draws fresh ones forever
        (not spec or config.task.train_size or hasattr(getattr(config.task, config.task.name, None), "path"),
         "rollout.speculative", "has nothing to draft: a procedural task with task.train_size=0 never repeats a "
         "prompt; set task.train_size=N (e.g. 64) or rollout.speculative=false"),
    ]


def _or(value, default):
    """`value`, or `default` where it is null (a 0 stays 0)."""
    return default if value is None else value


def _algo(config: Config) -> list[Check]:
    a, r, e = config.algo, config.rollout, config.estimator
    return [
        (a.pass_k is None or a.pass_k <= r.group_size, "algo.pass_k",
         f"must be at most rollout.group_size ({r.group_size}): pass@k draws k of a group's completions"),
        (0 <= a.overlong_buffer <= r.max_new_tokens, "algo.overlong_buffer",
         "must be between 0 (off) and rollout.max_new_tokens"),
        (_or(a.pass_rate_low, 0.0) < _or(a.pass_rate_high, 1.0), "algo.pass_rate_high",
         "must be above algo.pass_rate_low (the band keeps low < p < high)"),
        (a.clip_low is None or a.clip_low >= 0, "algo.clip_low", "must be >= 0 (the ratio floor is 1 - clip_low)"),
        (a.clip_high is None or a.clip_high >= 0, "algo.clip_high",
         "must be >= 0 (the ratio ceiling is 1 + clip_high)"),
        (a.critic_warmup_steps >= 0, "algo.critic_warmup_steps", "must be >= 0"),
        (a.cov_lb is None or a.cov_ub is None or a.cov_lb < a.cov_ub, "algo.cov_lb",
         f"must be below algo.cov_ub ({a.cov_ub}): Clip-Cov drops tokens whose covariance is between them"),
        (e.t_min is None or e.t_max is None or e.t_min < e.t_max, "estimator.t_min",
         f"must be below estimator.t_max ({e.t_max})"),
    ]


def _expert(config: Config) -> list[Check]:
    e = config.expert
    return [
        (e.per_step >= 0, "expert.per_step", "must be >= 0 (0 = no expert rows)"),
        (e.pool_size >= 0, "expert.pool_size", "must be >= 0 (0 = a fresh problem every row)"),
        (0 <= e.weight <= 1 and (e.weight_final is None or 0 <= e.weight_final <= 1), "expert.weight",
         "μ must be in [0, 1] (weight and weight_final)"),
        (e.decay_steps >= 0, "expert.decay_steps", "must be >= 0 (0 = constant μ)"),
    ]


def _partial(config: Config) -> list[Check]:
    """Partial rollouts and the per-token staleness bound (`trainer.partial_rollouts`, `max_token_staleness`)."""
    t, on = config.trainer, config.trainer.partial_rollouts
    kind = engine_kind(config)
    return [
        (not on or t.max_staleness is not None, "trainer.partial_rollouts",
         "works in the asynchronous loop; set trainer.max_staleness (>= 1) or trainer.partial_rollouts=false"),
        (not on or kind.partial, "trainer.partial_rollouts",
         f"rollout.engine={config.rollout.engine} samples a batch in one call a weight update cannot enter; use "
         "rollout.engine=torch or vllm_server"),
        (not on or config.model.kind == "causal", "trainer.partial_rollouts",
         "swaps weights in the causal sampler's KV cache; use model.kind=causal"),
        (not on or t.backend == "local", "trainer.partial_rollouts", "is for the local rollout side; use "
         "trainer.backend=local"),
        (not on or t.rollout_lanes == 1, "trainer.partial_rollouts", "takes one lane; set trainer.rollout_lanes=1"),
        (not on or t.staleness == "bounded", "trainer.partial_rollouts",
         "samples each chunk with the newest weights, which depends on timing (so data-parallel learners, "
         "which need one agreed version, cannot take it either); use trainer.staleness=bounded"),
        (t.max_token_staleness is None or t.max_staleness is not None, "trainer.max_token_staleness",
         "bounds the asynchronous loop's tokens; set trainer.max_staleness or leave it null"),
        (t.max_token_staleness is None or t.max_staleness is None or t.max_token_staleness <= t.max_staleness,
         "trainer.max_token_staleness", f"above trainer.max_staleness ({t.max_staleness}) it masks nothing "
         "(admission bounds every token by it); set it lower or leave it null"),
    ]


def _trainer(config: Config) -> list[Check]:
    t, r = config.trainer, config.rollout
    trackers = [n.strip() for n in t.trackers.split(",") if n.strip()]
    unknown = [n for n in trackers if n not in TRACKERS]
    return [
        (r.prompts_per_step % t.minibatches == 0, "trainer.minibatches",
         f"must divide rollout.prompts_per_step ({r.prompts_per_step}) so groups stay whole"),
        (re.fullmatch(r"auto|cpu|cuda(:\d+)?", t.device) is not None, "trainer.device",
         "must be 'auto', 'cpu', 'cuda' or 'cuda:N'"),
        (t.device in ("auto", "cpu") or config.model.kind == "causal", "trainer.device",
         "diffusion models run on the CPU only; use auto or cpu"),
        (t.thread_mode != "rows" or config.model.kind == "causal", "trainer.thread_mode",
         "'rows' splits causal-model batches only; use 'ops' with model.kind=diffusion"),
        (t.eval_every >= 0, "trainer.eval_every", "must be >= 0 (0 = only at start and end)"),
        (t.save_every >= 0, "trainer.save_every", "must be >= 0 (0 = only at the end)"),
        (t.samples_per_step >= 0, "trainer.samples_per_step", "must be >= 0"),
        (not unknown, "trainer.trackers",
         f"unknown tracker {unknown[0] if unknown else ''!r}; valid: {', '.join(TRACKERS)} (comma-separated)"),
        (t.rollout_lanes == 1 or (t.max_staleness or 0) >= 1, "trainer.rollout_lanes",
         "more than 1 needs trainer.max_staleness >= 1 (lanes roll out batches ahead of the update); set "
         "trainer.max_staleness or trainer.rollout_lanes=1"),
        (t.rollout_lanes == 1 or t.backend == "local", "trainer.rollout_lanes",
         "more than 1 is for the local rollout side; on Ray set trainer.rollout_workers instead"),
        (t.rollout_lanes == 1 or not engine_kind(config).own_weights, "trainer.rollout_lanes",
         "more than 1 needs lanes with their own copies of the weights, which an engine with its own weights "
         "(one engine) does not have; set rollout.engine=torch or trainer.rollout_lanes=1"),
        *_partial(config),
        (not t.ray_learners or t.learners == "fsdp", "trainer.ray_learners",
         "starts FSDP2 learners; set trainer.learners=fsdp as well (or trainer.ray_learners=0)"),
    ]


def _task_and_reward(config: Config) -> list[Check]:
    """Values that types accept but that would silently train on something else (or nothing)."""
    t, rw, tr = config.task, config.reward, config.trainer
    ray_rewards = tr.ray_learners > 0 or tr.backend == "ray"  # Ray reward workers, of rank 0 under ray_learners too
    sampler = REGISTRY["sampler.name"].get(config.sampler.name)
    section = getattr(t, t.name, None)
    heldout_file = bool(getattr(section, "heldout_path", None) or getattr(section, "heldout_split", None))
    return [
        (math.isfinite(config.reward.timeout_s) and config.reward.timeout_s >= 0, "reward.timeout_s",
         "must be a number of seconds >= 0, e.g. 10 (0 = no limit)"),
        (t.heldout_size >= 1 or heldout_file, "task.heldout_size",
         "must be >= 1: held-out accuracy is measured on these problems (evaluate less often with trainer.eval_every)"),
        (not config.sampler.calibration_every or hasattr(sampler, "predict"), "sampler.calibration_every",
         f"sampler {config.sampler.name!r} predicts no pass rates; use sampler.name=mopps, vade or dots, or set "
         "sampler.calibration_every=0"),
        (not rw.fn or not ray_rewards or tr.reward_workers <= 1 or rw.model_normalize != "batch",
         "reward.model_normalize=batch", f"each of trainer.reward_workers={tr.reward_workers} would whiten its own "
         "share of the batch; set trainer.reward_workers=1 or reward.model_normalize=none"),
    ]


def _optim(config: Config) -> list[Check]:
    o, s = config.optim, config.sft
    return [
        (o.warmup_steps >= 0, "optim.warmup_steps", "must be >= 0 (0 = no warmup)"),
        (o.weight_decay >= 0, "optim.weight_decay", "must be >= 0 (0 = none), e.g. 0.01"),
        (0 <= o.beta1 < 1, "optim.beta1", "must be in [0, 1), e.g. 0.9"),
        (0 <= o.beta2 < 1, "optim.beta2", "must be in [0, 1), e.g. 0.99"),
        (o.grad_clip >= 0, "optim.grad_clip", "must be >= 0 (0 = off)"),
        (0 <= o.min_lr_ratio <= 1, "optim.min_lr_ratio", "must be in [0, 1]"),
        (s.warmup_steps >= 0, "sft.warmup_steps", "must be >= 0 (0 = no warmup)"),
        (s.steps >= 1, "sft.steps", "must be >= 1"),
        (s.batch_size >= 1, "sft.batch_size", "must be >= 1"),
        (bool(config.preference.step_separator) or not config.preference.process, "preference.step_separator",
         "must not be empty: it splits each solution into the steps a process reward model scores, e.g. ','"),
        (_two_verdicts(config.reward.judge_verdicts), "reward.judge_verdicts",
         f"must be two different verdicts, the good one first, e.g. Yes,No (got {config.reward.judge_verdicts!r})"),
        (bool(config.reward.model_step_separator) or not config.reward.model_steps, "reward.model_step_separator",
         "must not be empty: it splits each completion into the steps the process reward model scores, e.g. '\\n\\n'"),
    ]


def _two_verdicts(text: str) -> bool:
    """`Yes,No`: two non-empty verdicts that differ (`Y,Y` makes every judged reward 0.5)."""
    parts = [v.strip() for v in text.split(",")]
    return len(parts) == 2 and all(parts) and parts[0] != parts[1]


class World(Protocol):
    """Where the run's learners are (`rlvr.runtime.distributed.Shard`)."""

    size: int
    fsdp: bool


FSDP_DTYPES = ("", "float32", "bfloat16")  # trainer.fsdp_*_dtype


def check_learners(config: Config, world: World) -> None:
    """What data-parallel learners support so far: the synchronous loop (a critic too, sharded as
    the policy), the asynchronous one with the torch engine (at η >= 1 on the exact schedule), and
    minibatches of whole groups (and the expert rows after them) that split over the ranks."""
    t = config.trainer
    if t.backend == "ray" and not t.ray_learners:  # Ray rollouts under torchrun's ranks
        raise ConfigError(f"trainer.backend: Ray runs the rollout side of one learner process; for {world.size} "
                          "FSDP2 learner(s) on Ray set trainer.ray_learners=N (Ray starts the ranks) and run "
                          "without torchrun, or use trainer.backend=local")
    if world.size > 1 and t.max_staleness and t.staleness != "exact":  # each rank would pick its own version
        raise ConfigError(f"trainer.staleness: {world.size} data-parallel learners overlapping the update "
                          f"(max_staleness {t.max_staleness}) sample every batch from one agreed version; "
                          "set trainer.staleness=exact")
    if world.size > 1 and t.max_staleness is not None and engine_kind(config).own_weights:
        raise ConfigError(f"rollout.engine: an engine with its own weights under trainer.max_staleness is not "
                          f"supported with {world.size} data-parallel learners yet (rank 0's engine would broadcast "
                          "from the rollout thread); use rollout.engine=torch, or the synchronous loop")


def check_fsdp_options(config: Config, world: World, device_type: str) -> None:
    """The FSDP2 options name a sharded learner, and CPU offload a model on a GPU (FSDP2's offload
    copies the shards to an accelerator for each use: on a CPU there is none). `device_type`: the
    resolved `trainer.device`'s (`cpu`, `cuda`)."""
    t = config.trainer
    for name in ("fsdp_param_dtype", "fsdp_reduce_dtype"):
        if getattr(t, name) not in FSDP_DTYPES:
            raise ConfigError(f"trainer.{name}: must be empty (the parameters' own dtype), 'float32' or 'bfloat16'")
    given = [name for name, value in (("fsdp_param_dtype", t.fsdp_param_dtype), ("fsdp_reduce_dtype",
             t.fsdp_reduce_dtype), ("fsdp_cpu_offload", t.fsdp_cpu_offload)) if value]
    if given and not world.fsdp:
        raise ConfigError(f"trainer.{given[0]}: applies to FSDP2 learners only; set trainer.learners=fsdp "
                          "or start the run with torchrun --nproc_per_node N")
    if t.fsdp_cpu_offload and device_type == "cpu":
        raise ConfigError("trainer.fsdp_cpu_offload: needs a CUDA device (the model already lives in CPU memory "
                          "on a CPU run); set it to false")
