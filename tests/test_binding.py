"""Which field feeds which keyword: `config.binding.bind` binds what `explain` shows, the same as the
builder binds, and `load_with_sources` says which layer set each value."""

import pathlib

import pytest

from rlvr import config as cfg
from rlvr.builder import build, plans
from rlvr.config import binding, load_config, load_with_sources
from rlvr.config.binding import DATA, ENTRY_DEFAULT, explain
from rlvr.config.load import _build
from rlvr.config.registries import COMPANIONS, CORRECTION, _import

ROOT = pathlib.Path(__file__).resolve().parents[1]
DAPO = ROOT / "recipes" / "dapo_countdown.yaml"  # algo: clip_low 0.2, clip_high 0.28, token_mean, kl_coef 0
RECIPES = [None, DAPO, ROOT / "recipes" / "dllm_spg_countdown.yaml", ROOT / "recipes" / "chord_countdown.yaml",
           ROOT / "recipes" / "ppo_countdown.yaml"]


def _rows(rows, key):
    return [(r.name, r.keyword, r.field, r.value, r.source) for r in rows if r.key == key]


def test_explain_names_the_field_and_source_of_each_objective_keyword():
    config, sources = load_with_sources(DAPO, ["algo.clip_low=0.1", "rollout.group_size=4"])
    rows = explain(config, sources)
    assert _rows(rows, "algo.objective") == [
        ("ppo_clip", "clip_low", "algo.clip_low", 0.1, "override algo.clip_low=0.1"),
        ("ppo_clip", "clip_high", "algo.clip_high", 0.28, f"recipe {DAPO}"),
        ("ppo_clip", "dual_clip", ENTRY_DEFAULT, None, "entry default"),  # ppo_clip's own default: off
        ("ppo_clip", "log_ratio_clamp", "algo.log_ratio_clamp", 20.0, "entry default"),  # null, resolved
    ]
    assert _rows(rows, "algo.aggregation") == [
        ("token_mean", "num_tokens", DATA, None, "-"),
        ("token_mean", "num_seqs", DATA, None, "-"),
        ("token_mean", "norm_length", "algo.norm_length", 16.0, "from rollout.max_new_tokens (config default)"),
    ]
    assert "algo.kl_estimator" not in {r.key for r in rows}  # kl_coef 0: no KL estimator runs
    task = {r.keyword: (r.field, r.value, r.source) for r in rows if r.key == "task.name"}
    assert task["heldout_size"] == ("task.heldout_size", 200, "config default")
    assert task["seed"] == ("seed", 0, "config default")
    assert task["num_count"] == ("task.countdown.num_count", 3, "entry default")


def test_a_value_from_elsewhere_names_its_field_and_source():
    config, sources = load_with_sources(None, ["algo.objective=nft", "rollout.group_size=4", "algo.nft_eps=0.3",
                                               "rollout.max_new_tokens=12", "task.countdown.num_count=4"])
    rows = explain(config, sources)
    objective = {r.keyword: (r.field, r.value, r.source) for r in rows if r.key == "algo.objective"}
    assert objective["group_size"] == ("rollout.group_size", 4, "override rollout.group_size=4")
    assert objective["nft_eps"] == ("algo.nft_eps", 0.3, "override algo.nft_eps=0.3")
    norm = next(r for r in rows if r.keyword == "norm_length")
    assert (norm.value, norm.source) == (12.0, "from rollout.max_new_tokens (override rollout.max_new_tokens=12)")
    count = next(r for r in rows if r.keyword == "num_count")
    assert (count.field, count.value, count.source) == ("task.countdown.num_count", 4,
                                                        "override task.countdown.num_count=4")


def test_a_null_field_of_an_unresolved_config_keeps_the_entry_default():
    raw = _build(cfg.Config, {"algo": {"objective": "gspo", "clip_high": 0.01}}, "")
    rows = {r.keyword: (r.field, r.value, r.source) for r in explain(raw) if r.key == "algo.objective"}
    assert rows["clip_low"] == (ENTRY_DEFAULT, 3e-4, "entry default")  # GSPO's own width
    assert rows["clip_high"] == ("algo.clip_high", 0.01, "-")  # no sources given
    assert binding.bound(raw, "algo.objective").keywords == {"clip_high": 0.01}


def test_sources_name_every_layer_and_load_config_is_unchanged():
    overrides = ["algo.clip_high=0.25", "algo.clip_low=null", "seed=3"]
    config, sources = load_with_sources(DAPO, overrides)
    assert config == load_config(DAPO, overrides)
    assert sources["algo.clip_high"] == "override algo.clip_high=0.25"
    assert sources["algo.clip_low"] == "entry default" and config.algo.clip_low == 0.2  # null: ppo_clip's 0.2
    assert sources["algo.overlong_buffer"] == f"recipe {DAPO}" and sources["seed"] == "override seed=3"
    assert sources["optim.lr"] == "config default" and sources["algo.gamma"] == "config default"  # unchosen: null
    assert sources["algo.rollout_correction"] == "from rollout.engine (config default)"
    assert set(sources) == set(cfg.all_keys())
    _, mapping = load_with_sources({"algo": {"clip_high": 0.28}})
    assert mapping["algo.clip_high"] == "recipe (mapping)"


def _same(ours, theirs):
    assert (ours.func, ours.args, ours.keywords) == (theirs.func, theirs.args, theirs.keywords)


def _sections(config):
    """(registry, name, entry, section) for every entry of every registry with a section, plus gae's
    returns and the rollout correction (no registry), against this config's sections."""
    out = []
    for key in ("algo.objective", "algo.advantage", "algo.aggregation", "algo.kl_estimator", "estimator.name",
                "expert.objective"):
        reg = cfg.REGISTRY[key]
        out += [(reg, name, fn, getattr(config, reg.section)) for name, fn in reg.entries().items()]
    out += [(None, src, _import(src), config.algo) for src in [CORRECTION, *COMPANIONS["algo.advantage"].values()]]
    tasks = cfg.REGISTRY["task.name"]
    for name, cls in tasks.entries().items():
        out.append((tasks, name, cls, getattr(config.task, name) or cfg.task_sections()[name]()))
    return out


def _bound(rows, key, name):
    """What the explanation says the builder binds for one entry: fed values, not defaults or data."""
    return {r.keyword: r.value for r in rows if (r.key, r.name) == (key, name) and r.value is not None
            and not r.field.startswith("(")}


@pytest.mark.parametrize("recipe", [p for p in RECIPES if p] + [ROOT / "recipes" / "nft_countdown.yaml",
                                                               ROOT / "recipes" / "rlplus_countdown.yaml"],
                         ids=lambda p: p.name)
@pytest.mark.parametrize("overrides", [[], ["algo.kl_coef=0.05", "algo.rollout_correction=true", "algo.advantage=gae"]])
def test_the_explanation_shows_what_the_builder_binds(recipe, overrides):
    if overrides and load_config(recipe).expert.per_step:
        overrides = overrides[:-1]  # expert rows have no critic values: no gae
    config = load_config(recipe, overrides)
    rows = explain(config)
    loss, adv = build.build_loss(config), build.build_advantage(config)
    a = config.algo
    assert _bound(rows, "algo.objective", a.objective) == loss.objective.keywords
    assert _bound(rows, "algo.aggregation", a.aggregation) == loss.aggregation.keywords
    assert _bound(rows, "algo.advantage", a.advantage) == adv.estimate.keywords
    if adv.returns is not None:
        assert _bound(rows, "algo.advantage", "gae_returns") == adv.returns.keywords
    kl = loss.kl_estimator or plans.reward_kl(config)
    assert any(r.key == "algo.kl_estimator" for r in rows) == (kl is not None)
    if kl is not None:
        assert _bound(rows, "algo.kl_estimator", a.kl_estimator) == kl.keywords
    correction = plans.correction(config)
    if correction is not None:
        assert _bound(rows, "algo.rollout_correction", "importance_correction") == correction.keywords
    assert any(r.key == "algo.rollout_correction" for r in rows) == (correction is not None)
    if loss.expert is not None:
        assert _bound(rows, "expert.objective", config.expert.objective) == loss.expert.keywords
    if config.model.kind == "diffusion":
        assert _bound(rows, "estimator.name", config.estimator.name) == binding.bound(
            config, "estimator.name").keywords
