"""What the `load_*` commands share: a JSON or YAML file of entries, and the errors that make a
load fail as a whole with a clear message."""

from pathlib import Path
from typing import Any

import yaml
from django.core.exceptions import ValidationError

from config.payloads import loads

# A file that cannot be read or parsed, or entries that the action refuses.
LOAD_ERRORS = (OSError, ValueError, yaml.YAMLError, ValidationError)


def read_entries(file: Path) -> Any:
    """The file's entries: JSON read as every payload is (config.payloads: no NaN, a bounded
    depth), or YAML; either way every key is text, as in JSON."""
    text = file.read_text()
    try:
        entries = yaml.safe_load(text) if file.suffix in (".yaml", ".yml") else loads(text, where=file.name)
    except RecursionError:
        raise ValueError(f"{file.name} nests too deep.") from None
    check_keys(entries)
    return entries


def check_keys(value: Any) -> None:
    level = [value]
    while level:
        for mapping in (v for v in level if isinstance(v, dict)):
            if odd := [k for k in mapping if not isinstance(k, str)]:
                raise ValueError(f"Keys are text: {odd[0]!r} is not.")
        level = [c for v in level if isinstance(v, dict | list) for c in (v.values() if isinstance(v, dict) else v)]
