"""What the `load_*` commands share: a JSON or YAML file of entries, and the errors that make a
load fail as a whole with a clear message."""

from pathlib import Path
from typing import Any

import yaml
from django.core.exceptions import ValidationError

from config.payloads import check_storable, loads

# A file that cannot be read or parsed, or entries that the action refuses.
LOAD_ERRORS = (OSError, ValueError, yaml.YAMLError, ValidationError)


def read_entries(file: Path) -> Any:
    """The file's entries, held to what every payload is (config.payloads: text keys and strings,
    finite numbers, a bounded depth), whether it is JSON or YAML."""
    text = file.read_text()
    if file.suffix not in (".yaml", ".yml"):
        return loads(text, where=file.name)
    try:
        entries = yaml.safe_load(text)
    except RecursionError:
        raise ValueError(f"{file.name} nests too deep.") from None
    check_storable(entries, where=file.name)
    return entries
