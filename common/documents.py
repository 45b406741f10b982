"""JSON and YAML documents that users give (job specs, evaluation specs, twin specs), parsed with
their nesting bounded: a document nested deeper than MAX_NESTING is refused with a clear error
rather than a RecursionError, before anything validates or walks it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from .limits import MAX_NESTING

YAML_SUFFIXES = (".yaml", ".yml")


class DocumentError(ValueError):
    """A document that cannot be read, does not parse, or is nested too deep; the message says which."""


def nesting_problem(value: Any, limit: int = MAX_NESTING) -> str | None:
    """Why `value` (parsed JSON or YAML) is nested too deep, or None; walks it without recursion."""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict | list):
            if depth > limit:
                return f"nested more than {limit} levels deep; a spec needs at most {limit} levels of lists and objects"
            stack.extend((child, depth + 1) for child in (item.values() if isinstance(item, dict) else item))
    return None


def parse_document(text: str, as_yaml: bool = False) -> Any:
    """The JSON (or, with `as_yaml`, YAML) document `text`; DocumentError saying why when it
    does not parse or is nested deeper than MAX_NESTING."""
    try:
        if as_yaml:
            import yaml

            try:
                value = yaml.safe_load(text)
            except yaml.YAMLError as exc:
                raise DocumentError(f"not valid YAML: {exc}") from None
        else:
            value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise DocumentError(f"not valid JSON: {exc}") from None
    except RecursionError:
        raise DocumentError(f"nested too deep to parse; a spec needs at most {MAX_NESTING} levels of lists and objects") from None
    if problem := nesting_problem(value):
        raise DocumentError(problem)
    return value


def read_document(path: str | Path, what: str) -> Any:
    """The JSON document in file `path` (YAML when it ends in .yaml or .yml); DocumentError
    "cannot read <what> <path>: <why>" when it cannot be read, does not parse or is nested too deep."""
    try:
        return parse_document(Path(path).read_text(), as_yaml=str(path).endswith(YAML_SUFFIXES))
    except (OSError, UnicodeDecodeError, DocumentError) as exc:
        raise DocumentError(f"cannot read {what} {path}: {exc}") from None
