"""YAML loading that remembers where every value came from, so errors can name `file:line: field.path`."""

from __future__ import annotations

from pathlib import Path
from typing import Any, NoReturn

import yaml

from labctl.core.errors import InputError

__all__ = [  # the public surface (docs/architecture.md, "Public surface"); the rest is internal
    "Loc",
    "SourcedYaml",
    "format_loc",
    "load_yaml",
    "pydantic_error_line",
]

Loc = tuple[str | int, ...]


# Limits on what a configuration file may make the parser build. Real inventories are a few hundred nodes
# deep-free documents; these stop hostile ones (alias bombs, deep nesting) before they cost time or memory.
MAX_NODES = 200_000  # after alias expansion: a 512-port lab with every fiber listed is ~10k
MAX_DEPTH = 64
MAX_INT_DIGITS = 40  # far beyond any physical count; Python itself refuses >4300 with a traceback
MAX_FILE_BYTES = 8 * 1024 * 1024  # a 576-port inventory with every fiber is ~0.2 MB; refused before reading

# libyaml's parser where PyYAML was built with it (every wheel is): the same events, marks and errors as
# the pure-Python one, ~20x faster, so a hostile file is refused in a fraction of a second, not seconds.
_SafeBase: type[yaml.SafeLoader] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class _UniqueKeyLoader(_SafeBase):  # type: ignore[valid-type,misc]
    """SafeLoader that refuses duplicate mapping keys (PyYAML silently keeps the last one), keys that are
    not plain values, and integers no field could hold."""


def _construct_mapping(
    loader: _UniqueKeyLoader, node: yaml.MappingNode, deep: bool = False
) -> dict[Any, Any]:
    loader.flatten_mapping(node)  # `<<: *defaults` merges, as SafeLoader does
    seen: set[Any] = set()
    for key_node, _ in node.value:
        if not isinstance(key_node, yaml.ScalarNode):
            raise yaml.constructor.ConstructorError(
                None, None, "a mapping key must be a plain value, not a list or mapping", key_node.start_mark
            )
        key = loader.construct_object(key_node, deep=deep)
        if key in seen:
            raise yaml.constructor.ConstructorError(None, None, f"duplicate key {key!r}", key_node.start_mark)
        seen.add(key)
    return dict(loader.construct_pairs(node, deep=deep))


def _construct_int(loader: _UniqueKeyLoader, node: yaml.ScalarNode) -> int:
    text = str(node.value)
    digits = len(text) if len(text) <= MAX_INT_DIGITS else sum(c.isalnum() for c in text)
    if digits > MAX_INT_DIGITS:
        raise yaml.constructor.ConstructorError(
            None, None, f"integer of {digits} digits is too large for any field", node.start_mark
        )
    value: int = loader.construct_yaml_int(node)
    return value


_UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)
_UniqueKeyLoader.add_constructor("tag:yaml.org,2002:int", _construct_int)


def _refuse(problem: str, mark: Any) -> NoReturn:
    raise yaml.constructor.ConstructorError(None, None, problem, mark)


def _check_shape(text: str) -> None:
    """Walk the event stream (PyYAML's parser is not recursive; its composer and our indexer are) and refuse
    nesting deeper than MAX_DEPTH, an alias to a node that contains it, or more than MAX_NODES nodes once
    aliases are expanded. Sizes are computed per anchor as its node closes, so an alias bomb costs one pass
    over its text, not its expansion."""
    anchor_size: dict[str, int] = {}
    open_anchors: set[str] = set()
    stack: list[tuple[str | None, int]] = []  # (anchor, nodes so far) per open collection
    total = 0

    def add(n: int, mark: Any) -> None:
        nonlocal total
        if stack:
            anchor, size = stack[-1]
            stack[-1] = (anchor, size + n)
        else:
            total += n
        if total + sum(size for _, size in stack) > MAX_NODES:
            _refuse(f"expands to more than {MAX_NODES} values (an alias bomb?)", mark)

    for event in yaml.parse(text, Loader=_SafeBase):
        if isinstance(event, yaml.ScalarEvent):
            if event.anchor is not None:
                anchor_size[event.anchor] = 1
            add(1, event.start_mark)
        elif isinstance(event, yaml.AliasEvent):
            if event.anchor in open_anchors:
                _refuse(f"alias *{event.anchor} refers to a node that contains it", event.start_mark)
            add(anchor_size.get(str(event.anchor), 1), event.start_mark)
        elif isinstance(event, yaml.CollectionStartEvent):
            if len(stack) >= MAX_DEPTH:
                _refuse(f"nested more than {MAX_DEPTH} levels deep", event.start_mark)
            if event.anchor is not None:
                open_anchors.add(event.anchor)
            stack.append((event.anchor, 1))
        elif isinstance(event, yaml.CollectionEndEvent):
            anchor, size = stack.pop()
            if anchor is not None:
                open_anchors.discard(anchor)
                anchor_size[anchor] = size
            add(size, event.start_mark)


class SourcedYaml:
    """Parsed YAML data plus a map from field path to 1-based line number."""

    def __init__(self, path: Path, data: Any, lines: dict[Loc, int]):
        self.path = path
        self.data = data
        self._lines = lines

    def where(self, loc: Loc) -> str:
        """`file:line` for the deepest prefix of `loc` that exists in the file."""
        for n in range(len(loc), -1, -1):
            line = self._lines.get(tuple(loc[:n]))
            if line is not None:
                return f"{self.path}:{line}"
        return str(self.path)


def format_loc(loc: Loc) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out or "(top level)"


def _index_lines(node: yaml.Node, loc: Loc, lines: dict[Loc, int]) -> None:
    lines[loc] = node.start_mark.line + 1
    if isinstance(node, yaml.MappingNode):
        for key_node, value_node in node.value:
            key = key_node.value
            _index_lines(value_node, (*loc, key), lines)
            lines[(*loc, key)] = key_node.start_mark.line + 1
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            _index_lines(item, (*loc, i), lines)


def text_line_of(path: Path, offset: int) -> str:
    """`:N` for the line holding byte `offset` of a file, or nothing if it cannot be read again."""
    try:
        newlines = path.read_bytes()[:offset].count(b"\n")
    except OSError:
        return ""
    return f":{newlines + 1}"


def load_yaml(path: Path, what: str) -> SourcedYaml:
    """Read a YAML file; any I/O or syntax problem becomes one InputError line with file and line."""
    try:
        size = path.stat().st_size
        if size > MAX_FILE_BYTES and path.is_file():
            limit = MAX_FILE_BYTES / 1e6
            raise InputError(
                f"{path}: {size / 1e6:.1f} MB is too large to be the {what} (at most {limit:.1f} MB)"
            )
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise InputError(f"{path}: {what} not found") from None
    except IsADirectoryError:
        raise InputError(f"{path}: is a directory, expected the {what}") from None
    except OSError as e:
        raise InputError(f"{path}: cannot read {what}: {e.strerror}") from None
    except UnicodeDecodeError as e:
        line = text_line_of(path, e.start)
        raise InputError(f"{path}{line}: not a UTF-8 text file (byte {e.start}: {e.reason})") from None
    try:
        _check_shape(text)
        loader = _UniqueKeyLoader(text)
        try:
            node = loader.get_single_node()
            data = loader.construct_document(node) if node is not None else None
        finally:
            loader.dispose()
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        line = f":{mark.line + 1}" if mark is not None else ""
        raise InputError(f"{path}{line}: invalid YAML: {e.problem or e.context}") from None
    except yaml.reader.ReaderError as e:  # a control character such as NUL: name its line, one line only
        line = f":{text[: e.position].count(chr(10)) + 1}"
        char = f"U+{e.character:04X}" if isinstance(e.character, int) else repr(e.character)
        raise InputError(
            f"{path}{line}: invalid YAML: character {char} is not allowed in YAML text"
        ) from None
    except yaml.YAMLError as e:
        raise InputError(f"{path}: invalid YAML: {str(e).splitlines()[0]}") from None
    lines: dict[Loc, int] = {}
    if node is not None:
        _index_lines(node, (), lines)
    if not isinstance(data, dict):
        raise InputError(f"{path}: {what} must be a YAML mapping at the top level")
    return SourcedYaml(path, data, lines)


def _without_union_tags(data: Any, loc: Loc) -> Loc:
    """A discriminated union puts the chosen tag into an error's location (`switches.ocs1.sim.size`): drop
    such elements, recognised as a key the data does not have whose name is a value of the mapping."""
    out: list[str | int] = []
    node = data
    for part in loc:
        if isinstance(node, dict) and isinstance(part, str) and part not in node and part in node.values():
            continue
        out.append(part)
        try:
            node = node[part]
        except (KeyError, IndexError, TypeError):
            node = None
    return tuple(out)


def pydantic_error_line(src: SourcedYaml, exc: Any) -> str:
    """First error of a pydantic ValidationError as `file:line: field.path: message`."""
    errors = exc.errors(include_url=False)
    # A typo'd key (`ifnam:`) also makes the real one "missing": name the unknown key first, it is the cause.
    err = min(errors, key=lambda e: e["type"] != "extra_forbidden")
    loc = tuple(p for p in err["loc"] if not (isinstance(p, str) and p.startswith("function-")))
    loc = _without_union_tags(src.data, loc)
    msg = err["msg"]
    ctx = err.get("ctx") or {}
    if err["type"] == "extra_forbidden":
        msg = "unknown field"
    elif err["type"] == "missing":
        msg = "required field is missing"
    elif err["type"] == "union_tag_invalid":  # e.g. a switch `driver` nobody registered
        field = str(ctx.get("discriminator", "")).strip("'")
        loc = (*loc, field)
        known = str(ctx.get("expected_tags", "")).replace("'", "")
        msg = f"unknown {field} {ctx.get('tag')!r} (known: {known})"
    elif err["type"] == "union_tag_not_found":
        loc = (*loc, str(ctx.get("discriminator", "")).strip("'"))
        msg = "required field is missing"
    msg = msg.removeprefix("Value error, ")
    more = len(exc.errors()) - 1
    tail = f" (and {more} more error{'s' if more > 1 else ''})" if more else ""
    return f"{src.where(loc)}: {format_loc(loc)}: {msg}{tail}"
