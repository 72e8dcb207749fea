"""What `rlvr dpo` and `rlvr rm` share with `rlvr train`: a claimed run directory (config.yaml,
run.json, metrics.jsonl with one line per evaluation or step, atomic checkpoints, the exit
record) and the preference pairs of the run, split into training and held-out pairs."""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from pathlib import Path

import torch

from rlvr.config import Config, dump_yaml, to_dict
from rlvr.errors import ConfigError
from rlvr.preference.pairs import Pair, load_pairs, verifier_pairs
from rlvr.tracking.run_dir import RunDir, StopSignals, atomic_write_text, finish_manifest, manifest
from rlvr.trainer.checkpoint import save_checkpoint

__all__ = ["PreferenceRun", "check_pairs_fit", "split_pairs"]


def split_pairs(config: Config, task) -> tuple[list[Pair], list[Pair]]:
    """(training pairs, held-out pairs): from `preference.data` (its last `heldout_pairs` rows held
    out), else made from the task's verifier (training problems, and its held-out problems)."""
    p = config.preference
    if p.data:
        pairs = load_pairs(p.data)
        held = min(p.heldout_pairs, len(pairs) // 2)
        return pairs[:len(pairs) - held], pairs[len(pairs) - held:]
    if not hasattr(task, "solution"):
        raise ConfigError(f"preference.data: the task '{config.task.name}' has no solutions to make pairs from; "
                          f"pass a JSONL of pairs, e.g. preference.data=pairs.jsonl")
    rng = random.Random(config.seed)
    train = verifier_pairs(task, task.sample(p.pairs, rng), rng, rejected=p.rejected)
    heldout = verifier_pairs(task, task.heldout()[:p.heldout_pairs], rng, rejected=p.rejected)
    if not train:
        raise ConfigError("preference.pairs: the verifier ranked no pair; raise preference.pairs")
    return train, heldout


def check_pairs_fit(pairs: list[Pair], tokenizer, model) -> None:
    """Refuse (one line) a pair whose prompt and longer answer exceed the model's positions
    (`max_position_embeddings`): past them the model trains on positions it has no embedding for."""
    limit = getattr(getattr(model, "config", None), "max_position_embeddings", None)
    if not isinstance(limit, int):
        return
    for i, pair in enumerate(pairs):
        prompt = len(tokenizer.encode(pair.prompt, add_special_tokens=False))
        longest = max(len(tokenizer.encode(text, add_special_tokens=False)) for text in (pair.chosen, pair.rejected))
        if prompt + longest + 2 > limit:  # + BOS and EOS
            raise ConfigError(f"preference.data: pair {i + 1} is {prompt + longest + 2} tokens (prompt and its longer "
                              f"answer), over the model's {limit} positions; shorten or drop that pair, or use a "
                              f"model with more (model.max_seq_len for a fresh tiny model)")


class PreferenceRun:
    """A run directory for a preference trainer named `kind` (`dpo`, `rm`)."""

    def __init__(self, config: Config, kind: str, command: list[str], *, echo: Callable = print):
        name = config.trainer.name or f"{kind}_{config.task.name}_s{config.seed}"
        self.run = RunDir.claim(Path(config.trainer.out_dir) / name)
        self.config, self.echo, self.final = config, echo, {}
        atomic_write_text(self.run.path / "config.yaml", dump_yaml(config))
        self.run.write_json("run.json", {**manifest(command, config.seed, config=to_dict(config)),
                                         "trainer": kind, "status": "running"})
        echo(f"run directory: {self.run.path}")

    def log(self, step: int, metrics: dict) -> None:
        line = {"step": step, **metrics}
        self.run.append(self.run.metrics_file, line)
        self.final = line

    def save(self, step: int, model, tokenizer) -> Path:
        return save_checkpoint(self.run.checkpoints, step, model, tokenizer, {},
                               keep_last=self.config.trainer.keep_last)

    def due(self, step: int, every: int) -> bool:
        return step == self.config.preference.steps or bool(every) and step % every == 0

    def train(self, model, tokenizer, optimizer, scheduler, step_loss: Callable, evaluate: Callable, *,
              kind: str) -> dict:
        """The loop both trainers run: evaluate at step 0, then per step `step_loss(step) -> (loss,
        metrics)`, backward, clip, AdamW; metrics logged under `kind/`, evaluations every
        `preference.eval_every`, checkpoints every `preference.save_every` and at the end; the
        run's exit recorded either way. Returns the last metrics line."""
        try:
            with StopSignals(self.echo) as stop:  # SIGTERM/SIGINT: stop after the step, its weights saved
                self._steps(model, tokenizer, optimizer, scheduler, step_loss, evaluate, kind=kind, stop=stop)
        except BaseException as err:
            self.finish(err)
            raise
        self.finish()
        return self.final

    def _steps(self, model, tokenizer, optimizer, scheduler, step_loss: Callable, evaluate: Callable, *,
               kind: str, stop: StopSignals) -> None:
        """The steps of `train`; a signal stops them after a step, whose weights are saved first."""
        p = self.config.preference
        model.eval()
        self.log(0, evaluate())
        for step in range(1, p.steps + 1):
            model.train()
            loss, metrics = step_loss(step)
            loss.backward()
            grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), self.config.optim.grad_clip or math.inf)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad(set_to_none=True)
            line = {f"{kind}/loss": loss.item(), **{f"{kind}/{k}": v for k, v in metrics.items()},
                    "actor/grad_norm": float(grad_norm)}
            if self.due(step, p.eval_every):
                model.eval()
                line.update(evaluate())
                self.echo(f"{kind} step {step}/{p.steps} loss={loss.item():.4f} " + " ".join(
                    f"{k}={v:.3f}" for k, v in line.items() if k.startswith("eval/")))
            self.log(step, line)
            if self.due(step, p.save_every) or stop.received:
                self.save(step, model, tokenizer)
            stop.check(step)

    def finish(self, error: BaseException | None = None) -> None:
        if error is None:
            finish_manifest(self.run, "finished", exit_status=0, final=self.final)
        elif isinstance(error, KeyboardInterrupt):  # a signal (RunInterrupted) or Ctrl-C outside the handlers
            finish_manifest(self.run, "interrupted", exit_status=getattr(error, "exit_status", 130),
                            signal=getattr(error, "signal_name", "SIGINT"), final=self.final)
        else:
            finish_manifest(self.run, "failed", exit_status=1, error=f"{type(error).__name__}: {error}")
        self.run.release()
