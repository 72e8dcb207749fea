"""docs/config.md, generated from the schema's field docstrings and the registries."""

from __future__ import annotations

import ast
import dataclasses
import inspect
import itertools
import sys
import textwrap
import typing
from pathlib import Path
from typing import Any

import yaml

import rlvr.config
from rlvr.config.load import load_config
from rlvr.config.ranges import range_of
from rlvr.config.registries import ELSEWHERE, REGISTRY, Entry, _get, all_entries, hyperparameters
from rlvr.config.schema import Config, section_type
from rlvr.config.trl_names import TRL_NAMES


def field_docs(cls: type) -> dict[str, str]:
    """Field name -> its attribute docstring (the string literal under the field), read with ast."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    body = tree.body[0].body
    docs = {}
    for node, after in itertools.pairwise(body):
        if (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and isinstance(after, ast.Expr)
                and isinstance(after.value, ast.Constant) and isinstance(after.value.value, str)):
            docs[node.target.id] = " ".join(after.value.value.split())
    for base in cls.__mro__[1:]:
        if dataclasses.is_dataclass(base):
            docs = {**field_docs(base), **docs}
    return docs


def _yaml(value: Any) -> str:
    if value is inspect.Parameter.empty:
        return "required"
    return yaml.safe_dump(value, default_flow_style=True).strip().removesuffix("...").strip()


def _section_rows(cls: type, path: str, entries: list[Entry]) -> list[str]:
    docs = field_docs(cls)
    declared: dict[str, dict[str, list[str]]] = {}  # field -> default -> entries declaring it
    for label, fn, reg in entries:
        for key, default in hyperparameters(fn, reg).items():
            declared.setdefault(key, {}).setdefault(_yaml(default), []).append(label)
    rows = ["| key | type | default | meaning |", "|---|---|---|---|"]
    for f in dataclasses.fields(cls):
        key = f"{path}.{f.name}" if path else f.name
        if section_type(typing.get_type_hints(cls)[f.name]) is not None:
            continue
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
        if default is None and f.name in declared and set(declared[f.name]) != {"null"}:
            shown = "; ".join(f"`{value}` ({', '.join(labels)})" for value, labels in declared[f.name].items())
            default_text = f"null → {shown}"
        else:
            default_text = f"`{_yaml(default)}`"
        meaning = docs.get(f.name, "")
        if (rule := range_of(f)) is not None:
            meaning += f" Range: {rule}."
        if key in REGISTRY:
            meaning += f" One of: {', '.join(f'`{n}`' for n in sorted(REGISTRY[key].entries()))}."
        cells = [f"`{key}`", f"`{f.type}`", default_text, meaning]
        rows.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return rows


def markdown() -> str:
    """docs/config.md: every section and field, its type, default and docstring, with the
    registries' allowed names and each entry's own default for its hyperparameters."""
    entries = all_entries()
    generated = ("Generated from the field docstrings of `src/rlvr/config/schema.py`, `task_schema.py`, "
                 "`method_schema.py` and `commands_schema.py` by "
                 "`python -m rlvr.config --markdown > docs/config.md` (a test checks that this file is current).")
    lines = ["# Configuration reference", "", generated, ""]
    lines += [" ".join(part.split()) + "\n" for part in rlvr.config.__doc__.split("\n\n")[1:]]
    lines += ["A default `null → v (entries)` is what a null field resolves to when one of those entries "
              "is chosen.", ""]

    def section(cls: type, path: str) -> None:
        doc = inspect.getdoc(cls) if cls.__doc__ and not cls.__doc__.startswith(cls.__name__ + "(") else ""
        lines.extend([f"## `{path}`" if path else "## Top level", ""] + ([" ".join(doc.split()), ""] if doc else []))
        lines.extend(_section_rows(cls, path, entries.get(path, [])) + [""])
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            sub = section_type(hints[f.name])
            if sub is not None:
                section(sub, f"{path}.{f.name}" if path else f.name)

    section(Config, "")
    elsewhere = ", ".join(f"`{k}` from {v}" for k, v in ELSEWHERE.items())
    lines.extend(["## Bound from elsewhere", "", f"Keywords the builder binds from other fields: {elsewhere}.", ""])
    return "\n".join(lines)


def trl_markdown() -> str:
    """The table of `docs/migrating-from-trl.md`: TRL name and default, rlvr field(s), note."""
    config = load_config()  # the defaults, resolved: a null field shows what the default methods take
    defaults = {key: _get(config, key) for t in TRL_NAMES.values() for key in t.fields()}
    rows = ["| TRL `GRPOConfig` | TRL default | rlvr | rlvr default | note |", "|---|---|---|---|---|"]
    for t in TRL_NAMES.values():
        if t.key:
            rlvr, rlvr_default = f"`{t.key}`", f"`{defaults[t.key]!r}`"
        elif t.choices:
            rlvr = "<br>".join(f"`{option!r}` → " + (", ".join(f"`{k}={v!r}`" for k, v in fields.items()) or "as is")
                               for option, fields in t.choices.items())
            rlvr_default = ", ".join(f"`{k}={defaults[k]!r}`" for k in t.fields())
        else:
            rlvr, rlvr_default = "—", "—"
        rows.append(f"| `{t.trl}` | `{t.trl_default!r}` | {rlvr} | {rlvr_default} | {t.note} |")
    return "\n".join(rows) + "\n"


TRL_BEGIN, TRL_END = "<!-- trl-names: begin -->", "<!-- trl-names: end -->"


def trl_page(page: str) -> str:
    """`page` (docs/migrating-from-trl.md) with the table between its markers regenerated."""
    head, _, rest = page.partition(TRL_BEGIN)
    _, _, tail = rest.partition(TRL_END)
    return f"{head}{TRL_BEGIN}\n{trl_markdown()}{TRL_END}{tail}"


def main(argv: list[str]) -> int:
    if len(argv) == 2 and argv[0] in ("--trl-page", "--verl-page"):  # regenerates the table in that page, in place
        from rlvr.config.from_verl import verl_page

        page = Path(argv[1])
        page.write_text((trl_page if argv[0] == "--trl-page" else verl_page)(page.read_text()))
        return 0
    if argv != ["--markdown"]:
        print("usage: python -m rlvr.config --markdown > docs/config.md\n"
              "       python -m rlvr.config --trl-page docs/migrating-from-trl.md", file=sys.stderr)
        return 2
    print(markdown(), end="")
    return 0
