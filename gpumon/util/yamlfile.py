"""Reading a YAML file written by hand, as a gate: every problem is a line, never an exception.

``read_yaml(path)`` returns the document (what ``yaml.safe_load`` returns for it) or raises
``YamlFileError`` whose ``problems`` say, with line and column, why the file cannot be used:

* it cannot be read, is not a regular file (a FIFO, a device), or is larger than ``MAX_FILE_BYTES``;
* it is not UTF-8 (a Latin-1 byte, a UTF-16 file);
* it is not valid YAML, or a value cannot be built (a date like ``2024-13-01``, ``!!int abc``);
* it nests deeper than ``MAX_DEPTH``, or its aliases expand to more than ``MAX_NODES`` values
  ("billion laughs"), or an alias refers to its own node (a structure that contains itself);
* a mapping gives the same key twice (``yaml.safe_load`` would keep the last one silently);
* an integer lies beyond ±``MAX_INT`` (no setting needs one; such numbers break ``float()``);
* a string holds a lone surrogate (``"\\ud800"``), which is not Unicode text.

When it accepts a document, the data is what PyYAML's safe loader returns for it (libyaml's parser
when PyYAML has it, as it does in its wheels; libyaml is a little more lenient, e.g. with a tab inside
a plain scalar). Every gpumon input goes through this one reader, so a document is read alike by
``check-config``, ``run`` and a reload.
``brief(value)`` shows a value in a problem line, cut to a few dozen characters.
"""

from __future__ import annotations

import re
import reprlib
from pathlib import Path
from typing import Any

import yaml
from yaml.constructor import ConstructorError
from yaml.nodes import MappingNode, Node, ScalarNode

from gpumon.util.boundedfile import FileReadError, read_regular_file

MAX_FILE_BYTES = 4 * 1024 * 1024
"""Largest file read (4 MiB); gpumon's configs and scenarios are a few KiB."""
MAX_DEPTH = 64
"""Deepest nesting of mappings and lists accepted; gpumon's own formats need fewer than 10 levels."""
MAX_NODES = 200_000
"""Most values a document may hold once its aliases are expanded."""
MAX_INT = 2**63
"""Integers must lie strictly between -MAX_INT and MAX_INT (a 64-bit signed range)."""

_MERGE_TAG = "tag:yaml.org,2002:merge"
_NON_PRINTABLE = re.compile("[^\x09\x0a\x0d\x20-\x7e\x85\xa0-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")
"""What YAML does not allow in a document (PyYAML's Reader.NON_PRINTABLE)."""

try:  # libyaml's parser: the same documents, ten times faster than the pure-Python one
    from yaml import CSafeLoader as _Base
except ImportError:  # pragma: no cover - PyYAML built without libyaml
    from yaml import SafeLoader as _Base  # type: ignore[assignment]


class YamlFileError(Exception):
    """The file cannot be used; ``problems`` lists every reason, one line each. ``document`` is the
    document as read despite them where it could be built (a key given twice: the last one kept; an
    integer out of range: 0), so that a caller can list the file's other problems too; else None."""

    def __init__(self, problems: list[str], document: Any = None) -> None:
        super().__init__("\n".join(problems))
        self.problems = problems
        self.document = document


def brief(value: Any, limit: int = 60) -> str:
    """``repr(value)`` cut to about ``limit`` characters, safe for any value (huge, nested, recursive)."""
    shown = reprlib.Repr()
    shown.maxstring = limit
    shown.maxother = limit
    shown.maxlevel = 3
    shown.maxlist = shown.maxtuple = shown.maxdict = shown.maxset = shown.maxfrozenset = 4
    try:
        text = shown.repr(value)
    except (ValueError, RecursionError, OverflowError):  # a str() of an int over 4300 digits
        text = f"<{type(value).__name__}>"
    return text if len(text) <= limit + 10 else text[:limit] + "..."


def read_yaml(path: str | Path, max_bytes: int = MAX_FILE_BYTES) -> Any:
    """The YAML document in the regular file ``path`` (None for an empty file), at most ``max_bytes``
    long; raises YamlFileError. A FIFO or a device is refused at once, never waited on."""
    where = str(path)
    try:
        data = read_regular_file(path, max_bytes)
    except FileReadError as exc:
        raise YamlFileError([f"{where}: {exc}"]) from None
    return parse_yaml(data, where)


def parse_yaml(data: bytes | str, where: str = "<text>") -> Any:
    """The YAML document in ``data`` (bytes must be UTF-8); raises YamlFileError."""
    text = decode_utf8(data, where) if isinstance(data, bytes) else data
    loader = None
    try:
        _check_shape(text)
        loader = _Loader(text)
        document = loader.get_single_data()
    except _ShapeError as exc:
        raise YamlFileError([f"{where}: {exc}"]) from None
    except yaml.YAMLError as exc:
        raise YamlFileError([f"{where}: {_describe(exc, text)}"]) from None
    except Exception as exc:  # a value built after its node (``!!set x``), or any other construction failure
        raise YamlFileError([f"{where}: not valid YAML: {type(exc).__name__}: {brief(str(exc), 120)}"]) from None
    finally:
        if loader is not None:
            loader.dispose()
    if loader.problems:
        raise YamlFileError([f"{where}: {p}" for p in loader.problems], document=document)
    return document


def decode_utf8(data: bytes, where: str) -> str:
    """``data`` as text; raises YamlFileError naming the first byte that is not UTF-8 and where it is."""
    if data.startswith((b"\xff\xfe", b"\xfe\xff")):
        raise YamlFileError([f"{where}: is UTF-16 or UTF-32 (it starts with a byte-order mark); save it as UTF-8"])
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        column = exc.start - (data.rfind(b"\n", 0, exc.start) + 1) + 1
        bad = sum(1 for _ in _bad_utf8_offsets(data))
        more = f" ({bad} such bytes in all)" if bad > 1 else ""
        raise YamlFileError(
            [
                f"{where}: line {line}, column {column}: byte 0x{data[exc.start]:02X} is not UTF-8{more}; "
                "save the file as UTF-8"
            ]
        ) from None


def _bad_utf8_offsets(data: bytes) -> Any:
    start = 0
    while start < len(data):
        try:
            data[start:].decode("utf-8")
            return
        except UnicodeDecodeError as exc:
            yield start + exc.start
            start += exc.end


def _at(event: Any) -> str:
    mark = event.start_mark
    return f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""


def _describe(exc: yaml.YAMLError, text: str) -> str:
    """One line for a YAML error: what and where (PyYAML's own text spans several lines)."""
    bad = _NON_PRINTABLE.search(text)
    if isinstance(exc, yaml.reader.ReaderError) and bad is not None:
        line = text.count("\n", 0, bad.start()) + 1
        column = bad.start() - (text.rfind("\n", 0, bad.start()) + 1) + 1
        return f"line {line}, column {column}: character U+{ord(bad.group()):04X} is not allowed in YAML"
    if isinstance(exc, yaml.MarkedYAMLError):
        what = "; ".join(p for p in (exc.context, exc.problem) if p) or "not valid"
        mark = exc.problem_mark or exc.context_mark
        at = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
        return " ".join(f"{at}not valid YAML: {what}".split())
    return " ".join(f"not valid YAML: {exc}".split())


class _ShapeError(yaml.YAMLError):
    """Too deep, too many values after alias expansion, or an alias inside its own node."""


def _check_shape(text: str) -> None:
    """Raise _ShapeError for a document nested deeper than MAX_DEPTH, one whose aliases expand to more
    than MAX_NODES values, or an alias inside its own node.

    Checked on the event stream, which the parser produces without recursion, before anything is
    composed (the composer recurses once per level: 100,000 levels would overflow the stack)."""
    depth = 0
    nodes = 0
    open_anchors: list[tuple[str | None, int]] = []
    sizes: dict[str, int] = {}
    try:
        for event in yaml.parse(text, Loader=_Base):
            depth, nodes = _check_event(event, depth, nodes, open_anchors, sizes)
    except yaml.MarkedYAMLError as exc:
        # libyaml (0.2.5 on) has its own limit of 1,000 levels, met by its scanner before the events
        if "nesting depth" in str(exc.problem) and exc.problem_mark is not None:
            mark = exc.problem_mark
            raise _ShapeError(
                f"line {mark.line + 1}, column {mark.column + 1}: nested more than {MAX_DEPTH} levels deep"
            ) from None
        raise


def _check_event(
    event: Any, depth: int, nodes: int, open_anchors: list[tuple[str | None, int]], sizes: dict[str, int]
) -> tuple[int, int]:
    """One event of _check_shape: the new depth and count of values; raises _ShapeError."""
    if isinstance(event, (yaml.MappingStartEvent, yaml.SequenceStartEvent)):
        depth += 1
        nodes += 1
        if depth > MAX_DEPTH:
            raise _ShapeError(f"{_at(event)}nested more than {MAX_DEPTH} levels deep")
        open_anchors.append((event.anchor, nodes))
    elif isinstance(event, (yaml.MappingEndEvent, yaml.SequenceEndEvent)):
        depth -= 1
        anchor, start = open_anchors.pop()
        if anchor is not None:
            sizes[anchor] = nodes - start + 1
    elif isinstance(event, yaml.ScalarEvent):
        nodes += 1
        if event.anchor is not None:
            sizes[event.anchor] = 1
    elif isinstance(event, yaml.AliasEvent):
        if any(event.anchor == anchor for anchor, _ in open_anchors):
            raise _ShapeError(f"{_at(event)}alias *{event.anchor} refers to the node that contains it")
        nodes += sizes.get(event.anchor or "", 1)
    if nodes > MAX_NODES:
        raise _ShapeError(f"{_at(event)}more than {MAX_NODES} values once aliases are expanded")
    return depth, nodes


class _Loader(_Base):
    """The safe loader (libyaml's when PyYAML has it) that turns every construction failure into a
    ConstructorError with a position, and notes (in ``problems``) duplicate keys, out-of-range
    integers and lone surrogates."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self.problems: list[str] = []

    def _note(self, node: Node, text: str) -> None:
        mark = node.start_mark
        self.problems.append(f"line {mark.line + 1}, column {mark.column + 1}: {text}")

    def construct_object(self, node: Node, deep: bool = False) -> Any:
        try:
            return super().construct_object(node, deep)
        except yaml.YAMLError:
            raise
        except (
            Exception
        ) as exc:  # a tag on a value it cannot read (``!!bool maybe``: KeyError, ``!!int ''``: IndexError)
            raise ConstructorError(
                None, None, f"cannot read {brief(getattr(node, 'value', ''), 40)} as {_tag_name(node)}", node.start_mark
            ) from exc

    def construct_mapping(self, node: MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _value in node.value:
            if key_node.tag == _MERGE_TAG or not isinstance(key_node, ScalarNode):
                continue
            key = self.construct_object(key_node)
            try:
                if key in seen:
                    self._note(key_node, f"key {brief(key)} is given twice in the same mapping")
                seen.add(key)
            except TypeError:
                continue
        return super().construct_mapping(node, deep)

    def construct_yaml_int(self, node: ScalarNode) -> int:
        try:
            value = super().construct_yaml_int(node)
        except ValueError:  # more than 4300 decimal digits: Python refuses to convert them
            if not str(node.value).lstrip("+-").replace("_", "").isdigit():
                raise
            value = MAX_INT
        if not -MAX_INT < value < MAX_INT:
            self._note(node, f"the integer {brief(node.value, 24)} is out of range (at most 2^63 either side of 0)")
            return 0
        return value

    def construct_yaml_str(self, node: ScalarNode) -> str:
        value = super().construct_yaml_str(node)
        if any("\ud800" <= c <= "\udfff" for c in value):
            self._note(node, f"the string {brief(value, 40)} holds a lone surrogate, which is not text")
        return value


def _tag_name(node: Node) -> str:
    return str(node.tag).rsplit(":", 1)[-1] or "a value"


_Loader.add_constructor("tag:yaml.org,2002:int", _Loader.construct_yaml_int)
_Loader.add_constructor("tag:yaml.org,2002:str", _Loader.construct_yaml_str)
