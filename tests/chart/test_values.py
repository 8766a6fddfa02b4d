"""values.yaml is documented (a one-line ``# --`` comment on every value), README.md's values table is
generated from it, and values.schema.json describes exactly its keys and rejects unknown ones."""

from __future__ import annotations

from typing import Any

import jsonschema

from dgx_operator.catalog import CatalogSpec
from tests.chart.conftest import CHART, ROOT, chart_schema, chart_values, generator

FIX = "run python charts/kubedgx/hack/generate.py and commit the result"


def test_every_value_has_a_description() -> None:
    gen = generator()
    docs = gen.value_docs((CHART / "values.yaml").read_text(encoding="utf-8"))
    assert gen.undocumented(chart_values(), docs) == [], "add a one-line '# -- ...' comment above these keys"
    for path, doc in docs.items():
        assert len(doc) >= 10, f"{path}: {doc!r}"


def test_the_documentation_parser_sees_what_yaml_sees() -> None:
    """Every documented path is a key of values.yaml (a comment above a list item is not a value's)."""
    gen = generator()
    docs = gen.value_docs((CHART / "values.yaml").read_text(encoding="utf-8"))
    values = chart_values()
    for path in docs:
        gen.lookup(values, path)  # KeyError if the parser invented it
    text = "a:\n  # -- the b\n  b: 1\n  c:\n    - # -- not a value\n      d: 2\n# -- e\ne: {}\n"
    assert gen.value_docs(text) == {"a.b": "the b", "e": "e"}
    assert gen.undocumented({"a": {"b": 1, "c": [{"d": 2}]}, "e": {}}, gen.value_docs(text)) == ["a.c"]


def test_the_readme_values_table_is_generated_from_values_yaml() -> None:
    gen = generator()
    stale = [str(p.relative_to(ROOT)) for p in gen.stale()]
    assert stale == [], f"{stale} out of date: {FIX}"
    readme = (CHART / "README.md").read_text(encoding="utf-8")
    for row in gen.rows():
        assert f"| `{row.path}` |" in readme


# -- the schema ---------------------------------------------------------------------------------------------


def walk_objects(schema: dict[str, Any], path: str = "") -> list[tuple[str, dict[str, Any]]]:
    """Every object schema inside ``schema`` with its path."""
    out = []
    if schema.get("type") == "object":
        out.append((path or "<root>", schema))
    for key, sub in (schema.get("properties") or {}).items():
        out += walk_objects(sub, f"{path}.{key}" if path else key)
    for keyword in ("items", "additionalProperties"):
        if isinstance(schema.get(keyword), dict):
            out += walk_objects(schema[keyword], f"{path}[{keyword}]")
    for keyword in ("anyOf", "oneOf", "allOf"):
        for i, sub in enumerate(schema.get(keyword) or []):
            out += walk_objects(sub, f"{path}[{keyword}{i}]")
    return out


#: Objects whose content is a Kubernetes structure the API server validates (free-form here on purpose).
FREE_FORM = {
    "affinity.nodeAffinity",
    "affinity.podAffinity",
    "affinity.podAntiAffinity",
    "extraEnv[items].valueFrom",
    # An umbrella chart's values for all its subcharts: none of them is this chart's to check.
    "global",
    # A Volume's source is one of some thirty kinds; its name is checked here, the rest by the apiserver.
    "extraVolumes[items]",
}


def test_the_schema_is_valid_and_closes_every_object() -> None:
    schema = chart_schema()
    jsonschema.Draft7Validator.check_schema(schema)
    jsonschema.Draft7Validator(schema).validate(chart_values())
    open_objects = []
    shared = [(f"#/definitions/{name}", sub) for name, sub in (schema.get("definitions") or {}).items()]
    for path, sub in walk_objects(schema) + [found for name, d in shared for found in walk_objects(d, name)]:
        if path in FREE_FORM:
            assert "additionalProperties" not in sub, path
            continue
        closed = sub.get("additionalProperties")
        if closed is not False and not isinstance(closed, dict):
            open_objects.append(path)
    assert open_objects == [], "give these additionalProperties: false (or a schema for map values)"


def schema_node(schema: dict[str, Any], path: str) -> dict[str, Any]:
    node = schema
    for part in path.split("."):
        props = node.get("properties") or {}
        assert part in props, f"values.schema.json has no {path}"
        node = props[part]
    return node


def test_the_schema_has_exactly_the_keys_of_values_yaml() -> None:
    """Each map of values.yaml (down to the documented values) has the same keys in the schema, so a
    key added to one and not the other fails here."""
    schema = chart_schema()
    values = chart_values()
    gen = generator()
    docs = gen.value_docs((CHART / "values.yaml").read_text(encoding="utf-8"))

    def compare(node: dict[str, Any], path: str) -> None:
        schema_keys = set((schema_node(schema, path) if path else schema).get("properties") or {})
        assert set(node) == schema_keys, f"{path or '<root>'}: values {sorted(node)} vs schema {sorted(schema_keys)}"
        for key, value in node.items():
            child = f"{path}.{key}" if path else key
            if isinstance(value, dict) and value and any(p.startswith(child + ".") for p in docs):
                compare(value, child)
            else:
                schema_node(schema, child)

    compare(values, "")


def pydantic_properties(schema: dict[str, Any], node: dict[str, Any]) -> dict[str, Any]:
    """Resolve $ref/anyOf of a pydantic JSON schema node to the object schema it describes."""
    if "$ref" in node:
        return pydantic_properties(schema, schema["$defs"][node["$ref"].split("/")[-1]])
    for option in node.get("anyOf") or []:
        if option.get("type") != "null":
            return pydantic_properties(schema, option)
    return node


def compare_catalog_schema(model: dict[str, Any], ours: dict[str, Any], model_node: dict[str, Any], path: str) -> None:
    model_node = pydantic_properties(model, model_node)
    if model_node.get("type") == "array" or "prefixItems" in model_node:
        items = model_node.get("items") or {}
        if isinstance(items, dict) and items:
            compare_catalog_schema(model, ours["items"], items, f"{path}[]")
        return
    if model_node.get("type") != "object":
        return
    if "properties" in model_node:
        assert set(model_node["properties"]) == set(ours["properties"]), path
        for key, sub in model_node["properties"].items():
            compare_catalog_schema(model, ours["properties"][key], sub, f"{path}.{key}")
    elif isinstance(model_node.get("additionalProperties"), dict):
        compare_catalog_schema(model, ours["additionalProperties"], model_node["additionalProperties"], f"{path}{{}}")


def test_the_catalog_schema_follows_the_operators_catalog_model() -> None:
    """values.schema.json's catalog has the fields of dgx_operator.catalog.CatalogSpec, at every level."""
    model = CatalogSpec.model_json_schema(by_alias=True)
    ours = chart_schema()["properties"]["catalog"]
    compare_catalog_schema(model, ours, model, "catalog")
    gpu = chart_schema()["properties"]["catalogExtraGpus"]["items"]
    assert gpu == ours["properties"]["gpus"]["items"]
