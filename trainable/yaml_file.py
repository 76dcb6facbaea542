"""Reading YAML files written by people: syntax errors become ConfigErrors with a line number.

A space file may come from anywhere, so reading one is bounded: the file's size, its nesting
depth, its number of aliases and how far they expand. Anything past a limit, any byte that is
not UTF-8 and any value PyYAML cannot build is a ConfigError naming the file, never a traceback,
a hang or a machine out of memory. Only plain YAML types are built (SafeLoader: no !!python/ tags).
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import yaml

from trainable.errors import ConfigError, problem

MAX_FILE_BYTES = 1024 * 1024  # a space or config file is a few kB
MAX_VALUE_CHARS = 64 * 1024  # one command-line value
MAX_DEPTH = 50  # nodes on the way from the top mapping down to a value, aliases followed
MAX_ALIASES = 100  # *name references in one document
MAX_ALIAS_NODES = 10_000  # nodes that aliases add when every alias is written out in full


class LimitError(yaml.MarkedYAMLError):
    """A document past one of the limits above (a YAMLError, so it reads like a syntax error)."""

    def __init__(self, problem: str, mark=None):
        super().__init__(problem=problem, problem_mark=mark)


class DuplicateKey(LimitError):
    """A key written twice in one mapping (a LimitError: a command-line value with one is refused,
    not read as plain text)."""


class Loader(yaml.SafeLoader):
    """SafeLoader that also reads 1e-3 as a number (YAML 1.2 does; PyYAML's 1.1 rules need a dot).

    It also enforces MAX_DEPTH, MAX_ALIASES and MAX_ALIAS_NODES while composing, before any
    Python object is built, and turns a value Python cannot build (2020-13-45, an integer of
    5000 digits) into a ConstructorError with the value's line and column.
    """

    def __init__(self, stream: Any) -> None:
        super().__init__(stream)
        self._depth = 0
        self._aliases: list[tuple[str, Any, yaml.Node]] = []  # (anchor, where, node it names)

    def compose_node(self, parent, index):
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            if len(self._aliases) >= MAX_ALIASES:
                raise LimitError(f"more than {MAX_ALIASES} aliases (*name) in one document", event.start_mark)
            node = super().compose_node(parent, index)
            self._aliases.append((event.anchor, event.start_mark, node))
            return node
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                raise LimitError(f"nested deeper than {MAX_DEPTH} levels", self.peek_event().start_mark)
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def compose_document(self):
        node = super().compose_document()
        if self._aliases:
            _check_aliases(node, self._aliases)
        self._aliases = []
        return node

    def compose_mapping_node(self, anchor: str | None) -> yaml.MappingNode:
        """A key written twice in one mapping is an error: PyYAML would keep the last one silently.

        Checked as the mapping is composed, as written: a merge (<<: *name) flattens keys into
        mappings later, and a merged key may be overridden, as YAML means it to be.
        """
        node = super().compose_mapping_node(anchor)
        seen: dict[Any, Any] = {}
        for key_node, _ in node.value:
            if not isinstance(key_node, yaml.ScalarNode) or key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node)
            if key in seen:
                raise DuplicateKey(f"the key {key!r} is written twice in one mapping (first on line "
                                   f"{seen[key].line + 1}); only one can hold", key_node.start_mark)
            seen[key] = key_node.start_mark
        return node

    def construct_object(self, node, deep=False):
        try:
            return super().construct_object(node, deep=deep)
        except (ValueError, OverflowError) as error:
            raise yaml.constructor.ConstructorError(
                None, None, f"cannot read this value: {error}", node.start_mark) from None


class Dumper(yaml.SafeDumper):
    """SafeDumper that quotes every string Loader would read as something else.

    PyYAML's dumper quotes a string only where its own (YAML 1.1) rules would read it as another
    type, so the trial id 11755e63 went out bare and came back through Loader as 1.1755e+67.
    Giving the dumper Loader's float rule makes what one writes the other reads back the same.
    """


FLOAT = re.compile(r"""^[-+]?(?:[0-9][0-9_]*\.[0-9_]*(?:[eE][-+]?[0-9]+)?|\.[0-9_]+(?:[eE][-+]?[0-9]+)?
               |[0-9][0-9_]*[eE][-+]?[0-9]+|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$""", re.X)
for _kind in (Loader, Dumper):
    _kind.add_implicit_resolver("tag:yaml.org,2002:float", FLOAT, list("-+0123456789."))


def dump_yaml(data: Any) -> str:
    """`data` as YAML text, keys in their order, that read_yaml_mapping reads back unchanged."""
    return yaml.dump(data, Dumper=Dumper, sort_keys=False)


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.SequenceNode):
        return node.value
    if isinstance(node, yaml.MappingNode):
        return [n for pair in node.value for n in pair]
    return []


def _check_aliases(root: yaml.Node, aliases: list[tuple[str, Any, yaml.Node]]) -> None:
    """Refuse a document whose aliases loop, nest past MAX_DEPTH or add over MAX_ALIAS_NODES nodes.

    An alias shares its node, so composing a "billion laughs" document is cheap; writing it out
    (a message, best.yaml, a walk over the values) is not. Sizes are counted with every alias
    written out in full, over the node graph (each node once, no recursion).
    """
    cap = 1 << 62
    size: dict[int, int] = {}  # id(node) -> nodes in its subtree, aliases written out
    height: dict[int, int] = {}  # id(node) -> levels in its subtree, aliases followed
    on_path: set[int] = set()
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, finished = stack.pop()
        key = id(node)
        if finished:
            children = _children(node)
            size[key] = min(cap, 1 + sum(size[id(c)] for c in children))
            height[key] = 1 + max((height[id(c)] for c in children), default=0)
            on_path.discard(key)
            continue
        if key in size:
            continue
        if key in on_path:  # reached again while its own subtree is being walked
            anchor, where, _ = next((a for a in aliases if a[2] is node), ("?", node.start_mark, node))
            raise LimitError(f"the alias *{anchor} refers to a node that contains it", where)
        on_path.add(key)
        stack.append((node, True))
        stack.extend((c, False) for c in _children(node) if id(c) not in size)
    added = size[id(root)] - len(size)
    anchor, where, node = max(aliases, key=lambda a: size[id(a[2])])
    if added > MAX_ALIAS_NODES:
        raise LimitError(f"aliases expand to {added} more nodes, at most {MAX_ALIAS_NODES} are allowed "
                         f"(*{anchor} alone is {size[id(node)]} nodes)", where)
    if height[id(root)] > MAX_DEPTH:
        deepest = max(aliases, key=lambda a: height[id(a[2])])
        raise LimitError(f"nested deeper than {MAX_DEPTH} levels once aliases are followed "
                         f"(*{deepest[0]} is {height[id(deepest[2])]} levels deep)", deepest[1])


def _where(error: yaml.YAMLError, text: str) -> str:
    mark = getattr(error, "problem_mark", None)
    if mark is not None:
        return f"line {mark.line + 1}, column {mark.column + 1}"
    position = getattr(error, "position", None)  # a ReaderError: an offset into the text
    if isinstance(position, int) and 0 <= position <= len(text):
        line = text.count("\n", 0, position) + 1
        return f"line {line}, column {position - (text.rfind(chr(10), 0, position) + 1) + 1}"
    return "somewhere"


def _reason(error: yaml.YAMLError) -> str:
    if isinstance(error, yaml.reader.ReaderError):
        character = error.character
        shown = f"#x{character:04x}" if isinstance(character, int) else repr(character)
        return f"unacceptable character {shown}: {error.reason}"
    reason = getattr(error, "problem", None) or str(error)
    context = getattr(error, "context", None)
    return f"{reason} ({context})" if context and isinstance(error, yaml.constructor.ConstructorError) else reason


def _load(text: str) -> Any:
    """Parse one document with Loader; raises yaml.YAMLError (LimitError past a limit)."""
    try:
        return yaml.load(text, Loader=Loader)
    except RecursionError:  # not expected under MAX_DEPTH; never a traceback all the same
        raise LimitError(f"nested too deeply to read (limit {MAX_DEPTH} levels)") from None


def _read_bytes(path: Path) -> bytes:
    try:
        with open(path, "rb") as stream:
            data = stream.read(MAX_FILE_BYTES + 1)
            if len(data) > MAX_FILE_BYTES:
                try:
                    size = os.fstat(stream.fileno()).st_size
                except OSError:
                    size = 0
                got = f"{size} bytes" if size > MAX_FILE_BYTES else f"more than {MAX_FILE_BYTES} bytes"
                raise ConfigError([f"{path}: must be at most {MAX_FILE_BYTES} bytes (1 MiB), got {got}"])
    except OSError as error:
        raise ConfigError([problem(str(path), "cannot be read", error.strerror or str(error))]) from None
    return data


def _decode(path: Path, data: bytes) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as error:
        line = data.count(b"\n", 0, error.start) + 1
        raise ConfigError([f"{path}: must be UTF-8 text, got byte 0x{data[error.start]:02x} at byte offset "
                           f"{error.start} (line {line})"]) from None


def _read_uri(uri: str) -> bytes:
    """A file on an object store (s3://bucket/run/best.yaml, an endpoint in its query as pyarrow takes it)."""
    import pyarrow.fs as pafs

    try:
        fs, path = pafs.FileSystem.from_uri(uri)
        with fs.open_input_stream(path) as stream:
            data = stream.read(MAX_FILE_BYTES + 1)
    except (OSError, ValueError) as error:  # pyarrow's ArrowInvalid is a ValueError
        raise ConfigError([problem(uri, "cannot be read", str(error).splitlines()[0][:300])]) from None
    if len(data) > MAX_FILE_BYTES:
        raise ConfigError([f"{uri}: must be at most {MAX_FILE_BYTES} bytes (1 MiB), got more"])
    return data


def read_yaml_mapping(path: str | Path) -> dict[str, Any]:
    """The top-level mapping of a YAML file (an empty file is an empty mapping); a URI reads through pyarrow."""
    if "://" in str(path):
        uri = str(path)
        text = _decode(Path(uri.split("?", 1)[0]), _read_uri(uri))
        path = uri  # named as given in messages
    else:
        path = Path(path)
        text = _decode(path, _read_bytes(path))
    try:
        data = _load(text)
    except yaml.YAMLError as error:
        raise ConfigError([f"{path}: invalid YAML at {_where(error, text)}: {_reason(error)}"]) from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError([problem(str(path), "must hold a mapping of keys to values", type(data).__name__)])
    return data


def parse_value(text: str) -> Any:
    """A command-line value read as YAML: `0.1`, `null`, `[256, 128]`, `true`, `sgd`.

    Text that is not valid YAML stays a string; text past a limit is a ConfigError.
    """
    if len(text) > MAX_VALUE_CHARS:
        raise ConfigError([problem("command-line value", f"must be at most {MAX_VALUE_CHARS} characters", text)])
    try:
        return _load(text)
    except LimitError as error:
        raise ConfigError([problem("command-line value", f"invalid YAML at {_where(error, text)}: "
                                   f"{_reason(error)}", text)]) from None
    except yaml.YAMLError:
        return text


def flag_value(text: str) -> Any:
    """parse_value for argparse `type=`: its own message, not argparse's 'invalid value'."""
    import argparse

    try:
        return parse_value(text)
    except ConfigError as error:
        raise argparse.ArgumentTypeError("; ".join(error.problems)) from None
