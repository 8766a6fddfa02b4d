"""Each operator setting is declared once, in ``settings.SETTINGS``, and these tests fail when any other
place that names a setting drifts from it: the chart's Deployment (every KUBEDGX_* variable it sets is
declared, with the chart value that decides it, and that value exists), the flags of `kubedgx operator`,
the OperatorConfig fields and defaults, docs/operator.md's table (generated from the declaration), the
operator's sources (no KUBEDGX_* variable read around the table) and the second reader of KUBEDGX_KUEUE
(handlers.kueue_watched, which must refuse what from_env refuses)."""

from __future__ import annotations

import argparse
import ast
import copy
import dataclasses
import functools
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from dgx_operator.cli.main import build_parser, operator_environment
from dgx_operator.runtime import handlers, settings
from dgx_operator.runtime.leader import ElectionConfig
from dgx_operator.runtime.settings import SETTING, SETTINGS, ConfigError, OperatorConfig, Setting
from dgx_operator.webhook.config import WebhookConfig
from tests.chart.conftest import CHART, SCENARIOS, Rendered, chart_values, one, render
from tests.chart.render_helpers import env
from tests.conftest import ROOT

DOCS = ROOT / "docs" / "operator.md"
#: The whole operator package, every folder of it.
SOURCES = Path(settings.__file__).parents[1]
REGENERATE = f"run `python -m {settings.__name__} docs/operator.md` and commit the result"

#: Renderings beyond the chart's ci/ scenarios that set the variables those leave out.
MORE_VALUES: list[dict[str, Any]] = [
    {"caBundle": {"configMap": {"name": "trust-bundle"}}},
    {"limits": {"maxDuration": {"default": "24h"}}},
]
#: Variables the chart sets that are no operator setting, and why.
NOT_SETTINGS = {"POD_NAME": "the pod's name (downward API): leader.default_identity's part, not a setting"}

#: Options of `kubedgx operator` that set no variable of the table, and why.
FLAG_ONLY = {
    "--all-namespaces": "KUBEDGX_WATCH_NAMESPACES's other flag (empty: every namespace); the table names --namespace",
    "--liveness": "kopf's liveness endpoint URL, passed to kopf, no variable",
    "--standalone": "kopf's peering off, passed to kopf, no variable",
    "--peering": "kopf's peering object, passed to kopf, no variable",
    "--log-format": "kopf's log format, no variable",
    "--verbose": "kopf's debug logging, no variable",
}

#: KUBEDGX_* reads outside settings.py that are not the operator's settings, by file, and why.
OTHER_READS = {
    ("local.py", "KUBEDGX_GPUS_PER_NODE"): "reads the environment `kubedgx run` planned for the trainer, not its own",
}


# -- the chart ------------------------------------------------------------------------------------------------


@functools.cache
def _rendered(values: str) -> list[Rendered]:
    return render(json.loads(values))


def rendered(values: dict[str, Any]) -> list[Rendered]:
    """The chart rendered with these values, once per session (the same scenarios serve many tests)."""
    return _rendered(json.dumps(values, sort_keys=True))


def scenarios() -> list[tuple[str, dict[str, Any]]]:
    return [*SCENARIOS, *((f"more-{i}", values) for i, values in enumerate(MORE_VALUES))]


def renderings() -> list[tuple[str, list[Rendered]]]:
    return [(name, rendered(values)) for name, values in scenarios()]


def template_variables() -> set[str]:
    """Every variable the Deployment's template can set, whichever values: what renderings may miss."""
    text = (CHART / "templates" / "deployment.yaml").read_text(encoding="utf-8")
    return set(re.findall(r"- name: ([A-Z][A-Z0-9_]*)\n", text))  # containers, volumes, ports: lower case


def test_every_variable_the_chart_sets_is_declared_with_a_chart_value() -> None:
    rendered = {name for _, objects in renderings() for name in env(objects)}
    assert rendered <= template_variables()
    undeclared = sorted((rendered | template_variables()) - set(SETTING) - set(NOT_SETTINGS))
    assert undeclared == [], "declare these in settings.SETTINGS, with the chart value that sets them"
    no_chart_value = sorted(v for v in template_variables() if v in SETTING and SETTING[v].chart is None)
    assert no_chart_value == [], "the chart sets these: name the chart value in settings.SETTINGS"
    # The chart's scenarios set every one of them, so the next test can see each value at work.
    assert rendered == template_variables()


@pytest.mark.parametrize("setting", [s for s in SETTINGS if s.chart], ids=lambda s: s.variable)
def test_the_chart_value_named_exists_in_values_yaml(setting: Setting) -> None:
    assert setting.chart is not None
    node: Any = chart_values()
    for key in setting.chart.split("."):
        assert isinstance(node, dict), f"{setting.variable}: {setting.chart}: {key} is under a leaf"
        assert key in node, f"{setting.variable}: values.yaml has no {setting.chart}"
        node = node[key]


#: The other value to give a chart value where the generic change (flip a bool, add one to a number or a
#: duration, a namespace for a list) does not fit: the schema allows only some strings, or it is a map.
OTHER_VALUE: dict[str, Any] = {
    "catalog": {"topologyKey": "kubernetes.io/hostname"},
    "trainer.image": {"repository": "registry.example/trainer"},
    "dataSync.image": {"repository": "registry.example/sync"},
    "dataMounts.cacheRoot": "/local/nvme",
    "trainer.imagePullPolicy": "Always",
    "webhook.failurePolicy": "Ignore",
    "caBundle": {"configMap": {"name": "trust-bundle"}},
    "usageInterval": "6m",
    "scheduling.schedulerName": "kubedgx-packing",
    "limits": {"maxNodes": 4},
}
#: Values the change needs besides (more than one replica needs leader election).
ALSO: dict[str, dict[str, Any]] = {"leaderElection.enabled": {"replicaCount": 1}}


def other_value(key: str, value: Any) -> Any:
    if key in OTHER_VALUE:
        return OTHER_VALUE[key]
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return value + 1
    if isinstance(value, list):
        return ["team-a"]
    if isinstance(value, str) and (seconds := re.fullmatch(r"(\d+)s", value)):
        return f"{int(seconds[1]) + 1}s"
    raise AssertionError(f"add an other value for the chart value {key} ({value!r}) to OTHER_VALUE")


def merged(base: dict[str, Any], layer: dict[str, Any]) -> dict[str, Any]:
    """Values merged as Helm merges -f files (maps deeply, everything else replaced)."""
    out = copy.deepcopy(base)
    for key, value in layer.items():
        out[key] = merged(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def at(key: str, value: Any) -> dict[str, Any]:
    for part in reversed(key.split(".")):
        value = {part: value}
    return dict(value)


def seen(setting: Setting, objects: list[Rendered]) -> Any:
    """What the chart gives the setting: the variable's value (None: not set). KUBEDGX_CATALOG and
    KUBEDGX_LIMITS are fixed paths: their chart values decide the files there, their ConfigMaps."""
    if setting.variable == "KUBEDGX_CATALOG":
        return one(objects, "ConfigMap", "kubedgx-catalog")["data"]
    if setting.variable == "KUBEDGX_LIMITS":  # a fixed path too, set when the limits ConfigMap is rendered
        found = [r.obj["data"] for r in objects if r.kind == "ConfigMap" and r.name == "kubedgx-limits"]
        return (env(objects).get(setting.variable), found)
    return env(objects).get(setting.variable)


@pytest.mark.parametrize("setting", [s for s in SETTINGS if s.chart], ids=lambda s: s.variable)
def test_the_chart_value_named_decides_the_variable(setting: Setting) -> None:
    """Change the chart value the table names, in one of the chart's scenarios: what the Deployment
    gives the variable changes (a renamed or rewired value fails here)."""
    assert setting.chart is not None
    for _, values in scenarios():
        node: Any = merged(chart_values(), values)
        for key in setting.chart.split("."):
            node = node[key]
        change = merged(at(setting.chart, other_value(setting.chart, node)), ALSO.get(setting.chart, {}))
        if seen(setting, rendered(values)) != seen(setting, rendered(merged(values, change))):
            return
    pytest.fail(f"changing {setting.chart} changes nothing the chart gives {setting.variable}")


# -- the flags of `kubedgx operator` ----------------------------------------------------------------------------


def operator_options() -> dict[str, argparse.Action]:
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return {
        option: action
        for action in sub.choices["operator"]._actions
        for option in action.option_strings
        if option.startswith("--") and option != "--help" and not option.startswith("--no-")
    }


def long_option(setting: Setting) -> str:
    assert setting.flag is not None
    return setting.flag.replace("[no-]", "")


@pytest.mark.parametrize("setting", [s for s in SETTINGS if s.flag], ids=lambda s: s.variable)
def test_each_declared_flag_sets_its_variable(setting: Setting) -> None:
    option = long_option(setting)
    action = operator_options().get(option)
    assert action is not None, f"{setting.variable}: `kubedgx operator` has no {option}"
    if setting.flag and "[no-]" in setting.flag:
        assert isinstance(action, argparse.BooleanOptionalAction), f"{option} has no --no- form"
    given = None if action.nargs == 0 else (str(next(iter(action.choices))) if action.choices else "7")
    args = build_parser().parse_args(["operator", option, *([given] if given is not None else [])])
    written = operator_environment(args, {})
    assert written.get(setting.variable), f"{option} does not set {setting.variable}: {written}"
    if given is not None:
        assert written[setting.variable] == given


def test_every_operator_flag_is_declared_or_listed_as_flag_only() -> None:
    declared = {long_option(s) for s in SETTINGS if s.flag}
    undeclared = sorted(set(operator_options()) - declared - set(FLAG_ONLY))
    assert undeclared == [], "name these flags in settings.SETTINGS (or, if they set no variable, in FLAG_ONLY)"
    assert set(FLAG_ONLY) <= set(operator_options())


# -- the config's fields and defaults -------------------------------------------------------------------------


def test_every_setting_fills_a_field_of_the_config() -> None:
    groups: dict[str, type[Any]] = {"webhook": WebhookConfig, "leader_election": ElectionConfig}
    top = {f.name for f in dataclasses.fields(OperatorConfig)}
    for s in SETTINGS:
        group, _, sub = s.field.partition(".")
        assert group in top, f"{s.variable}: OperatorConfig has no field {group}"
        if sub:
            assert sub in {f.name for f in dataclasses.fields(groups[group])}, f"{s.variable}: no field {s.field}"
    assert len({s.field for s in SETTINGS}) == len(SETTINGS), "two settings fill the same field"


def test_the_declared_defaults_are_what_unset_variables_give() -> None:
    """The table's defaults, which docs/operator.md shows, are what from_env gives."""
    plain = OperatorConfig.from_env({})
    given = {"KUBEDGX_WEBHOOK_PORT": "9443", "KUBEDGX_WEBHOOK_INSECURE": "1"}
    given |= {"KUBEDGX_LEADER_ELECTION": "1", "KUBEDGX_LEADER_ELECTION_NAMESPACE": "ops"}
    on = OperatorConfig.from_env(given)
    for s in SETTINGS:
        if s.variable in given:
            continue
        group, _, sub = s.field.partition(".")
        if not sub:
            got = getattr(plain, group)
            assert (got is not None if group in ("webhook", "leader_election") else got) == s.default, s.variable
        else:
            assert getattr(getattr(on, group), sub) == s.default, s.variable
    assert (plain.webhook, plain.leader_election) == (None, None)


# -- docs/operator.md -------------------------------------------------------------------------------------------


def test_the_docs_table_is_generated_from_the_settings() -> None:
    text = DOCS.read_text(encoding="utf-8")
    assert settings.with_docs_table(text) == text, f"docs/operator.md's settings table is stale: {REGENERATE}"


def test_the_docs_table_has_a_row_per_setting() -> None:
    text = DOCS.read_text(encoding="utf-8")
    table = text.split(settings.DOCS_BEGIN)[1].split(settings.DOCS_END)[0]
    rows = re.findall(r"^\| `(KUBEDGX_\w+)` \|", table, flags=re.MULTILINE)
    assert sorted(rows) == sorted(SETTING)
    assert len(rows) == len(set(rows))


def test_the_generator_checks_and_rewrites_the_doc(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    doc = tmp_path / "operator.md"
    doc.write_text(f"# Doc\n\n{settings.DOCS_BEGIN}\n| old |\n{settings.DOCS_END}\n\nAfter.\n", encoding="utf-8")
    assert settings.main([str(doc), "--check"]) == 1
    assert "stale" in capsys.readouterr().err
    assert settings.main([str(doc)]) == 0
    assert settings.main([str(doc), "--check"]) == 0
    text = doc.read_text(encoding="utf-8")
    assert text.startswith("# Doc\n\n")
    assert text.endswith("\n\nAfter.\n")
    assert "| `KUBEDGX_KUEUE` |" in text


# -- the operator's sources -------------------------------------------------------------------------------------


def environment_reads(tree: ast.Module) -> list[tuple[int, str]]:
    """(line, variable) of each KUBEDGX_* variable read from a mapping (``x.get(...)``, ``x[...]``,
    ``os.getenv(...)``), named by a literal or by a string constant of the module."""
    constants = {
        node.targets[0].id: node.value.value
        for node in tree.body
        if isinstance(node, ast.Assign)
        and len(node.targets) == 1
        and isinstance(node.targets[0], ast.Name)
        and isinstance(node.value, ast.Constant)
        and isinstance(node.value.value, str)
    }

    def name(expr: ast.expr | None) -> str | None:
        if isinstance(expr, ast.Constant) and isinstance(expr.value, str):
            return expr.value
        return constants.get(expr.id) if isinstance(expr, ast.Name) else None

    def key(node: ast.AST) -> str | None:
        if isinstance(node, ast.Call) and node.args:
            func = node.func
            if (isinstance(func, ast.Attribute) and func.attr in ("get", "getenv", "pop", "setdefault")) or (
                isinstance(func, ast.Name) and func.id == "getenv"
            ):
                return name(node.args[0])
        if isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load):
            return name(node.slice)
        return None

    return [
        (getattr(node, "lineno", 0), variable)
        for node in ast.walk(tree)
        if (variable := key(node)) is not None and variable.startswith("KUBEDGX_")
    ]


def test_no_kubedgx_variable_is_read_around_the_table() -> None:
    """Only settings.py reads the operator's KUBEDGX_* variables (through SETTINGS); a read anywhere
    else would be a second parser, as handlers.kueue_watched was."""
    stray = []
    for path in sorted(SOURCES.rglob("*.py")):
        if path == Path(settings.__file__):
            continue
        for line, variable in environment_reads(ast.parse(path.read_text(encoding="utf-8"))):
            if (path.name, variable) not in OTHER_READS:
                stray.append(f"{path.relative_to(SOURCES)}:{line}: {variable}")
    assert stray == [], "read these through settings (SETTINGS, read_flag), or list them in OTHER_READS"
    assert all(any(path.name == file for path in SOURCES.rglob("*.py")) for file, _ in OTHER_READS)


def test_the_source_check_sees_reads() -> None:
    source = 'import os\nV = "KUBEDGX_X"\nos.environ.get("KUBEDGX_A")\nos.environ[V]\nos.getenv("KUBEDGX_B")\n'
    source += 'env["KUBEDGX_C"] = "1"\n'
    assert environment_reads(ast.parse(source)) == [(3, "KUBEDGX_A"), (4, "KUBEDGX_X"), (5, "KUBEDGX_B")]


# -- KUBEDGX_KUEUE: one parser ----------------------------------------------------------------------------------


def test_kueue_maybe_is_refused_the_same_way_by_from_env_and_the_handlers() -> None:
    with pytest.raises(ConfigError) as by_config:
        OperatorConfig.from_env({"KUBEDGX_KUEUE": "maybe"})
    with pytest.raises(ConfigError) as by_handlers:
        handlers.kueue_watched({"KUBEDGX_KUEUE": "maybe"})
    assert str(by_handlers.value) == str(by_config.value) == "KUBEDGX_KUEUE: must be 1 or 0 (true/false), got 'maybe'"
    assert by_handlers.value.variable == "KUBEDGX_KUEUE"


@pytest.mark.parametrize("value", [None, "", "1", "0", " On ", "off", "no", "TRUE"])
def test_kueue_is_read_alike_by_from_env_and_the_handlers(value: str | None) -> None:
    environ = {} if value is None else {"KUBEDGX_KUEUE": value}
    assert handlers.kueue_watched(environ) is OperatorConfig.from_env(environ).kueue


def test_the_cli_refuses_kueue_maybe_in_one_line() -> None:
    """In a fresh interpreter, where importing the handlers reads KUBEDGX_KUEUE: the settings are checked
    first, so the value is refused in one line with exit 2, not with a traceback from that import."""
    environ = {name: value for name, value in os.environ.items() if not name.startswith("KUBEDGX_")}
    environ["KUBEDGX_KUEUE"] = "maybe"
    done = subprocess.run(
        [sys.executable, "-m", "dgx_operator.cli.main", "operator"],
        env=environ,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr == "kubedgx operator: KUBEDGX_KUEUE: must be 1 or 0 (true/false), got 'maybe'\n"


def test_read_flag_reads_only_flags() -> None:
    assert settings.read_flag("KUBEDGX_WEBHOOK_DRY_RUN", {}) is True
    with pytest.raises(TypeError):
        settings.read_flag("KUBEDGX_METRICS_PORT", {})
