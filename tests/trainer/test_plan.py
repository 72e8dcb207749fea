"""The step plan: what a run's steps do is resolved once by the builder, and the loop reads only it.

The plan is checked field by field for the configurations whose steps differ (on-policy, several
updates, an engine with its own log-probs, a diffusion estimator, stale batches, a critic, ReMax,
expert rows, the statistics each pass computes), and the loop's files are read to show they never
touch the config, an engine's type or a registry name, never read an entry's declarations
(`needs_of`) and never probe a component (`getattr`, `hasattr`, `isinstance`).
"""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import pytest
import torch

from rlvr.builder.build import base_model, build_advantage, build_loss, build_policy
from rlvr.builder.plans import BEHAVIOUR_WEIGHTS, fusable, step_plan
from rlvr.config import REGISTRIES, load_config
from rlvr.config.registries import engine_kind
from rlvr.engines.kinds import ENGINES
from rlvr.trainer import parts
from rlvr.trainer.plan import ProximalSource

SRC = Path(__file__).resolve().parents[2] / "src" / "rlvr"
TRAINER = SRC / "trainer"
LOOP_FILES = ("sync.py", "loop.py", "async_loop.py", "collect.py", "expert.py", "inpaint.py", "step.py",
              "proximal.py", "critic.py", "evaluate.py", "logit_stats.py", "scoring.py", "../agents/collect.py")
TINY = ["model.path=", "model.hidden_size=16", "model.num_layers=1", "model.num_heads=2",
        "model.intermediate_size=32", "rollout.max_new_tokens=8", "task.heldout_size=4"]


def _plan(*overrides: str):
    config = load_config(None, [*TINY, *overrides])
    loss, advantage = build_loss(config), build_advantage(config)
    model, _ = base_model(config)
    policy = build_policy(config, model)
    return step_plan(config, loss, advantage, fused=fusable(config, policy, advantage)), loss


def test_on_policy_default_needs_no_old_policy_pass():
    plan, _ = _plan()
    assert (plan.fresh.source, plan.fresh.weights) == (ProximalSource.NONE, None)
    assert plan.stale.source is ProximalSource.FUSED and plan.stale.weights is BEHAVIOUR_WEIGHTS  # decoupled PPO
    assert not plan.push_weights and plan.rollout.group_filter is not None and not plan.rollout.greedy_baseline


def test_several_updates_take_a_separate_pass():
    plan, _ = _plan("trainer.ppo_epochs=2")
    assert plan.fresh.source is plan.stale.source is ProximalSource.PASS and plan.ppo_epochs == 2


def test_rollout_correction_weights_fresh_batches_from_the_updates_forward():
    plan, _ = _plan("algo.rollout_correction=true", "algo.correction_cap=2.0")
    assert plan.fresh.source is ProximalSource.FUSED and plan.fresh.weights is plan.stale.weights
    assert plan.fresh.weights.keywords["correction_cap"] == 2.0  # the correction's cap, not decoupled PPO's


@pytest.mark.parametrize("name", sorted(ENGINES))
def test_engine_declarations_decide_the_plan(name):
    kind = ENGINES[name]
    config = load_config(None, [*TINY, f"rollout.engine={name}"])
    assert engine_kind(config) is kind
    loss, advantage = build_loss(config), build_advantage(config)
    plan = step_plan(config, loss, advantage, fused=True)
    assert plan.push_weights == kind.own_weights
    # log-probs from another implementation are never taken as the old policy's: the correction is on
    assert (plan.fresh.source is ProximalSource.NONE) == kind.exact_logprobs
    assert (plan.fresh.weights is not None) == (not kind.exact_logprobs)


def test_a_diffusion_estimator_never_fuses():
    plan, _ = _plan("model.kind=diffusion", "algo.rollout_correction=true")
    assert plan.fresh.source is plan.stale.source is ProximalSource.PASS


def test_declarations_of_entries_reach_the_plan():
    remax, _ = _plan("algo.advantage=remax")
    assert remax.rollout.greedy_baseline
    gae, _ = _plan("algo.advantage=gae", "algo.critic_warmup_steps=3")
    assert gae.critic_warmup_steps == 3 and gae.stale.source is ProximalSource.PASS  # a critic reads pi_prox first
    shaped, _ = _plan("algo.overlong_buffer=4")
    assert shaped.shaping(torch.tensor([2, 6, 8])).tolist() == pytest.approx([0.0, -0.5, -1.0])
    expert, _ = _plan("expert.per_step=2", "algo.aggregation=token_mean", "expert.weight=0.5",
                      "expert.weight_final=0.1", "expert.decay_steps=4")
    assert expert.expert.token_units and expert.expert.mu(0) == pytest.approx(0.5)
    assert expert.expert.mu(100) == pytest.approx(0.1) and expert.expert.mu(2) < 0.5  # decayed, then held
    rows, _ = _plan("expert.per_step=2", "algo.aggregation=seq_mean_token_mean")
    assert not rows.expert.token_units


def test_declared_statistics_are_resolved_once():
    """What each pass computes and what the update's forward hands the objective and the
    aggregation come from the entries' declarations, read by the builder."""
    plain, loss = _plan()
    assert plain.passes == type(plain.passes)() and (loss.stats, loss.fields, loss.aggregation_fields) == ((), (), ())
    shiq, loss = _plan("algo.objective=shiq")
    assert shiq.passes.reference_stats == ("logsumexp",) and shiq.token_rewards
    assert loss.stats == ("logsumexp",) and loss.fields == ("logsumexp", "ref_logp", "ref_logsumexp", "token_rewards")
    config = load_config(None, [*TINY, "algo.advantage=optimal_token_baseline"])
    otb = build_advantage(config)
    assert (otb.behaviour, otb.components, otb.trace) == (("old_logp", "sum_pi_squared"), False, False)
    otb_plan = step_plan(config, build_loss(config), otb, fused=False)
    assert otb_plan.passes.old_stats == ("sum_pi_squared",)
    gdpo = build_advantage(load_config(None, [*TINY, "algo.advantage=gdpo"]))
    assert gdpo.components and not gdpo.behaviour
    diffusion = ["model.kind=diffusion", "rollout.diffusion_steps=4"]
    bgpo, loss = _plan(*diffusion, "algo.objective=bgpo", "estimator.name=bgpo")
    assert bgpo.passes.old_draws and loss.stats == ("draws",) and loss.fields == ("draws", "old_draws")
    _, loss = _plan(*diffusion, "algo.aggregation=step_mean")
    assert loss.aggregation_fields == ("trace",)


def test_a_policy_without_the_declared_statistics_is_refused_when_built():
    from rlvr.builder.plans import check_statistics, passes
    from rlvr.errors import ConfigError

    config = load_config(None, [*TINY, "algo.objective=shiq"])
    loss, advantage = build_loss(config), build_advantage(config)

    class LogProbsOnly:  # a policy that gives log-probs and nothing else
        exact_logprobs = True

    with pytest.raises(ConfigError, match="returns no logit statistics"):
        check_statistics(LogProbsOnly(), loss, passes(loss, advantage))


def test_agent_episodes_and_sampler_feedback_are_the_plans():
    from rlvr.builder.components import build_components

    uniform = build_components(load_config(None, [*TINY, "rollout.prompts_per_step=2", "rollout.group_size=2"]))
    assert not uniform.rollout.plan.agent and not uniform.rollout.plan.sampler_feedback
    vade = build_components(load_config(None, [*TINY, "rollout.prompts_per_step=2", "rollout.group_size=2",
                                               "sampler.name=vade"]))
    assert vade.rollout.plan.sampler_feedback
    agent = build_components(load_config(None, ["task.name=agent_calculator", "model.path=", "model.hidden_size=16",
                                                "model.num_layers=1", "model.num_heads=2", "model.intermediate_size=32",
                                                "model.max_seq_len=128", "rollout.max_new_tokens=8",
                                                "task.heldout_size=2", "rollout.prompts_per_step=2",
                                                "rollout.group_size=2"]))
    assert agent.rollout.plan.agent


def test_the_parts_are_frozen_but_the_step_state():
    for part in (parts.RolloutParts, parts.LearnerParts, parts.Critic, parts.Components, parts.RolloutSide):
        assert part.__dataclass_params__.frozen, part
    assert not parts.StepState.__dataclass_params__.frozen
    from rlvr.trainer.scoring import Collected

    assert Collected.__dataclass_params__.frozen


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


COMPONENTS = {f.name for part in (parts.RolloutParts, parts.LearnerParts, parts.Critic, parts.Components,
                                  parts.RolloutSide) for f in dataclasses.fields(part)} | {
    "c", "r", "learner", "critic", "rollout", "side", "parts", "policy", "reference", "model", "full"}
"""Names a loop file gives a component (the parts' fields and the loop's local names for them)."""
PROBES = ("getattr", "hasattr", "isinstance")
DECLARATIONS = ("needs_of", "is_agent_task", "reads_step")  # what the builder resolves into the plan


def _names_in(node: ast.AST) -> set[str]:
    """The names and attribute names an expression is made of (`self.c.engine` -> self, c, engine)."""
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name)} | \
        {n.attr for n in ast.walk(node) if isinstance(n, ast.Attribute)}


@pytest.mark.parametrize("filename", LOOP_FILES)
def test_loop_files_probe_no_component_and_read_no_declaration(filename):
    tree = ast.parse((TRAINER / filename).read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.Name | ast.Attribute):
            name = node.id if isinstance(node, ast.Name) else node.attr
            assert name not in DECLARATIONS or isinstance(node, ast.Attribute) and name == "reads_step", \
                f"{filename}:{node.lineno} reads the declaration {name}"
        if isinstance(node, ast.ImportFrom):
            imported = {a.name for a in node.names} & set(DECLARATIONS)
            assert not imported, f"{filename}:{node.lineno} imports {imported}"
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) in PROBES and node.args:
            probed = _names_in(node.args[0]) & COMPONENTS
            assert not probed, f"{filename}:{node.lineno} {node.func.id} on the component {sorted(probed)}"


def test_the_probe_test_catches_a_probe():
    """The test above fails on the probes it forbids (a canary against a walk that finds nothing)."""
    bad = ast.parse("isinstance(c.rollout.sampler, Uniform)\nhasattr(self.engine, 'restarts')\nneeds_of(spec)")
    calls = [n for n in ast.walk(bad) if isinstance(n, ast.Call) and getattr(n.func, "id", None) in PROBES]
    assert [sorted(_names_in(n.args[0]) & COMPONENTS) for n in calls] == [["c", "rollout", "sampler"], ["engine"]]
    assert any(isinstance(n, ast.Name) and n.id in DECLARATIONS for n in ast.walk(bad))
