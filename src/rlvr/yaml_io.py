"""YAML as rlvr reads it: recipes, overrides and other runs' config.yaml are input, not trusted.

Three rules on top of PyYAML's safe loader:

1. **Bounded.** A document over `MAX_BYTES`, or whose aliases expand to more than `MAX_VALUES`
   values, is refused before it is built: a few hundred bytes of nested aliases (`&a [*b, *b,
   ...]`, a "billion laughs") otherwise become gigabytes once copied, printed or written back.
   Aliases within the limit (`<<: *defaults`) keep working; a merge key that merges no mapping
   (`<<: 5`) or an alias no anchor names is one line saying so.
2. **YAML 1.2 scalars.** Plain `true`/`false`, `null`/`~`, decimal, `0o` and `0x` integers and
   decimal floats (`5e-5` included) are typed; everything else is a string. PyYAML's YAML 1.1
   rules would read `010` as 8, `1:30` as 90 (base 60) and `on`/`no` as booleans; those spellings
   are refused with a hint rather than read either way, since the file's author meant one of two
   things and the loader cannot tell which. Quoting any of them makes it a string.
3. **One key once.** A key given twice in one mapping is refused (the last would silently win).
"""

from __future__ import annotations

import re
from typing import Any

import yaml

from rlvr.errors import ConfigError

__all__ = ["MAX_BYTES", "MAX_VALUES", "load_yaml"]

MAX_BYTES = 1 << 20
"""A recipe is a few kilobytes, a run's config.yaml about five; data goes in data files."""
MAX_VALUES = 10_000
"""Values (scalars, lists, mappings) a document may hold once its aliases are expanded; a full
config has about 500."""

_SURPRISES = [  # (plain scalar YAML 1.1 reads differently from 1.2, what it would be, the fix)
    (re.compile(r"[-+]?0[0-9_]+"), "YAML 1.1 reads a leading zero as octal",
     "write the number without the leading zero (or 0o17 for octal), or quote it for text"),
    (re.compile(r"[-+]?[0-9][0-9_]*(:[0-5]?[0-9])+(\.[0-9_]*)?"), "YAML 1.1 reads it as base 60 (1:30 = 90)",
     "write the number itself, or quote it for text"),
    (re.compile(r"[-+]?(0b[01_]+|[0-9][0-9_]*_[0-9_]*(\.[0-9_]*)?)"), "YAML 1.1 reads it as a number, 1.2 as text",
     "write the digits without '_' (or 0x/0o), or quote it for text"),
    (re.compile(r"yes|Yes|YES|no|No|NO|on|On|ON|off|Off|OFF"), "YAML 1.1 reads it as a boolean, 1.2 as text",
     "write true or false, or quote it for text"),
]


class _Resolver12(yaml.resolver.Resolver):
    """The YAML 1.2 core schema's implicit types (PyYAML implements 1.1's)."""

    yaml_implicit_resolvers: dict = {}


for _tag, _pattern, _first in [
    ("bool", r"true|True|TRUE|false|False|FALSE", "tTfF"),
    ("int", r"[-+]?[0-9]+|0o[0-7]+|0x[0-9a-fA-F]+", "-+0123456789"),
    ("float", r"[-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?|[-+]?\.(inf|Inf|INF)|\.(nan|NaN|NAN)",
     "-+0123456789."),
    ("null", r"~|null|Null|NULL|", ["~", "n", "N", ""]),
    ("merge", r"<<", "<"),
]:
    _Resolver12.add_implicit_resolver(f"tag:yaml.org,2002:{_tag}", re.compile(f"^(?:{_pattern})$"), list(_first))


class _Constructor12(yaml.constructor.SafeConstructor):
    """1.2 integers: decimal with leading zeros refused before this runs, `0o` octal."""

    yaml_constructors = dict(yaml.constructor.SafeConstructor.yaml_constructors)

    def construct_yaml_int(self, node):
        text = self.construct_scalar(node)
        sign = -1 if text.startswith("-") else 1
        digits = text.lstrip("+-")
        base = 8 if digits.startswith("0o") else 16 if digits.startswith("0x") else 10
        return sign * int(digits[2:] if base != 10 else digits, base)

    def construct_mapping(self, node, deep=False):
        seen = set()
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":  # `<<: *defaults`: its keys may be overridden
                continue
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                raise _Refused(f"key '{_clip(key)}' given twice (line {key_node.start_mark.line + 1}); keep one")
            seen.add(key)
        return super().construct_mapping(node, deep)


_Constructor12.add_constructor("tag:yaml.org,2002:int", _Constructor12.construct_yaml_int)


class _Refused(Exception):
    """A document rlvr will not build; the message says why and what to write instead."""


class _Loader(yaml.reader.Reader, yaml.scanner.Scanner, yaml.parser.Parser, yaml.composer.Composer,
              _Constructor12, _Resolver12):
    def __init__(self, stream):
        yaml.reader.Reader.__init__(self, stream)
        yaml.scanner.Scanner.__init__(self)
        yaml.parser.Parser.__init__(self)
        yaml.composer.Composer.__init__(self)
        _Constructor12.__init__(self)
        _Resolver12.__init__(self)

    def get_single_node(self):
        node = super().get_single_node()
        if node is not None:
            _check(node)
        return node


def _check(root) -> None:
    """Refuse a node graph whose expansion exceeds MAX_VALUES, that refers to itself, or that holds
    a plain scalar YAML 1.1 and 1.2 read differently. Shared nodes are counted once per use but
    walked once (memoised), so a bomb costs as little to refuse as to parse."""
    sizes: dict[int, int] = {}
    open_nodes: set[int] = set()

    def size(node) -> int:
        if id(node) in sizes:
            return sizes[id(node)]
        if id(node) in open_nodes:
            raise _Refused(f"an alias at line {node.start_mark.line + 1} refers to a value that contains it; "
                           "write the values out")
        if isinstance(node, yaml.ScalarNode):
            _check_scalar(node)
            total = 1
        else:
            open_nodes.add(id(node))
            children = node.value if isinstance(node, yaml.SequenceNode) else [n for pair in node.value for n in pair]
            total = 1 + sum(size(child) for child in children)
            open_nodes.discard(id(node))
        if total > MAX_VALUES:
            raise _Refused(f"its aliases expand to more than {MAX_VALUES} values (line {node.start_mark.line + 1}); "
                           "write the values out instead of nesting aliases")
        sizes[id(node)] = total
        return total

    size(root)


def _check_scalar(node) -> None:
    if node.style is not None:  # quoted or a block scalar: text, read alike by both versions
        return
    for pattern, meaning, fix in _SURPRISES:
        if pattern.fullmatch(node.value):
            raise _Refused(f"'{_clip(node.value)}' at line {node.start_mark.line + 1} is ambiguous ({meaning}); {fix}")


def _clip(value: Any, width: int = 60) -> str:
    text = str(value)
    return text if len(text) <= width else text[: width - 3] + "..."


def load_yaml(text: str | bytes, what: str) -> Any:
    """`text` as YAML under the rules above. `what` names the source in errors (`recipe 'a.yaml'`,
    `override 'seed'`); every refusal and syntax error is one `ConfigError` line."""
    if len(text) > MAX_BYTES:
        raise ConfigError(f"{what} is {len(text)} bytes, over the {MAX_BYTES} a config may be; "
                          "put data in a data file, not in the config")
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError as err:
            raise ConfigError(f"{what} is not UTF-8 text (byte {err.start}); save it as UTF-8") from None
    loader = _Loader(text)
    try:
        return loader.get_single_data()
    except _Refused as err:
        raise ConfigError(f"{what}: {err}") from None
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark else ""
        problem = str(getattr(err, "problem", "") or "")
        if "for merging" in problem:  # `<<: 5`: merge keys are read, this one merges no mapping
            raise ConfigError(f"{what}: the merge key (<<){where} merges a {problem.rsplit(' ', 1)[-1]}; merge keys "
                              f"are supported and take an anchored mapping: `x-defaults: &d {{lr: 0.001}}` at the "
                              f"top, then `<<: *d` (or a list of such aliases) in a section") from None
        if problem.startswith("found undefined alias"):
            raise ConfigError(f"{what}: {problem}{where}; anchor the value first (`x-defaults: &NAME ...` above "
                              f"the `*NAME` that uses it)") from None
        raise ConfigError(f"{what} is not valid YAML{where}{f' ({problem})' if problem else ''}; fix its syntax") \
            from None
    finally:
        loader.dispose()
