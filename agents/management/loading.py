"""What the `load_*` commands share: a JSON or YAML file of entries, and the errors that make a
load fail as a whole with a clear message."""

import json
from pathlib import Path
from typing import Any

import yaml
from django.core.exceptions import ValidationError

# A file that cannot be read or parsed, or entries that the action refuses.
LOAD_ERRORS = (OSError, ValueError, yaml.YAMLError, ValidationError)


def read_entries(file: Path) -> Any:
    text = file.read_text()
    return yaml.safe_load(text) if file.suffix in (".yaml", ".yml") else json.loads(text)
