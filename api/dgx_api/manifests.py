"""Reading YAML manifests the way kubectl reads them, with bounds no input can get past.

kubectl turns YAML into JSON (sigs.k8s.io/yaml over go-yaml v2) before anything sees it; PyYAML's
safe loader differs from that in ways users trip over and attackers use:

* **Alias bombs.** Nested anchors make a 2 KB file expand to gigabytes; PyYAML builds the whole
  expansion (as shared objects, cheap until something walks it: an error message, a CEL value,
  a JSON dump). Here the composed node graph is measured before anything is built: a document
  whose expansion exceeds :data:`MAX_DOCUMENT_BYTES` (the API server's largest request body) or
  nests deeper than :data:`MAX_DEPTH` is refused, and so is an alias that contains itself.
* **Deep nesting** (``[[[[...``) overflowed Python's recursion in the composer: refused at
  :data:`MAX_DEPTH` while composing.
* **Duplicate keys** silently kept the last value; kubectl refuses them, and so does this loader.
* **Types JSON has no word for**: YAML 1.1 dates became ``datetime.date`` (go-yaml keeps them as
  strings, and so do we), ``1:30`` became 90 (sexagesimal; go-yaml: a string), ``1e-4`` stayed a
  string (go-yaml: a number; so here too), ``.nan``/``.inf`` cannot be sent as JSON, integers
  beyond 64 bits do not fit the API's integers, ``!!set``/``!!binary``/``!!omap`` have no JSON
  form, and a lone UTF-16 surrogate escape is not a character. Each is refused with its line, or
  converted as kubectl converts it.
* **Non-string keys** (``on: true`` under ``lora``: YAML 1.1 reads ``on`` as a boolean) become the
  string kubectl would send (``"true"``), so the schema reports an unknown field instead of code
  tripping over a bool; null and composite keys are refused.
* **Bytes that are not UTF-8** are refused with their offset, not a ``UnicodeDecodeError``.

Every error is a :class:`ManifestError` whose message is one line naming the line of the input.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterator
from typing import Any, Final

import yaml
import yaml.reader
from yaml.composer import Composer
from yaml.constructor import ConstructorError, SafeConstructor
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode
from yaml.parser import Parser
from yaml.reader import Reader
from yaml.resolver import BaseResolver
from yaml.scanner import Scanner

from dgx_api.text import printable

#: The API server refuses request bodies over 3 MiB (``--max-request-body-bytes``'s default), and
#: etcd values over 1.5 MiB: no object it stores expands further than this.
MAX_DOCUMENT_BYTES: Final = 3 * 1024 * 1024
#: Nesting of sequences and mappings. Kubernetes objects nest a dozen levels; a schema-less field
#: (ConfigMap data is flat) rarely more. Far below what would exhaust Python's recursion in the
#: validators that walk a document.
MAX_DEPTH: Final = 100
INT64_MIN: Final = -(2**63)
INT64_MAX: Final = 2**63 - 1

_MERGE_TAG: Final = "tag:yaml.org,2002:merge"
_STR_TAG: Final = "tag:yaml.org,2002:str"


class ManifestError(ValueError):
    """Input that is not a manifest kubectl could send; the message is one printable line."""

    def __init__(self, message: str, line: int | None = None) -> None:
        self.line = line
        text = " ".join(printable(message).split())
        super().__init__(f"line {line}: {text}" if line is not None else text)


def _line(node_or_mark: Any) -> int | None:
    mark = getattr(node_or_mark, "start_mark", node_or_mark)
    return mark.line + 1 if mark is not None and hasattr(mark, "line") else None


class _Resolver(BaseResolver):
    """go-yaml v2's implicit types: YAML 1.1 booleans (``y``/``n`` included), numbers as Go parses
    them, no timestamps, no sexagesimal numbers."""


_Resolver.add_implicit_resolver(
    "tag:yaml.org,2002:bool",
    re.compile(r"^(?:y|Y|yes|Yes|YES|n|N|no|No|NO|true|True|TRUE|false|False|FALSE|on|On|ON|off|Off|OFF)$"),
    list("yYnNtTfFoO"),
)
_Resolver.add_implicit_resolver(
    "tag:yaml.org,2002:int",
    re.compile(r"^(?:[-+]?0b[0-1_]+|[-+]?0o?[0-7_]+|[-+]?(?:0|[1-9][0-9_]*)|[-+]?0x[0-9a-fA-F_]+)$"),
    list("-+0123456789"),
)
_Resolver.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(
        r"^(?:[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$"
    ),
    list("-+0123456789."),
)
_Resolver.add_implicit_resolver("tag:yaml.org,2002:merge", re.compile(r"^(?:<<)$"), ["<"])
_Resolver.add_implicit_resolver("tag:yaml.org,2002:null", re.compile(r"^(?:~|null|Null|NULL|)$"), ["~", "n", "N", ""])


class _Composer(Composer):
    """Counts nesting while composing, so ``[[[[...`` fails at :data:`MAX_DEPTH`, not in a
    RecursionError."""

    _depth = 0

    def compose_node(self, parent: Node | None, index: Any) -> Node:
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                event = self.peek_event()  # type: ignore[attr-defined]  # the Parser's, mixed in by _Loader
                raise ManifestError(f"nested more than {MAX_DEPTH} levels deep", _line(event))
            node: Node = super().compose_node(parent, index)  # type: ignore[assignment]  # None only at stream end
            return node
        finally:
            self._depth -= 1


def _unsupported(tag: str) -> Any:
    def construct(loader: SafeConstructor, node: Node) -> Any:
        raise ManifestError(f"{tag} values have no JSON form: write a list or a mapping instead", _line(node))

    return construct


class _Constructor(SafeConstructor):
    bool_values = {**SafeConstructor.bool_values, "y": True, "n": False}  # noqa: RUF012  (PyYAML's own shape)

    def construct_mapping(self, node: Node, deep: bool = False) -> dict[str, Any]:  # type: ignore[override]
        if not isinstance(node, MappingNode):
            raise ManifestError("expected a mapping", _line(node))
        explicit = [(k, v) for k, v in node.value if k.tag != _MERGE_TAG]
        seen: dict[str, Node] = {}
        for key_node, _ in explicit:
            key = json_key(self.construct_object(key_node, deep=True), key_node)
            if key in seen:
                raise ManifestError(
                    f"mapping key {key!r} already defined at line {_line(seen[key])}: remove one of them",
                    _line(key_node),
                )
            seen[key] = key_node
        self.flatten_mapping(node)
        mapping: dict[str, Any] = {}
        for key_node, value_node in node.value:
            key = json_key(self.construct_object(key_node, deep=True), key_node)
            mapping[key] = self.construct_object(value_node, deep=deep)
        return mapping

    def construct_yaml_int(self, node: ScalarNode) -> int:
        value: int = super().construct_yaml_int(node)
        if not INT64_MIN <= value <= INT64_MAX:
            raise ManifestError(
                f"the integer {printable(str(node.value))[:40]} is out of range: Kubernetes integers are 64-bit; "
                "quote it if it is meant as a string",
                _line(node),
            )
        return value

    def construct_yaml_float(self, node: ScalarNode) -> float:
        text = str(node.value).replace("_", "")
        try:
            value = float(text)
        except ValueError:
            value = super().construct_yaml_float(node)
        if math.isnan(value) or math.isinf(value):
            raise ManifestError(
                f"{printable(str(node.value))} is not a JSON number: quote it for a string", _line(node)
            )
        return value

    def construct_yaml_str(self, node: ScalarNode) -> str:
        value = str(self.construct_scalar(node))
        if any("\ud800" <= c <= "\udfff" for c in value):
            try:  # an escaped UTF-16 pair ("\ud83d\ude00") is the character it encodes, as in JSON
                value = value.encode("utf-16", "surrogatepass").decode("utf-16")
            except UnicodeDecodeError:
                raise ManifestError(
                    "a lone UTF-16 surrogate escape (\\ud800-\\udfff) is not a character", _line(node)
                ) from None
        return value


def _register(tag: str, construct: Callable[[Any, Any], Any]) -> None:
    _Constructor.add_constructor(f"tag:yaml.org,2002:{tag}", construct)


_register("int", _Constructor.construct_yaml_int)
_register("float", _Constructor.construct_yaml_float)
_register("str", _Constructor.construct_yaml_str)
# Timestamps are strings (go-yaml v2 keeps them so when decoding into an untyped value).
_register("timestamp", _Constructor.construct_yaml_str)
for _tag in ("binary", "set", "omap", "pairs"):
    _register(_tag, _unsupported(f"!!{_tag}"))


class _Loader(Reader, Scanner, Parser, _Composer, _Constructor, _Resolver):
    def __init__(self, stream: str) -> None:
        Reader.__init__(self, stream)
        Scanner.__init__(self)
        Parser.__init__(self)
        _Composer.__init__(self)
        _Constructor.__init__(self)
        _Resolver.__init__(self)


def json_key(key: Any, node: Node) -> str:
    """The JSON key sigs.k8s.io/yaml makes of a YAML key: strings as they are, booleans and
    numbers as their text (``on`` -> ``"true"``); null and composite keys are errors."""
    if isinstance(key, str):
        return key
    if isinstance(key, bool):
        return "true" if key else "false"
    if isinstance(key, int):
        return str(key)
    if isinstance(key, float):
        return repr(key)
    what = (
        "null"
        if key is None
        else "a list or mapping"
        if isinstance(node, SequenceNode | MappingNode)
        else type(key).__name__
    )
    raise ManifestError(f"a mapping key must be a string, number or boolean, not {what}", _line(node))


def _children(node: Node) -> list[Node]:
    if isinstance(node, SequenceNode):
        return list(node.value)
    if isinstance(node, MappingNode):
        return [n for pair in node.value for n in pair]
    return []


def measure(root: Node) -> tuple[int, int]:
    """(bytes, depth) of ``root`` with every alias expanded, computed over the node graph (each
    distinct node once), so a bomb is measured in microseconds and never built. Raises
    :class:`ManifestError` past the bounds or for an alias that contains itself."""
    sizes: dict[int, tuple[int, int]] = {}
    on_path: set[int] = set()
    stack: list[tuple[Node, bool]] = [(root, False)]
    while stack:
        node, finished = stack.pop()
        ident = id(node)
        if finished:
            children = _children(node)
            size = (len(node.value) + 3 if isinstance(node, ScalarNode) else 2) + sum(sizes[id(c)][0] for c in children)
            depth = 1 + max((sizes[id(c)][1] for c in children), default=0)
            on_path.discard(ident)
            sizes[ident] = (size, depth)
            if size > MAX_DOCUMENT_BYTES:
                raise ManifestError(
                    f"the value here expands (through its *aliases) to more than {MAX_DOCUMENT_BYTES // 2**20} MiB, "
                    "more than the API server accepts: write it out without aliases",
                    _line(node),
                )
            if depth > MAX_DEPTH:
                raise ManifestError(
                    f"the value here nests (through its *aliases) more than {MAX_DEPTH} levels deep", _line(node)
                )
            continue
        if ident in sizes:
            continue
        on_path.add(ident)
        stack.append((node, True))
        for child in _children(node):
            if id(child) in on_path:
                raise ManifestError("an alias refers to a value that contains it (a recursive anchor)", _line(child))
            if id(child) not in sizes:
                stack.append((child, False))
    return sizes[id(root)]


def decode(data: bytes) -> str:
    """UTF-8 text (a BOM is dropped), or a :class:`ManifestError` saying where it is not."""
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise ManifestError(
            f"byte 0x{data[exc.start]:02x} at offset {exc.start} is not UTF-8: save the file as UTF-8", line
        ) from None


def iter_documents(text: str | bytes) -> Iterator[Any]:
    """Each document of a YAML stream as a JSON-compatible value (``None`` for an empty one)."""
    if isinstance(text, bytes):
        text = decode(text)
    try:
        loader = _Loader(text)  # the Reader refuses control characters here already
    except yaml.reader.ReaderError as exc:
        raise _reader_error(exc, text) from None
    try:
        while loader.check_node():
            node = loader.get_node()
            if node is None:
                continue
            measure(node)
            yield loader.construct_document(node)
    except ManifestError:
        raise
    except yaml.reader.ReaderError as exc:
        raise _reader_error(exc, text) from None
    except (yaml.MarkedYAMLError, ConstructorError) as exc:
        mark = exc.problem_mark or exc.context_mark
        problem = " ".join(part for part in (exc.context, exc.problem) if part) or "not valid YAML"
        raise ManifestError(f"not valid YAML: {problem}", _line(mark)) from None
    except yaml.YAMLError as exc:
        raise ManifestError(f"not valid YAML: {exc}") from None
    finally:
        loader.dispose()


def _reader_error(exc: yaml.reader.ReaderError, text: str) -> ManifestError:
    """A character YAML does not allow (a control character, a lone surrogate), at its line."""
    line = text.count("\n", 0, exc.position) + 1
    char = exc.character if isinstance(exc.character, str) else chr(exc.character)
    return ManifestError(
        f"character U+{ord(char):04X} is not allowed in YAML (control characters must be escaped in a "
        'double-quoted string, e.g. "\\u001b")',
        line,
    )


def load_documents(text: str | bytes) -> list[Any]:
    """All documents of a YAML stream, empty ones left out."""
    return [doc for doc in iter_documents(text) if doc is not None]


def load(text: str | bytes) -> Any:
    """The single document of ``text`` (a config file): ``None`` if empty; more than one is an error."""
    docs = load_documents(text)
    if len(docs) > 1:
        raise ManifestError(f"expected one YAML document, found {len(docs)}")
    return docs[0] if docs else None
