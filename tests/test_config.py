"""Config reaches the math explicitly: registry defaults resolve, every keyword has one field,
names are checked against the registries, and docs/config.md is generated from the docstrings."""

import dataclasses
import functools
import inspect
import pathlib
import typing

import pytest
import yaml

from rlvr import config as cfg
from rlvr.algos import objectives
from rlvr.builder import build, plans
from rlvr.cli import main
from rlvr.config import binding, load_config
from rlvr.config.load import _build
from rlvr.config.reference import field_docs, markdown
from rlvr.errors import ConfigError

ROOT = pathlib.Path(__file__).resolve().parents[1]
RECIPES = sorted((ROOT / "recipes").glob("*.yaml"))


def _error(capsys, argv):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: ")
    return err


# ---------------------------------------------------------------------------- resolution

@pytest.mark.parametrize("objective, low, high", [("gspo", 3e-4, 4e-4), ("cispo", 1.0, 4.0), ("ppo_clip", 0.2, 0.2)])
def test_a_named_objective_gets_its_own_clip_widths(capsys, objective, low, high):
    assert main(["config", f"algo.objective={objective}"]) == 0
    algo = yaml.safe_load(capsys.readouterr().out)["algo"]
    assert (algo["clip_low"], algo["clip_high"]) == (low, high)
    spec = build.build_loss(load_config(None, [f"algo.objective={objective}"]))
    assert spec.objective.keywords["clip_low"] == low and spec.objective.keywords["clip_high"] == high


def test_every_entry_resolves_every_hyperparameter_to_its_own_default():
    for section, reg_key in (("algo", "algo.advantage"), ("algo", "algo.objective"), ("algo", "algo.aggregation"),
                             ("estimator", "estimator.name"), ("sampler", "sampler.name")):
        reg = cfg.REGISTRY[reg_key]
        for name, fn in reg.entries().items():
            overrides = [f"{reg_key}={name}"] + (["model.kind=diffusion"] if section == "estimator" else [])
            if (reg_key, name) == ("algo.objective", "bgpo"):  # reads the bgpo estimator's draws
                overrides += ["model.kind=diffusion", "estimator.name=bgpo"]
            if (reg_key, name) == ("algo.objective", "dipo"):  # reads the sampler's commit steps
                overrides += ["model.kind=diffusion", "estimator.name=trace"]
            if (reg_key, name) in (("algo.advantage", "lightning"), ("algo.aggregation", "step_mean")):
                # both read the diffusion sampler's steps
                overrides += ["model.kind=diffusion"]
            if (reg_key, name) == ("algo.objective", "reverse_kl_distill"):  # trains toward a teacher
                overrides += ["model.teacher_path=rlvr:countdown-warmstart"]
            required = [k for k, v in cfg.hyperparameters(fn, reg).items() if v is inspect.Parameter.empty]
            if required:  # no default of its own: the config must set it
                with pytest.raises(ConfigError, match=f"{section}.{required[0]}: {name} needs it"):
                    load_config(None, overrides)
                overrides += [f"{section}.{k}=0.5" for k in required]
            resolved = getattr(load_config(None, overrides), section)
            for key, default in cfg.hyperparameters(fn, reg).items():
                if key == "norm_length":  # null = rollout.max_new_tokens, bound from elsewhere
                    assert resolved.norm_length == 16.0
                elif default is not inspect.Parameter.empty:
                    assert getattr(resolved, key) == default, (name, key)


def test_an_override_wins_and_fields_of_entries_not_chosen_stay_null():
    c = load_config(None, ["algo.objective=sapo", "algo.tau_neg=2.0"])
    assert (c.algo.tau_pos, c.algo.tau_neg, c.algo.clip_low, c.algo.pass_k) == (1.0, 2.0, None, None)
    assert c.estimator.n is None and c.task.sudoku4 is None  # causal model, countdown task
    assert load_config(None, ["algo.advantage=gae"]).algo.lam == 1.0  # gae and gae_returns agree
    c = load_config(None, ["algo.rollout_correction=true"])
    assert (c.algo.correction_level, c.algo.correction_mode, c.algo.correction_cap) == ("token", "truncate", 2.0)


def test_entries_that_default_a_shared_field_differently_need_it_set(monkeypatch):
    def rival(logp, old_logp, advantages, mask, *, adv_eps: float = 0.5):
        return objectives.reinforce(logp, old_logp, advantages, mask)

    monkeypatch.setitem(objectives.OBJECTIVES, "rival", rival)
    with pytest.raises(ConfigError, match=r"^algo.adv_eps: the chosen entries default it differently "
                                          r"\(grpo 1e-06, rival 0.5\); set algo.adv_eps$"):
        load_config(None, ["algo.objective=rival"])
    c = load_config(None, ["algo.objective=rival", "algo.adv_eps=0.1"])
    assert build.build_loss(c).objective.keywords["adv_eps"] == 0.1
    assert build.build_advantage(c).estimate.keywords["adv_eps"] == 0.1


@pytest.mark.parametrize("recipe", RECIPES, ids=lambda p: p.name)
def test_a_resolved_config_reloads_to_itself(recipe, tmp_path):
    c = load_config(recipe)
    saved = tmp_path / "config.yaml"
    saved.write_text(cfg.dump_yaml(c))
    assert load_config(saved) == c


# ---------------------------------------------------------------------------- binding

@pytest.mark.parametrize("recipe", RECIPES, ids=lambda p: p.name)
def test_resolving_first_binds_the_same_values_as_binding_the_nulls(recipe):
    """The printed config is what runs: null fields bound as the entries' defaults give the same calls."""
    raw, resolved = _build(cfg.Config, cfg.read_recipe(recipe), ""), load_config(recipe)

    def calls(c):
        loss, adv = build.build_loss(c), build.build_advantage(c)
        parts = [loss.objective, loss.aggregation, loss.kl_estimator, plans.reward_kl(c), plans.correction(c),
                 adv.estimate, adv.returns]
        if c.model.kind == "diffusion":
            parts.append(binding.bound(c, "estimator.name"))
        return [(p.func, {**cfg.keywords(p.func), **p.keywords}) if p else None for p in parts]

    assert calls(raw) == calls(resolved)



def test_bind_sets_declared_keywords_only_and_null_keeps_the_default():
    def fn(a, b=1, *, clip_low=0.0, gamma=1.0, group_size=1):
        return (a, b, clip_low, gamma, group_size)

    section = cfg.AlgoConfig(clip_low=0.3, gamma=None, lam=0.9)
    bound = binding.bind(fn, section, group_size=8, rollout_only=3)
    assert isinstance(bound, functools.partial)
    assert bound.keywords == {"clip_low": 0.3, "group_size": 8}  # lam: not fn's; gamma: null
    assert bound(1) == (1, 1, 0.3, 1.0, 8)


def test_the_builder_binds_values_from_other_sections():
    c = load_config(None, ["algo.objective=wd1", "algo.aggregation=seq_mean_token_sum_norm", "rollout.group_size=4",
                           "rollout.max_new_tokens=12"])
    spec = build.build_loss(c)
    assert spec.objective.keywords == {"group_size": 4, "wd1_psi": 1.0}
    assert spec.aggregation.keywords == {"norm_length": 12.0}
    assert build.build_loss(load_config(None, ["algo.norm_length=7"])).aggregation.keywords == {"norm_length": 7.0}


def test_estimator_and_task_options_reach_their_classes():
    c = load_config(ROOT / "recipes" / "dllm_spg_countdown.yaml", ["estimator.block_length=4"])
    options = binding.bound(c, "estimator.name").keywords
    assert options == {"n": 2, "beta": 1.5, "omega": 0.5, "bound": "mixture", "block_length": 4}
    task = build.build_task(load_config(None, ["task.countdown.num_count=4", "task.heldout_size=7"]))
    assert task.num_count == 4 and task.ordered and len(task.heldout()) == 7
    sudoku = build.build_task(load_config(None, ["task.name=sudoku4", "task.sudoku4.min_blanks=4"]))
    assert (sudoku.min_blanks, sudoku.max_blanks) == (4, 10)


# ---------------------------------------------------------------------------- every keyword, one field

def _fields(cls) -> set[str]:
    hints = typing.get_type_hints(cls)
    return {f.name for f in dataclasses.fields(cls) if cfg.section_type(hints[f.name]) is None}


def test_every_keyword_of_every_entry_maps_to_one_field_and_back():
    sections = {"algo": cfg.AlgoConfig, "estimator": cfg.EstimatorConfig, "expert": cfg.ExpertConfig,
                "sampler": cfg.SamplerConfig}
    sections.update({f"task.{name}": cls for name, cls in cfg.task_sections().items()})
    tasks = cfg.REGISTRY["task.name"].entries()
    assert set(cfg.task_sections()) == set(tasks)  # one knob section per task, named as the task
    for path, entries in cfg.all_entries().items():
        fields = _fields(sections[path])
        used = set()
        for label, fn, reg in entries:
            every = cfg.keywords(fn)
            hyper = cfg.hyperparameters(fn, reg)
            missing = set(hyper) - fields
            assert not missing, f"{label}: keywords {sorted(missing)} have no field in {path}"
            outside = set(every) - set(hyper)  # data, bound from elsewhere, or common to the section
            allowed = set(reg.data) | set(reg.elsewhere) if reg else set()
            assert outside <= allowed | set(cfg.LOOP_KNOBS.get(path.split(".")[0], ())), (label, outside)
            used |= set(hyper)
        names = {key.split(".", 1)[1] for key in cfg.REGISTRY if key.startswith(path + ".")
                 and cfg.REGISTRY[key].section == path}
        loop = set(cfg.LOOP_KNOBS.get(path, ()))
        assert not loop & used, f"{path}: {sorted(loop & used)} are both loop knobs and entry keywords"
        unused = fields - used - names - loop
        assert not unused, f"{path}: fields {sorted(unused)} are no entry's keyword, name or loop knob"
    for cls in tasks.values():  # the common task fields are keywords of every task (train_size wraps it instead)
        assert set(cfg.LOOP_KNOBS["task"]) - {"train_size"} <= set(cfg.keywords(cls))
    assert _fields(cfg.TaskConfig) == {"name"} | set(cfg.LOOP_KNOBS["task"])
    for name, key in (("group_size", "algo.objective"), ("tokenizer", "task.name"), ("seed", "task.name")):
        assert name in cfg.REGISTRY[key].elsewhere and name in cfg.ELSEWHERE


def test_every_field_has_a_docstring():
    def walk(cls):
        docs, hints = field_docs(cls), typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            assert docs.get(f.name) or cfg.section_type(hints[f.name]), f"{cls.__name__}.{f.name} has no docstring"
            if cfg.section_type(hints[f.name]):
                walk(cfg.section_type(hints[f.name]))

    walk(cfg.Config)


def test_docs_config_md_is_current():
    committed = (ROOT / "docs" / "config.md").read_text()
    assert committed == markdown(), "regenerate: python -m rlvr.config --markdown > docs/config.md"


# ---------------------------------------------------------------------------- names from the registries

@pytest.mark.parametrize("override, message", [
    ("algo.objective=x", "algo.objective: unknown objective 'x'; valid: bgpo, cispo, clip_cov, dipo, dppo_kl, "
                         "dppo_tv, dro, gdsd, gmpo, gspo, kl_cov, nft, ppo_clip, reinforce, reverse_kl_distill, "
                         "sapo, shiq, wd1"),
    ("algo.advantage=x", "algo.advantage: unknown advantage 'x'; valid: dmpo, dr_grpo, gae,"),
    ("algo.aggregation=x", "algo.aggregation: unknown aggregation 'x'; valid: seq_mean_token_mean,"),
    ("algo.kl_estimator=x", "algo.kl_estimator: unknown KL estimator 'x'; valid: abs, forward_kl,"),
    ("estimator.name=x", "estimator.name: unknown likelihood estimator 'x'; valid: ar_order, bgpo,"),
    ("estimator.bound=x", "estimator.bound: unknown SPG bound 'x'; valid: elbo, eubo, mixture"),
    ("task.name=x", "task.name: unknown task 'x'; valid: agent_calculator, agent_countdown_python, agent_guess, "
                    "agent_lookup, arithmetic, code_file, count_shapes, countdown, image_qa, math_file, sudoku4"),
    ("rollout.remasking=x", "rollout.remasking: unknown remasking 'x'; valid: entropy, low_confidence, margin, random"),
    ("rollout.window=x", "rollout.window: unknown window 'x'; valid: eos, full"),
    ("algo.correction_mode=x", "algo.correction_mode: unknown correction mode 'x'; valid: mask, truncate"),
    ("task.countdown.sampling=x", "task.countdown.sampling: unknown sampling 'x'; valid: draws, keys"),
])
def test_an_unknown_name_fails_at_rlvr_config(capsys, override, message):
    assert message in _error(capsys, ["config", override])


@pytest.mark.parametrize("overrides, message", [
    (["task.num_count=4"], "unknown config key 'task.num_count'; did you mean 'task.countdown.num_count'?"),
    (["algo.mc_samples=4"], "unknown config key 'algo.mc_samples'"),
    (["task.countdown.path=x"], "unknown config key 'task.countdown.path'; did you mean 'task.math_file.path'?"),
    (["task.name=sudoku4", "task.countdown.num_count=4"],
     "task.countdown: knobs of task 'countdown', but task.name is 'sudoku4'; "
     "use task.sudoku4.* or set task.name=countdown"),
    (["task.name=math_file"], "task.math_file.path: math_file needs it; set task.math_file.path"),
    (["model.kind=diffusion", "estimator.name=elbo_mc", "estimator.n=0"], "estimator.n: must be >= 1"),
])
def test_bad_task_and_estimator_options_are_one_line_errors(capsys, overrides, message):
    assert message in _error(capsys, ["config", *overrides])
