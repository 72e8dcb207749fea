"""Binding a registry entry's keywords to config fields, and the table that shows which field fed
which keyword (`rlvr config --explain`).

One function, `choices`, decides for every keyword of an entry which field feeds it and with
what value; `bind` binds what it returns and `explain` prints it, so the two cannot disagree.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from rlvr.config.registries import (
    ELSEWHERE,
    REGISTRY,
    Registry,
    chosen_entries,
    hyperparameters,
    keywords,
    section_values,
)
from rlvr.config.schema import Config

ENTRY_DEFAULT = "(entry default)"
"""The field of a keyword whose section field is null: the entry keeps its own default."""
DATA = "(data)"
"""The field of a keyword the registry passes at call time (`old_logp`, `num_tokens`)."""

NONE = "(none)"
"""The keyword of the one row of an entry that takes no keywords (`reinforce`, `dr_grpo`)."""

FEEDS = {"group_size": "rollout.group_size", "norm_length": "algo.norm_length", "seed": "seed",
         "heldout_size": "task.heldout_size"}
"""The config field behind each value a builder passes from elsewhere (`bind(..., group_size=)`)."""


def choices(entry: Callable, section, registry: Registry | None = None, prefix: str = "",
            **elsewhere) -> Iterator[tuple[str, str, Any]]:
    """(keyword, field, value) for every keyword-only parameter of `entry`, in signature order.
    A hyperparameter is fed by the field of its name in `section` (`prefix` names the section,
    `algo.`); a keyword in `elsewhere` by that value (its field from `FEEDS`). `value` is None
    where nothing is bound: a null field (`ENTRY_DEFAULT`), a data keyword (`DATA`), or one the
    builder passes itself (the `ELSEWHERE` text in parentheses)."""
    hyper = hyperparameters(entry, registry)
    for keyword in keywords(entry):
        if keyword in elsewhere:
            yield keyword, FEEDS.get(keyword, f"({ELSEWHERE.get(keyword, 'the builder')})"), elsewhere[keyword]
        elif keyword in hyper:
            value = getattr(section, keyword)
            yield keyword, f"{prefix}{keyword}" if value is not None else ENTRY_DEFAULT, value
        elif registry is not None and keyword in registry.data:
            yield keyword, DATA, None
        else:
            yield keyword, f"({ELSEWHERE.get(keyword, 'the builder')})", None


def bind(entry: Callable, section, registry: Registry | None = None, **elsewhere) -> Callable:
    """`entry` with its hyperparameters bound once from the fields of the same names in `section`
    (`registry` says which of its keywords are data, passed at call time); a null field keeps the
    entry's own default. `elsewhere`: values from other sections (`group_size=`), bound where the
    entry takes them."""
    bound = {k: v for k, _, v in choices(entry, section, registry, **elsewhere) if v is not None}
    return functools.partial(entry, **bound)


@dataclass(frozen=True)
class Binding:
    """One keyword of a chosen entry: the field that feeds it, its value and who set that value."""

    key: str
    """The config field that names the entry (`algo.objective`)."""
    name: str
    """The entry's name (`ppo_clip`; `gae_returns`, `importance_correction` for those functions)."""
    keyword: str
    field: str
    """`algo.clip_high`, `rollout.group_size`, `(data)`, `(entry default)`, ..."""
    value: Any
    """What the entry gets; None for data and builder-passed keywords."""
    source: str
    """`entry default`, `config default`, `recipe <file>`, `override <key=value>`; `-` where no field feeds it."""


def _rows(key: str, name: str, entry: Callable, section, registry: Registry | None, prefix: str,
          sources: Mapping[str, str], **elsewhere) -> list[Binding]:
    defaults = keywords(entry)
    rows = []
    for keyword, field, value in choices(entry, section, registry, prefix, **elsewhere):
        if field == ENTRY_DEFAULT:
            value, source = defaults[keyword], "entry default"
        else:
            source = sources.get(field, "-")
        rows.append(Binding(key, name, keyword, field, value, source))
    return rows or [Binding(key, name, NONE, "-", None, "-")]  # chosen, with nothing to bind


EXPLAIN_ORDER = ("algo.objective", "algo.advantage", "algo.aggregation", "sampler.name", "algo.kl_estimator",
                 "estimator.name", "expert.objective", "algo.rollout_correction", "task.name")
"""The order `rlvr config --explain` lists the chosen entries in: the loss first, the task last."""


def explain(config: Config, sources: Mapping[str, str] = {}) -> list[Binding]:
    """One row per keyword of every entry this config uses (`chosen_entries`, the list the builder
    binds from, conditions included), bound as the builder binds it. `sources`: dotted field -> who
    set it (`load_with_sources`)."""
    rows = []
    for choice in sorted(chosen_entries(config), key=lambda c: EXPLAIN_ORDER.index(c.key)):
        rows += _rows(choice.key, choice.name, choice.entry, section_values(config, choice), choice.registry,
                      f"{choice.section}.", sources, **choice.elsewhere)
    return rows


def bound(config: Config, key: str) -> Callable | None:
    """The entry chosen by the config field `key` (`algo.objective`), bound as `explain` shows it;
    None where this config does not use one (`algo.kl_estimator` with `algo.kl_coef=0`). The
    companion of an entry (`gae_returns`) is `companion_bound`."""
    for choice in chosen_entries(config):
        if choice.key == key and (choice.registry is not None or key not in REGISTRY):
            return bind(choice.entry, section_values(config, choice), choice.registry, **choice.elsewhere)
    return None


def companion_bound(config: Config, key: str) -> Callable | None:
    """The function that comes with the entry chosen by `key` (`gae`'s `gae_returns`), bound; None if none."""
    for choice in chosen_entries(config):
        if choice.key == key and choice.registry is None and key in REGISTRY:
            return bind(choice.entry, section_values(config, choice), None, **choice.elsewhere)
    return None


def _shown(row: Binding) -> str:
    value = row.value
    if row.keyword == NONE or row.field.startswith("(") and row.field != ENTRY_DEFAULT:  # data, builder, none
        return "-"
    if value is inspect.Parameter.empty:
        return "required"
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    return str(value) if isinstance(value, (int, float, str)) else repr(value)


def table(rows: list[Binding]) -> str:
    """The rows as aligned text: entry, keyword, field, value, source (one line each)."""
    header = ("entry", "keyword", "field", "value", "source")
    cells = [header] + [(f"{r.key}={r.name}", r.keyword, r.field, _shown(r), r.source) for r in rows]
    widths = [max(len(c[i]) for c in cells) for i in range(len(header) - 1)]
    return "".join("  ".join(c.ljust(w) for c, w in zip(line[:-1], widths)) + "  " + line[-1] + "\n"
                   for line in cells)
