"""The sections of the training commands beside `rlvr train`: `rlvr sft` (`sft`), `rlvr rm` and
`rlvr dpo` (`preference`); re-exported by `schema`, of which they are part."""

from __future__ import annotations

from dataclasses import dataclass

from rlvr.config.ranges import choice, ranged


@dataclass(frozen=True)
class SFTConfig:
    steps: int = ranged(80, ">= 1")
    """Optimizer steps of supervised warm start."""
    batch_size: int = ranged(64, ">= 1")
    """Examples per step."""
    lr: float = ranged(1e-3, "(0, 1]", "e.g. 1e-3")
    """AdamW learning rate."""
    warmup_steps: int = ranged(20, ">= 0", "0 = no warmup")
    """Linear LR warmup."""
    schedule: str = choice("constant", ("constant", "cosine"))
    """LR after warmup: `constant` or `cosine` (decays to 0 at the last step)."""
    data: str = ""
    """Chat SFT: a data file of rows with `messages` (TRL's conversational format), rendered with the tokenizer's
    chat template, the loss on assistant tokens only (causal models); empty = the task's procedural solutions."""


@dataclass(frozen=True)
class PreferenceConfig:
    data: str = ""
    """JSONL of preference pairs (`prompt`, `chosen`, `rejected`, optional `margin`) for `rlvr dpo` and `rlvr rm`;
    empty = pairs made from the task's verifier (a correct solution over a completion it scores lower)."""
    pairs: int = ranged(512, ">= 1")
    """Pairs made from the verifier for training (when `data` is empty)."""
    rejected: str = choice("random", ("random", "near_miss"))
    """Rejected completions of verifier pairs: `random` (a random expression over the problem's numbers) or
    `near_miss` (the solution with one operator changed: the pair differs in one token)."""
    heldout_pairs: int = ranged(64, ">= 1")
    """Pairs held out for pairwise accuracy (made from the task's held-out problems, or the last rows of `data`)."""
    steps: int = ranged(100, ">= 1")
    """Optimizer steps."""
    batch_size: int = ranged(16, ">= 1")
    """Pairs per step."""
    lr: float | None = ranged(None, "(0, 1]", "null = 2e-5 for dpo, 1e-4 for rm")
    """AdamW learning rate; null = each command's own (`PREFERENCE_LR`): `rlvr dpo` 2e-5, `rlvr rm` 1e-4."""
    beta: float = ranged(1.0, "> 0", "0 or below trains toward the rejected answer")
    """`rlvr dpo`: the temperature β on the log-ratio margin (IPO: its regulariser τ). With lr 2e-5 the
    measured setting that raises Countdown held-out accuracy above the warm start (TRL's DPOConfig: β 0.1,
    lr 1e-6)."""
    loss: str = "sigmoid"
    """`rlvr dpo`: `sigmoid` (DPO) or `ipo` (IPO, on per-token mean log-ratios)."""
    margin: float = ranged(0.0, "finite")
    """`rlvr rm`: the Bradley–Terry margin m in −log σ(r_w − r_l − m) for pairs without their own `margin`."""
    process: bool = False
    """`rlvr rm`: train a process reward model from step labels (rows with `prompt`, `steps`, `labels` in `data`,
    else Countdown's shown work with one step made wrong) by binary cross-entropy on every step prefix."""
    step_separator: str = ","
    """`rlvr rm` with `process`: the text between steps of a prefix (score with the same
    `reward.model_step_separator`)."""
    eval_every: int = ranged(25, ">= 0", "0 = only at start and end")
    """Steps between held-out evaluations (0 = only at start and end)."""
    save_every: int = ranged(0, ">= 0", "0 = only at the end")
    """Steps between checkpoints (0 = only at the end)."""


PREFERENCE_LR = {"dpo": 2e-5, "rm": 1e-4}
"""`preference.lr` when null: DPO's measured setting (β 1, lr 2e-5: results §14d); a reward model's."""


def preference_lr(p: PreferenceConfig, command: str) -> float:
    """The learning rate `rlvr <command>` trains with: `preference.lr`, else the command's own."""
    return p.lr if p.lr is not None else PREFERENCE_LR[command]
