"""An in-memory Kubernetes API served over HTTP on loopback, for running the real kopf operator in tests.

Why: there is no kube-apiserver, kind or Docker here, and kmock's ``KubernetesEmulator`` is deliberately
simplistic (its docstring: "inherit and implement for your cases"). This module is that inheritance. From
kmock it keeps the HTTP server (``kmock.Server``: aiohttp on 127.0.0.1), request recording, the DSL for
scripted responses (``emulator['get /version'] << 500`` still takes precedence over everything below), API
discovery (``KubernetesScaffold``) and the object store with per-object history
(``emulator.objects['v1/pods', 'ml', 'p'].history``). It replaces kmock's create/patch/delete/list/watch
handling, which cannot be extended in place, with the API server's semantics:

* Discovery for core/v1 pods, services, configmaps, secrets, events, namespaces, persistentvolumeclaims;
  apiextensions.k8s.io/v1 customresourcedefinitions; coordination.k8s.io/v1 leases; and every served version
  of every CRD created (:meth:`Emulator.install_crds`, or an HTTP POST of a CRD), with verbs and ``/status``.
* Metadata: uid, one global resourceVersion counter bumped by every write, generation (1 on create, bumped
  when anything but metadata and status changes; kept for custom resources, CRDs and pods), creationTimestamp,
  generateName; DNS name checks; namespaces must exist; metav1 Status bodies for every error.
* Writes: POST, PUT, PATCH (JSON merge patch; JSON patch including ``test``; strategic merge treated as a
  merge patch for built-in kinds and refused with 415 for custom resources, as the API server refuses it);
  a stale metadata.resourceVersion -> 409 Conflict; PUT of a custom resource without one -> 422; a write that
  changes nothing is not written (no new resourceVersion, no watch event); status-subresource isolation.
* Custom resources are pruned of unknown fields (Warning header; ``fieldValidation=Strict`` -> 400) and
  validated with ``dgx_api.schema.validate`` (OpenAPI + CEL, ``old=`` on updates): 422 Invalid + causes;
  on updates, errors at values the update did not change are ratcheted away, as since Kubernetes 1.33.
* DELETE: finalizers (deletionTimestamp, removal when the last one goes, none added while terminating),
  preconditions, propagationPolicy
  Background/Foreground/Orphan, ownerReference garbage collection, namespaces and CRDs that take their
  contents with them, deletecollection.
* LIST: label selectors (=, ==, !=, in, notin, exists, !exists), field selectors (metadata.name,
  metadata.namespace and a few kind-specific fields), limit/continue. WATCH: ADDED/MODIFIED/DELETED for every
  write, resourceVersion replay, 410 Expired past the retained history, timeoutSeconds, bookmarks,
  sendInitialEvents, and selector transitions (an object leaving a watch's selector is DELETED for it).
* Request bodies of up to 3 MiB, as the API server reads (aiohttp's own limit is 1 MiB); larger ones get 413.
* Pods and Services get the API server's common defaults and admission additions (restartPolicy, dnsPolicy,
  imagePullPolicy, requests from limits, default tolerations, the service-account token volume; a cluster
  IP), since an operator comparing desired and stored specs meets them in a cluster; a pod's spec is
  immutable but for images, deadlines, tolerations and a first nodeName (422 otherwise).
* ``dryRun=All`` on a create (POST): everything a create does (defaults, validation, the ``admission`` hooks),
  the name checked last (409 after admission, as the API server orders it), then nothing stored: no
  resourceVersion, no watch event. Other dryRun values answer 422. Not on updates, patches or deletes.
* Pods get status.phase Pending on create; there is no scheduler or kubelet: tests play them
  (:meth:`Emulator.patch_status`). DELETE removes a pod at once unless it has finalizers, or unless
  ``hold_pod_deletion`` is set: then it stays Terminating until :meth:`Emulator.finish_pod_deletion`.

Test controls: :meth:`Emulator.fail` (fault injection), :attr:`Emulator.log` (every request with its verb and
status code), :meth:`Emulator.drop_watches`, :meth:`Emulator.compact`, ``admission`` hooks, direct helpers that
run the same code as HTTP (create/get/select/patch/patch_status/delete), and :meth:`Emulator.wait_for`, which
re-checks its condition on the emulator's own change notifications (no sleeping, no polling). ``get``, ``patch``
and ``delete`` replace kmock's HTTP shortcuts of those names (raw HTTP: an aiohttp session on ``emulator.url``);
``emulator.objects`` is kmock's record of every stored version, to read, not to write.

Deliberately not emulated: authentication and RBAC (any token works); admission webhooks (a Python hook in
``admission`` plays a validating webhook); server-side apply and managedFields; dryRun but on creates (above);
strategic-merge list semantics (patchMergeKey, ``$patch``); defaulting, conversion, CEL cost limits; schemas
of built-in kinds (only their names are checked); LIST at an older resourceVersion and list snapshots (a list is
the current state; a continue token pages through the current state); the orphan finalizer (Orphan drops the
owner references at once); the asynchrony of the garbage collector and namespace controller (here they act
within the write that triggers them).
"""

from __future__ import annotations

import asyncio
import base64
import collections
import contextlib
import copy
import datetime
import json
import random
import re
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import EllipsisType
from typing import Any, NoReturn, TypeVar, cast

import aiohttp.web
import attrs
import kmock
import yaml

from dgx_api.schema import Problem, join_path, validate

Body = dict[str, Any]
T = TypeVar("T")

WRITE_VERBS = frozenset({"create", "update", "patch", "delete", "deletecollection"})
ALL_VERBS = ("create", "delete", "deletecollection", "get", "list", "patch", "update", "watch")
MERGE_PATCH = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"
STRATEGIC_PATCH = "application/strategic-merge-patch+json"
_SYSTEM_META = ("uid", "creationTimestamp", "generation", "deletionTimestamp", "deletionGracePeriodSeconds")


# --------------------------------------------------------------------------------------------
# Resource kinds
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Kind:
    """One served resource (group, version, plural) and what the API server knows about it."""

    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool = True
    status: bool = False  # has the /status subresource (writes to it change only status, and vice versa)
    generation: bool = False  # metadata.generation is maintained
    custom: bool = False  # a custom resource: pruned and validated against ``schema``
    short_names: tuple[str, ...] = ()
    categories: tuple[str, ...] = ()
    schema: Mapping[str, Any] | None = field(default=None, compare=False, hash=False, repr=False)

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def group_resource(self) -> str:
        """``pods``, ``dgxtrainingjobs.kubedgx.io``: how the API server names a resource in messages."""
        return f"{self.plural}.{self.group}" if self.group else self.plural

    @property
    def qualified_kind(self) -> str:
        return f"{self.kind}.{self.group}" if self.group else self.kind

    @property
    def resource(self) -> kmock.resource:
        return kmock.resource(group=self.group, version=self.version, plural=self.plural)

    @property
    def verbs(self) -> tuple[str, ...]:
        return tuple(v for v in ALL_VERBS if not (self.plural == "namespaces" and v == "deletecollection"))


BUILTIN_KINDS = (
    Kind("", "v1", "pods", "Pod", status=True, generation=True, short_names=("po",), categories=("all",)),
    Kind("", "v1", "services", "Service", status=True, short_names=("svc",), categories=("all",)),
    Kind("", "v1", "configmaps", "ConfigMap", short_names=("cm",)),
    Kind("", "v1", "secrets", "Secret"),
    Kind("", "v1", "events", "Event", short_names=("ev",)),
    Kind("", "v1", "persistentvolumeclaims", "PersistentVolumeClaim", status=True, short_names=("pvc",)),
    Kind("", "v1", "namespaces", "Namespace", namespaced=False, status=True, short_names=("ns",)),
    Kind("coordination.k8s.io", "v1", "leases", "Lease"),
    Kind(
        "apiextensions.k8s.io",
        "v1",
        "customresourcedefinitions",
        "CustomResourceDefinition",
        namespaced=False,
        status=True,
        generation=True,
        short_names=("crd", "crds"),
    ),
)

#: Field selectors the API server accepts beyond metadata.name and metadata.namespace.
_FIELD_LABELS = {
    "pods": {"spec.nodeName", "spec.restartPolicy", "spec.schedulerName", "status.phase", "status.podIP"},
    "events": {"involvedObject.kind", "involvedObject.name", "involvedObject.namespace", "involvedObject.uid"}
    | {"reason", "type", "source", "reportingComponent"},
    "namespaces": {"status.phase"},
    "secrets": {"type"},
}


# --------------------------------------------------------------------------------------------
# Errors: metav1 Status
# --------------------------------------------------------------------------------------------


class ApiError(Exception):
    """A failure the API server answers with a metav1 Status; the direct helpers raise it too."""

    def __init__(
        self,
        code: int,
        reason: str,
        message: str,
        details: Mapping[str, Any] | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(f"{code} {reason}: {message}")
        self.code, self.reason, self.message = code, reason, message
        self.details = dict(details or {})
        self.headers = dict(headers or {})

    @property
    def causes(self) -> list[dict[str, str]]:
        return list(self.details.get("causes", []))

    def body(self) -> Body:
        status: Body = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure"}
        status.update(message=self.message, reason=self.reason, code=self.code)
        if self.details:
            status["details"] = self.details
        return status


def _named(kind: Kind, name: str, *, detail_kind: str | None = None) -> Body:
    return {"name": name, "group": kind.group, "kind": detail_kind or kind.plural}


def not_found(kind: Kind, name: str) -> ApiError:
    return ApiError(404, "NotFound", f'{kind.group_resource} "{name}" not found', _named(kind, name))


def already_exists(kind: Kind, name: str) -> ApiError:
    return ApiError(409, "AlreadyExists", f'{kind.group_resource} "{name}" already exists', _named(kind, name))


def conflict(kind: Kind, name: str, why: str = "") -> ApiError:
    why = why or "the object has been modified; please apply your changes to the latest version and try again"
    message = f'Operation cannot be fulfilled on {kind.group_resource} "{name}": {why}'
    return ApiError(409, "Conflict", message, _named(kind, name))


def invalid(kind: Kind, name: str, problems: Iterable[Problem]) -> ApiError:
    """422 Invalid listing every problem as a cause with its field path, as the API server reports them."""
    problems = list(problems)
    causes = [{"reason": _cause_reason(p.message), "message": p.message, "field": p.path} for p in problems]
    listed = "; ".join(str(p) for p in problems)
    message = f'{kind.qualified_kind} "{name}" is invalid: ' + (f"[{listed}]" if len(problems) > 1 else listed)
    return ApiError(422, "Invalid", message, {**_named(kind, name, detail_kind=kind.kind), "causes": causes})


def bad_request(message: str) -> ApiError:
    return ApiError(400, "BadRequest", message)


def _cause_reason(message: str) -> str:
    if message.startswith("Forbidden"):
        return "FieldValueForbidden"
    if message.startswith("Required value"):
        return "FieldValueRequired"
    if message.startswith("Unsupported value"):
        return "FieldValueNotSupported"
    if message.startswith("unknown field"):
        return "FieldValueTypeInvalid"
    return "FieldValueInvalid"


# --------------------------------------------------------------------------------------------
# Requests: routes, the log, faults
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Route:
    """A parsed API path: ``/apis/{group}/{version}[/namespaces/{ns}]/{plural}[/{name}[/{subresource}]]``."""

    group: str
    version: str
    plural: str | None = None
    namespace: str | None = None
    name: str | None = None
    subresource: str | None = None


_API_PATH = re.compile(r"/(?:api/(?P<core>[^/]+)|apis/(?P<group>[^/]+)/(?P<version>[^/]+))(?P<rest>(?:/[^/]+)*)/?")


def parse_route(path: str) -> Route | None:
    """The route of an API path, ``None`` for anything else (kmock 0.8's parser raises on /api/v1/namespaces)."""
    match = _API_PATH.fullmatch(path)
    if match is None:
        return None
    group, version = ("", match["core"]) if match["core"] else (match["group"], match["version"])
    parts = [p for p in match["rest"].split("/") if p]
    namespace = None
    if len(parts) >= 3 and parts[0] == "namespaces" and parts[2] not in ("status", "finalize"):
        namespace, parts = parts[1], parts[2:]
    if not parts:
        return Route(group, version)
    return Route(group, version, parts[0], namespace, parts[1] if len(parts) > 1 else None, "/".join(parts[2:]) or None)


def _flag(value: str | None) -> bool:
    """Go's strconv.ParseBool, which the API server uses: the Python clients send ``watch=True``."""
    return (value or "").lower() in ("1", "t", "true")


def verb_of(method: str, route: Route | None, params: Mapping[str, str]) -> str | None:
    """The Kubernetes verb of a request (as RBAC and audit logs name it); ``None`` for non-resource paths."""
    if route is None or route.plural is None:
        return None
    method = method.upper()
    if method == "GET":
        return "watch" if _flag(params.get("watch")) else ("get" if route.name else "list")
    if method == "DELETE":
        return "delete" if route.name else "deletecollection"
    return {"POST": "create", "PUT": "update", "PATCH": "patch"}.get(method)


@dataclass
class Call:
    """One request in :attr:`Emulator.log`: enough to count writes and see which verbs an operator used."""

    method: str
    path: str
    params: dict[str, str]
    verb: str | None
    group: str | None
    resource: str | None
    subresource: str | None
    namespace: str | None
    name: str | None
    content_type: str | None = None
    status: int | None = None  # None while a request (e.g. a watch stream) is being served
    fault: bool = False  # answered by an injected fault

    @property
    def succeeded(self) -> bool:
        return self.status is not None and self.status < 400

    @property
    def write(self) -> bool:
        return self.verb in WRITE_VERBS

    def __str__(self) -> str:
        return f"{self.method} {self.path} -> {self.status}{' (fault)' if self.fault else ''}"


def _resource_matches(spec: str, group: str | None, plural: str | None) -> bool:
    """``*``, a plural (``pods``) or a group resource (``dgxtrainingjobs.kubedgx.io``)."""
    if spec == "*":
        return True
    name, _, spec_group = spec.partition(".")
    return name == plural and (not spec_group or spec_group == group)


@dataclass
class Fault:
    """The next ``times`` requests matching (verb, resource, subresource) answer ``code`` instead of being served."""

    verb: str
    resource: str
    subresource: str | None
    code: int
    times: int
    retry_after: int = 1
    namespace: str | None = None
    name: str | None = None
    hits: int = 0

    @property
    def remaining(self) -> int:
        return self.times - self.hits

    def matches(self, call: Call) -> bool:
        return (
            self.remaining > 0
            and self.verb in ("*", call.verb, call.method.lower())
            and _resource_matches(self.resource, call.group, call.resource)
            and self.subresource == call.subresource
            and self.namespace in (None, call.namespace)
            and self.name in (None, call.name)
        )

    def error(self, call: Call) -> ApiError:
        """The Status the API server would send with this code, so clients take their usual paths."""
        details: Body = {"name": call.name or "", "group": call.group or "", "kind": call.resource or ""}
        if self.code == 429:
            message = "the server has received too many requests and has asked us to try again later"
            details["retryAfterSeconds"] = self.retry_after
            return ApiError(429, "TooManyRequests", message, details, {"Retry-After": str(self.retry_after)})
        if self.code == 409:
            why = "the object has been modified; please apply your changes to the latest version and try again"
            message = f'Operation cannot be fulfilled on {call.resource} "{call.name}": {why} (injected)'
            return ApiError(409, "Conflict", message, details)
        reason = _REASONS.get(self.code, "InternalError")
        return ApiError(self.code, reason, f"injected {self.code} {reason} for {call.method} {call.path}", details)


_REASONS = {400: "BadRequest", 403: "Forbidden", 404: "NotFound", 410: "Expired", 503: "ServiceUnavailable"}


# --------------------------------------------------------------------------------------------
# Selectors
# --------------------------------------------------------------------------------------------

_LABEL_KEY = r"(?:[a-z0-9](?:[-a-z0-9.]*[a-z0-9])?/)?[A-Za-z0-9](?:[-A-Za-z0-9_.]*[A-Za-z0-9])?"
_LABEL_VALUE = r"(?:[A-Za-z0-9](?:[-A-Za-z0-9_.]*[A-Za-z0-9])?)?"
_REQUIREMENT = re.compile(
    rf"\s*(?:(?P<key>{_LABEL_KEY})\s+(?P<set_op>in|notin)\s*\((?P<values>[^)]*)\)"
    rf"|(?P<eq_key>{_LABEL_KEY})\s*(?P<eq_op>==|!=|=)\s*(?P<value>{_LABEL_VALUE})"
    rf"|(?P<not>!?)\s*(?P<exists_key>{_LABEL_KEY}))\s*"
)

#: One selector requirement: (operator, key or field path, values). Operators: in, notin, exists, !exists.
Requirement = tuple[str, str, frozenset[str]]
LabelMatcher = Callable[[Mapping[str, str]], bool]


def _split_top_level(text: str) -> list[str]:
    """Split at commas outside parentheses: ``a in (x,y),b`` -> ``['a in (x,y)', 'b']``."""
    parts, depth, start = [], 0, 0
    for i, char in enumerate(text):
        depth += {"(": 1, ")": -1}.get(char, 0)
        if char == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    return [p for p in parts if p.strip()]


def _label_requirement(part: str, selector: str) -> Requirement:
    m = _REQUIREMENT.fullmatch(part)
    if m is None:
        raise bad_request(f"unable to parse requirement: {part.strip()!r} in label selector {selector!r}")
    if m["set_op"]:
        return m["set_op"], m["key"], frozenset(v.strip() for v in m["values"].split(",") if v.strip())
    if m["eq_op"]:
        return "notin" if m["eq_op"] == "!=" else "in", m["eq_key"], frozenset({m["value"]})
    return "!exists" if m["not"] else "exists", m["exists_key"], frozenset()


def _satisfied(requirement: Requirement, value: str | None) -> bool:
    """``value`` is None where the label (or field) is absent: ``!=`` and ``notin`` match absence."""
    operator, _, values = requirement
    return {
        "in": value in values,
        "notin": value not in values,
        "exists": value is not None,
        "!exists": value is None,
    }[operator]


def label_selector(selector: str | Mapping[str, str] | None) -> LabelMatcher:
    """A matcher for a label selector in the API's syntax (or a dict of equalities); 400 if unparsable."""
    if isinstance(selector, Mapping):
        requirements = [("in", k, frozenset({v})) for k, v in selector.items()]
    else:
        text = selector or ""
        requirements = [_label_requirement(part, text) for part in _split_top_level(text)]
    return lambda labels: all(_satisfied(r, labels.get(r[1])) for r in requirements)


def _dig(obj: Mapping[str, Any], dotted: str) -> str:
    node: Any = obj
    for part in dotted.split("."):
        node = node.get(part) if isinstance(node, Mapping) else None
    return "" if node is None else str(node)


def field_selector(kind: Kind, selector: str | Mapping[str, str] | None) -> Callable[[Body], bool]:
    """A matcher for a field selector (``=``, ``==``, ``!=``); 400 for a field the kind does not index."""
    if isinstance(selector, Mapping):
        selector = ",".join(f"{k}={v}" for k, v in selector.items())
    supported = {"metadata.name", "metadata.namespace"} | _FIELD_LABELS.get(kind.plural, set())
    requirements: list[Requirement] = []
    for part in filter(None, (p.strip() for p in (selector or "").split(","))):
        m = re.fullmatch(r"([A-Za-z.]+)\s*(==|!=|=)\s*(.*)", part)
        if m is None:
            raise bad_request(f"invalid field selector: {part!r}")
        if m[1] not in supported:
            raise bad_request(f'field label not supported: {m[1]} ("{kind.group_resource}")')
        requirements.append(("notin" if m[2] == "!=" else "in", m[1], frozenset({m[3]})))
    return lambda obj: all(_satisfied(r, _dig(obj, r[1])) for r in requirements)


# --------------------------------------------------------------------------------------------
# Patches and pruning
# --------------------------------------------------------------------------------------------


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch: ``null`` removes a key, objects merge, everything else replaces."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = copy.deepcopy(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


class JsonPatchError(ValueError):
    """A JSON patch that cannot be applied (the API server answers 422)."""


def _pointer(path: Any) -> list[str]:
    if not isinstance(path, str) or (path and not path.startswith("/")):
        raise JsonPatchError(f"invalid JSON pointer {path!r}")
    return [t.replace("~1", "/").replace("~0", "~") for t in path.split("/")[1:]]


def _locate(doc: Any, tokens: list[str]) -> tuple[Any, str]:
    """The container holding the last token, and that token."""
    node = doc
    for token in tokens[:-1]:
        try:
            node = node[int(token)] if isinstance(node, list) else node[token]
        except (KeyError, IndexError, ValueError, TypeError):
            raise JsonPatchError(f"path /{'/'.join(tokens)} does not exist") from None
    return node, tokens[-1]


def _index(container: list[Any], token: str, *, insert: bool) -> int:
    if insert and token == "-":
        return len(container)
    if not token.isdigit() or int(token) > len(container) - (0 if insert else 1):
        raise JsonPatchError(f"array index {token!r} out of range")
    return int(token)


def json_patch(doc: Body, ops: Any) -> Body:
    """RFC 6902 JSON patch (add, remove, replace, move, copy, test) on a copy of ``doc``."""
    if not isinstance(ops, list):
        raise bad_request("json: cannot unmarshal object into Go value of type jsonpatch.Patch")
    result: Any = copy.deepcopy(doc)

    def get(tokens: list[str]) -> Any:
        if not tokens:
            return result
        container, token = _locate(result, tokens)
        try:
            return (
                container[_index(container, token, insert=False)] if isinstance(container, list) else container[token]
            )
        except (KeyError, TypeError):
            raise JsonPatchError(f"path /{'/'.join(tokens)} does not exist") from None

    def remove(tokens: list[str]) -> Any:
        value = get(tokens)
        container, token = _locate(result, tokens)
        if isinstance(container, list):
            del container[_index(container, token, insert=False)]
        else:
            del container[token]
        return value

    def add(tokens: list[str], value: Any) -> None:
        nonlocal result
        if not tokens:
            result = copy.deepcopy(value)
            return
        container, token = _locate(result, tokens)
        if isinstance(container, list):
            container.insert(_index(container, token, insert=True), copy.deepcopy(value))
        elif isinstance(container, dict):
            container[token] = copy.deepcopy(value)
        else:
            raise JsonPatchError(f"path /{'/'.join(tokens)} does not exist")

    for op in ops:
        if not isinstance(op, dict) or "op" not in op:
            raise JsonPatchError(f"invalid operation {op!r}")
        tokens = _pointer(op.get("path"))
        if op["op"] == "test":
            if get(tokens) != op.get("value"):
                raise JsonPatchError(f"testing value {op['path']} failed")
        elif op["op"] == "add":
            add(tokens, op.get("value"))
        elif op["op"] == "remove":
            remove(tokens)
        elif op["op"] == "replace":
            get(tokens)  # must exist
            if tokens:
                remove(tokens)
            add(tokens, op.get("value"))
        elif op["op"] in ("move", "copy"):
            source = _pointer(op.get("from"))
            value = remove(source) if op["op"] == "move" else copy.deepcopy(get(source))
            add(tokens, value)
        else:
            raise JsonPatchError(f"unsupported operation {op['op']!r}")
    if not isinstance(result, dict):
        raise JsonPatchError("the patched document is not an object")
    return result


_MISSING = object()
_PATH_PART = re.compile(r"\.?([A-Za-z_][A-Za-z0-9_]*)|\[(\d+)\]|\[(\"(?:[^\"\\\\]|\\\\.)*\")\]")


def _value_at(obj: Any, path: str) -> Any:
    """The value at a Problem's path (``spec.env[1].name``, ``spec.nodeSelector["a b"]``); a sentinel
    when absent (two absences are equal: an unchanged missing field)."""
    node = obj
    for name, index, quoted in _PATH_PART.findall(path):
        key: Any = name or (int(index) if index else json.loads(quoted))
        try:
            node = node[key]
        except (KeyError, IndexError, TypeError):
            return _MISSING
    return node


def prune(schema: Mapping[str, Any], value: Any, path: str = "") -> list[str]:
    """Drop, in place, the fields a structural schema does not declare; return their paths.

    The API server prunes unknown fields of custom resources rather than rejecting them (unless the request
    says ``fieldValidation=Strict``); ``x-kubernetes-preserve-unknown-fields`` keeps them. At the root,
    apiVersion, kind and metadata are the API server's own (it keeps all of ObjectMeta).
    """
    dropped: list[str] = []
    if isinstance(value, dict):
        props = schema.get("properties", {})
        extra = schema.get("additionalProperties")
        keep_unknown = bool(schema.get("x-kubernetes-preserve-unknown-fields")) or extra is True
        for key in list(value):
            sub = props.get(key, extra if isinstance(extra, Mapping) else None)
            if not path and key in ("apiVersion", "kind", "metadata"):
                continue
            if sub is not None:
                dropped += prune(sub, value[key], join_path(path, key))
            elif not keep_unknown:
                del value[key]
                dropped.append(join_path(path, key))
    elif isinstance(value, list) and isinstance(schema.get("items"), Mapping):
        for i, item in enumerate(value):
            dropped += prune(schema["items"], item, join_path(path, i))
    return dropped


# --------------------------------------------------------------------------------------------
# The emulator
# --------------------------------------------------------------------------------------------

_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_DNS_1035_LABEL = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")
_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_NAME_SUFFIX_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"  # apimachinery's: no vowels, no look-alikes
_NAMESPACE_FINALIZER = "kubernetes"
_CRD_FINALIZER = "customresourcecleanup.apiextensions.k8s.io"
_FOREGROUND = "foregroundDeletion"

#: The largest request body the API server reads (its MaxRequestBodyBytes, 3 MiB); more is answered 413.
MAX_REQUEST_BYTES = 3 * 2**20

#: A validating admission hook: (operation "CREATE"/"UPDATE", kind, new object, old object or None).
#: Raise :class:`ApiError` to deny the request.
AdmissionHook = Callable[[str, Kind, Body, Body | None], None]


def _now(plus_seconds: float = 0) -> str:
    moment = datetime.datetime.now(datetime.UTC) + datetime.timedelta(seconds=plus_seconds)
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def _meta(obj: Mapping[str, Any]) -> dict[str, Any]:
    meta = obj.get("metadata")
    return meta if isinstance(meta, dict) else {}


@dataclass(frozen=True)
class _Change:
    """One committed write, as watch streams and waiters see it."""

    rv: int
    kind: Kind
    type: str  # ADDED, MODIFIED, DELETED
    obj: Body
    old: Body | None


@dataclass(eq=False)
class _Watcher:
    kind: Kind
    matches: Callable[[Body], bool]
    queue: asyncio.Queue[_Change | None] = field(default_factory=asyncio.Queue)


class _Reply(Exception):  # noqa: N818 - control flow, not an error
    """Carries a finished aiohttp response out of kmock's reaction machinery.

    kmock renders a reaction's result with one status per reaction and headers that accumulate across
    requests; the API needs a status and headers per request, so the API fallback raises its response
    through kmock and :meth:`Emulator._handle` returns it.
    """

    def __init__(self, response: aiohttp.web.StreamResponse) -> None:
        super().__init__()
        self.response = response


@attrs.define(kw_only=True, eq=False)
class Emulator(kmock.KubernetesEmulator):
    """An in-memory Kubernetes API server (see the module docstring for what it emulates and what not).

    Every write, HTTP or direct, goes through the same synchronous code, so no two writes interleave and no
    lock is needed. Stored bodies are never mutated after a write; readers get deep copies.
    """

    hold_pod_deletion: bool = False  # keep deleted pods Terminating until finish_pod_deletion()
    history_limit: int = 10_000  # watch events kept for resourceVersion replay; older ones answer 410
    bookmark_interval: float = 30.0  # seconds between BOOKMARK events on idle watches that allow them
    # kmock matches every request against its reactions by scanning all requests served so far,
    # which is quadratic over a long run. False forgets a request once it is answered (the
    # emulator's own ``log`` keeps it): benchmarks need that; tests asserting on kmock's request
    # views (``emulator["get /x"]``) need the default.
    keep_requests: bool = True
    admission: list[AdmissionHook] = attrs.field(factory=list)
    log: list[Call] = attrs.field(factory=list, init=False)
    #: What each container printed, by (namespace, pod, container): served by ``pods/{name}/log``
    #: (see :meth:`set_log`); a container with nothing here printed nothing.
    container_logs: dict[tuple[str, str, str], str] = attrs.field(factory=dict, init=False)

    _kinds: dict[tuple[str, str, str], Kind] = attrs.field(factory=dict, init=False)
    _index: dict[tuple[str, str, str], dict[tuple[str | None, str], Body]] = attrs.field(factory=dict, init=False)
    _rv: int = attrs.field(default=0, init=False)
    _compacted_rv: int = attrs.field(default=0, init=False)
    _history: collections.deque[_Change] = attrs.field(init=False)
    _watchers: set[_Watcher] = attrs.field(factory=set, init=False)
    _waiters: set[asyncio.Event] = attrs.field(factory=set, init=False)
    _faults: list[Fault] = attrs.field(factory=list, init=False)
    _calls: dict[int, Call] = attrs.field(factory=dict, init=False)

    @_history.default
    def _make_history(self) -> collections.deque[_Change]:
        return collections.deque(maxlen=self.history_limit)

    def __attrs_post_init__(self) -> None:
        # Discovery and the 404 fallback come from the scaffold. kmock's own CRUD fallbacks (registered by
        # KubernetesEmulator.__attrs_post_init__) are replaced by one dispatcher with the API's semantics.
        kmock.KubernetesScaffold.__attrs_post_init__(self)
        self.fallback[self._is_api_request] << self._serve_resource
        for kind in BUILTIN_KINDS:
            self._register(kind)
        for name in ("default", "kube-system", "kube-public"):
            self.create_namespace(name)

    # ----------------------------------------------------------------------------------------
    # Public helpers for tests (they bypass HTTP but not the semantics)
    # ----------------------------------------------------------------------------------------

    def install_crds(self, paths: Iterable[str | Path]) -> list[Kind]:
        """Create the CRDs in these YAML files, registering their resources; returns the new kinds."""
        before = set(self._kinds.values())
        for path in paths:
            text = Path(path).read_text(encoding="utf-8")
            for doc in yaml.load_all(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader)):  # C: 10x faster
                if doc and doc.get("kind") == "CustomResourceDefinition":
                    self.create("customresourcedefinitions", doc)
        return [k for k in self._kinds.values() if k not in before]

    def create_namespace(self, name: str, labels: Mapping[str, str] | None = None) -> Body:
        return self.create("namespaces", {"metadata": {"name": name, "labels": dict(labels or {})}})

    def kind(self, resource: str | Kind) -> Kind:
        """The kind for ``pods``, ``v1/pods``, ``dgxtrainingjobs.kubedgx.io``, ``DGXTrainingJob`` or ``dgxjob``."""
        if isinstance(resource, Kind):
            return resource
        spec = kmock.resource(resource)
        candidates = [
            k
            for k in self._kinds.values()
            if spec.plural in (None, k.plural) and spec.group in (None, k.group) and spec.version in (None, k.version)
        ] or [k for k in self._kinds.values() if resource in (k.kind, *k.short_names)]
        core = [k for k in candidates if k.group == ""]
        if len(candidates) > 1 and len(core) == 1:
            candidates = core  # "pods" means core/v1 pods, as in kubectl
        if len(candidates) != 1:
            raise KeyError(f"{resource!r} names {len(candidates)} served resources: {candidates}")
        return candidates[0]

    def set_log(self, namespace: str, pod: str, container: str, text: str) -> None:
        """What a container has printed so far, as the kubelet would serve it (the test plays the kubelet)."""
        self.container_logs[namespace, pod, container] = text

    def _pod_log(self, namespace: str | None, name: str, params: Mapping[str, str]) -> str:
        """``GET pods/{name}/log`` as the apiserver answers it: the pod must exist, a pod of several
        containers needs ``container``, and ``tailLines`` / ``limitBytes`` cut the text."""
        kind = self._kinds[("", "v1", "pods")]
        pod = self._require(kind, namespace, name)
        names = [c["name"] for c in (pod.get("spec") or {}).get("containers") or []]
        container = params.get("container")
        if container is None:
            if len(names) != 1:
                raise bad_request(f"a container name must be specified for pod {name}, choose one of: {names}")
            container = names[0]
        elif container not in names:
            raise bad_request(f"container {container} is not valid for pod {name}")
        text = self.container_logs.get((namespace or "", name, container), "")
        if "tailLines" in params:
            lines = text.splitlines(keepends=True)
            text = "".join(lines[-int(params["tailLines"]) :]) if int(params["tailLines"]) > 0 else ""
        if "limitBytes" in params:
            text = text.encode()[: int(params["limitBytes"])].decode(errors="ignore")
        return text

    def create(self, resource: str | Kind, body: Mapping[str, Any], namespace: str | None = None) -> Body:
        """Create an object (as a POST with ``fieldValidation=Strict``: a typo in a test fails loudly)."""
        kind = self.kind(resource)
        namespace = namespace or _meta(body).get("namespace")
        obj, _ = self._create(kind, namespace, copy.deepcopy(dict(body)), "Strict")
        return copy.deepcopy(obj)

    def get(self, resource: str | Kind, namespace: str | None, name: str) -> Body | None:  # type: ignore[override]
        obj = self._current(self.kind(resource), namespace, name)
        return copy.deepcopy(obj) if obj is not None else None

    def select(
        self,
        resource: str | Kind,
        namespace: str | None = None,
        *,
        labels: str | Mapping[str, str] | None = None,
        fields: str | Mapping[str, str] | None = None,
    ) -> list[Body]:
        """Current objects of a kind (all namespaces when ``namespace`` is None), as a LIST would return them."""
        kind = self.kind(resource)
        matches = self._matcher(kind, namespace, None, labels, fields)
        return [copy.deepcopy(obj) for obj in self._objects_of(kind) if matches(obj)]

    def patch(  # type: ignore[override]
        self,
        resource: str | Kind,
        namespace: str | None,
        name: str,
        patch: Any,
        *,
        subresource: str | None = None,
        patch_type: str = MERGE_PATCH,
    ) -> Body:
        kind = self.kind(resource)
        obj, _ = self._patch(kind, namespace, name, patch_type, patch, subresource, "Strict")
        return copy.deepcopy(obj)

    def count(
        self, resource: str | Kind, namespace: str | None = None, predicate: Callable[[Body], object] | None = None
    ) -> int:
        """How many current objects of a kind match ``predicate``, read in place (no copies): cheap
        enough to re-check after every write of a large run, as benchmarks/operator_scale.py does.
        ``predicate`` must not modify what it is given."""
        objects = self._index.get(_key(self.kind(resource)), {})
        if namespace is None and predicate is None:
            return len(objects)
        return sum(
            1 for key, obj in objects.items() if namespace in (None, key[0]) and (predicate is None or predicate(obj))
        )

    def patch_status(self, resource: str | Kind, namespace: str | None, name: str, status: Mapping[str, Any]) -> Body:
        """Merge-patch the status through the /status subresource: what a kubelet or controller would do."""
        return self.patch(resource, namespace, name, {"status": dict(status)}, subresource="status")

    def delete(  # type: ignore[override]
        self,
        resource: str | Kind,
        namespace: str | None,
        name: str,
        *,
        propagation: str | None = None,
        grace_period: int | None = None,
    ) -> Body | None:
        """Delete; returns the object while it is still terminating (finalizers), None once it is gone."""
        options = {"propagationPolicy": propagation, "gracePeriodSeconds": grace_period}
        obj, removed = self._delete(self.kind(resource), namespace, name, options)
        return None if removed else copy.deepcopy(obj)

    def finish_pod_deletion(self, namespace: str, name: str) -> None:
        """Play the kubelet for a Terminating pod: it is gone once it has no finalizers left."""
        self.delete("pods", namespace, name, grace_period=0)

    def fail(
        self,
        verb: str,
        resource: str,
        subresource: str | None = None,
        *,
        code: int = 500,
        times: int = 1,
        retry_after: int = 1,
        namespace: str | None = None,
        name: str | None = None,
    ) -> Fault:
        """Make the next ``times`` matching requests answer ``code`` (429 with Retry-After, 409, 500, ...).

        ``verb`` is a Kubernetes verb (``patch``, ``list``, ``watch``...), an HTTP method or ``*``; ``resource``
        a plural, ``plural.group`` or ``*``; ``subresource`` None means the main resource only.
        """
        fault = Fault(verb.lower(), resource, subresource, code, times, retry_after, namespace, name)
        self._faults.append(fault)
        return fault

    def drop_watches(self) -> int:
        """End every open watch stream, as an API server restart or a load balancer would; returns how many."""
        for watcher in self._watchers:
            watcher.queue.put_nowait(None)
        return len(self._watchers)

    def compact(self) -> None:
        """Forget the watch history: a watch from any earlier resourceVersion now gets 410 Expired."""
        self._history.clear()
        self._compacted_rv = self._rv

    def open_watches(self, resource: str | Kind | None = None) -> int:
        kind = self.kind(resource) if resource is not None else None
        return sum(1 for w in self._watchers if kind is None or w.kind == kind)

    def calls(
        self,
        verb: str | None = None,
        resource: str = "*",
        *,
        subresource: str | EllipsisType | None = ...,
        succeeded: bool | None = None,
    ) -> list[Call]:
        """Logged requests by verb, resource (as in :meth:`fail`), subresource (``...``: any) and outcome."""
        return [
            c
            for c in self.log
            if verb in (None, c.verb)
            and _resource_matches(resource, c.group, c.resource)
            and (subresource is ... or c.subresource == subresource)
            and (succeeded is None or c.succeeded == succeeded)
        ]

    async def wait_for(
        self,
        predicate: Callable[[], T | None],
        *,
        timeout: float = 5.0,
        message: str | Callable[[], str] = "",
    ) -> T:
        """Return ``predicate()`` once it is truthy, re-checked after every write, request and watch change.

        Raises :class:`TimeoutError` with the condition, the recent requests and the stored objects' summary.
        """
        changed = asyncio.Event()
        self._waiters.add(changed)
        try:
            async with asyncio.timeout(timeout):
                while not (result := predicate()):
                    changed.clear()
                    await changed.wait()
                return result
        except TimeoutError:
            what = message() if callable(message) else message
            raise TimeoutError(f"not met within {timeout}s: {what or predicate}\n{self.describe()}") from None
        finally:
            self._waiters.discard(changed)

    async def wait_for_object(
        self,
        resource: str | Kind,
        namespace: str | None,
        name: str,
        predicate: Callable[[Body], object] | None = None,
        *,
        timeout: float = 5.0,
    ) -> Body:
        """The object once it exists and satisfies ``predicate``."""

        def check() -> Body | None:
            obj = self.get(resource, namespace, name)
            return obj if obj is not None and (predicate is None or predicate(obj)) else None

        what = f"{resource} {namespace}/{name} exists" + (f" and {predicate}" if predicate else "")
        return await self.wait_for(
            check, timeout=timeout, message=lambda: f"{what}; now: {self.get(resource, namespace, name)}"
        )

    async def wait_for_absence(
        self, resource: str | Kind, namespace: str | None, name: str, *, timeout: float = 5.0
    ) -> None:
        await self.wait_for(
            lambda: self.get(resource, namespace, name) is None,
            timeout=timeout,
            message=lambda: f"{resource} {namespace}/{name} is gone; now: {self.get(resource, namespace, name)}",
        )

    def describe(self, last: int = 15) -> str:
        """A summary for failure messages: object counts per kind and the last requests."""
        counts = collections.Counter(k.group_resource for k in self._kinds.values() for _ in self._objects_of(k))
        lines = [f"  {c}" for c in self.log[-last:]]
        return f"objects: {dict(counts)}; open watches: {len(self._watchers)}; last requests:\n" + "\n".join(lines)

    # ----------------------------------------------------------------------------------------
    # Storage and change notification
    # ----------------------------------------------------------------------------------------

    def _register(self, kind: Kind) -> None:
        self._kinds[kind.group, kind.version, kind.plural] = kind
        self.resources[kind.resource] = kmock.ResourceInfo(
            kind=kind.kind,
            singular=kind.kind.lower(),
            namespaced=kind.namespaced,
            verbs=kind.verbs,
            shortnames=kind.short_names,
            categories=kind.categories,
            subresources={"status"} if kind.status else set(),
        )

    def _unregister(self, kind: Kind) -> None:
        self._kinds.pop((kind.group, kind.version, kind.plural), None)
        if kind.resource in self.resources:
            del self.resources[kind.resource]

    def _get_resources(self) -> list[kmock.resource]:
        # Discovery serves what is registered; kmock would also list kinds of soft-deleted stored objects.
        return [kind.resource for kind in self._kinds.values()]

    async def _serve_server_version(self, request: kmock.Request) -> Body:
        return {"major": "1", "minor": "33", "gitVersion": "v1.33.0+kubedgx-emulator", "platform": "linux/amd64"}

    async def _serve_version(self, request: kmock.Request) -> Body:
        payload = cast(Body, await super()._serve_version(request))
        payload["groupVersion"] = payload["groupVersion"].lstrip("/")  # kmock says "/v1" for the core group
        for resource in payload["resources"]:
            if "/" in resource["name"]:
                resource["verbs"] = ["get", "patch", "update"]  # a subresource's verbs, not its parent's
        return payload

    def _current(self, kind: Kind, namespace: str | None, name: str | None) -> Body | None:
        return self._index.get(_key(kind), {}).get((namespace if kind.namespaced else None, name or ""))

    def _require(self, kind: Kind, namespace: str | None, name: str) -> Body:
        obj = self._current(kind, namespace, name)
        if obj is None:
            raise not_found(kind, name)
        return obj

    def _objects_of(self, kind: Kind, namespace: str | None = None) -> list[Body]:
        """Current objects in etcd key order (namespace, name)."""
        objects = self._index.get(_key(kind), {})
        keys = sorted((key for key in objects if namespace in (None, key[0])), key=lambda key: (key[0] or "", key[1]))
        return [objects[key] for key in keys]

    def _all_objects(self) -> list[tuple[Kind, Body]]:
        return [(kind, obj) for kind in list(self._kinds.values()) for obj in self._index.get(_key(kind), {}).values()]

    def _commit(self, kind: Kind, event: str, new: Body, old: Body | None) -> Body:
        """Write ``new`` with the next resourceVersion, notify watches and waiters; ``new`` is frozen after."""
        self._rv += 1
        new["metadata"]["resourceVersion"] = str(self._rv)
        namespace, name = new["metadata"].get("namespace"), new["metadata"]["name"]
        objects = self._index.setdefault(_key(kind), {})
        key = (kind.resource, namespace, name)  # kmock's store keeps every version, for assertions on history
        if event == "DELETED":
            del objects[namespace, name]
            self._objects[key].delete()
        else:
            objects[namespace, name] = new
            if key in self._objects:
                self._objects[key].history.append(copy.deepcopy(new))
            else:
                self._objects[key] = copy.deepcopy(new)
        if len(self._history) == self._history.maxlen:
            self._compacted_rv = self._history[0].rv
        change = _Change(self._rv, kind, event, new, old)
        self._history.append(change)
        for watcher in self._watchers:
            watcher.queue.put_nowait(change)
        self.notify()
        return new

    def notify(self) -> None:
        """Wake every :meth:`wait_for` to re-check its condition. Writes, requests and watch changes call it;
        call it when something outside the emulator that a condition looks at has changed."""
        for waiter in self._waiters:
            waiter.set()

    # ----------------------------------------------------------------------------------------
    # Create, update, patch
    # ----------------------------------------------------------------------------------------

    def _create(
        self, kind: Kind, namespace: str | None, body: Any, validation: str, *, dry_run: bool = False
    ) -> tuple[Body, list[str]]:
        if not isinstance(body, dict) or not isinstance(body.setdefault("metadata", {}), dict):
            raise bad_request("the body of the request is not a JSON object with metadata")
        self._check_type(kind, body)
        meta = body["metadata"]
        if kind.namespaced:
            if namespace is None or meta.get("namespace", namespace) != namespace:
                raise bad_request(
                    "the namespace of the provided object does not match the namespace sent on the request"
                )
            meta["namespace"] = namespace
            self._check_namespace(namespace)
        else:
            meta.pop("namespace", None)
        if not meta.get("name") and meta.get("generateName"):
            meta["name"] = self._generate_name(kind, namespace, str(meta["generateName"]))
        name = meta.get("name")
        self._check_name(kind, name)
        exists = self._current(kind, namespace, name) is not None
        if exists and not dry_run:
            raise already_exists(kind, name)
        for key in (*_SYSTEM_META, "resourceVersion", "selfLink", "managedFields"):
            meta.pop(key, None)
        meta.update(uid=str(uuid.uuid4()), creationTimestamp=_now())
        if kind.generation:
            meta["generation"] = 1
        if kind.status:
            body.pop("status", None)  # status is ignored on create where it is a subresource
        self._initialize(kind, body)
        warnings = self._admit("CREATE", kind, body, None, validation)
        if dry_run:
            # As the API server's dry-run: validation and admission ran; the name is checked last; nothing
            # is stored, no resourceVersion is used, no watch hears of it.
            if exists:
                raise already_exists(kind, name)
            return body, warnings
        self._commit(kind, "ADDED", body, None)
        if kind.plural == "customresourcedefinitions":
            self._register_crd(body)
        return body, warnings

    def _initialize(self, kind: Kind, body: Body) -> None:
        """What the API server's create strategies, defaulting and controllers fill in at once."""
        if kind.plural == "pods":
            default_pod(body)
            admit_pod(body)
            body["status"] = {"phase": "Pending"}
        elif kind.plural == "services":
            default_service(body, f"10.96.{(self._rv + 1) // 250 % 250}.{(self._rv + 1) % 250 + 1}")
        elif kind.plural == "namespaces":
            body["spec"] = {"finalizers": [_NAMESPACE_FINALIZER]}
            body["status"] = {"phase": "Active"}
        elif kind.plural == "customresourcedefinitions":
            body["metadata"].setdefault("finalizers", []).append(_CRD_FINALIZER)
            body["status"] = self._crd_status(body)

    def _update(
        self,
        kind: Kind,
        namespace: str | None,
        name: str,
        candidate: Any,
        subresource: str | None,
        validation: str,
        *,
        put: bool = False,
    ) -> tuple[Body, list[str]]:
        """Replace an object with ``candidate`` (a PUT body, or the result of a patch), with the API's rules."""
        old = self._require(kind, namespace, name)
        if not isinstance(candidate, dict) or not isinstance(candidate.get("metadata", {}), dict):
            raise bad_request("the body of the request is not a JSON object")
        self._check_type(kind, candidate)
        meta = candidate.setdefault("metadata", {})
        if meta.get("name", name) != name:
            raise bad_request(f"the name of the object ({meta['name']}) does not match the name on the URL ({name})")
        if kind.namespaced and meta.get("namespace", namespace) != namespace:
            raise bad_request("the namespace of the provided object does not match the namespace sent on the request")
        rv = meta.get("resourceVersion")
        if rv in (None, "") and put and kind.custom:  # custom resources allow no unconditional update
            problem = Problem("metadata.resourceVersion", "Invalid value: 0x0: must be specified for an update")
            raise invalid(kind, name, [problem])
        if rv not in (None, "") and str(rv) != old["metadata"]["resourceVersion"]:
            raise conflict(kind, name)
        if meta.get("uid") not in (None, old["metadata"]["uid"]):
            raise conflict(kind, name, f"Precondition failed: UID in object meta: {meta['uid']}")
        added = set(meta.get("finalizers") or ()) - set(old["metadata"].get("finalizers") or ())
        if old["metadata"].get("deletionTimestamp") and added and subresource is None:
            why = "Forbidden: no new finalizers can be added if the object is being deleted, found new finalizers"
            raise invalid(kind, name, [Problem("metadata.finalizers", f"{why} {sorted(added)}")])
        if subresource == "status":
            new = copy.deepcopy(old)
            new.pop("status", None)
            if "status" in candidate:
                new["status"] = candidate["status"]
        elif subresource is None:
            new = candidate
            new["metadata"].update(name=name, **({"namespace": namespace} if kind.namespaced else {}))
            for key in (*_SYSTEM_META, "resourceVersion"):
                new["metadata"].pop(key, None)
                if key in old["metadata"]:
                    new["metadata"][key] = old["metadata"][key]
            if kind.status:
                new.pop("status", None)
                if "status" in old:
                    new["status"] = copy.deepcopy(old["status"])
        else:
            raise not_found(kind, f"{name}/{subresource}")
        if kind.plural == "customresourcedefinitions" and new.get("spec") != old.get("spec"):
            new["status"] = self._crd_status(new)
        if kind.plural == "pods":
            default_pod(new)  # defaulting applies to every write, not only to creates
        elif kind.plural == "services":
            default_service(new, old["spec"].get("clusterIP", ""))  # an update keeps the allocated IP
        if kind.plural == "pods" and _pod_spec_view(new.get("spec", {}), old) != _pod_spec_view(old["spec"], old):
            message = (
                "Forbidden: pod updates may not change fields other than images, activeDeadlineSeconds, tolerations"
            )
            raise invalid(kind, name, [Problem("spec", message)])
        if kind.generation and _strip(new, kind) != _strip(old, kind):
            new["metadata"]["generation"] = old["metadata"].get("generation", 0) + 1
        warnings = self._admit("UPDATE", kind, new, old, validation)
        if new == old:
            return old, warnings  # nothing changed: nothing is written, no new resourceVersion, no event
        if self._removable(kind, new):
            return self._remove(kind, new), warnings
        self._commit(kind, "MODIFIED", new, old)
        if kind.plural == "customresourcedefinitions":
            self._register_crd(new)
        return new, warnings

    def _patch(
        self,
        kind: Kind,
        namespace: str | None,
        name: str,
        content_type: str,
        patch: Any,
        subresource: str | None,
        validation: str,
    ) -> tuple[Body, list[str]]:
        old = self._require(kind, namespace, name)
        if content_type == JSON_PATCH:
            try:
                candidate = json_patch(old, patch)
            except JsonPatchError as exc:
                message = f"the server rejected our request due to an error in our request: {exc}"
                raise ApiError(422, "Invalid", message) from None
        elif content_type == MERGE_PATCH or (content_type == STRATEGIC_PATCH and not kind.custom):
            if not isinstance(patch, dict):
                raise bad_request("the patch is not a JSON object")
            candidate = merge_patch(old, patch)
        else:
            accepted = [JSON_PATCH, MERGE_PATCH] + ([] if kind.custom else [STRATEGIC_PATCH])
            raise ApiError(
                415,
                "UnsupportedMediaType",
                "the body of the request was in an unknown format - accepted media types include: "
                + ", ".join(accepted)
                + (" (server-side apply is not emulated)" if "apply-patch" in content_type else ""),
            )
        return self._update(kind, namespace, name, candidate, subresource, validation)

    def _admit(self, operation: str, kind: Kind, new: Body, old: Body | None, validation: str) -> list[str]:
        """Prune and validate a custom resource, then run the admission hooks; returns the warnings."""
        warnings: list[str] = []
        if kind.custom and kind.schema is not None:
            dropped = prune(kind.schema, new)
            if dropped and validation == "Strict":
                raise bad_request("strict decoding error: " + ", ".join(f'unknown field "{p}"' for p in dropped))
            if validation != "Ignore":
                warnings = [f'unknown field \\"{p}\\"' for p in dropped]
            problems = validate(kind.schema, new, old=old)
            if old is not None:
                # Validation ratcheting (CRDValidationRatcheting, GA in 1.33): on an update, an error
                # at a value the update did not change is not raised, so an object stored under a
                # looser schema can still get its finalizer removed or its status written.
                problems = [p for p in problems if _value_at(new, p.path) != _value_at(old, p.path)]
            if problems:
                raise invalid(kind, new["metadata"]["name"], problems)
        for hook in self.admission:
            hook(operation, kind, new, old)
        return warnings

    def _check_type(self, kind: Kind, body: Body) -> None:
        """Fill apiVersion/kind from the URL (kopf posts events without them); refuse a mismatch."""
        body.setdefault("apiVersion", kind.api_version)
        body.setdefault("kind", kind.kind)
        if (body["apiVersion"], body["kind"]) != (kind.api_version, kind.kind):
            raise bad_request(
                f"the API version in the data ({body['apiVersion']}) or the kind ({body['kind']}) does not match "
                f"the expected API version ({kind.api_version}) and kind ({kind.kind})"
            )

    def _check_name(self, kind: Kind, name: Any) -> None:
        if not name:
            raise invalid(kind, "", [Problem("metadata.name", "Required value: name or generateName is required")])
        pattern, limit = (
            (_DNS_LABEL, 63)
            if kind.plural == "namespaces"
            else (_DNS_1035_LABEL, 63)
            if kind.plural == "services"
            else (_DNS_SUBDOMAIN, 253)
        )
        if not isinstance(name, str) or len(name) > limit or not pattern.fullmatch(name):
            message = f"Invalid value: {name!r}: must be a lowercase DNS name of at most {limit} characters"
            raise invalid(kind, str(name), [Problem("metadata.name", message)])

    def _check_namespace(self, namespace: str) -> None:
        ns = self._current(self.kind("namespaces"), None, namespace)
        if ns is None:
            raise not_found(self.kind("namespaces"), namespace)
        if ns["metadata"].get("deletionTimestamp"):
            message = f"unable to create new content in namespace {namespace} because it is being terminated"
            raise ApiError(403, "Forbidden", message, {"name": namespace, "kind": "namespaces"})

    def _generate_name(self, kind: Kind, namespace: str | None, prefix: str) -> str:
        while True:
            name = prefix[:58] + "".join(random.choices(_NAME_SUFFIX_ALPHABET, k=5))
            if self._current(kind, namespace, name) is None:
                return name

    # ----------------------------------------------------------------------------------------
    # CRDs
    # ----------------------------------------------------------------------------------------

    def _crd_status(self, crd: Body) -> Body:
        spec = crd.get("spec", {})
        now = _now()
        conditions = [
            {"type": "NamesAccepted", "status": "True", "reason": "NoConflicts", "lastTransitionTime": now},
            {"type": "Established", "status": "True", "reason": "InitialNamesAccepted", "lastTransitionTime": now},
        ]
        stored = [v["name"] for v in spec.get("versions", []) if v.get("storage")]
        return {"conditions": conditions, "acceptedNames": spec.get("names", {}), "storedVersions": stored}

    def _crd_kinds(self, crd: Body) -> list[Kind]:
        spec = crd.get("spec", {})
        names = spec.get("names", {})
        return [
            Kind(
                spec["group"],
                version["name"],
                names["plural"],
                names["kind"],
                namespaced=spec.get("scope") == "Namespaced",
                status="status" in version.get("subresources", {}),
                generation=True,
                custom=True,
                short_names=tuple(names.get("shortNames", ())),
                categories=tuple(names.get("categories", ())),
                schema=_with_implicit_fields(version.get("schema", {}).get("openAPIV3Schema") or {}),
            )
            for version in spec.get("versions", [])
            if version.get("served", True)
        ]

    def _register_crd(self, crd: Body) -> None:
        group, plural = crd["spec"]["group"], crd["spec"]["names"]["plural"]
        for kind in [k for k in self._kinds.values() if (k.group, k.plural) == (group, plural)]:
            self._unregister(kind)
        for kind in self._crd_kinds(crd):
            self._register(kind)

    # ----------------------------------------------------------------------------------------
    # Delete and garbage collection
    # ----------------------------------------------------------------------------------------

    def _delete(self, kind: Kind, namespace: str | None, name: str, options: Mapping[str, Any]) -> tuple[Body, bool]:
        """Delete or start deleting; returns (the object as it now is or last was, whether it is gone)."""
        old = self._require(kind, namespace, name)
        preconditions = options.get("preconditions") or {}
        for key in ("uid", "resourceVersion"):
            if preconditions.get(key) not in (None, old["metadata"][key]):
                why = f"Precondition failed: {key} in precondition: {preconditions[key]}, in object meta: "
                why += str(old["metadata"][key])
                raise conflict(kind, name, why)
        grace = options.get("gracePeriodSeconds")
        policy = options.get("propagationPolicy") or "Background"
        if policy not in ("Background", "Foreground", "Orphan"):
            raise invalid(kind, name, [Problem("propagationPolicy", f"Unsupported value: {policy!r}")])
        new = copy.deepcopy(old)
        meta = new["metadata"]
        if meta.get("deletionTimestamp"):
            if grace == 0 and meta.get("deletionGracePeriodSeconds"):  # the kubelet's final delete
                meta["deletionGracePeriodSeconds"] = 0
                return self._settle(kind, new, old)
            return old, False
        if policy == "Orphan":
            self._orphan_dependents(meta["uid"])
        if policy == "Foreground" and self._dependents(meta["uid"]):
            meta["finalizers"] = [*meta.get("finalizers", []), _FOREGROUND]
        if kind.plural == "pods" and self.hold_pod_deletion and grace != 0:  # graceful: until the kubelet is done
            grace = new.get("spec", {}).get("terminationGracePeriodSeconds", 30) if grace is None else grace
        else:
            grace = 0
        meta["deletionTimestamp"] = _now(grace)  # the time by which the object should be gone
        meta["deletionGracePeriodSeconds"] = grace
        if kind.plural == "namespaces":
            new["status"] = {"phase": "Terminating"}
        new, gone = self._settle(kind, new, old)
        if not gone and (policy == "Foreground" or kind.plural in ("namespaces", "customresourcedefinitions")):
            for dep_kind, dep in self._contents(kind, new):
                dep_meta = dep["metadata"]
                self._delete(dep_kind, dep_meta.get("namespace"), dep_meta["name"], {"propagationPolicy": policy})
            self._release(kind, namespace, name)
        current = self._current(kind, namespace, name)
        return (current, False) if current is not None else (new, True)

    def _settle(self, kind: Kind, new: Body, old: Body) -> tuple[Body, bool]:
        """Write a terminating object, or remove it if nothing holds it any more."""
        if self._removable(kind, new):
            return self._remove(kind, new), True
        return self._commit(kind, "MODIFIED", new, old), False

    def _removable(self, kind: Kind, obj: Body) -> bool:
        meta = obj["metadata"]
        blocked = bool(meta.get("finalizers")) or bool(meta.get("deletionGracePeriodSeconds"))
        if kind.plural == "namespaces":
            blocked = blocked or bool(obj.get("spec", {}).get("finalizers"))
        return bool(meta.get("deletionTimestamp")) and not blocked

    def _remove(self, kind: Kind, obj: Body) -> Body:
        """The object leaves the store; then the garbage collector and waiting owners/containers react."""
        meta = obj["metadata"]
        old = self._require(kind, meta.get("namespace"), meta["name"])
        gone = self._commit(kind, "DELETED", copy.deepcopy(obj), old)
        if kind.plural == "customresourcedefinitions":
            for crd_kind in self._crd_kinds(obj):
                self._unregister(crd_kind)
        self._collect_garbage(meta["uid"])
        for owner in meta.get("ownerReferences", []):
            self._release_foreground_owner(str(owner.get("uid")))
        if kind.namespaced:
            self._release(self.kind("namespaces"), None, meta["namespace"])
        elif kind.custom:
            for crd in self._objects_of(self.kind("customresourcedefinitions")):
                if (crd["spec"]["group"], crd["spec"]["names"]["plural"]) == (kind.group, kind.plural):
                    self._release(self.kind("customresourcedefinitions"), None, crd["metadata"]["name"])
        return gone

    def _contents(self, kind: Kind, obj: Body) -> list[tuple[Kind, Body]]:
        """What deleting ``obj`` deletes too: a namespace's objects, a CRD's resources, foreground dependents."""
        if kind.plural == "namespaces":
            name = obj["metadata"]["name"]
            return [(k, o) for k, o in self._all_objects() if k.namespaced and o["metadata"]["namespace"] == name]
        if kind.plural == "customresourcedefinitions":
            kinds = set(self._crd_kinds(obj))
            return [(k, o) for k, o in self._all_objects() if k in kinds]
        return self._dependents(obj["metadata"]["uid"])

    def _release(self, kind: Kind, namespace: str | None, name: str) -> None:
        """Drop a terminating namespace's or CRD's own finalizer once its contents are gone."""
        obj = self._current(kind, namespace, name)
        if obj is None or not obj["metadata"].get("deletionTimestamp") or self._contents(kind, obj):
            return
        new = copy.deepcopy(obj)
        if kind.plural == "namespaces":
            new["spec"]["finalizers"] = [f for f in new["spec"].get("finalizers", []) if f != _NAMESPACE_FINALIZER]
        elif kind.plural == "customresourcedefinitions":
            new["metadata"]["finalizers"] = [f for f in new["metadata"].get("finalizers", []) if f != _CRD_FINALIZER]
        if new != obj:
            self._update(kind, namespace, name, new, None, "Ignore")

    def _dependents(self, uid: str, *, blocking_only: bool = False) -> list[tuple[Kind, Body]]:
        return [
            (kind, obj)
            for kind, obj in self._all_objects()
            if any(
                ref.get("uid") == uid and (ref.get("blockOwnerDeletion") or not blocking_only)
                for ref in obj["metadata"].get("ownerReferences", [])
            )
        ]

    def _drop_owner(self, kind: Kind, obj: Body, uid: str) -> None:
        meta = obj["metadata"]
        refs = [ref for ref in meta["ownerReferences"] if ref.get("uid") != uid]
        self._patch(
            kind,
            meta.get("namespace"),
            meta["name"],
            MERGE_PATCH,
            {"metadata": {"ownerReferences": refs or None}},
            None,
            "Ignore",
        )

    def _collect_garbage(self, uid: str) -> None:
        """Background propagation: dependents left without a live owner are deleted; others lose the reference."""
        live = {obj["metadata"]["uid"] for _, obj in self._all_objects()}
        for kind, obj in self._dependents(uid):
            meta = obj["metadata"]
            if any(ref.get("uid") in live for ref in meta["ownerReferences"]):
                self._drop_owner(kind, obj, uid)
            elif self._current(kind, meta.get("namespace"), meta["name"]) is not None:
                self._delete(kind, meta.get("namespace"), meta["name"], {})

    def _orphan_dependents(self, uid: str) -> None:
        for kind, obj in self._dependents(uid):
            self._drop_owner(kind, obj, uid)

    def _release_foreground_owner(self, uid: str) -> None:
        for kind, owner in self._all_objects():
            meta = owner["metadata"]
            waiting = meta["uid"] == uid and _FOREGROUND in meta.get("finalizers", [])
            if waiting and not self._dependents(uid, blocking_only=True):
                patch = {"metadata": {"finalizers": [f for f in meta["finalizers"] if f != _FOREGROUND]}}
                self._patch(kind, meta.get("namespace"), meta["name"], MERGE_PATCH, patch, None, "Ignore")

    # ----------------------------------------------------------------------------------------
    # List and watch
    # ----------------------------------------------------------------------------------------

    def _matcher(
        self,
        kind: Kind,
        namespace: str | None,
        name: str | None,
        labels: str | Mapping[str, str] | None,
        fields: str | Mapping[str, str] | None,
    ) -> Callable[[Body], bool]:
        match_labels, match_fields = label_selector(labels), field_selector(kind, fields)
        return lambda obj: (
            (namespace is None or obj["metadata"].get("namespace") == namespace)
            and (name is None or obj["metadata"]["name"] == name)
            and match_labels(obj["metadata"].get("labels") or {})
            and match_fields(obj)
        )

    def _list(self, kind: Kind, namespace: str | None, params: Mapping[str, str]) -> Body:
        matches = self._matcher(kind, namespace, None, params.get("labelSelector"), params.get("fieldSelector"))
        items = [obj for obj in self._objects_of(kind, namespace) if matches(obj)]
        rv, after = self._rv, None
        if token := params.get("continue"):
            try:
                state = json.loads(base64.urlsafe_b64decode(token))
                rv, after = int(state["rv"]), tuple(state["after"])
            except (ValueError, KeyError, TypeError):
                raise ApiError(410, "Expired", "The provided continue parameter is too old or malformed") from None
            items = [o for o in items if (o["metadata"].get("namespace") or "", o["metadata"]["name"]) > after]
        metadata: Body = {"resourceVersion": str(rv)}
        limit = int(params.get("limit") or 0)
        if 0 < limit < len(items):
            last = items[limit - 1]["metadata"]
            state = {"rv": rv, "after": [last.get("namespace") or "", last["name"]]}
            metadata.update(
                {"continue": base64.urlsafe_b64encode(json.dumps(state).encode()).decode()},
                remainingItemCount=len(items) - limit,
            )
            items = items[:limit]
        if not kind.custom:  # typed lists carry kind/apiVersion on the list only, unstructured ones on each item
            items = [{k: v for k, v in obj.items() if k not in ("apiVersion", "kind")} for obj in items]
        return {"kind": f"{kind.kind}List", "apiVersion": kind.api_version, "metadata": metadata, "items": items}

    async def _watch(self, kind: Kind, route: Route, params: Mapping[str, str], request: kmock.Request) -> NoReturn:
        """Stream watch events as JSON lines until the timeout, the client leaving, or :meth:`drop_watches`."""
        matches = self._matcher(
            kind, route.namespace, route.name, params.get("labelSelector"), params.get("fieldSelector")
        )
        since = params.get("resourceVersion") or "0"
        bookmarks = _flag(params.get("allowWatchBookmarks"))
        initial_events = _flag(params.get("sendInitialEvents"))
        timeout = params.get("timeoutSeconds")
        if not since.isdigit() or not (timeout or "0").isdigit():
            raise bad_request(f"invalid resourceVersion {since!r} or timeoutSeconds {timeout!r}")
        watcher = _Watcher(kind, matches)
        events: list[Body] = []
        if since == "0" or initial_events:
            events = [{"type": "ADDED", "object": obj} for obj in self._objects_of(kind) if matches(obj)]
            if initial_events and bookmarks:
                events.append(self._bookmark(kind, {"k8s.io/initial-events-end": "true"}))
        elif int(since) < self._compacted_rv:
            gone = ApiError(410, "Expired", f"too old resource version: {since} ({self._compacted_rv})")
            events = [{"type": "ERROR", "object": gone.body()}]
            watcher.queue.put_nowait(None)
        else:
            for past in self._history:
                if past.rv > int(since) and past.kind == kind and (event := _event_for(past, matches)):
                    events.append(event)
        floor = self._rv
        self._watchers.add(watcher)
        self.notify()
        assert request._raw_request is not None  # only None for requests built by hand
        response = aiohttp.web.StreamResponse(headers={"Content-Type": "application/json"})
        try:
            await response.prepare(request._raw_request)
            self._calls[request.id].status = 200
            for event in events:
                await response.write(json.dumps(event).encode() + b"\n")
            async with asyncio.timeout(int(timeout) if timeout else None):
                while True:
                    try:
                        change: _Change | None = await asyncio.wait_for(watcher.queue.get(), self.bookmark_interval)
                    except TimeoutError:
                        if bookmarks:
                            await response.write(json.dumps(self._bookmark(kind)).encode() + b"\n")
                        continue
                    if change is None:
                        break
                    if change.rv > floor and change.kind == kind and (event := _event_for(change, matches)):
                        await response.write(json.dumps(event).encode() + b"\n")
        except (TimeoutError, ConnectionResetError):
            pass  # the server-side timeout, or the client has gone
        finally:
            self._watchers.discard(watcher)
            self.notify()
        with contextlib.suppress(ConnectionResetError):
            await response.write_eof()
        raise _Reply(response)

    def _bookmark(self, kind: Kind, annotations: Mapping[str, str] | None = None) -> Body:
        """A BOOKMARK event: the stream is current up to this resourceVersion."""
        meta: Body = {"resourceVersion": str(self._rv), **({"annotations": dict(annotations)} if annotations else {})}
        return {"type": "BOOKMARK", "object": {"kind": kind.kind, "apiVersion": kind.api_version, "metadata": meta}}

    # ----------------------------------------------------------------------------------------
    # HTTP
    # ----------------------------------------------------------------------------------------

    async def __call__(self, raw_request: aiohttp.web.BaseRequest) -> aiohttp.web.StreamResponse:
        """aiohttp's entry point. Replaces kmock's only to parse requests with :func:`parse_route`.

        kmock 0.8's path parser raises ValueError on ``/api/v1/namespaces`` (kopf lists namespaces), which kmock
        answers with a 500 before any reaction sees the request.
        """
        # Bodies of up to the API server's limit (aiohttp's default is 1 MiB): a pod of 2 MiB is a pod.
        raw_request = raw_request.clone(client_max_size=MAX_REQUEST_BYTES)
        body = await raw_request.read()
        route = parse_route(raw_request.path)
        group_only = re.fullmatch(r"/apis/([^/]+)/?", raw_request.path)
        resource = (
            kmock.resource(group=route.group, version=route.version, plural=route.plural)
            if route
            else kmock.resource(group=group_only[1])
            if group_only
            else None
        )
        try:
            data = json.loads(body) if body else None
        except ValueError:
            data = None
        params = dict(raw_request.query)
        verb = verb_of(raw_request.method, route, params)
        request = kmock.Request(
            id=len(self._requests),
            raw_request=raw_request,
            url=raw_request.url,
            method=raw_request.method,
            params=params,
            headers=dict(raw_request.headers),
            cookies=dict(raw_request.cookies),
            body=body,
            text=body.decode("utf-8", "replace"),
            data=data,
            action=_ACTIONS.get(verb or ""),
            resource=resource,
            namespace=route.namespace if route else None,
            name=route.name if route else None,
            subresource=route.subresource if route else None,
        )
        self._requests.append(request)
        try:
            return await self._handle(request)
        except Exception as exc:  # an emulator bug: recorded so that kmock's strict mode fails the test
            if self._errors:
                self._errors[-1].append(exc)
            return aiohttp.web.json_response(ApiError(500, "InternalError", repr(exc)).body(), status=500)
        finally:
            if not self.keep_requests:
                self._forget(request)

    def _forget(self, request: kmock.Request) -> None:
        """Drop an answered request from kmock's request lists (see ``keep_requests``)."""
        for holder in (self, *self._payloads):
            requests = holder._requests
            for i in range(len(requests) - 1, -1, -1):
                if requests[i] is request:
                    del requests[i]
                    break

    async def _handle(self, request: kmock.Request) -> aiohttp.web.StreamResponse:
        route = parse_route(request.url.path)
        call = Call(
            method=request.method.value,
            path=request.url.path,
            params=dict(request.params),
            verb=verb_of(request.method.value, route, request.params),
            group=route.group if route and route.plural else None,
            resource=route.plural if route else None,
            subresource=route.subresource if route else None,
            namespace=route.namespace if route else None,
            name=route.name if route else None,
            content_type=request.headers.get("Content-Type"),
        )
        self.log.append(call)
        self._calls[request.id] = call
        response: aiohttp.web.StreamResponse
        try:
            fault = next((f for f in self._faults if f.matches(call)), None)
            if fault is not None:
                fault.hits += 1
                call.fault = True
                response = self._error_response(fault.error(call))
            else:
                try:
                    # Past KubernetesEmulator._handle (kmock's simplistic state tracking) to the DSL dispatch:
                    # scripted reactions first, then discovery, then _serve_resource.
                    response = await super(kmock.KubernetesEmulator, self)._handle(request)
                except _Reply as reply:
                    response = reply.response
                except kmock.KubernetesError as exc:  # kmock's discovery answers 404 for unknown groups
                    message = "the server could not find the requested resource"
                    response = self._error_response(ApiError(exc.status, "NotFound", message))
            call.status = response.status
            return response
        finally:
            del self._calls[request.id]
            self.notify()

    def _is_api_request(self, request: kmock.Request) -> bool:
        route = parse_route(request.url.path)
        return route is not None and route.plural is not None

    async def _serve_resource(self, request: kmock.Request) -> NoReturn:
        route = parse_route(request.url.path)
        assert route is not None  # guaranteed by _is_api_request
        assert route.plural is not None
        params = dict(request.params)
        verb = verb_of(request.method.value, route, params)
        try:
            kind = self._kinds.get((route.group, route.version, route.plural))
            if kind is None or (route.namespace is not None and not kind.namespaced):
                raise ApiError(404, "NotFound", "the server could not find the requested resource")
            if route.plural == "pods" and route.subresource == "log" and route.name and verb == "get":
                text = self._pod_log(route.namespace, route.name, params)
                raise _Reply(aiohttp.web.Response(text=text, content_type="text/plain"))
            if route.subresource not in (None, "status") or (route.subresource and not kind.status):
                raise ApiError(404, "NotFound", "the server could not find the requested resource")
            if verb == "watch":
                await self._watch(kind, route, params, request)
            body, code, warnings = self._serve_verb(verb, kind, route, params, request)
            response: aiohttp.web.StreamResponse = aiohttp.web.json_response(body, status=code)
            for warning in warnings:
                response.headers.add("Warning", f'299 - "{warning}"')
        except ApiError as exc:
            response = self._error_response(exc)
        raise _Reply(response)

    def _serve_verb(
        self, verb: str | None, kind: Kind, route: Route, params: Mapping[str, str], request: kmock.Request
    ) -> tuple[Body, int, list[str]]:
        namespace, name = (route.namespace if kind.namespaced else None), route.name
        if kind.namespaced and namespace is None and verb not in ("list", "deletecollection"):
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        validation = params.get("fieldValidation", "Warn")
        if validation not in ("Ignore", "Warn", "Strict"):
            raise bad_request(f"fieldValidation must be one of Ignore, Warn, Strict; got {validation!r}")
        data = _json_body(request.body)
        if verb == "get":
            return self._require(kind, namespace, name or ""), 200, []
        if verb == "list":
            return self._list(kind, namespace, params), 200, []
        if verb == "create" and name is None:
            dry_run = params.get("dryRun")
            if dry_run not in (None, "All"):
                message = f'CreateOptions.meta.k8s.io "" is invalid: dryRun: Unsupported value: ["{dry_run}"]: '
                raise ApiError(422, "Invalid", message + 'supported values: "All"')
            obj, warnings = self._create(kind, namespace, data, validation, dry_run=dry_run == "All")
            return obj, 201, warnings
        if verb == "update" and name:
            obj, warnings = self._update(kind, namespace, name, data, route.subresource, validation, put=True)
            return obj, 200, warnings
        if verb == "patch" and name:
            content_type = (request.headers.get("Content-Type") or "").split(";")[0].strip()
            obj, warnings = self._patch(kind, namespace, name, content_type, data, route.subresource, validation)
            return obj, 200, warnings
        if verb == "delete" and name and route.subresource is None:
            options = {**(data if isinstance(data, dict) else {}), **_delete_params(params)}
            obj, removed = self._delete(kind, namespace, name, options)
            return (obj if not removed or kind.custom or kind.plural == "pods" else _success(kind, obj)), 200, []
        if verb == "deletecollection":
            matches = self._matcher(kind, namespace, None, params.get("labelSelector"), params.get("fieldSelector"))
            options = {**(data if isinstance(data, dict) else {}), **_delete_params(params)}
            for obj in [o for o in self._objects_of(kind, namespace) if matches(o)]:
                self._delete(kind, obj["metadata"].get("namespace"), obj["metadata"]["name"], options)
            return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success"}, 200, []
        raise ApiError(405, "MethodNotAllowed", f"{request.method.value} is not supported on {request.url.path}")

    def _error_response(self, error: ApiError) -> aiohttp.web.Response:
        return aiohttp.web.json_response(error.body(), status=error.code, headers=error.headers)


_ACTIONS = {
    "get": kmock.action.FETCH,
    "list": kmock.action.LIST,
    "watch": kmock.action.WATCH,
    "create": kmock.action.CREATE,
    "update": kmock.action.UPDATE,
    "patch": kmock.action.UPDATE,
    "delete": kmock.action.DELETE,
}


def default_pod(pod: Body) -> None:
    """Fill in the defaults the API server gives every pod it stores (see also :func:`admit_pod`).

    An operator that compares the pod it wants with the stored one meets these differences in a cluster, so it
    must meet them here too. Not added: priority (needs PriorityClasses), node affinity, runtime-class overhead.
    """
    spec = pod.setdefault("spec", {})
    for key, value in (
        ("restartPolicy", "Always"),
        ("terminationGracePeriodSeconds", 30),
        ("dnsPolicy", "ClusterFirst"),
        ("securityContext", {}),
        ("schedulerName", "default-scheduler"),
        ("enableServiceLinks", True),
        ("serviceAccountName", "default"),
    ):
        spec.setdefault(key, value)
    spec.setdefault("serviceAccount", spec["serviceAccountName"])
    for container in [*spec.get("initContainers", []), *spec.get("containers", [])]:
        tag = container.get("image", "").rsplit("/", 1)[-1]
        latest = ":" not in tag or tag.endswith(":latest")
        container.setdefault("imagePullPolicy", "Always" if latest else "IfNotPresent")
        container.setdefault("terminationMessagePath", "/dev/termination-log")
        container.setdefault("terminationMessagePolicy", "File")
        resources = container.setdefault("resources", {})
        for resource, limit in resources.get("limits", {}).items():  # requests default to limits
            resources.setdefault("requests", {}).setdefault(resource, limit)
        for port in container.get("ports", []):
            port.setdefault("protocol", "TCP")


def admit_pod(pod: Body) -> None:
    """What standard admission plugins add to a pod on create: DefaultTolerationSeconds' tolerations and the
    ServiceAccount plugin's token volume, mounted in every container."""
    spec = pod["spec"]
    tolerations = spec.setdefault("tolerations", [])
    for taint in ("node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable"):
        if not any(t.get("key") == taint for t in tolerations):
            tolerations.append({"key": taint, "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300})
    if spec.get("automountServiceAccountToken", True):
        volume = "kube-api-access-" + "".join(random.choices(_NAME_SUFFIX_ALPHABET, k=5))
        sources = [{"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}}]
        spec.setdefault("volumes", []).append({"name": volume, "projected": {"defaultMode": 420, "sources": sources}})
        for container in [*spec.get("initContainers", []), *spec.get("containers", [])]:
            mount = {"name": volume, "readOnly": True, "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount"}
            container.setdefault("volumeMounts", []).append(mount)


def default_service(service: Body, cluster_ip: str) -> None:
    """Fill in what the API server adds to a new Service, including a cluster IP unless it is headless."""
    spec = service.setdefault("spec", {})
    spec.setdefault("type", "ClusterIP")
    spec.setdefault("sessionAffinity", "None")
    spec.setdefault("internalTrafficPolicy", "Cluster")
    if spec.get("clusterIP") != "None":
        spec.setdefault("clusterIP", cluster_ip)
    spec.setdefault("clusterIPs", [spec["clusterIP"]])
    for port in spec.get("ports", []):
        port.setdefault("protocol", "TCP")
        port.setdefault("targetPort", port.get("port"))


def _pod_spec_view(spec: Body, old: Body) -> Body:
    """The part of a pod's spec that no update may change (images, deadlines and tolerations may; nodeName may
    be set once, as the scheduler's binding does)."""
    view = copy.deepcopy(spec)
    for key in ("activeDeadlineSeconds", "tolerations", "schedulingGates"):
        view.pop(key, None)
    if not old.get("spec", {}).get("nodeName"):
        view.pop("nodeName", None)
    for container in [*view.get("initContainers", []), *view.get("containers", [])]:
        container.pop("image", None)
    return view


def _json_body(body: bytes) -> Any:
    if not body:
        return None

    def not_json(constant: str) -> Any:
        raise ValueError(f"{constant} is not a JSON value")

    try:
        # The apiserver's decoder is Go's: NaN and Infinity (which Python's json writes) are errors.
        return json.loads(body, parse_constant=not_json)
    except ValueError as exc:
        raise bad_request(f"the body of the request is not JSON: {exc}") from None


def _delete_params(params: Mapping[str, str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if "gracePeriodSeconds" in params:
        if not params["gracePeriodSeconds"].isdigit():
            raise bad_request(f"invalid gracePeriodSeconds {params['gracePeriodSeconds']!r}")
        out["gracePeriodSeconds"] = int(params["gracePeriodSeconds"])
    if "propagationPolicy" in params:
        out["propagationPolicy"] = params["propagationPolicy"]
    return out


def _success(kind: Kind, obj: Body) -> Body:
    details = {**_named(kind, obj["metadata"]["name"]), "uid": obj["metadata"]["uid"]}
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "details": details}


def _with_implicit_fields(schema: Mapping[str, Any]) -> Body:
    """A CRD schema need not declare apiVersion, kind and metadata: the API server implies them."""
    implicit = {"apiVersion": {"type": "string"}, "kind": {"type": "string"}, "metadata": {"type": "object"}}
    return {**schema, "type": "object", "properties": {**implicit, **schema.get("properties", {})}}


def _key(kind: Kind) -> tuple[str, str, str]:
    return (kind.group, kind.version, kind.plural)


def _strip(obj: Body, kind: Kind) -> Body:
    """What counts for metadata.generation: everything but metadata (and status where it is a subresource)."""
    return {k: v for k, v in obj.items() if k != "metadata" and not (kind.status and k == "status")}


def _event_for(change: _Change, matches: Callable[[Body], bool]) -> Body | None:
    """The event a watch with this selector sees: objects entering or leaving the selector are ADDED/DELETED."""
    now = change.type != "DELETED" and matches(change.obj)
    before = change.old is not None and matches(change.old) if change.type != "ADDED" else False
    if change.type == "DELETED":
        kind = "DELETED" if matches(change.obj) else None
    else:
        kind = {(True, True): "MODIFIED", (True, False): "ADDED", (False, True): "DELETED"}.get((now, before))
    return {"type": kind, "object": change.obj} if kind else None
