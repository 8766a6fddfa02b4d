"""Argo CD's health checks (charts/kubedgx/files/argocd/*.lua) run as Argo CD runs them.

A script is a chunk that reads the global ``obj`` (the object as JSON: objects and arrays become tables, arrays
1-based, null is nil) and returns ``hs`` with ``status`` and ``message``. Argo CD runs it in gopher-lua, a Lua 5.1,
with only the base, table and package libraries (and a reduced os) unless ``resource.customizations.useOpenLibs``
is set: no string library, no string methods. :func:`health` runs it in such a sandbox under Lua 5.1 and again under
Lua 5.4 (lupa's bundled runtimes), and both must agree.
"""

from __future__ import annotations

import importlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tests.conftest import ROOT

ARGOCD = ROOT / "charts" / "kubedgx" / "files" / "argocd"
SCRIPTS = {"DGXTrainingJob": ARGOCD / "dgxtrainingjob.lua", "DGXDataMount": ARGOCD / "dgxdatamount.lua"}
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
# Running the health checks
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


def evaluate(runtime: str, script: str, obj: Mapping[str, Any]) -> Health:
    lua = importlib.import_module(runtime).LuaRuntime(register_eval=False, register_builtins=False)
    lua.execute(SANDBOX)
    # Through JSON, as Argo CD gets the object: what the emulator stores is what the API server would serve.
    lua.globals().obj = to_lua(lua, json.loads(json.dumps(obj)))
    hs = lua.execute(script)
    assert hs is not None, "the script returns no table"
    status, message = hs["status"], hs["message"]
    assert status in STATUSES, f"hs.status {status!r}"
    assert isinstance(message, str), f"hs.message {message!r}"
    return Health(status, message)


def health(obj: Mapping[str, Any]) -> Health:
    script = SCRIPTS[obj["kind"]].read_text(encoding="utf-8")
    results = {runtime: evaluate(runtime, script, obj) for runtime in RUNTIMES}
    assert len(set(results.values())) == 1, results
    return results[RUNTIMES[0]]
