"""The sections read by one family of methods each: expert data mixed into the update
(`expert`), the diffusion likelihood estimators (`estimator`) and the prompt samplers (`sampler`);
re-exported by `schema`, of which they are part."""

from __future__ import annotations

from dataclasses import dataclass

from rlvr.config.ranges import choice, ranged


@dataclass(frozen=True)
class ExpertConfig:
    """Off-policy expert completions mixed into every RL step (CHORD, RL-PLUS; ERILS's external
    rollouts on diffusion models, `rlvr.algos.erils`): `per_step` rows
    with the task's reference solutions (Countdown's exact ones, a file task's `solution_key`),
    trained by `objective` beside the on-policy rows through the same update. The step loss is
    (1 − μ) L_on + μ L_expert (`keep_onpolicy`: L_on + μ L_expert), each term normalised over its
    own rows (over its own tokens under `algo.aggregation=token_mean`)."""

    per_step: int = ranged(0, ">= 0", "0 = off")
    """Expert rows per step, 0 = off."""
    pool_size: int = ranged(0, ">= 0", "0 = a fresh problem every row")
    """Distinct expert problems: a fixed pool drawn once (with `seed`) from the training
    distribution, the scarce-expert-data setting; 0 = a fresh problem every row (unlimited)."""
    objective: str = "sft"
    """Loss on expert rows (`rlvr.algos.hybrid.EXPERT_OBJECTIVES`): `sft`, `chord_phi`, `rlplus`,
    or `main` (`algo.objective` trains them as it trains the on-policy rows, e.g. ShiQ)."""
    weight: float = ranged(0.5, "[0, 1]")
    """μ, the expert loss's share, at step 1."""
    weight_final: float | None = ranged(None, "[0, 1]")
    """μ after `decay_steps` (linear decay, CHORD's global schedule); null = `weight` throughout."""
    decay_steps: int = ranged(0, ">= 0", "0 = constant")
    """Steps over which μ goes from `weight` to `weight_final`."""
    keep_onpolicy: bool = False
    """True: the on-policy loss keeps weight 1 (L_on + μ L_expert, RL-PLUS); False: 1 − μ (CHORD)."""
    advantage: str = choice("batch", ("batch", "source"))
    """Expert rows' advantage: `batch` standardises their rewards against the whole step's
    (on-policy and expert together); `source` against the expert rows' own only (ERILS's
    source-specific processing, `rlvr.algos.erils.per_source_advantages`). The on-policy rows keep
    `algo.advantage` either way. Diffusion models: the rows are also length-controlled, EOS-padded
    to `rollout.max_new_tokens` (a solution that does not fit is dropped)."""
    rlplus_gamma: float | None = ranged(None, ">= 0")
    """RL-PLUS: γ of the exploration weight (1 − π_θ(token))^γ on the expert rows' advantage."""


@dataclass(frozen=True)
class EstimatorConfig:
    """Diffusion models: the likelihood estimator behind the policy's log-probs
    (`rlvr.models.likelihood.ESTIMATORS`) and its options, named as the estimators' keywords.
    A null option takes the chosen estimator's own default; options of other estimators stay
    null. Unused by causal models."""

    name: str = "mean_field"
    """Likelihood estimator (`rlvr.models.likelihood.ESTIMATORS`)."""
    n: int | None = ranged(None, ">= 1")
    """Monte-Carlo mask draws."""
    antithetic: bool | None = None
    """Complementary (antithetic) mask pairs."""
    p_mask_prompt: float | None = ranged(None, "[0, 1]")
    """Prompt-token masking probability."""
    t_min: float | None = ranged(None, "[0, 1]")
    """Lowest mask ratio."""
    t_max: float | None = ranged(None, "[0, 1]")
    """Highest mask ratio."""
    include_full: bool | None = None
    """Add the all-masked pass as the released code does."""
    beta: float | None = ranged(None, "> 0")
    """EUBO exponent β."""
    omega: float | None = ranged(None, "[0, 1]")
    """Weight of the EUBO in the ω-mixture for A < 0."""
    bound: str | None = None
    """Bound for negative advantages: `elbo`, `eubo` or `mixture`."""
    block_length: int | None = ranged(None, ">= 1", "null = the whole window")
    """Block-wise masking block, null = the whole window."""
    shrink: int | None = ranged(None, ">= 1")
    """Merge this many sampler steps into one (σ)."""


@dataclass(frozen=True)
class SamplerConfig:
    """Which prompts a step rolls out and how many completions each gets (`rlvr.sampling.SAMPLERS`),
    and the samplers' options, named as their keywords. A null option takes the chosen sampler's
    own default; options of other samplers stay null."""

    name: str = "uniform"
    """Sampler (`rlvr.sampling.SAMPLERS`): `uniform`, `mopps`, `vade`, `dump`, `gvm`, `coba`, `dots`."""
    candidates: float | None = ranged(None, "[1, 1000]", "1 = no choice")
    """Candidates drawn per prompt slot (1/κ); the sampler picks among them."""
    target: float | None = ranged(None, "[0, 1]")
    """Mopps: success rate the selection aims at."""
    decay: float | None = ranged(None, "[0, 1]", "1 = never forget")
    """λ, weight kept by a prompt's old evidence at each new observation of it."""
    time_decay: float | None = ranged(None, "(0, 1]", "1 = never forget")
    """Vade: weight kept by a prompt's evidence per step since it was last observed."""
    ucb_c: float | None = ranged(None, ">= 0")
    """Dump: exploration bonus c of the UCB score."""
    temperature: float | None = ranged(None, "[0.001, 1000]")
    """Dump: softmax temperature τ of the source mix; dots: of the attention over measured prompts."""
    window: int | None = ranged(None, ">= 1")
    """Dump: groups per source in the learnability window; dots: measured groups kept."""
    reference: int | None = ranged(None, ">= 1")
    """Dots: random candidates rolled out each step beside the predicted ones (the reference set)."""
    dims: int | None = ranged(None, ">= 1")
    """Dots: hash buckets of the prompts' character-bigram embedding."""
    max_groups: int | None = ranged(None, ">= 1")
    """Gvm, coba: most groups of G one prompt may get in a step."""
    concentration: float | None = ranged(None, "(0, 1e6]")
    """Coba: concentration κ of the value curve around its mode (the failure rate)."""
    ema: float | None = ranged(None, "[0, 1)")
    """Coba: weight kept by the failure-rate average at each step."""
    calibration_every: int = ranged(0, ">= 0", "0 = off")
    """Samplers that predict pass rates (mopps, vade, dots): every this many steps, roll the step's prompts
    out `calibration_rollouts` more times (trained on by nothing, shown to nobody) and log the predictions
    against those Monte-Carlo rates (`sampler/calibration_*`)."""
    calibration_prompts: int = ranged(8, ">= 1")
    """Calibration: most distinct prompts of the step probed."""
    calibration_rollouts: int = ranged(32, ">= 1")
    """Calibration: Monte-Carlo completions per probed prompt."""
