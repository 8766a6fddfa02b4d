"""Hostile and broken manifests: each refused with one clear line, quickly, in little memory.

Every case here ended in a traceback, a hang or a wrong answer before :mod:`dgx_api.manifests`
(alias bombs grew past 30 s and 1.8 GB; a date key, ``on: true`` under ``lora``, a non-string
``apiVersion``, 20,000 brackets, an escaped surrogate pair and non-UTF-8 bytes raised; duplicate keys,
a ``kind: List`` of invalid jobs, invalid labels and a mis-cased apiVersion passed).
"""

from __future__ import annotations

import io
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from dgx_api import manifests
from dgx_api.manifests import ManifestError, load_documents
from dgx_api.text import printable
from dgx_operator.cli.main import main
from tests.conftest import BASE_JOB, EXAMPLES

QUICKSTART = (EXAMPLES / "quickstart.yaml").read_text(encoding="utf-8")


def run(argv: list[str], stdin: str = "") -> tuple[int, list[str], list[str]]:
    out, err = io.StringIO(), io.StringIO()
    code = main(argv, out=out, err=err, stdin=io.StringIO(stdin))
    return code, out.getvalue().splitlines(), err.getvalue().splitlines()


def validate_file(tmp_path: Path, content: str | bytes, name: str = "in.yaml") -> tuple[int, list[str], list[str]]:
    path = tmp_path / name
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content, encoding="utf-8")
    return run(["validate", str(path)])


def measured(fn: Callable[[], Any], *, trace: bool = True) -> tuple[Any, float, int]:
    """``fn()``'s result (or exception), the CPU time it took on this thread and its peak of Python
    allocations (0 without ``trace``: tracemalloc slows the pure-Python scanner several times over).

    CPU time, not wall time: an expanding bomb burns seconds of CPU (30 s and more before the
    limit), while a wall clock also counts the time this thread waited for a core that other tests
    (other pytest-xdist workers, a control plane) were using, and so fails under load."""
    if not trace:
        started = time.thread_time()
        return fn(), time.thread_time() - started, 0
    tracemalloc.start()
    started = time.thread_time()
    try:
        result: Any = fn()
    except Exception as exc:  # the exception is the result under test
        result = exc
    elapsed = time.thread_time() - started
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return result, elapsed, peak


# -- alias bombs ------------------------------------------------------------------------------------


def bomb(levels: int = 9, fan: int = 9) -> str:
    """A flow list that defines and uses its own anchors where it stands: its last item expands to
    4 * fan**(levels-1) strings of 16 bytes (1.7 GB at 9/9) from about 300 bytes of YAML."""
    items = ['&a0 ["xxxxxxxxxxxxxxxx","xxxxxxxxxxxxxxxx","xxxxxxxxxxxxxxxx","xxxxxxxxxxxxxxxx"]']
    items += [f"&a{i} [{','.join([f'*a{i - 1}'] * fan)}]" for i in range(1, levels)]
    return "[" + ", ".join(items) + "]"


JOB_HEAD = "apiVersion: kubedgx.io/v1alpha1\nkind: DGXTrainingJob\nmetadata:\n  name: j\n"
#: Where the bomb sits (the places the issue found): each a whole manifest with {bomb} in it.
BOMBS = {
    "spec.instance": JOB_HEAD + "spec:\n  instance: {bomb}\n  command: [python]\n",
    "a list item": JOB_HEAD + "spec:\n  instance: dgxa100.80g.8.norm\n  command: [python]\n  args: [x, {bomb}]\n",
    "a nodeSelector value": JOB_HEAD + "spec:\n  instance: dgxa100.80g.8.norm\n  command: [python]\n"
    "  nodeSelector: {{a: {bomb}}}\n",
    "metadata.name": "apiVersion: kubedgx.io/v1alpha1\nkind: DGXTrainingJob\nmetadata:\n  name: {bomb}\n",
    "ConfigMap data": "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: c\ndata:\n  key: {bomb}\n",
}


def bomb_document(where: str) -> str:
    return BOMBS[where].format(bomb=bomb())


@pytest.mark.parametrize("where", list(BOMBS))
def test_alias_bomb_is_refused_fast_and_small(where: str, tmp_path: Path) -> None:
    text = bomb_document(where)
    assert len(text) < 2500  # the size of the attack
    (code, out, err), elapsed, peak = measured(lambda: validate_file(tmp_path, text))
    assert code == 1, (out, err)
    assert len(err) == 1, err
    assert "expands (through its *aliases) to more than 3 MiB" in err[0], err
    assert elapsed < 1.0, f"{elapsed:.2f}s of CPU"
    assert peak < 5 * 2**20, f"peak {peak / 2**20:.1f} MiB"


def test_bomb_in_a_trainer_config_and_a_catalog_is_refused(tmp_path: Path) -> None:
    from dgx_api.trainer_config import ConfigError, load_config
    from dgx_operator.catalog import Catalog, CatalogError

    path = tmp_path / "bomb.yaml"
    path.write_text(f"model: {bomb()}\n", encoding="utf-8")
    with pytest.raises(ConfigError, match="expands"):
        load_config(path)
    with pytest.raises(CatalogError, match="expands"):
        Catalog.load(path)


def test_aliases_that_stay_small_are_fine() -> None:
    docs = load_documents("base: &b {cpu: 1}\nx: *b\nz: [*b, *b]\n")
    assert docs == [{"base": {"cpu": 1}, "x": {"cpu": 1}, "z": [{"cpu": 1}, {"cpu": 1}]}]


def test_recursive_anchor_is_refused() -> None:
    with pytest.raises(ManifestError, match="recursive anchor"):
        load_documents("a: &a [1, *a]\n")


def test_alias_depth_is_bounded() -> None:
    lines = ["a0: &a0 [1]"] + [f"a{i}: &a{i} [*a{i - 1}]" for i in range(1, 120)]
    with pytest.raises(ManifestError, match=r"nests .* more than 100 levels"):
        load_documents("\n".join(lines))


# -- YAML that is not JSON --------------------------------------------------------------------------


def test_deep_nesting_is_refused_not_a_recursion_error(tmp_path: Path) -> None:
    (code, _, err), elapsed, _ = measured(
        lambda: validate_file(tmp_path, "a: " + "[" * 20000 + "]" * 20000), trace=False
    )
    assert code == 1
    assert err == [f"{tmp_path / 'in.yaml'}: line 1: nested more than 100 levels deep"]
    assert elapsed < 1.0, f"{elapsed:.2f}s of CPU"


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("when: 2001-12-14\n", {"when": "2001-12-14"}),  # go-yaml v2: a string
        ("2001-12-14: x\n", {"2001-12-14": "x"}),  # and so usable as a key
        ("t: 1:30\n", {"t": "1:30"}),  # no sexagesimal 90
        ("lr: 1e-4\n", {"lr": 0.0001}),  # a number, as kubectl sends it (PyYAML: a string)
        ("h: 0x1F\n", {"h": 31}),
        ("on: true\n", {"true": True}),  # YAML 1.1 boolean key, as sigs.k8s.io/yaml converts it
        ("y: n\n", {"true": False}),
        ("3: x\n", {"3": "x"}),
        ('s: "\\ud83d\\ude00"\n', {"s": "\U0001f600"}),  # an escaped UTF-16 pair is the character
        ("b: &b {x: 1}\nc:\n  <<: *b\n  x: 2\n", {"b": {"x": 1}, "c": {"x": 2}}),  # merge, then override
    ],
)
def test_values_are_what_kubectl_sends(text: str, value: Any) -> None:
    assert load_documents(text) == [value]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("a: 1\na: 2\n", "line 2: mapping key 'a' already defined at line 1"),
        ("x: .nan\n", "line 1: .nan is not a JSON number"),
        ("x: -.inf\n", "line 1: -.inf is not a JSON number"),
        ("x: 99999999999999999999999\n", "line 1: the integer 99999999999999999999999 is out of range"),
        ('x: "\\ud83d"\n', "line 1: a lone UTF-16 surrogate escape"),
        ("? [a]\n: 1\n", "line 1: a mapping key must be a string, number or boolean, not a list or mapping"),
        ("~: 1\n", "line 1: a mapping key must be a string, number or boolean, not null"),
        ("x: !!set {a, b}\n", "line 1: !!set values have no JSON form"),
        ("x: !!binary aGVsbG8=\n", "line 1: !!binary values have no JSON form"),
        ("x: [1\n", "not valid YAML"),
        ("x: *nope\n", "found undefined alias"),
    ],
)
def test_malformed_yaml_is_one_line_with_its_line(text: str, message: str) -> None:
    with pytest.raises(ManifestError) as info:
        load_documents(text)
    assert message in str(info.value)
    assert "\n" not in str(info.value)


def test_non_utf8_bytes_name_the_offset(tmp_path: Path) -> None:
    code, _, err = validate_file(tmp_path, b"apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: \xff\xfe\n")
    assert code == 1
    assert err == [f"{tmp_path / 'in.yaml'}: line 4: byte 0xff at offset 49 is not UTF-8: save the file as UTF-8"]


def test_a_bom_is_dropped() -> None:
    assert load_documents("\ufeffa: 1\n".encode()) == [{"a": 1}]


# -- the CLI: one line per problem, never a traceback -------------------------------------------


def quickstart(replace: str, by: str) -> str:
    assert replace in QUICKSTART
    return QUICKSTART.replace(replace, by, 1)


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        pytest.param(quickstart("    lora:\n", "    lora:\n      on: true\n"),
                     "spec.trainer.lora.true: unknown field (YAML reads an unquoted on", id="on-true"),
        pytest.param("apiVersion: 5\nkind: [a]\nmetadata: {name: x}\n", "apiVersion: must be of type string",
                     id="apiversion-int"),
        pytest.param(quickstart("  instance:", "  nodeSelector:\n    2001-12-14: x\n  instance:"), None,
                     id="date-key"),
        pytest.param('apiVersion: kubedgx.io/v1alpha1\nkind: DGXTrainingJob\nmetadata:\n  name: "\\ud83d\\ude00x"\n'
                     "spec: {}\n", "metadata.name: invalid value", id="surrogate-pair-name"),
        pytest.param(quickstart("  trainer:", "  backoffLimit: 99999999999999999999999\n  trainer:"),
                     "the integer 99999999999999999999999 is out of range", id="int-above-int64"),
        pytest.param(quickstart("maxDuration: 30m", "maxDuration: 30m\n  maxDuration: 40m"),
                     "mapping key 'maxDuration' already defined at line", id="duplicate-key"),
    ],
)  # fmt: skip
def test_cli_answers_broken_input_in_one_line(content: str, expected: str | None, tmp_path: Path) -> None:
    code, out, err = validate_file(tmp_path, content)
    lines = out + err
    assert not any("Traceback" in line for line in lines)
    if expected is None:  # valid once read as kubectl reads it
        assert code == 0, lines
        return
    assert code == 1, lines
    assert any(expected in line for line in lines), lines


def test_list_items_are_validated_each(tmp_path: Path) -> None:
    content = yaml.safe_dump(
        {
            "apiVersion": "v1",
            "kind": "List",
            "items": [
                BASE_JOB,
                {**BASE_JOB, "metadata": {"name": "bad"}, "spec": {**BASE_JOB["spec"], "instance": "x"}},
            ],
        }
    )
    code, out, err = validate_file(tmp_path, content)
    assert code == 1
    assert out == [
        f'{tmp_path / "in.yaml"}: DGXTrainingJob/bad (List items[1]): spec.instance: invalid value "x": must look like '
        "dgx<gpu>.<memory>g.<gpus>.<capacity>, e.g. dgxa100.80g.8.norm, or dgx<gpu>.<memory>g.mig-<profile>.<capacity> "
        "for a MIG slice, e.g. dgxa100.80g.mig-1g.10gb.debug (capacity: norm, spot or debug)"
    ]
    assert err[-1] == "2 object(s) checked, 1 invalid"


def test_mis_cased_api_version_is_refused_not_skipped(tmp_path: Path) -> None:
    code, out, _ = validate_file(
        tmp_path, quickstart("apiVersion: kubedgx.io/v1alpha1", "apiVersion: KubeDGX.io/v1alpha1")
    )
    assert code == 1
    assert out == [
        f"{tmp_path / 'in.yaml'}: DGXTrainingJob/quickstart: apiVersion: unknown API version 'KubeDGX.io/v1alpha1': "
        "did you mean 'kubedgx.io/v1alpha1'?"
    ]
    code, out, _ = validate_file(tmp_path, quickstart("kind: DGXTrainingJob", "kind: DGXTrainingjob"))
    assert code == 1
    assert "did you mean 'DGXTrainingJob'? (kinds are case-sensitive)" in out[0]


def test_namespace_and_metadata_are_checked(tmp_path: Path) -> None:
    content = quickstart("  name: quickstart", "  name: quickstart\n  namespace: Bad_NS\n  bogus: 1")
    code, out, _ = validate_file(tmp_path, content)
    assert code == 1
    problems = [line.split(": ", 2)[2] for line in out]
    assert "metadata.bogus: unknown field" in problems
    assert any(
        p.startswith('metadata.namespace: Invalid value: "Bad_NS": a lowercase RFC 1123 label') for p in problems
    )


def test_builtin_kinds_get_the_metadata_checks_too(tmp_path: Path) -> None:
    code, out, _ = validate_file(
        tmp_path, "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: c\n  labels: {'a b': x}\n"
    )
    assert code == 1
    assert 'metadata.labels: Invalid value: "a b": name part must consist' in out[0]


def test_explicit_nulls_are_pruned_as_the_apiserver_prunes_them(tmp_path: Path) -> None:
    content = quickstart("  trainer:", "  backoffLimit: null\n  nodeSelector: ~\n  tolerations:\n  trainer:")
    assert validate_file(tmp_path, content)[0] == 0
    code, out, _ = run(["render", str(tmp_path / "in.yaml")])
    assert code == 0
    assert any(line.startswith("kind: Pod") or line == "kind: Service" for line in out), out[:5]


def test_bad_kube_version_is_a_usage_error(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = tmp_path / "job.yaml"
    path.write_text(QUICKSTART, encoding="utf-8")
    with pytest.raises(SystemExit) as info:
        run(["validate", "--kube-version", "one.thirty", str(path)])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert "argument --kube-version: 'one.thirty' is not a Kubernetes version it knows: give X.Y (1." in err
    assert run(["validate", "--kube-version", "1.33.2", str(path)])[0] == 0


def test_render_refuses_an_invalid_namespace(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = tmp_path / "job.yaml"
    path.write_text(QUICKSTART, encoding="utf-8")
    with pytest.raises(SystemExit) as info:
        run(["render", "-n", "Bad_NS", str(path)])
    assert info.value.code == 2
    assert "argument -n/--namespace: invalid namespace 'Bad_NS': a lowercase RFC 1123 label" in capsys.readouterr().err


# -- printed names cannot forge output -------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "shown"),
    [
        ("a\x1b[31mred", "a\\x1b[31mred"),
        ("evil\u202etxt.yaml", "evil\\u202etxt.yaml"),
        ("two\nlines", "two\\nlines"),
        ("zero\u200bwidth", "zero\\u200bwidth"),
        ("c1\x9bcontrol", "c1\\x9bcontrol"),
        ("Grüße-名前", "Grüße-名前"),  # letters stay letters
    ],
)
def test_names_are_escaped_in_every_line(name: str, shown: str, tmp_path: Path) -> None:
    assert printable(name) == shown
    doc = {**BASE_JOB, "metadata": {"name": name, "labels": {name: "x"}}}
    path = tmp_path / f"{name.replace('/', '_').replace(chr(10), '_')}.yaml"
    path.write_text(yaml.safe_dump(doc), encoding="utf-8")
    code, out, err = run(["validate", str(path)])
    assert code == 1
    assert out, err
    for line in out + err:
        assert line.isprintable() or not any(c in line for c in "\x1b\u202e\u200b\x9b"), repr(line)
        assert not any(c in line for c in "\x1b\u202e\u200b\x9b\n")
    assert all(shown in line for line in out), out


def test_loader_messages_are_escaped() -> None:
    with pytest.raises(ManifestError) as info:
        load_documents("\x1b: 1\n\x1b: 2\n".replace("\x1b", '"\\e[2J"'))
    assert "\x1b" not in str(info.value)
    assert "\\x1b[2J" in str(info.value)


def test_bounds_are_what_the_docs_say() -> None:
    assert manifests.MAX_DOCUMENT_BYTES == 3 * 2**20
    assert manifests.MAX_DEPTH == 100


@pytest.mark.parametrize(
    ("api_version", "kind", "message"),
    [
        ("kub" + "[" * 300, "DGXTrainingJob", "apiVersion: invalid value 'kub[[[["),  # found by a generated run:
        ("apps/v1/extra", "Deployment", "apiVersion: invalid value 'apps/v1/extra'"),  # ENAMETOOLONG / a path
        ("v1", "Config Map", "kind: invalid value 'Config Map'"),
    ],
)
def test_malformed_api_version_or_kind_is_a_problem_not_a_file_lookup(
    api_version: str, kind: str, message: str, tmp_path: Path
) -> None:
    doc = {"apiVersion": api_version, "kind": kind, "metadata": {"name": "x"}}
    code, out, err = validate_file(tmp_path, yaml.safe_dump(doc))
    assert code == 1, (out, err)
    assert any(message in line for line in out), out
