"""What a method needs is declared once, on its entry, and enforced by `rlvr.config.checks`.

A toy entry registered here (and nowhere else: no edit to the checks, the loader or the builder)
states a requirement; a config that chooses it without meeting it is refused with the entry's own
one line, a config that meets it loads, and `rlvr config --explain` and the builder see the same
chosen entry.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from rlvr.algos import advantages, objectives
from rlvr.algos._registry import SET, Requirement, requirements_of, requires
from rlvr.cli import main
from rlvr.config import chosen_entries, load_config
from rlvr.config.binding import bound, explain
from rlvr.engines import kinds
from rlvr.errors import ConfigError

RECIPES = sorted((Path(__file__).resolve().parent.parent / "recipes").glob("*.yaml"))


@requires(Requirement({"model.kind": "diffusion", "rollout.group_size": (4, 8)}, "toy reads the sampler's denoising "
                      "steps; set model.kind=diffusion and rollout.group_size=4 or 8"))
def toy(logp, old_logp, advantages, mask, *, clip_low: float = 0.3):
    return objectives.reinforce(logp, old_logp, advantages, mask)


@requires(Requirement({"model.teacher_path": SET}, "toy_adv compares with a teacher; set it to a checkpoint",
                      field="model.teacher_path"))
def toy_adv(inp):
    return advantages.ADVANTAGES["grpo"](inp)


@pytest.fixture
def registered(monkeypatch):
    monkeypatch.setitem(objectives.OBJECTIVES, "toy", toy)
    monkeypatch.setitem(advantages.ADVANTAGES, "toy_adv", toy_adv)
    monkeypatch.setitem(kinds.ENGINES, "toy_engine", kinds.EngineKind(
        own_weights=False, exact_logprobs=True, batches_itself=False, causal_only=True,
        options=("rollout.vllm_kv_cache_mb",)))


def test_an_entrys_requirement_is_enforced_with_its_own_line(registered):
    with pytest.raises(ConfigError, match=r"^algo.objective: toy reads the sampler's denoising steps; set "
                                          r"model.kind=diffusion and rollout.group_size=4 or 8$"):
        load_config(None, ["algo.objective=toy"])
    with pytest.raises(ConfigError, match=r"^algo.objective: toy reads"):  # one field of two is not enough
        load_config(None, ["algo.objective=toy", "model.kind=diffusion", "rollout.group_size=6"])
    config = load_config(None, ["algo.objective=toy", "model.kind=diffusion", "rollout.group_size=8"])
    assert config.algo.clip_low == 0.3  # its own default, filled as any entry's
    # the field the requirement names, not the one that chose the entry; SET: any non-empty value
    with pytest.raises(ConfigError, match=r"^model.teacher_path: toy_adv compares with a teacher; set it to a "
                                          r"checkpoint$"):
        load_config(None, ["algo.advantage=toy_adv"])
    assert requirements_of(toy_adv)[0].met(lambda key: {"model.teacher_path": "runs/t"}[key])


def test_an_engines_declarations_are_enforced(registered):
    with pytest.raises(ConfigError, match=r"^rollout.engine: toy_engine samples causal models only"):
        load_config(None, ["rollout.engine=toy_engine", "model.kind=diffusion"])
    load_config(None, ["rollout.engine=toy_engine"])
    # its own option is allowed under it, and refused under another engine, which would ignore it
    load_config(None, ["rollout.engine=toy_engine", "rollout.vllm_kv_cache_mb=32"])
    with pytest.raises(ConfigError, match=r"^rollout.vllm_kv_cache_mb: only read with rollout.engine=vllm "
                                          r"\(rollout.engine is 'torch'\)"):
        load_config(None, ["rollout.vllm_kv_cache_mb=32"])


def test_the_cli_refuses_an_unmet_requirement_in_one_line(registered, capsys):
    assert main(["config", "algo.objective=toy"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: algo.objective: toy reads the sampler's denoising steps")


def test_explain_and_the_builder_see_the_same_chosen_entry(registered):
    config = load_config(None, ["algo.objective=toy", "model.kind=diffusion", "rollout.group_size=4"])
    rows = [r for r in explain(config) if r.key == "algo.objective"]
    assert [(r.name, r.keyword, r.value) for r in rows] == [("toy", "clip_low", 0.3)]
    objective = bound(config, "algo.objective")
    assert objective.func is toy and objective.keywords == {"clip_low": 0.3}


@pytest.mark.parametrize("recipe", RECIPES, ids=lambda p: p.stem)
def test_every_bound_keyword_is_one_explain_shows(recipe):
    """For every recipe, each chosen entry the builder binds carries exactly the values `explain`
    lists for it (explain and the builder read one list, conditions included)."""
    config = load_config(recipe)
    rows = explain(config)
    for choice in chosen_entries(config):
        if choice.registry is None:
            continue  # a companion or the correction: bound beside its entry
        shown = {r.keyword: r.value for r in rows if r.key == choice.key and r.name == choice.name
                 and not r.field.startswith("(") and r.value is not None}
        assert bound(config, choice.key).keywords == shown, (choice.key, choice.name)
    assert bound(config, "algo.kl_estimator") is None or config.algo.kl_coef > 0
    assert (bound(config, "estimator.name") is None) == (config.model.kind == "causal")
