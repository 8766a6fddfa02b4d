"""The API server's own checks of ``metadata`` (and of label maps elsewhere), in its words.

A CRD's schema cannot restrict ``metadata`` beyond the name: the API server validates ObjectMeta
itself (apimachinery's ``ValidateObjectMeta``), for custom and built-in kinds alike, and drops or
refuses unknown metadata fields (kubectl's strict field validation refuses them). The kubernetes
JSON schemas kubernetes-validate ships check types only, not label syntax. So without these checks
`kubedgx validate` passed label keys with spaces, a namespace ``Bad_NS`` and ``metadata.bogus``
that `kubectl apply` then refused. Messages are apimachinery's (``Invalid value: "x": name part
must ...``), so a search for the apiserver's error finds this too.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping
from typing import Any, Final

from dgx_api.schema import Problem, join_path, json_type

_NAME_PART: Final = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
_LABEL_VALUE: Final = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
_DNS1123_LABEL: Final = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_DNS1123_SUBDOMAIN: Final = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")

NAME_PART_MESSAGE: Final = (
    "name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an "
    "alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for validation is "
    "'([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')"
)
QUALIFIED_NAME_MESSAGE: Final = (
    "a qualified name must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an "
    "alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for validation is "
    "'([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]') with an optional DNS subdomain prefix and '/' (e.g. "
    "'example.com/MyName')"
)
LABEL_VALUE_MESSAGE: Final = (
    "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must "
    "start and end with an alphanumeric character (e.g. 'MyValue',  or 'my_value',  or '12345', regex used for "
    "validation is '(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?')"
)
DNS1123_LABEL_MESSAGE: Final = (
    "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and "
    "end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for validation is "
    "'[a-z0-9]([-a-z0-9]*[a-z0-9])?')"
)
DNS1123_SUBDOMAIN_MESSAGE: Final = (
    "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must "
    "start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is "
    "'[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')"
)
#: apimachinery's TotalAnnotationSizeLimitB.
ANNOTATIONS_LIMIT: Final = 256 * 1024

#: ObjectMeta's fields (JSON names) and the JSON type of each.
OBJECT_META_FIELDS: Final[Mapping[str, str]] = {
    "name": "string",
    "generateName": "string",
    "namespace": "string",
    "selfLink": "string",
    "uid": "string",
    "resourceVersion": "string",
    "generation": "integer",
    "creationTimestamp": "string",
    "deletionTimestamp": "string",
    "deletionGracePeriodSeconds": "integer",
    "labels": "object",
    "annotations": "object",
    "ownerReferences": "array",
    "finalizers": "array",
    "managedFields": "array",
}


def invalid(value: Any, why: str) -> str:
    return f"Invalid value: {json.dumps(value, ensure_ascii=False)}: {why}"


def qualified_name_errors(key: str) -> list[str]:
    """apimachinery's IsQualifiedName: ``[prefix/]name``, prefix a DNS subdomain, name up to 63."""
    parts = key.split("/")
    if len(parts) == 1:
        name = parts[0]
    elif len(parts) == 2:
        prefix, name = parts
        if not prefix:
            return ["prefix part must be non-empty"]
        if len(prefix) > 253:
            return ["prefix part must be no more than 253 characters"]
        if not _DNS1123_SUBDOMAIN.match(prefix):
            return [f"prefix part {DNS1123_SUBDOMAIN_MESSAGE}"]
    else:
        return [QUALIFIED_NAME_MESSAGE]
    if not name:
        return ["name part must be non-empty"]
    return _errors(name, _NAME_PART, NAME_PART_MESSAGE, "name part ")


def _errors(value: str, pattern: re.Pattern[str], message: str, prefix: str = "") -> list[str]:
    """apimachinery's two checks of a 63-character name: its length, then its characters."""
    errors = [f"{prefix}must be no more than 63 characters"] if len(value) > 63 else []
    return errors if pattern.match(value) else [*errors, message]


def label_value_errors(value: str) -> list[str]:
    return _errors(value, _LABEL_VALUE, LABEL_VALUE_MESSAGE)


def dns1123_label_errors(value: str) -> list[str]:
    return _errors(value, _DNS1123_LABEL, DNS1123_LABEL_MESSAGE)


def label_problems(labels: Mapping[Any, Any], path: str) -> Iterator[Problem]:
    """Each bad key and each bad value of a label map (``metadata.labels``, a node selector), both
    at the map's path as apimachinery reports them (the value names the entry)."""
    for key, value in labels.items():
        if not isinstance(key, str):
            continue
        for why in qualified_name_errors(key):
            yield Problem(path, invalid(key, why))
        if isinstance(value, str):
            for why in label_value_errors(value):
                yield Problem(path, invalid(value, why))


def metadata_problems(meta: Any, *, types: bool = True) -> list[Problem]:
    """What the API server refuses in ``metadata``. ``types``: also unknown fields and wrong types
    (for built-in kinds kubernetes-validate's strict schemas already report those)."""
    if not isinstance(meta, Mapping):
        return [Problem("metadata", f"must be of type object, got {json_type(meta)}")] if types else []
    problems: list[Problem] = []
    for field, value in meta.items():
        where = join_path("metadata", field)
        expected = OBJECT_META_FIELDS.get(field)
        if expected is None:
            if types:
                problems.append(Problem(where, "unknown field"))
            continue
        got = json_type(value)
        if got != expected and value is not None:
            if types:
                problems.append(Problem(where, f"must be of type {expected}, got {got}"))
            continue
        if field in ("labels", "annotations") and isinstance(value, Mapping):
            for key, item in value.items():
                if not isinstance(item, str) and types:
                    problems.append(Problem(join_path(where, key), f"must be of type string, got {json_type(item)}"))
        if field in ("finalizers",) and isinstance(value, list) and types:
            problems.extend(
                Problem(join_path(where, i), f"must be of type string, got {json_type(item)}")
                for i, item in enumerate(value)
                if not isinstance(item, str)
            )
    namespace = meta.get("namespace")
    if isinstance(namespace, str) and namespace:
        problems.extend(
            Problem("metadata.namespace", invalid(namespace, why)) for why in dns1123_label_errors(namespace)
        )
    labels = meta.get("labels")
    if isinstance(labels, Mapping):
        problems.extend(label_problems(labels, "metadata.labels"))
    annotations = meta.get("annotations")
    if isinstance(annotations, Mapping):
        total = 0
        for key, value in annotations.items():
            # apimachinery checks annotation keys lower-cased: upper-case letters are allowed there.
            for why in qualified_name_errors(str(key).lower()):
                problems.append(Problem("metadata.annotations", invalid(key, why)))
            total += len(str(key).encode()) + (len(value.encode(errors="replace")) if isinstance(value, str) else 0)
        if total > ANNOTATIONS_LIMIT:
            problems.append(Problem("metadata.annotations", f"Too long: must have at most {ANNOTATIONS_LIMIT} bytes"))
    finalizers = meta.get("finalizers")
    if isinstance(finalizers, list):
        for name in finalizers:
            if isinstance(name, str):
                problems.extend(
                    Problem("metadata.finalizers", invalid(name, why)) for why in qualified_name_errors(name)
                )
    return problems
