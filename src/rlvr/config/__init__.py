"""The one source of truth for a run's settings: frozen dataclasses, a docstring under each field.

`load_config(recipe, overrides)` reads a YAML recipe, applies dotted command-line overrides
(`algo.clip_high=0.28 seed=3`), checks names, types and ranges, resolves defaults, and returns a
`Config`. Every mistake becomes one `ConfigError` line that names the field and the fix.
Components never see this object: `rlvr.builder.build` reads it once.

Registry entries (advantages, objectives, aggregations, KL estimators, likelihood estimators,
samplers, tasks) declare their hyperparameters as keyword-only parameters with their papers'
defaults, and each such keyword is a config field of the same name in the entry's section
(`algo`, `estimator`, `sampler`, `task.<name>`). A field left null takes the chosen entry's own default, so
`rlvr config algo.objective=gspo` shows GSPO's clip widths (3e-4 / 4e-4) and a run's
`config.yaml` records every value used. When two chosen entries declare one field with different
defaults, the config is rejected until that field is set (no precedence rule to remember).
Fields of entries that are not chosen stay null. Every name that picks a registry entry, and
every option with a fixed set of values, is checked against its registry on loading, so a typo
fails at `rlvr config` already. What an entry needs of the rest of the config (a diffusion model,
a teacher, no LoRA ...) it declares itself (`Requirement`), and `rlvr.config.checks` enforces it
whenever the config chooses the entry, with the cross-field rules by subject.

`rlvr config --explain recipes/dapo_countdown.yaml algo.clip_low=0.1` prints, instead of the
config, one row per keyword of every chosen entry (`chosen_entries`, the list the builder binds
from: objective, advantage, aggregation, KL
estimator when `algo.kl_coef > 0`, rollout correction when on, likelihood estimator, task,
expert objective): the field that feeds it (`algo.clip_high`; `rollout.group_size` for a value
the builder passes from another section; `(data)` for one the registry passes at call time;
`(entry default)` for a null field), its value, and what set that value (`entry default`,
`config default`, `recipe <file>`, `override <key=value>`). `load_with_sources` returns the
same sources from Python.
"""

from rlvr.config.load import (
    all_keys,
    data_files,
    derived_batch_numbers,
    dump_yaml,
    load_config,
    load_with_sources,
    parse_overrides,
    read_recipe,
    to_dict,
    validate,
)
from rlvr.config.registries import (
    ELSEWHERE,
    LOOP_KNOBS,
    REGISTRIES,
    REGISTRY,
    Registry,
    all_entries,
    chosen_entries,
    hyperparameters,
    keywords,
    resolve,
    task_sections,
)
from rlvr.config.schema import (
    AlgoConfig,
    CodeFileTaskConfig,
    Config,
    CountdownTaskConfig,
    EstimatorConfig,
    ExpertConfig,
    FileTaskConfig,
    LoraConfig,
    MathFileTaskConfig,
    ModelConfig,
    OptimConfig,
    RewardConfig,
    RolloutConfig,
    SamplerConfig,
    SFTConfig,
    Sudoku4TaskConfig,
    TaskConfig,
    TrainerConfig,
    section_type,
)

__all__ = [
    "ELSEWHERE", "LOOP_KNOBS", "REGISTRIES", "REGISTRY", "AlgoConfig", "CodeFileTaskConfig", "Config",
    "CountdownTaskConfig", "EstimatorConfig", "ExpertConfig", "FileTaskConfig", "LoraConfig", "MathFileTaskConfig",
    "ModelConfig", "OptimConfig",
    "Registry", "RewardConfig", "RolloutConfig", "SamplerConfig", "SFTConfig", "Sudoku4TaskConfig", "TaskConfig",
    "TrainerConfig",
    "all_entries", "all_keys", "chosen_entries", "data_files", "derived_batch_numbers", "dump_yaml", "hyperparameters",
    "keywords", "load_config", "load_with_sources", "parse_overrides", "read_recipe", "resolve", "section_type",
    "task_sections", "to_dict", "validate",
]
