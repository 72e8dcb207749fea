import pytest
import torch

from rlvr.batch import Rollouts, left_pad


class ScriptedEngine:
    """A RolloutEngine that plays predetermined actions: row r (seed r) says `script[r][turn]`.

    An action ending in "|" is cut there without EOS (as if it hit the per-turn limit). Log-prob of
    the j-th sampled id of row r, turn k: -(r + 1) * 0.01 - k * 0.1 - j * 0.001 (to check alignment)."""

    def __init__(self, tokenizer, script: list[list[str]], raw: dict | None = None):
        self.tokenizer, self.script, self.raw = tokenizer, script, raw or {}
        self.prompts: list[tuple[int, int, list[int]]] = []

    def logprob(self, row: int, turn: int, j: int) -> float:
        return -(row + 1) * 0.01 - turn * 0.1 - j * 0.001

    def __call__(self, prompt_ids, prompt_mask, seeds, *, temperature):
        outs, lps = [], []
        for ids, mask, seed in zip(prompt_ids.tolist(), prompt_mask.tolist(), seeds.tolist()):
            row, turn = divmod(seed, 64)
            self.prompts.append((row, turn, [i for i, m in zip(ids, mask) if m]))
            if (row, turn) in self.raw:
                new = list(self.raw[(row, turn)])
            else:
                text = self.script[row][turn]
                cut = text.endswith("|")
                new = self.tokenizer(text.rstrip("|"), add_special_tokens=False).input_ids
                new = new + ([] if cut else [self.tokenizer.eos_token_id])
            outs.append(new)
            lps.append([self.logprob(row, turn, j) for j in range(len(new))])
        width = max(1, max(len(o) for o in outs))
        pad = self.tokenizer.pad_token_id
        return Rollouts(prompt_ids, prompt_mask,
                        torch.tensor([o + [pad] * (width - len(o)) for o in outs]),
                        torch.tensor([[1.0] * len(o) + [0.0] * (width - len(o)) for o in outs]),
                        torch.tensor([lp + [0.0] * (width - len(lp)) for lp in lps]),
                        torch.tensor([not o or o[-1] != self.tokenizer.eos_token_id for o in outs]))


@pytest.fixture
def scripted():
    return ScriptedEngine


__all__ = ["ScriptedEngine", "left_pad"]
