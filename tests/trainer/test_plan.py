"""The step plan: what a run's steps do is resolved once by the builder, and the loop reads only it.

The plan is checked field by field for the configurations whose steps differ (on-policy, several
updates, an engine with its own log-probs, a diffusion estimator, stale batches, a critic, ReMax,
expert rows), and the loop's files are read to show they never touch the config, an engine's type
or a registry name.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch

from rlvr.builder.build import base_model, build_advantage, build_loss, build_policy
from rlvr.builder.components import fusable, step_plan
from rlvr.config import REGISTRIES, load_config
from rlvr.config.registries import engine_kind
from rlvr.engines.kinds import ENGINES

LOOP_FILES = ("sync.py", "loop.py", "async_loop.py", "collect.py", "expert.py", "step.py", "proximal.py",
              "critic.py", "evaluate.py", "logit_stats.py", "scoring.py")
TRAINER = Path(__file__).resolve().parents[2] / "src" / "rlvr" / "trainer"
TINY = ["model.path=", "model.hidden_size=16", "model.num_layers=1", "model.num_heads=2",
        "model.intermediate_size=32", "rollout.max_new_tokens=8", "task.heldout_size=4"]


def _plan(*overrides: str):
    config = load_config(None, [*TINY, *overrides])
    loss, advantage = build_loss(config), build_advantage(config)
    model, _ = base_model(config)
    policy = build_policy(config, model)
    return step_plan(config, loss, advantage, fused=fusable(config, policy, loss, advantage)), loss


def test_on_policy_default_needs_no_old_policy_pass():
    plan, _ = _plan()
    assert (plan.fresh.source, plan.fresh.weights) == ("none", None)
    assert plan.stale.source == "fused" and plan.stale.weights is not None  # decoupled PPO when a batch is stale
    assert not plan.push_weights and plan.rollout.group_filter is not None and not plan.rollout.greedy_baseline


def test_several_updates_take_a_separate_pass():
    plan, _ = _plan("trainer.ppo_epochs=2")
    assert plan.fresh.source == "pass" and plan.stale.source == "pass" and plan.ppo_epochs == 2


def test_rollout_correction_weights_fresh_batches_from_the_updates_forward():
    plan, loss = _plan("algo.rollout_correction=true", "algo.correction_cap=2.0")
    assert plan.fresh.source == "fused" and plan.fresh.weights is loss.correction


@pytest.mark.parametrize("name", sorted(ENGINES))
def test_engine_declarations_decide_the_plan(name):
    kind = ENGINES[name]
    config = load_config(None, [*TINY, f"rollout.engine={name}"])
    assert engine_kind(config) is kind
    loss, advantage = build_loss(config), build_advantage(config)
    plan = step_plan(config, loss, advantage, fused=True)
    assert plan.push_weights == kind.own_weights
    # log-probs from another implementation are never taken as the old policy's: the correction is on
    assert (plan.fresh.source == "none") == kind.exact_logprobs
    assert (plan.fresh.weights is not None) == (not kind.exact_logprobs)


def test_a_diffusion_estimator_never_fuses():
    plan, _ = _plan("model.kind=diffusion", "algo.rollout_correction=true")
    assert plan.fresh.source == "pass" and plan.stale.source == "pass"


def test_declarations_of_entries_reach_the_plan():
    remax, _ = _plan("algo.advantage=remax")
    assert remax.rollout.greedy_baseline
    gae, _ = _plan("algo.advantage=gae", "algo.critic_warmup_steps=3")
    assert gae.critic_warmup_steps == 3 and gae.stale.source == "pass"  # a critic reads pi_prox before the update
    shaped, _ = _plan("algo.overlong_buffer=4")
    assert shaped.shaping(torch.tensor([2, 6, 8])).tolist() == pytest.approx([0.0, -0.5, -1.0])
    expert, _ = _plan("expert.per_step=2", "algo.aggregation=token_mean", "expert.weight=0.5",
                      "expert.weight_final=0.1", "expert.decay_steps=4")
    assert expert.expert.token_units and expert.expert.mu(0) == pytest.approx(0.5)
    assert expert.expert.mu(100) == pytest.approx(0.1) and expert.expert.mu(2) < 0.5  # decayed, then held
    rows, _ = _plan("expert.per_step=2", "algo.aggregation=seq_mean_token_mean")
    assert not rows.expert.token_units


def _names() -> set[str]:
    """Every registry entry name and engine name a loop could compare a string with."""
    names = set(ENGINES)
    for registry in REGISTRIES:
        entries = registry.entries()
        names |= set(entries)
    return names


@pytest.mark.parametrize("filename", LOOP_FILES)
def test_loop_files_read_no_config_and_compare_no_names(filename):
    tree = ast.parse((TRAINER / filename).read_text())
    names = _names()
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            assert node.attr != "config", f"{filename}:{node.lineno} reads .config"
        if isinstance(node, ast.ImportFrom) and node.module:
            assert not node.module.startswith("rlvr.config"), f"{filename}:{node.lineno} imports the config"
            assert node.module not in ("rlvr.builder.build", "rlvr.builder.components"), \
                f"{filename}:{node.lineno} imports the builder"
        if isinstance(node, ast.Compare):
            for side in [node.left, *node.comparators]:
                assert not (isinstance(side, ast.Constant) and side.value in names), \
                    f"{filename}:{node.lineno} compares with the name {side.value!r}"
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "isinstance":
            kind = ast.unparse(node.args[1])
            # LogitStatsPolicy, DrawsPolicy: a capability the call needs, whose absence is an error, not a mode
            assert "Engine" not in kind and ("Policy" not in kind or kind in ("LogitStatsPolicy", "DrawsPolicy")), \
                f"{filename}:{node.lineno} isinstance({kind})"
