"""One schema engine for both sides of the contract.

The pydantic models are the single source of truth. This module turns them into Kubernetes
*structural* OpenAPI schemas (what a CRD must carry: no ``$ref``, every node typed, no ``title``
or ``uniqueItems``) and validates documents against such a schema the way the API server does:
OpenAPI keywords, unknown fields rejected (kubectl's strict field validation), list-type
uniqueness, and the ``x-kubernetes-validations`` CEL rules evaluated with cel-python.

Cross-field rules are written once, in CEL, on the models (:func:`cel`). The API server enforces
them from the generated CRD; ``kubedgx validate``, the admission webhook and the trainer's config
loader enforce the very same strings through :func:`validate`. No rule exists twice.

It lives in the shared contract (:mod:`dgx_api`) because both sides validate with it: the operator's
CRD models and the trainer's config model are built on :class:`KubeModel`, and neither side imports
the other.
"""

from __future__ import annotations

import copy
import difflib
import functools
import json
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import celpy
import jsonschema
from celpy import celtypes
from celpy.adapter import json_to_cel
from celpy.evaluation import CELEvalError
from pydantic import BaseModel, ConfigDict
from pydantic.alias_generators import to_camel

from dgx_api.text import printable

# --------------------------------------------------------------------------------------------
# Model helpers
# --------------------------------------------------------------------------------------------


def _attach_rules(schema: dict[str, Any], cls: type[BaseModel]) -> None:
    """Collect ``cel_rules`` along the class hierarchy, so a subclass adds to its parent's rules
    instead of replacing them (pydantic replaces ``json_schema_extra`` dicts on inheritance)."""
    entries = [entry for klass in reversed(cls.__mro__) for entry in vars(klass).get("cel_rules", ())]
    if entries:
        schema["x-kubernetes-validations"] = entries


class KubeModel(BaseModel):
    """Base for every API object: camelCase on the wire, unknown fields rejected.

    ``extra="forbid"`` mirrors kubectl's strict field validation (the default since 1.27): a
    typo such as ``minNode`` must be an error, not a silently pruned field. Cross-field rules
    go in a ``cel_rules`` class attribute (see :func:`cel`).
    """

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="forbid",
        json_schema_extra=_attach_rules,
    )

    cel_rules: ClassVar[tuple[dict[str, str], ...]] = ()

    def to_manifest(self) -> dict[str, Any]:
        """The object as it appears in YAML: camelCase keys, unset optional fields left out."""
        return self.model_dump(by_alias=True, exclude_none=True, mode="json")


def cel(
    rule: str,
    message: str | None = None,
    *,
    message_expression: str | None = None,
    field_path: str | None = None,
    reason: str | None = None,
) -> dict[str, str]:
    """One ``x-kubernetes-validations`` entry, in the exact shape the CRD carries.

    A message expression may not convert a value with ``string()``: kube-apiserver 1.34's CEL cost
    estimator rates ``string(<int>)`` as unbounded, even for a field with a maximum, and refuses the
    whole CRD ("estimated messageExpression cost exceeds budget"); seen on the real apiserver
    (tests/cluster), which cel-python does not estimate. Concatenating string fields is fine."""
    entry: dict[str, str] = {"rule": rule}
    if message is not None:
        entry["message"] = message
    if message_expression is not None:
        if re.search(r"\bstring\(", message_expression):
            raise ValueError(
                f"messageExpression {message_expression!r}: no string() conversions; the apiserver's cost "
                "estimator refuses the CRD for them (concatenate string fields, or use a static message)"
            )
        entry["messageExpression"] = message_expression
    if field_path is not None:
        entry["fieldPath"] = field_path
    if reason is not None:
        entry["reason"] = reason
    return entry


# Human phrases for regular expressions, so that an error says "must be a duration such as 90m"
# rather than printing the regex. Registered next to the pattern's definition by :func:`pattern`.
_PATTERN_HINTS: dict[str, str] = {}


def pattern(regex: str, hint: str) -> str:
    """Register ``hint`` as the error text for ``regex`` and return ``regex`` for ``Field``."""
    _PATTERN_HINTS[regex] = hint
    return regex


# --------------------------------------------------------------------------------------------
# Structural schema generation
# --------------------------------------------------------------------------------------------


class SchemaError(ValueError):
    """A model uses a construct that has no structural-schema equivalent."""


_DROP_KEYS = {"title", "examples", "discriminator"}


def structural_schema(model: type[BaseModel]) -> dict[str, Any]:
    """The model's JSON schema rewritten as a Kubernetes structural schema."""
    raw = model.model_json_schema(by_alias=True, mode="validation")
    defs = raw.pop("$defs", {})
    return _structural(raw, defs, model.__name__)


def _describe_default(node: dict[str, Any]) -> None:
    """CRDs carry no defaults (the API server would write them into the user's spec and make
    Argo CD see drift); the default is stated in the description instead, for kubectl explain."""
    if "default" not in node:
        return
    default = node.pop("default")
    # An empty default (a message that is "" until there is something to say) is no information:
    # "Defaults to ." would only puzzle the reader of `kubectl explain`.
    if default is None or default in ([], {}, ""):
        return
    text = node.get("description", "").rstrip()
    # A plain word reads best bare (Defaults to Equal.); a string that blank space would blur, and
    # anything not a string, is shown as JSON.
    plain = isinstance(default, str) and default.strip() == default
    shown = default if plain else json.dumps(default)
    if "default" not in text.lower():
        node["description"] = f"{text} Defaults to {shown}.".strip()


def _merge(base: dict[str, Any], overrides: Mapping[str, Any]) -> dict[str, Any]:
    """A referenced model's schema with the field's own keys on top: the field's description
    wins, and CEL rules of both the field and the model apply."""
    out = dict(base)
    for key, value in overrides.items():
        if key == "x-kubernetes-validations":
            out[key] = [*out.get(key, []), *value]
        else:
            out[key] = value
    return out


def _structural(node: Mapping[str, Any], defs: Mapping[str, Any], where: str) -> dict[str, Any]:
    out: dict[str, Any] = {k: copy.deepcopy(v) for k, v in node.items() if k not in _DROP_KEYS}

    ref = out.pop("$ref", None)
    if ref is not None:
        target = defs[ref.rsplit("/", 1)[-1]]
        out = _merge(_structural(target, defs, where), out)

    all_of = out.pop("allOf", None)
    if all_of is not None:
        if len(all_of) != 1:
            raise SchemaError(f"{where}: allOf with {len(all_of)} members is not structural")
        out = _merge(_structural(all_of[0], defs, where), out)

    any_of = out.pop("anyOf", None)
    if any_of is not None:
        branches = [b for b in any_of if b != {"type": "null"}]
        if len(branches) == 1:
            out = _merge(_structural(branches[0], defs, where), out)
        elif sorted(b.get("type", "") for b in branches) == ["integer", "string"]:
            # int-or-string (quantities): the only union a structural schema allows.
            for branch in branches:
                # The value rules of both branches hold the whole value; jsonschema (and the API
                # server) apply pattern to strings only and minimum to numbers only.
                for rule in ("pattern", "minimum"):
                    if rule in branch:
                        out[rule] = branch[rule]
            out["anyOf"] = [{"type": "integer"}, {"type": "string"}]
            out["x-kubernetes-int-or-string"] = True
        else:
            raise SchemaError(f"{where}: union {any_of} has no structural equivalent")

    if "const" in out:
        out["enum"] = [out.pop("const")]
    if out.pop("uniqueItems", False):
        raise SchemaError(f"{where}: uniqueItems is not allowed in a CRD; use x-kubernetes-list-type")
    for bound in ("exclusiveMinimum", "exclusiveMaximum"):
        value = out.get(bound)
        if isinstance(value, int | float) and not isinstance(value, bool):
            out["minimum" if bound == "exclusiveMinimum" else "maximum"] = value
            out[bound] = True

    _describe_default(out)

    if "properties" in out:
        out["properties"] = {name: _structural(sub, defs, f"{where}.{name}") for name, sub in out["properties"].items()}
        out.setdefault("type", "object")
        if out.get("additionalProperties") is False:
            del out["additionalProperties"]
    if isinstance(out.get("additionalProperties"), Mapping):
        out["additionalProperties"] = _structural(out["additionalProperties"], defs, f"{where}.*")
    elif out.get("additionalProperties") is True:
        del out["additionalProperties"]
        out["x-kubernetes-preserve-unknown-fields"] = True
    if "items" in out:
        out["items"] = _structural(out["items"], defs, f"{where}[]")

    if (
        "type" not in out
        and not out.get("x-kubernetes-int-or-string")
        and not out.get("x-kubernetes-preserve-unknown-fields")
    ):
        raise SchemaError(f"{where}: every node of a structural schema needs a type")
    return out


# --------------------------------------------------------------------------------------------
# Validation (schema + list types + CEL), as the API server does it
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, order=True)
class Problem:
    """One reason a document is invalid, anchored at a Kubernetes-style field path."""

    path: str
    message: str

    def __str__(self) -> str:
        # Paths and messages quote the manifest's keys and values: escaped, so a key holding a
        # newline or an ANSI escape cannot forge a second line or recolour the terminal.
        return printable(f"{self.path}: {self.message}" if self.path else self.message)


def join_path(base: str, part: str | int) -> str:
    """``spec`` + ``env`` -> ``spec.env``; ``spec.env`` + 2 -> ``spec.env[2]``."""
    if isinstance(part, int):
        return f"{base}[{part}]"
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", part):
        return f"{base}[{json.dumps(part)}]"
    return f"{base}.{part}" if base else part


def validate(schema: Mapping[str, Any], document: Any, *, root: str = "", old: Any = None) -> list[Problem]:
    """All problems of ``document`` under ``schema``, sorted and de-duplicated.

    CEL rules run only on subtrees with no schema error, as the API server would have rejected
    the value before a rule could see a wrongly typed field. Transition rules (``oldSelf``) run
    only when ``old`` is given, i.e. on updates.
    """
    problems = _schema_problems(schema, document, root)
    problems += _list_type_problems(schema, document, root)
    broken = {p.path for p in problems}
    problems += _cel_problems(schema, document, old, root, broken)
    return sorted(set(problems))


def _strict_copy(schema: Mapping[str, Any], *, open_object: bool = False) -> dict[str, Any]:
    """Draft-4 view of a structural schema: objects with declared properties reject unknown
    fields (kubectl --validate=strict), the K8s-only keywords are left for our own passes.
    ``metadata`` stays open: a CRD may restrict its name but the API server owns the rest."""
    out = {k: _strict_copy(v) if isinstance(v, Mapping) else v for k, v in schema.items()}
    if "properties" in out:
        out["properties"] = {k: _strict_copy(v, open_object=(k == "metadata")) for k, v in schema["properties"].items()}
        if (
            "additionalProperties" not in out
            and not schema.get("x-kubernetes-preserve-unknown-fields")
            and not open_object
        ):
            out["additionalProperties"] = False
    if isinstance(schema.get("items"), Mapping):
        out["items"] = _strict_copy(schema["items"])
    if "anyOf" in schema:
        out["anyOf"] = [dict(b) for b in schema["anyOf"]]
    out.pop("x-kubernetes-validations", None)
    return out


@functools.lru_cache(maxsize=32)
def _validator(schema_json: str) -> jsonschema.Draft4Validator:
    return jsonschema.Draft4Validator(_strict_copy(json.loads(schema_json)))


def json_type(value: Any) -> str:
    """The JSON type name of a decoded value, as the apiserver's messages name it."""
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, Mapping):
        return "object"
    if isinstance(value, list):
        return "array"
    return "null" if value is None else type(value).__name__


def _count(n: Any, one: str, many: str | None = None) -> str:
    return f"{n} {one if n == 1 else many or one + 's'}"


def _show(value: Any, limit: int = 60) -> str:
    """``value`` as JSON, cut at ``limit`` characters; containers are summarised before they are
    serialised, so a huge value costs no more than a small one."""
    if isinstance(value, Mapping | list) and len(value) > limit:
        return f"{json_type(value)} of {len(value)} {'entries' if isinstance(value, Mapping) else 'items'}"
    text = json.dumps(value, default=str)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _number(value: Any) -> str:
    """A bound as the apiserver prints it (Go's ``%v`` of a float64): ``1``, not ``1.0``."""
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


#: The apiserver's wording of numeric bounds (kube-openapi's validate package), by keyword and exclusiveness.
_BOUND_TEXT = {
    ("minimum", False): "should be greater than or equal to",
    ("minimum", True): "should be greater than",
    ("maximum", False): "should be less than or equal to",
    ("maximum", True): "should be less than",
}


def _schema_problems(schema: Mapping[str, Any], document: Any, root: str) -> list[Problem]:
    validator = _validator(json.dumps(schema, sort_keys=True))
    problems: list[Problem] = []
    for error in validator.iter_errors(document):
        problems.extend(explain(error, root))
    return problems


def explain(error: jsonschema.ValidationError, root: str = "") -> Iterator[Problem]:
    """Readable problems for one jsonschema error, at its Kubernetes-style field path. Also used
    for the errors kubernetes-validate raises on built-in kinds.

    Types, enums and numeric bounds are worded as kube-apiserver words them (``must be of type integer``,
    ``Unsupported value: "x": supported values: ...``, ``should be greater than or equal to 0``), so that
    ``kubedgx validate`` and ``kubectl apply`` read the same; the CLI adds the value it got where the
    apiserver shows only the JSON type or leaves the value out (tests/cluster/test_crds.py compares them)."""
    path = root
    for part in error.absolute_path:
        path = join_path(path, part)
    # jsonschema types these as "maybe unset"; on a raised error they are always set.
    keyword: Any = error.validator
    expected: Any = error.validator_value
    value: Any = error.instance
    if keyword == "required":
        for name in expected:
            if isinstance(value, Mapping) and name not in value:
                yield Problem(join_path(path, name), "Required value")
    elif keyword == "additionalProperties":
        known = list(error.schema.get("properties", {})) if isinstance(error.schema, Mapping) else []
        for name in value:
            if name not in known:
                hint = difflib.get_close_matches(name, known, n=1)
                extra = f" (did you mean {hint[0]!r}?)" if hint else ""
                if name in ("true", "false"):
                    extra = " (YAML reads an unquoted on, off, yes, no, y or n as a boolean: quote the key)"
                yield Problem(join_path(path, name), f"unknown field{extra}")
    elif keyword == "type":
        wanted = " or ".join([expected] if isinstance(expected, str) else expected)
        got = "null (an empty value)" if value is None else f"{json_type(value)} {_show(value)}"
        yield Problem(path, f"must be of type {wanted}, got {got}")
    elif keyword == "anyOf" and isinstance(error.schema, Mapping) and error.schema.get("x-kubernetes-int-or-string"):
        got = "null (an empty value)" if value is None else f"{json_type(value)} {_show(value)}"
        yield Problem(path, f"must be an integer or a string, got {got}")
    elif keyword == "enum":
        options = ", ".join(json.dumps(v, default=str) for v in expected)
        yield Problem(path, f"Unsupported value: {_show(value)}: supported values: {options}")
    elif keyword == "pattern":
        text = _PATTERN_HINTS.get(expected, f"must match the regular expression {expected}")
        yield Problem(path, f"invalid value {_show(value)}: {text}")
    elif keyword in ("minimum", "maximum"):
        bounds = error.schema if isinstance(error.schema, Mapping) else {}
        exclusive = bounds.get("exclusiveMinimum" if keyword == "minimum" else "exclusiveMaximum")
        text = _BOUND_TEXT[(keyword, bool(exclusive))]
        yield Problem(path, f"{text} {_number(expected)} (got {_show(value)})")
    elif keyword in ("minLength", "maxLength"):
        bound = "at least" if keyword == "minLength" else "at most"
        yield Problem(path, f"must be {bound} {_count(expected, 'character')} long (got {len(value)})")
    elif keyword in ("minItems", "maxItems"):
        bound = "at least" if keyword == "minItems" else "at most"
        yield Problem(path, f"must have {bound} {_count(expected, 'item')} (got {len(value)})")
    elif keyword in ("minProperties", "maxProperties"):
        bound = "at least" if keyword == "minProperties" else "at most"
        yield Problem(path, f"must have {bound} {_count(expected, 'entry', 'entries')} (got {len(value)})")
    else:
        yield Problem(path, error.message)


def _walk(schema: Mapping[str, Any], value: Any, path: str) -> Iterator[tuple[Mapping[str, Any], Any, str]]:
    """Every (schema node, value, path) pair, for values that are present."""
    if value is None:
        return
    yield schema, value, path
    if isinstance(value, Mapping):
        props = schema.get("properties", {})
        extra = schema.get("additionalProperties")
        for key, sub in value.items():
            sub_schema = props.get(key, extra if isinstance(extra, Mapping) else None)
            if sub_schema is not None:
                yield from _walk(sub_schema, sub, join_path(path, key))
    elif isinstance(value, list) and isinstance(schema.get("items"), Mapping):
        for i, item in enumerate(value):
            yield from _walk(schema["items"], item, join_path(path, i))


def _list_type_problems(schema: Mapping[str, Any], document: Any, root: str) -> list[Problem]:
    """``x-kubernetes-list-type: map|set`` uniqueness, which Draft-4 does not know. Worded as the
    apiserver words it (``Duplicate value: {"name":"x"}``: a map entry's keys as compact JSON, a set
    item as JSON), plus the index of the first entry with that key."""
    problems: list[Problem] = []
    for node, value, path in _walk(schema, document, root):
        kind = node.get("x-kubernetes-list-type")
        if not isinstance(value, list) or kind not in ("map", "set"):
            continue
        keys = node.get("x-kubernetes-list-map-keys", [])
        seen: dict[str, int] = {}
        for i, item in enumerate(value):
            if kind == "map" and isinstance(item, Mapping):
                ident = json.dumps([item.get(k) for k in keys])
                shown = json.dumps({k: item.get(k) for k in keys}, sort_keys=True, separators=(",", ":"))
            else:
                ident = shown = json.dumps(item, sort_keys=True, separators=(",", ":"))
            if ident in seen:
                problems.append(Problem(join_path(path, i), f"Duplicate value: {shown} (same as [{seen[ident]}])"))
            else:
                seen[ident] = i
    return problems


_CEL_ENV = celpy.Environment()


def _split(text: Any, separator: Any) -> celtypes.ListType:
    """``string.split(string)`` of cel-go's strings extension, which Kubernetes enables for CRD
    rules and cel-python lacks. An empty separator splits into characters, as in cel-go."""
    value, sep = str(text), str(separator)
    parts = list(value) if sep == "" else value.split(sep)
    return celtypes.ListType([celtypes.StringType(p) for p in parts])


#: The Kubernetes CEL library functions our rules may use, beyond standard CEL.
KUBERNETES_CEL_FUNCTIONS: dict[str, Any] = {"split": _split}


@functools.lru_cache(maxsize=512)
def _program(rule: str) -> celpy.Runner:
    return _CEL_ENV.program(_CEL_ENV.compile(rule), functions=KUBERNETES_CEL_FUNCTIONS)


def to_cel(value: Any, schema: Mapping[str, Any]) -> Any:
    """A CEL value typed by the schema, as the API server types it: ``type: number`` is a double
    even when the YAML says ``3``, so rules like ``self.epochs > 0.0`` behave as in a cluster."""
    if value is None:
        return None
    kind = schema.get("type")
    if isinstance(value, Mapping):
        props = schema.get("properties", {})
        extra = schema.get("additionalProperties")
        fallback = extra if isinstance(extra, Mapping) else {}
        return celtypes.MapType({celtypes.StringType(k): to_cel(v, props.get(k, fallback)) for k, v in value.items()})
    if isinstance(value, list):
        item_schema = schema.get("items", {})
        return celtypes.ListType([to_cel(v, item_schema) for v in value])
    if kind == "number" and isinstance(value, int | float) and not isinstance(value, bool):
        return celtypes.DoubleType(float(value))
    return json_to_cel(value)


def _field_path(base: str, field_path: str | None) -> str:
    """Join a rule's ``fieldPath`` (``.minNodes``, ``.env[0]``, ``['a.b']``) onto ``base``."""
    if not field_path:
        return base
    out = base
    for name, index, quoted in re.findall(r"\.([A-Za-z_][A-Za-z0-9_]*)|\[(\d+)\]|\['([^']*)'\]", field_path):
        if name:
            out = join_path(out, name)
        elif index:
            out = join_path(out, int(index))
        else:
            out = join_path(out, quoted)
    return out


def evaluate_rule(rule: Mapping[str, str], self_value: Any, old_value: Any = None) -> str | None:
    """The error message of one rule on one value, or ``None`` when the rule holds."""
    activation: dict[str, Any] = {"self": self_value}
    if old_value is not None:
        activation["oldSelf"] = old_value
    try:
        result = _program(rule["rule"]).evaluate(activation)
    except CELEvalError as exc:
        return f"rule {rule['rule']!r} could not be evaluated: {exc.args[0] if exc.args else exc}"
    if isinstance(result, CELEvalError):
        return f"rule {rule['rule']!r} could not be evaluated: {result.args[0] if result.args else result}"
    if bool(result):
        return None
    if "messageExpression" in rule:
        try:
            message = _program(rule["messageExpression"]).evaluate(activation)
            if isinstance(message, str) and message:
                return str(message)
        except CELEvalError:
            pass
    return rule.get("message") or f"failed rule: {rule['rule']}"


def _within(path: str, ancestor: str) -> bool:
    """Whether ``path`` is ``ancestor`` or lies below it."""
    return not ancestor or path == ancestor or path.startswith((ancestor + ".", ancestor + "["))


def _cel_problems(schema: Mapping[str, Any], document: Any, old: Any, root: str, broken: set[str]) -> list[Problem]:
    problems: list[Problem] = []
    old_by_path = {path: value for _, value, path in _walk(schema, old, root)} if old is not None else {}
    for node, value, path in _walk(schema, document, root):
        entries: Sequence[Mapping[str, str]] = node.get("x-kubernetes-validations", [])
        if not entries or any(_within(b, path) for b in broken):
            continue
        self_value = to_cel(value, node)
        old_value = old_by_path.get(path)
        for entry in entries:
            if "oldSelf" in entry["rule"] and old_value is None:
                continue  # transition rules apply to updates only
            message = evaluate_rule(entry, self_value, to_cel(old_value, node) if old_value is not None else None)
            if message is not None:
                problems.append(Problem(_field_path(path, entry.get("fieldPath")), message))
    return problems
