"""SPEC-RL's speculative rollouts on the causal torch sampler: draft, verify, continue.

A row whose prompt (and group slot) was rolled out before gets its previous completion as a
draft. One teacher-forced forward of prompt + draft under the current policy gives π_new at every
draft position; `sampling.speculative.accepted_prefix` keeps the leading tokens that pass
u < min(1, ℓ·π_new/π_old); at the first rejected position one token is drawn from
`first_token_probs` (the residual (p − q)⁺ by default), and ordinary sampling continues from
there: every row that still needs tokens (rejected drafts and rows without a draft) goes through
`torch_ar.generate` at once, from prefixes of different lengths, left-padded, and each is cut to
its own remaining budget. A row's completion depends only on its prefix and seed, so the cut
changes no distribution.

What the cache keeps per completion is its tokens and the *full* next-token log-distribution at
every position under the policy that produced it (the residual needs q over the whole
vocabulary, not only q of the drafted token): L × V floats, which `rollout.spec_capacity` bounds.
The continuation's distributions come from one more teacher-forced forward of the rows that had
one. Recorded log-probs are the current policy's for every returned token (the verify forward's
for the kept prefix and the first token, the sampler's for the rest), the quantity the trainer
recomputes. With ℓ = 1 and the residual rule a completion is an exact draw from the current
policy given its draft (tests/engines/test_speculative_engine.py enumerates it); the draft itself
was trained on, so across steps the draws are not independent of the weights, as in SPEC-RL.

Deviations: the draft is the last completion of the same (prompt, slot in its group), not a
per-prompt pick; sampling must be untruncated (no top-p/top-k/min-p/repetition penalty), so that
the policy's distribution is the one sampled.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import torch
from torch.nn.utils.rnn import pad_sequence

from rlvr.batch import Rollouts, left_pad
from rlvr.noise import gumbel_noise, uniform_noise
from rlvr.sampling.speculative import accepted_prefix, first_token_probs

VERIFY_STEP = 1 << 24
"""Counter of the acceptance uniforms in `rlvr.noise`, and + 1 that of the first new token's
Gumbel noise: past any decoding step, so they never coincide with the continuation's noise."""


@dataclass
class Draft:
    """A cached completion: its tokens (L,) and the producing policy's log-distributions (L, V)."""

    ids: torch.Tensor
    logdist: torch.Tensor


class DraftCache:
    """The last completion of each key, the `capacity` most recently written kept."""

    def __init__(self, capacity: int):
        self.capacity = capacity
        self.drafts: OrderedDict[object, Draft] = OrderedDict()

    def get(self, key) -> Draft | None:
        return self.drafts.get(key)

    def put(self, key, draft: Draft) -> None:
        self.drafts.pop(key, None)
        self.drafts[key] = draft
        while len(self.drafts) > self.capacity:
            self.drafts.popitem(last=False)


@torch.no_grad()
def completion_logdists(model, prompt_ids, prompt_mask, completion_ids, completion_mask, temperature: float):
    """(B, Tc, V) log-softmax(logits / T) of the model's next-token distribution at every completion
    position, by one teacher-forced forward of the left-padded prompt and the right-padded completion."""
    device = model.get_input_embeddings().weight.device
    ids = torch.cat([prompt_ids, completion_ids], dim=1).to(device)
    mask = torch.cat([prompt_mask, completion_mask.long()], dim=1).to(device)
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    was_training = model.training
    model.eval()
    try:
        logits = model(input_ids=ids, attention_mask=mask, position_ids=positions).logits
    finally:
        model.train(was_training)
    tp, tc = prompt_ids.shape[1], completion_ids.shape[1]
    return (logits[:, tp - 1:tp - 1 + tc].float() / temperature).log_softmax(-1).cpu()


@dataclass
class Verified:
    """Per drafted row: the kept tokens (accepted prefix, plus the first new token after a
    rejection), their current-policy log-probs and log-distributions, and whether it is finished."""

    ids: list[torch.Tensor]
    logp: list[torch.Tensor]
    logdist: list[torch.Tensor]
    finished: list[bool]
    accepted: torch.Tensor      # (D,) draft tokens kept
    draft_tokens: int


def verify(model, prompt_ids, prompt_mask, seeds, drafts: list[Draft], *, temperature: float, lenience: float,
           rule: str, eos_id: int, pad_id: int, max_new_tokens: int) -> Verified:
    """Verify D drafts (rows of prompt_ids) under the current policy and draw each rejected row's
    first new token."""
    ids = pad_sequence([d.ids for d in drafts], batch_first=True, padding_value=pad_id)
    mask = pad_sequence([torch.ones(len(d.ids)) for d in drafts], batch_first=True)
    new = completion_logdists(model, prompt_ids, prompt_mask, ids, mask, temperature)       # (D, L, V)
    old = torch.stack([torch.nn.functional.pad(d.logdist, (0, 0, 0, ids.shape[1] - len(d.ids)))
                       for d in drafts])
    new_tok = new.gather(-1, ids[..., None]).squeeze(-1)
    old_tok = old.gather(-1, ids[..., None]).squeeze(-1)
    uniforms = uniform_noise(seeds, VERIFY_STEP, ids.shape[1])  # float64: in float32 the largest round to 1
    n, _ = accepted_prefix(new_tok.double(), old_tok.double(), mask, uniforms, lenience=lenience)
    gumbel = gumbel_noise(seeds, VERIFY_STEP + 1, new.shape[-1])
    out = Verified([], [], [], [], n, int(mask.sum()))
    for i, d in enumerate(drafts):
        k, length = int(n[i]), len(d.ids)
        kept, logp, dist = ids[i, :k], new_tok[i, :k], new[i, :k]
        if k < length:  # rejected at k: one token from the residual (or from p), scored under p
            p, q = new[i, k].exp(), old[i, k].exp()
            first = first_token_probs(p[None], q[None], rule=rule)[0]
            token = int((first.double().log() + gumbel[i]).argmax())
            kept = torch.cat([kept, torch.tensor([token])])
            logp = torch.cat([logp, new[i, k, token:token + 1]])
            dist = new[i, :k + 1]
        out.ids.append(kept)
        out.logp.append(logp)
        out.logdist.append(dist)
        out.finished.append(k == length or int(kept[-1]) == eos_id or len(kept) >= max_new_tokens)
    return out


class SpeculativeRollouts:
    """The causal torch engine with a draft cache: `__call__(keys, prompt_ids, prompt_mask, seeds)`
    returns the batch's `Rollouts` and the step's reuse metrics. `generate` is
    `torch_ar.generate` bound to the model and the sampling settings except `max_new_tokens`."""

    def __init__(self, model, generate, *, max_new_tokens: int, eos_id: int, pad_id: int, temperature: float,
                 lenience: float = 1.0, rule: str = "residual", capacity: int = 4096):
        self.model, self.generate = model, generate
        self.max_new_tokens, self.eos_id, self.pad_id = max_new_tokens, eos_id, pad_id
        self.temperature, self.lenience, self.rule = temperature, lenience, rule
        self.cache = DraftCache(capacity)

    def __call__(self, keys: list, prompt_ids, prompt_mask, seeds) -> tuple[Rollouts, dict[str, float]]:
        drafts = [self.cache.get(k) for k in keys]
        drafted = [i for i, d in enumerate(drafts) if d is not None]
        heads = [torch.zeros(0, dtype=torch.long)] * len(keys)     # tokens fixed before the continuation
        head_logp = [torch.zeros(0)] * len(keys)
        head_dist: list[torch.Tensor | None] = [None] * len(keys)
        finished = [False] * len(keys)
        accepted, draft_tokens = 0, 0
        if drafted:
            rows = torch.tensor(drafted)
            v = verify(self.model, prompt_ids[rows], prompt_mask[rows], seeds[rows], [drafts[i] for i in drafted],
                       temperature=self.temperature, lenience=self.lenience, rule=self.rule, eos_id=self.eos_id,
                       pad_id=self.pad_id, max_new_tokens=self.max_new_tokens)
            for j, i in enumerate(drafted):
                heads[i], head_logp[i], head_dist[i], finished[i] = v.ids[j], v.logp[j], v.logdist[j], v.finished[j]
            accepted, draft_tokens = int(v.accepted.sum()), v.draft_tokens
        ids, logp, truncated = self._continue(prompt_ids, prompt_mask, seeds, heads, head_logp, finished)
        out = self._rollouts(prompt_ids, prompt_mask, ids, logp, truncated)
        self._remember(keys, out, head_dist, finished)
        total = float(out.lengths.sum())
        return out, {"rollout/spec_drafted_frac": len(drafted) / max(len(keys), 1),
                     "rollout/spec_accept_frac": accepted / draft_tokens if draft_tokens else 0.0,
                     "rollout/spec_reuse_frac": accepted / total if total else 0.0,
                     "rollout/spec_new_tokens": total - accepted}

    def _continue(self, prompt_ids, prompt_mask, seeds, heads, head_logp, finished):
        """Every unfinished row sampled on from its prompt + kept tokens, cut to its own budget;
        returns per row the whole completion, its log-probs and whether the cap ended it."""
        ids, logp = list(heads), list(head_logp)
        truncated = [bool(f and len(h) >= self.max_new_tokens and int(h[-1]) != self.eos_id)
                     for h, f in zip(heads, finished)]
        todo = [i for i, f in enumerate(finished) if not f]
        if not todo:
            return ids, logp, truncated
        prefixes = [prompt_ids[i][prompt_mask[i].bool()].tolist() + heads[i].tolist() for i in todo]
        prefix_ids, prefix_mask = left_pad(prefixes, self.pad_id)
        budgets = [self.max_new_tokens - len(heads[i]) for i in todo]
        more = self.generate(prefix_ids, prefix_mask, seeds[torch.tensor(todo)], max_new_tokens=max(budgets),
                             temperature=self.temperature)
        lengths = more.lengths.long().tolist()
        for j, i in enumerate(todo):
            n = min(lengths[j], budgets[j])
            ids[i] = torch.cat([heads[i], more.completion_ids[j, :n].cpu()])
            logp[i] = torch.cat([head_logp[i], more.logprobs[j, :n].float().cpu()])
            truncated[i] = n == 0 or int(ids[i][-1]) != self.eos_id
        return ids, logp, truncated

    def _rollouts(self, prompt_ids, prompt_mask, ids, logp, truncated) -> Rollouts:
        lengths = torch.tensor([len(x) for x in ids])
        width = int(lengths.max()) if len(ids) else 0
        mask = (torch.arange(width)[None, :] < lengths[:, None]).float()
        return Rollouts(prompt_ids, prompt_mask, pad_sequence(ids, batch_first=True, padding_value=self.pad_id), mask,
                        pad_sequence(logp, batch_first=True), torch.tensor(truncated, dtype=torch.bool))

    def _remember(self, keys, out: Rollouts, head_dist, finished) -> None:
        """Cache every row's completion with its log-distributions: the verify forward's where the
        row finished there, one forward of the continued rows otherwise."""
        continued = [i for i, f in enumerate(finished) if not f]
        dists = dict(zip(continued, completion_logdists(
            self.model, out.prompt_ids[continued], out.prompt_mask[continued], out.completion_ids[continued],
            out.completion_mask[continued], self.temperature))) if continued else {}
        for i, key in enumerate(keys):
            n = int(out.lengths[i])
            dist = dists[i] if i in dists else head_dist[i]
            self.cache.put(key, Draft(out.completion_ids[i, :n].clone(), dist[:n].clone()))

