"""The schema: one frozen dataclass per section, a docstring under each field (docs/config.md is
generated from them)."""

from __future__ import annotations

from dataclasses import dataclass, field

from rlvr.config.commands_schema import PreferenceConfig, SFTConfig  # noqa: F401  re-exported, as below
from rlvr.config.method_schema import EstimatorConfig, ExpertConfig, SamplerConfig
from rlvr.config.ranges import choice, ranged
from rlvr.config.sections import section_type  # noqa: F401  re-exported: the loader's walk of the schema
from rlvr.config.task_schema import (  # noqa: F401  re-exported: the schema is one namespace
    AgentTaskConfig,
    ArithmeticTaskConfig,
    CalculatorTaskConfig,
    CodeFileTaskConfig,
    CountdownPythonTaskConfig,
    CountdownTaskConfig,
    FileTaskConfig,
    GuessTaskConfig,
    LookupTaskConfig,
    MathFileTaskConfig,
    Sudoku4TaskConfig,
    TaskConfig,
)


@dataclass(frozen=True)
class LoraConfig:
    """LoRA adapters through `peft` (the `lora` extra): only the adapters train, the base stays
    as loaded, and the KL reference is the base (the adapter disabled)."""

    r: int = ranged(0, ">= 0", "0 = no adapters")
    """Adapter rank, 0 = off (full fine-tuning)."""
    alpha: float = ranged(16.0, "> 0", "e.g. 16")
    """Scaling numerator: the update is (alpha / r)·BA."""
    dropout: float = ranged(0.0, "[0, 1)")
    """Dropout on the adapter's input."""
    target_modules: str | list[str] = "all-linear"
    """Modules that get adapters: a list of module-name suffixes (`[q_proj, v_proj]`) or a peft
    shorthand such as `all-linear` (every linear layer but the LM head)."""


@dataclass(frozen=True)
class ModelConfig:
    kind: str = "causal"
    """`causal` (autoregressive LM) or `diffusion` (masked-diffusion LM)."""
    path: str = "rlvr:countdown-warmstart"
    """Local HF directory, `rlvr:NAME` (packaged checkpoint), empty = fresh tiny model; `???` in a
    recipe = the user must pass one."""
    shift_logits: bool = False
    """Diffusion: Dream-style shifted logits (position i predicts token i+1)."""
    teacher_path: str = ""
    """On-policy distillation: a checkpoint (as `path`) that the reference is loaded from instead of a copy
    of the starting weights; the objective `reverse_kl_distill` trains toward it. Empty = off."""
    block_size: int = ranged(0, ">= 0", "0 = bidirectional")
    """Diffusion: 0 = fully bidirectional; > 0 = block diffusion (full attention inside blocks of this many window
    tokens, causal across blocks, sampled block by block with a KV cache); a block checkpoint sets its own."""
    hidden_size: int = ranged(128, ">= 1")
    """Tiny model: width."""
    num_layers: int = ranged(4, ">= 1")
    """Tiny model: transformer blocks."""
    num_heads: int = ranged(4, ">= 1")
    """Tiny model: attention heads."""
    intermediate_size: int = ranged(512, ">= 1")
    """Tiny model: MLP width."""
    max_seq_len: int = ranged(64, ">= 2")
    """Tiny model: longest prompt + completion."""
    dtype: str = choice("float32", ("float32", "bfloat16", "auto"))
    """Weight dtype: `float32`, `bfloat16` or `auto` (the checkpoint's own; float32 for a fresh tiny
    model) (causal models; log-probs are computed in float32 from the logits
    either way; the fused fast path and C++ kernels take float32 only, bf16 runs the plain
    `transformers` forward)."""
    lora: LoraConfig = field(default_factory=LoraConfig)
    """LoRA adapters (causal models)."""
    train_vision: bool = False
    """Vision-language models: train the vision tower and connector too (LoRA `all-linear` then covers
    them); false = frozen, only the language model trains."""


@dataclass(frozen=True)
class RewardConfig:
    fn: str = ""
    """User reward `file.py:name` or `module:name` replacing the task's verifier; empty = task's."""
    timeout_s: float = ranged(10.0, ">= 0", "0 = no limit")
    """Wall-clock deadline of each sample's reward and `is_correct` (a batched call: the whole batch, then each
    sample alone); a sample past it gets reward 0 (`reward/<name>/timeouts`). 0 = no limit."""
    workers: int = ranged(2, ">= 0", "0 = in the trainer's process, where a call holding the GIL cannot be stopped")
    """Processes that run reward functions and task verifiers, killed and replaced when a sample breaches."""
    worker_memory_mb: int = ranged(2048, ">= 0", "0 = no limit")
    """Memory a reward worker may add to its size when forked (RLIMIT_AS); a sample over it gets reward 0."""
    math_workers: int = ranged(2, ">= 1")
    """Processes for symbolic math checks (sympy via math-verify), each under `math_memory_mb`."""
    math_memory_mb: int = ranged(1024, ">= 0", "0 = no limit")
    """Memory a symbolic math worker may add to its size at start (RLIMIT_AS); past it the check is False."""
    model_batch_size: int = ranged(16, ">= 1")
    """Reward models named in `fn` (a saved model folder): pairs scored per forward (memory only)."""
    model_normalize: str = choice("none", ("none", "batch"))
    """Reward models: `none` (raw scores) or `batch` (whitened over each rollout batch: (r − mean) / std)."""
    model_clip: float = ranged(0.0, ">= 0", "0 = no clipping")
    """Reward models: bound each (normalised) score to [−clip, clip]; 0 = no clipping."""
    model_steps: str = ""
    """Reward models as process reward models: each step's prefix scored, the step scores aggregated by `min`,
    `last`, `mean`, `clipped` (Σ min(s − η, 0)) or `delta` (Σ of s_k − s_{k+1}); empty = whole completions."""
    model_step_separator: str = "\n\n"
    """Process reward models: the text between steps."""
    model_step_threshold: float = ranged(0.0, "finite")
    """Process reward models, `clipped`: the threshold η."""
    model_turns: str = ""
    """Agent tasks: the process reward model in `fn` scores each turn's prefix of actions, and turn k gets its weight
    × the `raw`, `clipped` or `delta` step reward k on top of the environment's (gigpo, turn_return); empty = off."""
    judge_rubric: str = "Question: {prompt}\nAnswer: {completion}\nIs the answer correct?"
    """Generative judges named in `fn` (`judge:DIR`, a causal LM): their prompt, with `{prompt}` and `{completion}`."""
    judge_mode: str = choice("verdict", ("verdict", "score"))
    """Judges: `verdict` (p(first verdict) / p(both) at the next token) or `score` (a greedy verdict's `Score: N`)."""
    judge_verdicts: str = "Yes,No"
    """Judges, `verdict`: the good and the bad verdict, one token each of the judge's tokenizer."""
    judge_score_max: float = ranged(10.0, "> 0")
    """Judges, `score`: the top of the score scale (scores in [0, max] map to [0, 1])."""
    judge_max_new_tokens: int = ranged(32, ">= 1")
    """Judges, `score`: the verdict's length cap."""


@dataclass(frozen=True)
class RolloutConfig:
    prompts_per_step: int = ranged(8, ">= 1")
    """P: fresh prompts per step."""
    group_size: int = ranged(16, ">= 2", "group baselines need siblings")
    """G: completions per prompt (B = P·G)."""
    max_new_tokens: int = ranged(16, ">= 1")
    """Completion length cap (longer samples are truncated)."""
    temperature: float = ranged(1.0, ">= 0", "0 = greedy")
    """Sampling temperature (the trainer's log-probs use the same)."""
    top_p: float = ranged(1.0, "(0, 1]")
    """Nucleus sampling mass."""
    top_k: int = ranged(0, ">= 0", "0 = off")
    """Sample from the k most likely tokens only, 0 = off (causal models, both engines)."""
    min_p: float = ranged(0.0, "[0, 1)", "0 = off")
    """Drop tokens less likely than min_p times the most likely one, 0 = off (causal models, both engines)."""
    repetition_penalty: float = ranged(1.0, "[0.1, 10]", "1 = off")
    """Seen tokens' logits divided (if > 0) or multiplied by this in sampling, 1 = off (causal models, both engines)."""
    diffusion_steps: int = ranged(0, ">= 0", "0 = one token per step")
    """Diffusion sampler: denoising steps N, 0 = one token per step (N = L)."""
    block_length: int = ranged(0, ">= 0", "0 = the whole window")
    """Diffusion sampler: semi-autoregressive block length B, 0 = the whole window."""
    remasking: str = "low_confidence"
    """Diffusion sampler: low_confidence | random | entropy | margin."""
    threshold: float | None = ranged(None, "(0, 1]", "a confidence; null = off")
    """Diffusion sampler: commit every token above this confidence (dynamic)."""
    suppress_eos: bool = False
    """Diffusion sampler: lower EOS confidence so content is committed first."""
    step_schedule: str = choice("even", ("even", "ascending"))
    """Diffusion sampler: tokens committed per step of a block: `even` (LLaDA) or `ascending` (CJ-GRPO's ASS: 2^s at
    step s, the rest at the block's last step; a block of 2^k tokens in k steps)."""
    eoser_gamma: float | None = ranged(None, "(0, 1]", "null = off")
    """Diffusion sampler, low_confidence: CJ-GRPO's EOS Early Rejection, EOS confidence × γ + (1 − γ)·t, t the
    block's progress (0 → 1); e.g. 0.01."""
    greedy_in_group: bool = False
    """Diffusion models: the last completion of every group is decoded greedily (T = 0) and trains with its
    siblings, so the advantage sees whether the greedy answer (what evaluation scores) beats the samples."""
    window: str = "eos"
    """Diffusion: which window tokens are the completion: `eos` (up to EOS) or `full`."""
    igpo: bool = False
    """IGPO (diffusion): a group with no correct completion gets hinted ones (a prefix of the task's reference
    inpainted into the window); up to igpo_replace·G of its rows are replaced by the correct hinted ones."""
    igpo_hint_low: float = ranged(0.2, "[0, 1]")
    """IGPO: smallest share of the reference's tokens injected as the hint (drawn uniform per group)."""
    igpo_hint_high: float = ranged(0.6, "[0, 1]")
    """IGPO: largest share of the reference's tokens injected as the hint."""
    igpo_replace: float = ranged(0.5, "[0, 1]")
    """IGPO: λ, hinted completions per such group and most rows replaced, as a share of group_size."""
    replay_fraction: float = ranged(0.0, "[0, 1)", "0 = off")
    """Rollout replay (DOTS): share of each step's prompt slots filled with recent groups from a
    buffer instead of fresh generations, trained with importance weights; 0 = off."""
    replay_capacity: int = ranged(256, ">= 1")
    """Rollout replay: groups the buffer keeps (the most recent)."""
    speculative: bool = False
    """SPEC-RL (causal models, torch engine, single-turn tasks): each row's previous completion of the same
    prompt and group slot is a draft, verified under the current policy (`rollout.spec_lenience`); sampling
    continues from the first rejected token. Needs untruncated sampling (top_p 1, top_k 0, min_p 0, no
    repetition penalty) and the synchronous loop; prompts recur only on a finite train set (`task.train_size`)."""
    spec_lenience: float = ranged(1.0, ">= 1", "1 = exactly on policy")
    """SPEC-RL: ℓ, draft token t is kept while u < min(1, ℓ·π_new/π_old); above 1 more is kept, off-policy."""
    spec_first_token: str = choice("residual", ("residual", "fresh"))
    """SPEC-RL: the first token after a rejection, from the residual (p − q)⁺ (exact at ℓ = 1) or `fresh`
    from p (the rule as SPEC-RL describes it; biased)."""
    spec_capacity: int = ranged(4096, ">= 1")
    """SPEC-RL: completions the draft cache keeps (the most recent; each holds L × V log-probs)."""
    micro_group_size: int = ranged(0, ">= 0", "0 = the whole group")
    """Single-turn tasks: generate each group of G in passes of this many completions per prompt
    (Infinite Sampling's micro-groups: less memory per pass, the same completions); 0 = the whole
    group in one pass."""
    decode_engine: str = choice("cpp", ("eager", "cpp"))
    """Llama/Qwen2 sampler's decode step: `cpp` fused C++ kernel (built once per machine, ~30 s; falls back
    to `eager` with one line if it cannot be built), `eager` ATen ops."""
    engine: str = "torch"
    """Who samples causal-model rollouts: `torch` (rlvr's own sampler, reading the trainer's weights) or `vllm`
    (the `vllm` extra: vLLM in the trainer's process with its own copy of the weights, pushed after every
    update, and with `trainer.backend=ray` one more in each rollout worker; turns on
    `algo.rollout_correction` unless set), or `vllm_server` (vLLM server processes, `rollout.servers` replicas,
    weights pushed through vLLM's weight-update protocol; the `vllm` options below apply to it too)."""
    vllm_kv_cache_mb: int = ranged(64, ">= 1", "e.g. 64")
    """vLLM engine: KV-cache size in MiB (vLLM's own default takes most of the machine's memory). One that
    cannot hold a step's rows makes vLLM sample them in turns; the engine then warns with the size that can."""
    vllm_block_size: int = ranged(0, ">= 0", "0 = vLLM's default")
    """vLLM engine: KV-cache block size in tokens (a multiple of 32 on CPU), 0 = vLLM's default."""
    vllm_max_model_len: int = ranged(0, ">= 0", "0 = the model config's")
    """vLLM engine: longest prompt + completion it accepts, 0 = the model config's `max_position_embeddings`."""
    servers: int = ranged(1, ">= 1", "e.g. 2")
    """vllm_server engine: vLLM servers (data-parallel replicas) rlvr starts; requests go to the least busy."""
    server_urls: str = ""
    """vllm_server engine: comma-separated addresses of running servers to attach to instead (rlvr starts none);
    each must run vLLM 0.32 with `--served-model-name rlvr` and rlvr's weight transfer (docs/usage.md)."""
    server_port: int = ranged(0, ">= 0", "0 = free ports")
    """vllm_server engine: the first started server's port (the next ones count up), on 127.0.0.1."""
    server_start_timeout_s: float = ranged(300.0, "> 0", "e.g. 300")
    """vllm_server engine: seconds a started server may take to answer /health before the run stops."""
    server_on_crash: str = choice("restart", ("restart", "fail"))
    """vllm_server engine: a started server that dies restarts with the newest weights, or the run ends (`fail`)."""
    weight_bucket_mb: int = ranged(64, ">= 1", "e.g. 64")
    """vllm_server engine: MiB of weights per transfer bucket (one shared-memory file each)."""
    lora_sync: str = choice("adapter", ("adapter", "merged"))
    """vllm_server engine under LoRA: push the adapter alone, served by vLLM unmerged (`adapter`), or the
    weights with the adapter folded in (`merged`, in fp32 then cast)."""


@dataclass(frozen=True)
class AlgoConfig:
    """The RL algorithm: which advantage, objective, aggregation and KL estimator, their
    hyperparameters, and the loop-level knobs (KL, DAPO, critic, rollout correction).

    A hyperparameter field left null takes the default of the chosen entry that declares it
    (GSPO's clip widths are 3e-4 / 4e-4, CISPO's 1.0 / 4.0, PPO-clip's 0.2 / 0.2); `rlvr config`
    prints the value that will be used. Where two chosen entries declare one with different
    defaults, the config is rejected until the field is set. Fields of entries not chosen stay
    null."""

    advantage: str = "grpo"
    """Advantage estimator (`rlvr.algos.advantages.ADVANTAGES`)."""
    objective: str = "ppo_clip"
    """Policy objective (`rlvr.algos.objectives.OBJECTIVES`)."""
    aggregation: str = "seq_mean_token_mean"
    """Loss aggregation (`rlvr.algos.aggregate.AGGREGATIONS`)."""
    kl_estimator: str = "k3"
    """KL estimator (`rlvr.algos.kl.KL_ESTIMATORS`)."""
    kl_coef: float = ranged(0.0, ">= 0")
    """KL weight β against the frozen initial policy; 0 = no reference model."""
    kl_placement: str = choice("loss", ("loss", "reward"))
    """Where the KL goes: `loss` or `reward`."""
    std_normalize: bool | None = None
    """Divide the centred score by a standard deviation (grpo: the group std; passk: the
    subset-reward std; grpo_passk: the best row's gap, by the group std)."""
    adv_eps: float | None = ranged(None, ">= 0")
    """Added to a standard deviation before dividing by it."""
    pass_k: int | None = ranged(None, ">= 1")
    """k of the pass@k objective."""
    speed_weight: float | None = ranged(None, ">= 0")
    """lightning: weight λ of the tokens-per-forward reward's group advantage beside the task reward's."""
    nll_coef: float | None = ranged(None, ">= 0")
    """lightning: advantage bonus β of correct rows (the NLL regulariser on correct trajectories)."""
    correct_at: float | None = ranged(None, "finite")
    """lightning: the task reward at and above which a row counts as correct."""
    tpf_filter: bool | None = None
    """lightning: drop (advantage 0) groups where neither the task reward nor the speed reward varies."""
    gamma: float | None = ranged(None, "[0, 1]")
    """Discount of token-level returns (`reinforce_pp`, `gae`) or of turn-level ones (`gigpo`, `turn_return`)."""
    omega: float | None = ranged(None, ">= 0")
    """GiGPO: weight of the anchor-state step advantage added to the episode advantage."""
    lam: float | None = ranged(None, "[0, 1]")
    """GAE lambda."""
    clip_low: float | None = ranged(None, ">= 0")
    """ε_low: ratio floor 1-ε_low (gspo: of the sequence ratio; cispo: of the detached weight; gmpo: log-ratio
    floor -ε_low; dppo_*: divergence threshold of A <= 0 tokens)."""
    clip_high: float | None = ranged(None, ">= 0")
    """ε_high: ratio ceiling 1+ε_high (gmpo: log-ratio ceiling; dppo_*: divergence threshold of A > 0 tokens)."""
    dual_clip: float | None = ranged(None, "> 1", "null = off")
    """Dual-clip constant c > 1 for A<0, null = off."""
    log_ratio_clamp: float | None = ranged(None, "> 0")
    """Clamp |log ratio| to this before exp (overflow guard)."""
    tau_pos: float | None = ranged(None, "> 0")
    """Gate temperature for A > 0."""
    tau_neg: float | None = ranged(None, "> 0")
    """Gate temperature for A <= 0."""
    wd1_psi: float | None = ranged(None, "> 0")
    """Inverse temperature ψ of the group softmax over advantages."""
    gdsd_psi: float | None = ranged(None, "> 0")
    """GDSD: guidance scale ψ of the self-teacher, log π_teacher = log π_old + ψ·A per token."""
    ratio_cap: float | None = ranged(None, "> 0")
    """DPPO: cap of the detached importance weight min(ρ, cap); verl runs with 3.0 (objectives_zoo deviation 5)."""
    dro_beta: float | None = ranged(None, "> 0")
    """DRO: weight of the quadratic log-ratio penalty (required by `dro`)."""
    cov_ratio: float | None = ranged(None, "[0, 1]", "a share of the tokens")
    """KL-Cov / Clip-Cov: fraction of the micro-batch's valid tokens the covariance rule acts on."""
    cov_kl_coef: float | None = ranged(None, ">= 0")
    """KL-Cov: weight β of |log ρ| on the selected high-covariance tokens."""
    cov_lb: float | None = ranged(None, "finite", "below algo.cov_ub")
    """Clip-Cov: lower end of the covariance window of the tokens that may be dropped."""
    cov_ub: float | None = ranged(None, "finite", "above algo.cov_lb")
    """Clip-Cov: upper end of that window."""
    zero_tail: bool | None = None
    """Optimal token baseline: no baseline past the second-longest row of a group."""
    f_norm: float | None = ranged(None, "> 0")
    """GPG: constant divisor of the advantage (verl's `f_norm`; 1 = none)."""
    dmpo_beta: float | None = ranged(None, "> 0", "e.g. 0.5")
    """DMPO: temperature β of the reward tilt π_ref·exp(r/β); the group weights are softmax(r/β)."""
    shiq_beta: float | None = ranged(None, "> 0", "e.g. 0.1")
    """ShiQ: KL strength β of its Bellman residual (logits read as Q-values q = β(ℓ − ℓ_ref))."""
    norm_length: float | None = ranged(None, "> 0", "null = rollout.max_new_tokens")
    """Constant length normaliser of Dr.GRPO's aggregation; null = `rollout.max_new_tokens`."""
    entropy_coef: float = ranged(0.0, "finite", "0 = entropy only logged")
    """Entropy bonus weight (0 = entropy only logged)."""
    value_clip: float | None = ranged(0.5, "> 0", "null = off")
    """GAE critic: clip of the value update around the old value, null = off."""
    critic_lr: float = ranged(1e-4, "(0, 1]")
    """GAE critic: AdamW learning rate of the value model."""
    critic_warmup_steps: int = ranged(0, ">= 0")
    """GAE critic: steps that train only the critic."""
    kl_target: float | None = ranged(None, "> 0", "null = a fixed coefficient")
    """Adaptive KL: target per-sequence KL, null = fixed kl_coef."""
    kl_horizon: float = ranged(10000.0, "> 0", "in samples, e.g. 10000")
    """Adaptive KL: horizon (in samples) of the controller."""
    overlong_buffer: int = ranged(0, ">= 0", "0 = off")
    """DAPO soft overlong punishment: buffer in tokens below max_new_tokens, 0 = off."""
    overlong_factor: float = ranged(1.0, ">= 0", "a penalty: 0 = none")
    """DAPO soft overlong punishment at max_new_tokens."""
    overlong_filter: bool = False
    """DAPO overlong filtering: truncated completions get no loss."""
    dynamic_sampling: bool = True
    """DAPO: drop zero-variance groups (backfilled while rounds remain)."""
    max_sampling_rounds: int = ranged(1, ">= 1")
    """Dynamic sampling: rollout rounds per step; 1 = filter, no backfill."""
    pass_rate_low: float | None = ranged(None, "[0, 1]", "null = 0 when pass_rate_high is set, else off")
    """TraceRL band filter: train only groups whose solved fraction p has low < p < high (refilled as
    dynamic sampling refills), replacing DAPO's reward-variance filter; both null = off."""
    pass_rate_high: float | None = ranged(None, "[0, 1]", "null = 1 when pass_rate_low is set, else off")
    """TraceRL band filter: the band's upper edge (exclusive)."""
    rollout_correction: bool | None = None
    """Weight the loss by pi_old / pi_rollout (TIS / MIS); null = on with `rollout.engine=vllm`, off with torch."""
    correction_level: str | None = None
    """Rollout correction: `token` or `sequence` weights."""
    correction_mode: str | None = None
    """Rollout correction: `truncate` (TIS) or `mask` (MIS)."""
    correction_cap: float | None = ranged(None, "> 0")
    """Rollout correction: cap C on the weight."""
    nft_eps: float | None = ranged(None, "(0, 1]")
    """NFT: floor ε of the implicit negative policy's likelihood ratio (its log is clipped there)."""
    nft_weight: str | None = None
    """NFT: prompt weight ω(r̂) of a group with accuracy r̂: `grpo` √((1−r̂)/r̂), `one` or `hard` (1−r̂)."""


@dataclass(frozen=True)
class OptimConfig:
    lr: float = ranged(1e-4, "(0, 1]", "e.g. 5e-5")
    """AdamW learning rate."""
    weight_decay: float = ranged(0.0, ">= 0", "0 = none")
    """AdamW weight decay."""
    beta1: float = ranged(0.9, "[0, 1)")
    """AdamW β1."""
    beta2: float = ranged(0.99, "[0, 1)")
    """AdamW β2."""
    grad_clip: float = ranged(1.0, ">= 0", "0 = off")
    """Max global grad norm, 0 = off."""
    warmup_steps: int = ranged(10, ">= 0", "0 = no warmup")
    """Linear LR warmup, in optimizer steps."""
    schedule: str = choice("cosine", ("constant", "cosine"))
    """After warmup: `constant` or `cosine` (decays to min_lr_ratio·lr at the last step)."""
    min_lr_ratio: float = ranged(0.0, "[0, 1]")
    """Cosine schedule: final LR as a fraction of optim.lr."""


@dataclass(frozen=True)
class TrainerConfig:
    steps: int = ranged(3000, ">= 1")
    """Rollout steps."""
    minibatches: int = ranged(1, ">= 1")
    """Optimizer steps per rollout batch."""
    ppo_epochs: int = ranged(1, ">= 1")
    """Passes over each rollout batch."""
    micro_batch_size: int = ranged(64, ">= 1")
    """Completions per forward; memory only, never changes results."""
    micro_batch_tokens: int = ranged(0, ">= 0", "0 = micro_batch_size rows per forward")
    """Token budget per forward (a shared prompt counted once): rows bin-packed under it, balanced over ranks;
    memory only, results equal to float rounding. 0 = `micro_batch_size` rows per forward."""
    packing: str = choice("auto", ("auto", "padded", "packed", "shared"))
    """Training forward off the fast path (bf16, LoRA, GPU, not Llama/Qwen2): `packed` = a micro-batch's rows
    in one padding-free sequence, `shared` = also each group's prompt once, `padded`; `auto` = `shared`,
    or `padded` with a notice for a model that cannot pack exactly (probed when built; FSDP learners too)."""
    eval_every: int = ranged(250, ">= 0", "0 = only at start and end")
    """Steps between greedy held-out evaluations (0 = only at start and end)."""
    eval_samples: int = ranged(0, ">= 0", "0 = greedy evaluation only")
    """Also score k samples per held-out problem at the rollout temperature
    (eval/heldout_sampled_accuracy = avg@k, eval/heldout_pass_at_k); 0 = greedy only."""
    samples_per_step: int = ranged(4, ">= 0")
    """Rollouts written to samples.jsonl each step."""
    save_every: int = ranged(500, ">= 0", "0 = only at the end")
    """Steps between checkpoints (0 = only at the end)."""
    keep_last: int = ranged(2, ">= 1")
    """Checkpoints kept on disk."""
    out_dir: str = "runs"
    """Parent of run directories."""
    name: str = ""
    """Run directory name, empty = recipe name + seed."""
    threads: int = ranged(0, ">= 0", "0 = torch's default")
    """Torch threads, 0 = torch's default."""
    kernels: str = choice("cpp", ("eager", "cpp"))
    """Training forward+backward of Llama-family models: `cpp` = each layer one C++ call each way (built once
    per machine; eager if it cannot be built), `eager` = ATen ops; same math to float rounding."""
    thread_mode: str = choice("auto", ("auto", "ops", "rows"))
    """How threads are used: `ops` = torch's intra-op threads; `rows` = each thread takes a share of every
    batch's rows with single-threaded ops (faster, and no collapse when another process holds a core; causal
    models); `auto` = rows for causal models, ops for diffusion ones."""
    device: str = "auto"
    """Where the model and the step's tensors live: `auto` (cuda when available, else cpu), `cpu`,
    `cuda` or `cuda:i` (causal models; diffusion ones run on cpu). The fused fast path and C++
    kernels run on CPU only."""
    gradient_checkpointing: bool = False
    """Recompute activations in the backward pass (less memory, one more forward) on the plain
    `transformers` forward; the fused fast path already keeps only what its backward needs."""
    trackers: str = ""
    """Extra metric sinks beside metrics.jsonl, comma-separated: tensorboard,wandb,mlflow."""
    max_staleness: int | None = ranged(None, ">= 0", "0 = none ahead; null = the synchronous loop")
    """Asynchronous rollouts: null = the synchronous loop; η >= 0 = a rollout side generates ahead of the
    learner from a copy of the weights pushed after every update, and a batch may come from any policy
    version >= current - η (0: none ahead, the synchronous loop's metrics bit for bit; 1: one-step-off
    overlap). Stale batches train with the decoupled PPO objective (`algo.rollout_correction` caps
    its weights)."""
    staleness: str = choice("bounded", ("bounded", "exact"))
    """With `max_staleness` η: `bounded` = each batch from the newest version the rollout side has when it
    starts it (at most η old; which versions depends on the two sides' pace), `exact` = the batch of step k
    always from version max(0, k-1-η) (the rollout side waits for it; up to η+1 published copies of the
    weights are kept), so the run's metrics do not depend on timing or backend."""
    rollout_lanes: int = ranged(1, ">= 1")
    """With `max_staleness` η >= 1 and the local backend: batches the rollout side rolls out at once, each lane
    with its own copy of the weights (of the version its batch was admitted with). More than 1 pays where a
    rollout waits (tool calls inside multi-turn episodes): one lane samples while another's tools answer.
    Each batch's prompt and seed draws are made in step order first, so lanes change only the timing, never
    the samples (uniform prompt sampler, one sampling round: no dynamic refill, replay, hints or calibration)."""
    partial_rollouts: bool = False
    """With `max_staleness` η >= 1: an update enters the batch in flight (the own sampler swaps weights between
    chunks, recomputing its cache; vLLM servers take it keep-paused); each token keeps its version and log-prob."""
    partial_chunk: int = ranged(16, ">= 1")
    """With `partial_rollouts` and the own sampler: tokens sampled between two checks for newer weights."""
    max_token_staleness: int | None = ranged(None, ">= 0", "null = max_staleness")
    """Completion tokens sampled more than this many versions before the weights training on them are masked
    out of the loss (the rest of the sample trains); below η it bites under `partial_rollouts`. null = η."""
    backend: str = choice("local", ("local", "ray"))
    """Where the rollout side runs: `local` (a thread of this process) or `ray` (Ray actors: rollout
    workers, reward scorers; `ray.init(address=...)` joins a running cluster, see `ray_address`)."""
    rollout_workers: int = ranged(1, ">= 1")
    """Rollout worker actors (`backend=ray`); each generates its share of a batch's rows from its own copy of
    the weights. With `ray_learners`, more than 1 puts them on rank 0, which samples the whole batch there."""
    reward_workers: int = ranged(1, ">= 1")
    """Reward-scoring actors (`backend=ray`), fed with back-pressure (at most two calls in flight each). With
    `ray_learners`, more than 1 puts them on rank 0, which scores the whole batch there."""
    ray_address: str = ""
    """`backend=ray`: the cluster to join (`auto` = the one `ray start --head` started here), empty = a local
    Ray started with `threads` CPUs."""
    ray_learners: int = ranged(0, ">= 0")
    """`backend=ray` with `learners=fsdp`: FSDP2 learner ranks Ray starts as actors instead of torchrun (one
    `threads`-CPU bundle each), each sampling its share of the batch itself unless `rollout_workers` /
    `reward_workers` > 1 (then rank 0's actors do, outside the bundles); 0 = Ray runs the rollout side."""
    collective_timeout_s: float = ranged(600.0, "(0, 86400]", "seconds, a day at most")
    """Data-parallel learners (`torchrun --nproc_per_node N -m rlvr train`): seconds a collective waits
    for the other ranks before the run stops with an error (a rank that died or hangs)."""
    learners: str = choice("auto", ("auto", "fsdp"))
    """How the learner trains: `auto` = FSDP2 shards when torchrun starts more than one process, else one
    plain process; `fsdp` = FSDP2 at any world size, a single process too (a group of one: the sharded
    path on one GPU or CPU, same updates as the plain process)."""
    fsdp_param_dtype: str = ""
    """FSDP2 learners: the dtype each layer is gathered and computed in (`bfloat16`, `float32`; empty = the
    model's, `model.dtype`); the shards and AdamW keep the model's dtype (`MixedPrecisionPolicy`)."""
    fsdp_reduce_dtype: str = ""
    """FSDP2 learners: the dtype gradients are reduce-scattered in (`float32` with bf16 compute; empty =
    the compute dtype)."""
    fsdp_cpu_offload: bool = False
    """FSDP2 learners on CUDA: shards, gradients and optimizer states in CPU memory between uses
    (`CPUOffloadPolicy`: less GPU memory, a host-device copy per use)."""


@dataclass(frozen=True)
class Config:
    seed: int = ranged(0, "[0, 4294967295]", "2**32 - 1 at most")
    """Seeds model init, prompts and sampling."""
    model: ModelConfig = field(default_factory=ModelConfig)
    task: TaskConfig = field(default_factory=TaskConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    algo: AlgoConfig = field(default_factory=AlgoConfig)
    estimator: EstimatorConfig = field(default_factory=EstimatorConfig)
    sampler: SamplerConfig = field(default_factory=SamplerConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    sft: SFTConfig = field(default_factory=SFTConfig)
    expert: ExpertConfig = field(default_factory=ExpertConfig)
    preference: PreferenceConfig = field(default_factory=PreferenceConfig)

