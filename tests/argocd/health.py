"""Argo CD's health checks and resource actions (charts/kubedgx/files/argocd/resource_customizations) run as Argo CD
runs them, in Python, without Go: tests/argocd/luavm runs the same cases in Argo CD's own VM.

A script is a chunk that reads the global ``obj`` (the object as JSON: objects and arrays become tables, arrays
1-based, null is nil) and returns a table: a health check ``hs`` with ``status`` and ``message``, an action discovery
script a table of action name to its attributes, an action the object it made. Argo CD runs it in gopher-lua, a Lua
5.1, with only the base, table and package libraries (and a reduced os) unless ``resource.customizations.useOpenLibs``
is set: no string library, no string methods. :func:`health`, :func:`discover` and :func:`act` run a script in such a
sandbox under Lua 5.1 and again under Lua 5.4 (lupa's bundled runtimes), and both must agree.

The directory is laid out as Argo CD's own resource_customizations/, with its test cases in Argo CD's format
(``health_test.yaml``, ``actions/action_test.yaml``): :func:`health_cases`, :func:`discovery_cases` and
:func:`action_cases` read them.
"""

from __future__ import annotations

import importlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from tests.conftest import ROOT

ARGOCD = ROOT / "charts" / "kubedgx" / "files" / "argocd"
CUSTOMIZATIONS = ARGOCD / "resource_customizations"
GROUP = "kubedgx.io"
KINDS = ("DGXTrainingJob", "DGXDataMount")
SCRIPTS = {kind: CUSTOMIZATIONS / GROUP / kind / "health.lua" for kind in KINDS}
#: The kinds with resource actions, and the actions' directory.
ACTIONS = {"DGXTrainingJob": CUSTOMIZATIONS / GROUP / "DGXTrainingJob" / "actions"}
#: gopher-lua, which Argo CD embeds, implements Lua 5.1; 5.4 keeps the scripts portable.
RUNTIMES = ("lupa.lua51", "lupa.lua54")
STATUSES = {"Healthy", "Progressing", "Degraded", "Suspended", "Missing", "Unknown"}
#: What Argo CD's VM leaves out unless resource.customizations.useOpenLibs is set.
SANDBOX = """
debug.setmetatable("", nil)  -- no ("x"):sub(...) either
string, math, io, os, debug, coroutine, utf8, python = nil, nil, nil, nil, nil, nil, nil, nil
load, loadstring, dofile, loadfile, require = nil, nil, nil, nil, nil
"""


# --------------------------------------------------------------------------------------------
# Running the scripts
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Health:
    status: str
    message: str


def to_lua(lua: Any, value: Any) -> Any:
    """A JSON value as Argo CD hands it to Lua: objects and arrays become tables, null becomes nil."""
    if isinstance(value, Mapping):
        return lua.table_from({k: to_lua(lua, v) for k, v in value.items() if v is not None})
    if isinstance(value, list):
        return lua.table_from([to_lua(lua, v) for v in value])
    return value


def from_lua(lupa: Any, value: Any, like: Any = None) -> Any:
    """A Lua value back as JSON, as Argo CD's gopher-json encodes it: a table with keys 1..n is an array, an empty
    table an empty array unless the object it came from had an empty object there (Argo CD's cleanReturnedObj)."""
    if lupa.lua_type(value) != "table":
        return value
    items = dict(value.items())
    if not items:
        return {} if isinstance(like, Mapping) else []
    if all(isinstance(k, int) for k in items) and sorted(items) == list(range(1, len(items) + 1)):
        old = like if isinstance(like, list) else []
        return [from_lua(lupa, items[i], old[i - 1] if i <= len(old) else None) for i in range(1, len(items) + 1)]
    old_map = like if isinstance(like, Mapping) else {}
    return {str(k): from_lua(lupa, v, old_map.get(str(k))) for k, v in items.items()}


def run(runtime: str, script: str, obj: Mapping[str, Any]) -> Any:
    """The script's return value, as JSON, after running it on ``obj`` in the sandbox of ``runtime``."""
    lupa = importlib.import_module(runtime)
    lua = lupa.LuaRuntime(register_eval=False, register_builtins=False)
    lua.execute(SANDBOX)
    # Through JSON, as Argo CD gets the object: what the emulator stores is what the API server would serve.
    plain = json.loads(json.dumps(obj))
    lua.globals().obj = to_lua(lua, plain)
    return from_lua(lupa, lua.execute(script), plain)


def evaluate(runtime: str, script: str, obj: Mapping[str, Any]) -> Health:
    hs = run(runtime, script, obj)
    assert isinstance(hs, dict), f"the script returns {hs!r}, not a table"
    status, message = hs.get("status"), hs.get("message")
    assert status in STATUSES, f"hs.status {status!r}"
    assert isinstance(message, str), f"hs.message {message!r}"
    return Health(status, message)


def agreed(results: Mapping[str, Any]) -> Any:
    """The one result every runtime gave."""
    values = list(results.values())
    assert all(v == values[0] for v in values), results
    return values[0]


def health(obj: Mapping[str, Any]) -> Health:
    script = SCRIPTS[obj["kind"]].read_text(encoding="utf-8")
    result: Health = agreed({runtime: evaluate(runtime, script, obj) for runtime in RUNTIMES})
    return result


def discover(obj: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """The actions discovery.lua offers for ``obj``: name -> attributes (iconClass, displayName, disabled)."""
    script = (ACTIONS[obj["kind"]] / "discovery.lua").read_text(encoding="utf-8")
    found = agreed({runtime: run(runtime, script, obj) for runtime in RUNTIMES})
    if found == []:  # an empty table: no action (Argo CD's noAvailableActions)
        return {}
    assert isinstance(found, dict), found
    # An action whose attributes are an empty table has none (Argo CD's emptyResourceActionFromLua).
    return {name: (attrs if attrs != [] else {}) for name, attrs in found.items()}


def act(obj: Mapping[str, Any], action: str) -> dict[str, Any]:
    """What the action makes of ``obj``: the object it returns (kubedgx's actions are Argo CD's old-style ones)."""
    script = (ACTIONS[obj["kind"]] / action / "action.lua").read_text(encoding="utf-8")
    result = agreed({runtime: run(runtime, script, obj) for runtime in RUNTIMES})
    assert isinstance(result, dict), f"{action} returns {result!r}, not an object"
    return result


# --------------------------------------------------------------------------------------------
# The test cases, in Argo CD's format
# --------------------------------------------------------------------------------------------


def load(path: Path) -> Any:
    return yaml.safe_load(path.read_text(encoding="utf-8"))


@dataclass(frozen=True)
class HealthCase:
    """One entry of a health_test.yaml: the object at ``input`` has ``expected`` health."""

    input: Path
    expected: Health

    @property
    def id(self) -> str:
        return str(self.input.relative_to(CUSTOMIZATIONS))


@dataclass(frozen=True)
class DiscoveryCase:
    """One of action_test.yaml's discoveryTests: the actions offered for ``input``."""

    input: Path
    expected: dict[str, dict[str, Any]]

    @property
    def id(self) -> str:
        return str(self.input.relative_to(CUSTOMIZATIONS))


@dataclass(frozen=True)
class ActionCase:
    """One of action_test.yaml's actionTests: ``action`` turns ``input`` into ``output``."""

    action: str
    input: Path
    output: Path

    @property
    def id(self) -> str:
        return f"{self.action}:{self.input.relative_to(CUSTOMIZATIONS)}"


def health_cases() -> list[HealthCase]:
    cases = []
    for test_file in sorted(CUSTOMIZATIONS.glob("*/*/health_test.yaml")):
        for test in load(test_file)["tests"]:
            status = test["healthStatus"]
            expected = Health(status["status"], status.get("message", ""))
            cases.append(HealthCase(test_file.parent / test["inputPath"], expected))
    return cases


def discovery_cases() -> list[DiscoveryCase]:
    cases = []
    for test_file in sorted(CUSTOMIZATIONS.glob("*/*/actions/action_test.yaml")):
        for test in load(test_file)["discoveryTests"]:
            expected = {a["name"]: {k: v for k, v in a.items() if k != "name"} for a in test.get("result") or []}
            cases.append(DiscoveryCase(test_file.parent / test["inputPath"], expected))
    return cases


def action_cases() -> list[ActionCase]:
    cases = []
    for test_file in sorted(CUSTOMIZATIONS.glob("*/*/actions/action_test.yaml")):
        here = test_file.parent
        for test in load(test_file)["actionTests"]:
            cases.append(ActionCase(test["action"], here / test["inputPath"], here / test["expectedOutputPath"]))
    return cases
