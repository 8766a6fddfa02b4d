"""The client of the API server for the user's verbs (`kubedgx usage`, `submit`, `logs`, ...) and
the Python client, with the user's kubeconfig, in the standard library (and PyYAML) only.

Why not the operator's client (``kube.py``): it runs on aiohttp and logs in through kopf, the
daemon's dependencies, and `pip install kubedgx` must give a working user CLI without them
(tests/unit/test_cli_without_daemon.py). The verbs make a few calls and
follow two kinds of stream (a watch, a pod's log), so plain ``urllib`` does.

What it understands of a kubeconfig, as kubectl does: ``--kubeconfig``, else ``KUBECONFIG`` (files
separated by the path separator, merged: the first file to name a cluster, user or context, or the
current context, wins), else ``~/.kube/config``; the context given, else the current one, and its
namespace (``default`` when it names none); a cluster's ``server``, ``certificate-authority(-data)``,
``insecure-skip-tls-verify`` and ``tls-server-name``; a user's ``token``, ``tokenFile``,
``client-certificate(-data)`` and ``client-key(-data)``, ``username``/``password``, an ``exec``
plugin (EKS, GKE, AKS, OIDC helpers) and an OIDC ``auth-provider``'s ``id-token``. Without a
kubeconfig, inside a pod, the pod's ServiceAccount. Anything else is a :class:`ClusterError` that
says what to do: a report must never end in a traceback.
"""

from __future__ import annotations

import base64
import json
import os
import ssl
import subprocess
import tempfile
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from dgx_operator.client.errors import ClientError

SERVICE_ACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
#: Seconds one call may take: a report waits for no hung server.
TIMEOUT_S = 30.0


class ClusterError(ClientError):
    """The cluster cannot be read: no kubeconfig, an unknown context, a server that does not answer,
    credentials it refuses. The message is for the user, with the fix where there is one."""


class NotFoundError(ClusterError):
    """The API server answered 404: the resource is not served (its CRD is not installed)."""


class ConflictError(ClusterError):
    """The API server answered 409: the object exists already (create) or changed meanwhile."""


class ForbiddenError(ClusterError):
    """The API server answered 403: the user's role does not allow it."""


class InvalidError(ClusterError):
    """The API server (or the admission webhook) refused the object: 400 or 422, with its message."""


@dataclass
class Client:
    """One context's server, credentials and default namespace.

    ``warnings`` collects the ``Warning`` headers the server answered with (the admission webhook's
    warnings, deprecations), in order, for the caller to show as kubectl does."""

    server: str
    namespace: str
    context: str
    headers: dict[str, str] = field(default_factory=dict)
    ssl_context: ssl.SSLContext | None = None
    warnings: list[str] = field(default_factory=list)

    def _url(self, path: str, query: Mapping[str, str] | None) -> str:
        return self.server + path + ("?" + urllib.parse.urlencode(query) if query else "")

    def _open(
        self,
        method: str,
        path: str,
        *,
        query: Mapping[str, str] | None = None,
        body: Any = None,
        content_type: str = "application/json",
        accept: str = "application/json",
        timeout: float | None = TIMEOUT_S,
    ) -> Any:
        """The open response of one call; an HTTP or network failure as the :class:`ClusterError`
        that says what happened and, where there is one, the fix."""
        data = None if body is None else json.dumps(body).encode("utf-8")
        headers = {**self.headers, "Accept": accept}
        if data is not None:
            headers["Content-Type"] = content_type
        request = urllib.request.Request(self._url(path, query), data=data, headers=headers, method=method)
        try:
            answer = urllib.request.urlopen(request, timeout=timeout, context=self.ssl_context)
        except urllib.error.HTTPError as exc:
            self._collect_warnings(exc.headers)
            raise self._error(exc, path) from None
        except (urllib.error.URLError, OSError, ValueError) as exc:
            reason = getattr(exc, "reason", exc)
            raise ClusterError(
                f"cannot reach the API server at {self.server} (context {self.context!r}): {reason}"
            ) from None
        self._collect_warnings(answer.headers)
        return answer

    def _collect_warnings(self, headers: Any) -> None:
        for value in headers.get_all("Warning") or [] if headers is not None else []:
            # RFC 7234: `299 - "text"`; kubectl shows the text alone.
            text = str(value)
            if text.startswith("299 ") and '"' in text:
                text = text[text.index('"') + 1 : text.rindex('"')] if text.count('"') >= 2 else text
            self.warnings.append(text.replace('\\"', '"'))

    def _error(self, exc: urllib.error.HTTPError, path: str) -> ClusterError:
        message = _status_message(exc)
        if exc.code == 404:
            return NotFoundError(f"{path}: not found ({message})")
        if exc.code == 401:
            return ClusterError(
                f"the API server at {self.server} refused the credentials of context {self.context!r} "
                f"(401 Unauthorized: {message}): log in again, as for kubectl"
            )
        if exc.code == 403:
            return ForbiddenError(f"forbidden (403): {message}")
        if exc.code == 409:
            return ConflictError(message)
        if exc.code in (400, 422):
            return InvalidError(message)
        return ClusterError(f"the API server at {self.server} answered {exc.code}: {message}")

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        query: Mapping[str, str] | None = None,
        content_type: str = "application/json",
    ) -> dict[str, Any]:
        """One call answered with JSON (an object, or ``{}``)."""
        with self._open(method, path, query=query, body=body, content_type=content_type) as answer:
            try:
                found = json.loads(answer.read() or b"{}")
            except (ValueError, OSError) as exc:
                raise ClusterError(f"the API server at {self.server} answered {path} with no JSON: {exc}") from None
        return found if isinstance(found, dict) else {}

    def get(self, path: str, query: Mapping[str, str] | None = None) -> dict[str, Any]:
        """``GET path`` as JSON. 404 raises :class:`NotFoundError`; any other failure :class:`ClusterError`."""
        return self.request("GET", path, query=query)

    def create(self, path: str, body: Mapping[str, Any], dry_run: bool = False) -> dict[str, Any]:
        """``POST`` the object to its collection; the stored object comes back."""
        return self.request("POST", path, dict(body), query={"dryRun": "All"} if dry_run else None)

    def merge_patch(self, path: str, patch: Mapping[str, Any]) -> dict[str, Any]:
        return self.request("PATCH", path, dict(patch), content_type="application/merge-patch+json")

    def delete(self, path: str, propagation: str = "Background") -> dict[str, Any]:
        return self.request(
            "DELETE", path, {"kind": "DeleteOptions", "apiVersion": "v1", "propagationPolicy": propagation}
        )

    def text(self, path: str, query: Mapping[str, str] | None = None) -> str:
        """``GET path`` as text (a pod's log)."""
        with self._open("GET", path, query=query, accept="*/*") as answer:
            return bytes(answer.read()).decode("utf-8", errors="replace")

    def lines(self, path: str, query: Mapping[str, str] | None = None, timeout: float | None = None) -> Iterator[str]:
        """The lines of a streamed answer (``follow=true`` logs, a watch) as they come, without their
        newline; ends when the server ends the stream. ``timeout``: the longest silence tolerated
        (None: wait as long as the server keeps the stream open)."""
        with self._open("GET", path, query=query, accept="*/*", timeout=timeout) as answer:
            pending = b""
            while True:
                try:
                    chunk = answer.read1(65536) if hasattr(answer, "read1") else answer.readline()
                except (OSError, ValueError) as exc:
                    raise ClusterError(f"the stream of {path} from {self.server} broke: {exc}") from None
                if not chunk:
                    break
                pending += chunk
                *whole, pending = pending.split(b"\n")
                for line in whole:
                    yield line.decode("utf-8", errors="replace").rstrip("\r")
            if pending:
                yield pending.decode("utf-8", errors="replace").rstrip("\r")

    def watch(
        self, path: str, query: Mapping[str, str] | None = None, timeout_s: int = 300
    ) -> Iterator[dict[str, Any]]:
        """The events of ``GET path?watch=1`` ({"type", "object"}) for at most ``timeout_s``: the
        server ends the watch then, and the caller lists again (as client-go's reflector does)."""
        params = {**(query or {}), "watch": "1", "timeoutSeconds": str(timeout_s), "allowWatchBookmarks": "false"}
        for line in self.lines(path, params, timeout=timeout_s + 30):
            if not line.strip():
                continue
            try:
                event = json.loads(line)
            except ValueError:
                continue
            if isinstance(event, dict) and isinstance(event.get("object"), dict):
                if event.get("type") == "ERROR":
                    raise ClusterError(f"watch of {path}: {event['object'].get('message')}")
                yield event

    def list(
        self, path: str, label_selector: str | None = None, field_selector: str | None = None
    ) -> list[dict[str, Any]]:
        """Every item of a list, following ``continue`` tokens."""
        items: list[dict[str, Any]] = []
        query: dict[str, str] = {"limit": "500"}
        if label_selector:
            query["labelSelector"] = label_selector
        if field_selector:
            query["fieldSelector"] = field_selector
        while True:
            page = self.get(path, query)
            items += [i for i in page.get("items") or [] if isinstance(i, dict)]
            token = (page.get("metadata") or {}).get("continue")
            if not token:
                return items
            query["continue"] = token


def _status_message(exc: urllib.error.HTTPError) -> str:
    """The ``message`` of the Status the server answered with, else the HTTP reason."""
    try:
        body = json.loads(exc.read() or b"{}")
    except (ValueError, OSError):
        body = {}
    message = body.get("message") if isinstance(body, dict) else None
    return str(message or exc.reason)


# -- the kubeconfig --------------------------------------------------------------------------------


def _config_paths(kubeconfig: str | None, environ: Mapping[str, str]) -> list[Path]:
    if kubeconfig:
        path = Path(kubeconfig).expanduser()
        if not path.is_file():
            raise ClusterError(f"--kubeconfig {kubeconfig}: no such file")
        return [path]
    listed = [Path(p).expanduser() for p in environ.get("KUBECONFIG", "").split(os.pathsep) if p]
    if listed:
        return [p for p in listed if p.is_file()]
    home = Path(environ.get("HOME", "~")).expanduser() / ".kube" / "config"
    return [home] if home.is_file() else []


@dataclass
class _Merged:
    """Named entries by kind, with the directory of the file that named each (relative paths)."""

    current: str | None = None
    entries: dict[str, dict[str, tuple[dict[str, Any], Path]]] = field(
        default_factory=lambda: {"clusters": {}, "users": {}, "contexts": {}}
    )


def _merge(paths: list[Path]) -> _Merged:
    merged = _Merged()
    for path in paths:
        try:
            document = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
        except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
            raise ClusterError(f"kubeconfig {path}: cannot read it: {exc}") from None
        if not isinstance(document, dict):
            raise ClusterError(f"kubeconfig {path}: not a kubeconfig (a YAML mapping with clusters, users, contexts)")
        current = document.get("current-context")
        merged.current = merged.current or (current if isinstance(current, str) and current else None)
        for kind, key in (("clusters", "cluster"), ("users", "user"), ("contexts", "context")):
            listed = document.get(kind)
            for entry in listed if isinstance(listed, list) else []:
                if isinstance(entry, dict) and isinstance(entry.get("name"), str):
                    found = entry.get(key)
                    body: dict[str, Any] = found if isinstance(found, dict) else {}
                    merged.entries[kind].setdefault(entry["name"], (body, path.parent))
    return merged


def load(kubeconfig: str | None = None, context: str | None = None, environ: Mapping[str, str] | None = None) -> Client:
    """The client of ``context`` (else the current one) of the kubeconfig kubectl would read."""
    env = os.environ if environ is None else environ
    paths = _config_paths(kubeconfig, env)
    if not paths:
        in_pod = _in_cluster(env)
        if in_pod is not None and context is None:
            return in_pod
        raise ClusterError(
            "no kubeconfig: pass --kubeconfig FILE, set KUBECONFIG or write ~/.kube/config (as for kubectl)"
        )
    merged = _merge(paths)
    name = context or merged.current
    if not name:
        raise ClusterError("the kubeconfig has no current context: pass --context NAME (kubectl config get-contexts)")
    if name not in merged.entries["contexts"]:
        known = ", ".join(sorted(merged.entries["contexts"])) or "none"
        raise ClusterError(f"--context {name}: no such context in the kubeconfig (it has: {known})")
    ctx, _ = merged.entries["contexts"][name]
    cluster_name, user_name = ctx.get("cluster"), ctx.get("user")
    if cluster_name not in merged.entries["clusters"]:
        raise ClusterError(f"context {name!r} names cluster {cluster_name!r}, which the kubeconfig lacks")
    cluster, cluster_dir = merged.entries["clusters"][cluster_name]
    user, user_dir = merged.entries["users"].get(str(user_name), ({}, paths[0].parent))
    server = str(cluster.get("server") or "").rstrip("/")
    if not server.startswith(("https://", "http://")):
        raise ClusterError(f"cluster {cluster_name!r} of the kubeconfig has no server URL")
    client = Client(server=server, namespace=str(ctx.get("namespace") or "default"), context=name)
    credentials = _credentials(user, user_dir, str(user_name), env)
    if server.startswith("https://"):
        client.ssl_context = _ssl_context(cluster, cluster_dir, credentials)
    if credentials.token:
        client.headers["Authorization"] = f"Bearer {credentials.token}"
    elif credentials.basic:
        client.headers["Authorization"] = "Basic " + base64.b64encode(credentials.basic.encode()).decode()
    return client


@dataclass
class _Credentials:
    token: str | None = None
    basic: str | None = None
    certificate: bytes | None = None
    key: bytes | None = None


def _data(entry: Mapping[str, Any], key: str, directory: Path) -> bytes | None:
    """``key-data`` (base64) or the file ``key`` names (relative to the kubeconfig's directory)."""
    if entry.get(f"{key}-data"):
        try:
            return base64.b64decode(str(entry[f"{key}-data"]), validate=True)
        except ValueError:
            raise ClusterError(f"kubeconfig: {key}-data is not base64") from None
    if entry.get(key):
        path = directory / str(entry[key])
        try:
            return path.read_bytes()
        except OSError as exc:
            raise ClusterError(f"kubeconfig: {key} {path}: {exc.strerror}") from None
    return None


def _credentials(user: Mapping[str, Any], directory: Path, name: str, environ: Mapping[str, str]) -> _Credentials:
    found = _Credentials(
        certificate=_data(user, "client-certificate", directory), key=_data(user, "client-key", directory)
    )
    if user.get("token"):
        found.token = str(user["token"])
    elif user.get("tokenFile"):
        try:
            found.token = (directory / str(user["tokenFile"])).read_text(encoding="utf-8").strip()
        except OSError as exc:
            raise ClusterError(f"user {name!r}: tokenFile {user['tokenFile']}: {exc.strerror}") from None
    elif user.get("username") is not None and user.get("password") is not None:
        found.basic = f"{user['username']}:{user['password']}"
    elif isinstance(user.get("exec"), dict):
        found = _exec(user["exec"], name, environ, found)
    elif isinstance(user.get("auth-provider"), dict):
        provider = user["auth-provider"]
        token = (provider.get("config") or {}).get("id-token")
        if not token:
            raise ClusterError(
                f"user {name!r} logs in through auth-provider {provider.get('name')!r}, which kubedgx does not run: "
                "switch to its exec plugin (kubectl dropped auth-providers in 1.26), or pass a kubeconfig with a token"
            )
        found.token = str(token)
    return found


def _exec(spec: Mapping[str, Any], name: str, environ: Mapping[str, str], found: _Credentials) -> _Credentials:
    """Run the user's exec credential plugin as kubectl does and take the token (or client
    certificate) it prints as an ExecCredential."""
    command = spec.get("command")
    if not command:
        raise ClusterError(f"user {name!r}: exec has no command")
    env = {**environ, **{str(e.get("name")): str(e.get("value")) for e in spec.get("env") or [] if isinstance(e, dict)}}
    api_version = str(spec.get("apiVersion") or "client.authentication.k8s.io/v1")
    env["KUBERNETES_EXEC_INFO"] = json.dumps(
        {"apiVersion": api_version, "kind": "ExecCredential", "spec": {"interactive": False}}
    )
    argv = [str(command), *(str(a) for a in spec.get("args") or [])]
    try:
        done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ClusterError(f"user {name!r}: the exec plugin {command} did not run: {exc}") from None
    if done.returncode != 0:
        raise ClusterError(
            f"user {name!r}: the exec plugin {command} failed (exit {done.returncode}): {done.stderr.strip()[-400:]}"
        )
    try:
        status = json.loads(done.stdout).get("status") or {}
    except (ValueError, AttributeError):
        raise ClusterError(f"user {name!r}: the exec plugin {command} printed no ExecCredential JSON") from None
    if status.get("token"):
        found.token = str(status["token"])
    elif status.get("clientCertificateData") and status.get("clientKeyData"):
        found.certificate = str(status["clientCertificateData"]).encode()
        found.key = str(status["clientKeyData"]).encode()
    else:
        raise ClusterError(f"user {name!r}: the exec plugin {command} gave neither a token nor a client certificate")
    return found


def _ssl_context(cluster: Mapping[str, Any], directory: Path, credentials: _Credentials) -> ssl.SSLContext:
    context = ssl.create_default_context()
    if cluster.get("insecure-skip-tls-verify"):
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    else:
        authority = _data(cluster, "certificate-authority", directory)
        if authority is not None:
            try:
                context.load_verify_locations(cadata=authority.decode("utf-8"))
            except (ssl.SSLError, UnicodeDecodeError, ValueError) as exc:
                raise ClusterError(
                    f"kubeconfig: the cluster's certificate authority is not a PEM certificate: {exc}"
                ) from None
    if credentials.certificate is not None and credentials.key is not None:
        # ssl loads a client pair from files only: written for the load, removed at once.
        with tempfile.TemporaryDirectory(prefix="kubedgx-") as scratch:
            cert, key = Path(scratch) / "tls.crt", Path(scratch) / "tls.key"
            for path, data in ((cert, credentials.certificate), (key, credentials.key)):
                path.touch(mode=0o600)
                path.write_bytes(data)
            try:
                context.load_cert_chain(cert, key)
            except ssl.SSLError as exc:
                raise ClusterError(f"kubeconfig: the client certificate or key cannot be used: {exc}") from None
    return context


def in_cluster(environ: Mapping[str, str] | None = None) -> Client | None:
    """The pod's ServiceAccount, None outside a pod: what :func:`load` falls back to without a
    kubeconfig, for a caller whose own rule prefers it (the Flyte connector in its Deployment)."""
    return _in_cluster(os.environ if environ is None else environ)


def _in_cluster(environ: Mapping[str, str], directory: str = SERVICE_ACCOUNT_DIR) -> Client | None:
    """The pod's ServiceAccount at KUBERNETES_SERVICE_HOST/PORT, as client-go's InClusterConfig reads it."""
    host, port = environ.get("KUBERNETES_SERVICE_HOST", ""), environ.get("KUBERNETES_SERVICE_PORT", "")
    token_path = Path(directory) / "token"
    if not host or not port or not token_path.is_file():
        return None
    namespace_path = Path(directory) / "namespace"
    namespace = namespace_path.read_text(encoding="utf-8").strip() if namespace_path.is_file() else ""
    server = f"https://[{host}]:{port}" if ":" in host else f"https://{host}:{port}"
    context = ssl.create_default_context()
    if (Path(directory) / "ca.crt").is_file():
        context.load_verify_locations(cafile=str(Path(directory) / "ca.crt"))
    return Client(
        server=server,
        namespace=namespace or "default",
        context="(in-cluster)",
        headers={"Authorization": f"Bearer {token_path.read_text(encoding='utf-8').strip()}"},
        ssl_context=context,
    )
