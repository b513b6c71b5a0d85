"""The one line a params.yaml validation error becomes: the key as `section.key`, its whole value, and what it
must be (the field's description) or the type it must have."""

from __future__ import annotations

import types
import typing
from typing import Annotated, Literal

from pydantic import BaseModel

# pydantic error types that mean "right type, value out of its rule" (the rest mean a wrong type)
_RULE_ERRORS = {"greater_than", "greater_than_equal", "less_than", "less_than_equal", "too_short", "too_long",
                "string_too_short", "string_too_long", "value_error"}


def _type_name(tp) -> str:
    origin = typing.get_origin(tp)
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in typing.get_args(tp))
    if origin in (typing.Union, types.UnionType):
        inner = [a for a in typing.get_args(tp) if a is not type(None)]
        return " or ".join(_type_name(a) for a in inner) + " or null"
    if origin is Annotated:
        return _type_name(typing.get_args(tp)[0])
    if origin is list:
        return f"a list (each item {_type_name(typing.get_args(tp)[0])})"
    if isinstance(tp, type) and issubclass(tp, BaseModel):
        return f"a mapping with keys {', '.join(tp.model_fields)}"
    return {int: "an integer", float: "a number", bool: "true/false", str: "a string"}.get(tp, str(tp))


def _field_at(loc: tuple, schema: type[BaseModel]) -> tuple[type[BaseModel], str] | None:
    """The section class and field name that an error location (section, field, [index…]) points at."""
    if len(loc) < 2 or loc[0] not in schema.model_fields:
        return None
    section = schema.model_fields[loc[0]].annotation
    return (section, loc[1]) if loc[1] in section.model_fields else None


def explain(error: dict, raw: dict, source: str, schema: type[BaseModel], prefix: str | None = None) -> str:
    """One line for pydantic's first error, naming the key as `section.key` and showing its whole value.
    schema: the whole params model (its fields are the sections); prefix: the section name when one section was
    validated on its own."""
    loc, kind = tuple(error["loc"]), error["type"]
    if prefix is not None:
        loc = (prefix, *loc)
    if kind == "value_error" and len(loc) <= 1:  # a cross-field rule: its message names the keys itself
        return f"{source}: {error['ctx']['error']}"
    key = ".".join(str(part) for part in loc[:2])
    if kind == "extra_forbidden":
        if len(loc) == 1:
            return f"{source}: unknown section '{loc[0]}'. Allowed sections: {', '.join(schema.model_fields)}."
        allowed = ", ".join(schema.model_fields[loc[0]].annotation.model_fields)
        return (f"{source}: unknown key '{key}'. Allowed keys in '{loc[0]}': {allowed}. "
                "Fix the name in conf/ (or your -S override) and recompose params.yaml.")
    if kind == "missing":
        if len(loc) == 1:
            return f"{source}: missing section '{loc[0]}'. Recompose params.yaml from conf/ (make params)."
        section, name = _field_at(loc, schema)
        return (f"{source}: missing key '{key}' ({_type_name(section.model_fields[name].annotation)}). "
                "Add it to conf/ and recompose params.yaml.")
    if len(loc) == 1:
        expected = _type_name(schema.model_fields[loc[0]].annotation)
        return f"{source}: '{loc[0]}' must be {expected}; got {error['input']!r}."
    section, name = _field_at(loc, schema)
    info = section.model_fields[name]
    shown = repr(raw[loc[0]][name])  # the whole value, also when one item of a list is wrong
    if kind in _RULE_ERRORS and info.description:
        return f"{source}: '{key}' = {shown} is invalid; it must be {info.description}."
    return f"{source}: '{key}' = {shown} has the wrong type or value; expected {_type_name(info.annotation)}."
