"""The schema engine: pydantic models -> structural schemas, and validation as the API server does it."""

from __future__ import annotations

from typing import Annotated, Any, Literal

import pytest
from pydantic import Field

from dgx_api.schema import (
    KubeModel,
    Problem,
    SchemaError,
    cel,
    evaluate_rule,
    join_path,
    pattern,
    structural_schema,
    to_cel,
    validate,
)

HINTED = pattern(r"^[a-z]+$", "must be lower-case letters")


class Inner(KubeModel):
    """An inner object."""

    cel_rules = (
        cel(
            "!has(self.low) || !has(self.high) || self.low <= self.high",
            message_expression="'low must be <= high' + (has(self.unit) ? ' (in ' + self.unit + ')' : '')",
            field_path=".low",
        ),
    )

    low: int | None = Field(default=None, ge=0, description="Low.")
    high: int | None = Field(default=None, le=10, description="High.")
    unit: str | None = Field(default=None, max_length=16, description="What low and high count.")
    ratio: float = Field(default=0.5, gt=0.0, description="A ratio.")


class Item(KubeModel):
    """A keyed list item."""

    name: str = Field(description="Key.")
    value: str | None = Field(default=None, description="Value.")


class Outer(KubeModel):
    """The outer object."""

    cel_rules = (cel("!has(self.ratioCheck) || self.ratioCheck > 0.0", "ratioCheck must be positive"),)

    word: str = Field(pattern=HINTED, description="A word.")
    mode: Literal["a", "b"] = Field(default="a", description="Mode.")
    size: int | Annotated[str, Field(pattern=r"^[0-9]+Gi$")] | None = Field(default=None, description="A size.")
    inner: Inner | None = Field(default=None, description="Inner.")
    items: list[Item] = Field(
        default_factory=list,
        max_length=4,
        description="Items.",
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"]},
    )
    tags: list[str] = Field(
        default_factory=list, description="Tags.", json_schema_extra={"x-kubernetes-list-type": "set"}
    )
    labels: dict[str, str] = Field(default_factory=dict, description="Labels.")
    ratio_check: float | None = Field(default=None, description="Checked in CEL.")


SCHEMA = structural_schema(Outer)


def paths(problems: list[Problem]) -> list[str]:
    return [p.path for p in problems]


def test_structural_schema_inlines_refs_and_collapses_optionals() -> None:
    text = repr(SCHEMA)
    assert "$ref" not in text
    assert "$defs" not in text
    assert "title" not in text
    inner = SCHEMA["properties"]["inner"]
    assert inner["type"] == "object"
    assert inner["description"] == "Inner."  # the field's description wins over the class docstring
    assert "anyOf" not in inner
    assert inner["properties"]["low"] == {"minimum": 0, "type": "integer", "description": "Low."}


def test_int_or_string_keeps_the_string_pattern() -> None:
    size = SCHEMA["properties"]["size"]
    assert size["x-kubernetes-int-or-string"] is True
    assert size["anyOf"] == [{"type": "integer"}, {"type": "string"}]
    assert size["pattern"] == r"^[0-9]+Gi$"
    assert "type" not in size


def test_defaults_move_into_descriptions_and_out_of_the_schema() -> None:
    mode = SCHEMA["properties"]["mode"]
    assert "default" not in mode
    assert mode["description"] == "Mode. Defaults to a."
    assert SCHEMA["properties"]["inner"]["properties"]["ratio"]["description"] == "A ratio. Defaults to 0.5."


def test_a_default_that_says_nothing_is_not_described() -> None:
    """An empty string, list or map default adds no text ("Defaults to ." was what kubectl explain
    showed for every condition's message); a string that blank space would blur is quoted."""

    class Defaults(KubeModel):
        empty: str = Field(default="", description="Empty.")
        blank: str = Field(default=" ", description="Blank.")
        padded: str = Field(default=" x", description="Padded.")
        word: str = Field(default="Equal", description="Word.")
        zero: int = Field(default=0, description="Zero.")
        off: bool = Field(default=False, description="Off.")
        none: list[str] = Field(default_factory=list, description="None.")

    props = structural_schema(Defaults)["properties"]
    described = {name: node["description"] for name, node in props.items()}
    assert described == {
        "empty": "Empty.",
        "blank": 'Blank. Defaults to " ".',
        "padded": 'Padded. Defaults to " x".',
        "word": "Word. Defaults to Equal.",
        "zero": "Zero. Defaults to 0.",
        "off": "Off. Defaults to false.",
        "none": "None.",
    }
    assert all("default" not in node for node in props.values())


def test_exclusive_bounds_use_the_openapi_v3_boolean_form() -> None:
    ratio = SCHEMA["properties"]["inner"]["properties"]["ratio"]
    assert ratio["minimum"] == 0.0
    assert ratio["exclusiveMinimum"] is True


def test_map_fields_become_additional_properties() -> None:
    assert SCHEMA["properties"]["labels"] == {
        "additionalProperties": {"type": "string"},
        "description": "Labels.",
        "type": "object",
    }


def test_rules_of_a_model_are_attached_to_its_node() -> None:
    rules = SCHEMA["properties"]["inner"]["x-kubernetes-validations"]
    assert [r["fieldPath"] for r in rules] == [".low"]


def test_subclass_adds_rules_instead_of_replacing_them() -> None:
    class Base(KubeModel):
        cel_rules = (cel("true", "base"),)
        x: int = Field(default=0, description="x")

    class Child(Base):
        cel_rules = (cel("true", "child"),)

    messages = [r["message"] for r in structural_schema(Child)["x-kubernetes-validations"]]
    assert messages == ["base", "child"]


def test_constructs_without_a_structural_form_are_refused() -> None:
    class WithSet(KubeModel):
        s: set[str] = Field(default_factory=set, description="A set.")

    class WithUnion(KubeModel):
        u: int | bool = Field(default=0, description="A union.")

    with pytest.raises(SchemaError, match="uniqueItems"):
        structural_schema(WithSet)
    with pytest.raises(SchemaError, match="union"):
        structural_schema(WithUnion)


def test_a_valid_document_has_no_problems() -> None:
    doc = {"word": "ok", "size": "10Gi", "inner": {"low": 1, "high": 2}, "items": [{"name": "a"}], "tags": ["x"]}
    assert validate(SCHEMA, doc) == []
    assert validate(SCHEMA, {**doc, "size": 3}) == []


@pytest.mark.parametrize(
    ("doc", "path", "message"),
    [
        ({}, "word", "Required value"),
        ({"word": "ok", "mdoe": "a"}, "mdoe", "unknown field (did you mean 'mode'?)"),
        ({"word": "ok", "mode": "c"}, "mode", 'Unsupported value: "c": supported values: "a", "b"'),
        ({"word": "OK"}, "word", 'invalid value "OK": must be lower-case letters'),
        ({"word": "ok", "size": "ten"}, "size", 'invalid value "ten": must match the regular expression ^[0-9]+Gi$'),
        ({"word": "ok", "size": True}, "size", "must be an integer or a string, got boolean true"),
        ({"word": "ok", "inner": {"low": "1"}}, "inner.low", 'must be of type integer, got string "1"'),
        ({"word": "ok", "inner": {"low": -1}}, "inner.low", "should be greater than or equal to 0 (got -1)"),
        ({"word": "ok", "inner": {"ratio": 0}}, "inner.ratio", "should be greater than 0 (got 0)"),
        ({"word": "ok", "items": [{"name": str(i)} for i in range(5)]}, "items", "must have at most 4 items (got 5)"),
        (
            {"word": "ok", "items": [{"name": "a"}, {"name": "a"}]},
            "items[1]",
            'Duplicate value: {"name":"a"} (same as [0])',
        ),
        ({"word": "ok", "tags": ["x", "y", "x"]}, "tags[2]", 'Duplicate value: "x" (same as [0])'),
        ({"word": "ok", "labels": {"a": 1}}, "labels.a", "must be of type string, got integer 1"),
        ({"word": "ok", "inner": {"low": 5, "high": 3, "unit": "GPUs"}}, "inner.low", "low must be <= high (in GPUs)"),
        ({"word": "ok", "ratioCheck": -1}, "", "ratioCheck must be positive"),
    ],
)
def test_each_problem_is_reported_at_its_field_path(doc: dict[str, Any], path: str, message: str) -> None:
    problems = validate(SCHEMA, doc)
    assert Problem(path, message) in problems, problems


def test_root_prefixes_every_path() -> None:
    problems = validate(SCHEMA, {"word": "ok", "inner": {"low": -1}}, root="spec")
    assert paths(problems) == ["spec.inner.low"]


def test_cel_rules_do_not_run_on_a_subtree_with_schema_errors() -> None:
    # high is out of range AND low > high: only the schema error is reported, like the API server.
    problems = validate(SCHEMA, {"word": "ok", "inner": {"low": 5, "high": 30}})
    assert problems == [Problem("inner.high", "should be less than or equal to 10 (got 30)")]


def test_integers_in_number_fields_are_doubles_for_cel() -> None:
    # `self.ratioCheck > 0.0` would not compile against an int in CEL; the API server types by schema.
    assert validate(SCHEMA, {"word": "ok", "ratioCheck": 2}) == []
    assert str(to_cel(2, {"type": "number"})) == "2.0"


def test_transition_rules_run_only_on_updates() -> None:
    schema = {
        "type": "object",
        "properties": {"fixed": {"type": "string", "description": "d"}},
        "x-kubernetes-validations": [{"rule": "self.fixed == oldSelf.fixed", "message": "fixed is immutable"}],
    }
    assert validate(schema, {"fixed": "b"}) == []
    assert validate(schema, {"fixed": "b"}, old={"fixed": "a"}) == [Problem("", "fixed is immutable")]
    assert validate(schema, {"fixed": "a"}, old={"fixed": "a"}) == []


def test_a_rule_that_cannot_be_evaluated_is_reported_not_swallowed() -> None:
    message = evaluate_rule({"rule": "self.missing > 1"}, to_cel({}, {"type": "object"}))
    assert message is not None
    assert "could not be evaluated" in message


@pytest.mark.parametrize(
    ("text", "separator", "parts"),
    [("dgxa100.80g.8.norm", ".", ["dgxa100", "80g", "8", "norm"]), ("a", ".", ["a"]), ("ab", "", ["a", "b"])],
)
def test_kubernetes_strings_split_is_available_to_rules(text: str, separator: str, parts: list[str]) -> None:
    """Kubernetes enables cel-go's strings extension for CRD rules; cel-python lacks it."""
    rule = {"rule": f"self.split('{separator}') == {parts!r}", "message": "split differs"}
    assert evaluate_rule(rule, to_cel(text, {"type": "string"})) is None
    assert (
        evaluate_rule({"rule": "int(self.split('.')[2]) == 8"}, to_cel("dgxa100.80g.8.norm", {"type": "string"}))
        is None
    )


def test_join_path_quotes_keys_that_are_not_identifiers() -> None:
    assert join_path("spec", "nodeSelector") == "spec.nodeSelector"
    assert join_path("spec.env", 2) == "spec.env[2]"
    assert join_path("spec.nodeSelector", "kubedgx.io/capacity") == 'spec.nodeSelector["kubedgx.io/capacity"]'
    assert join_path("", "spec") == "spec"
