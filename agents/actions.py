from typing import Any

from django.db import transaction

from agents.models import PROFILE_TYPES, WRONG_TYPE, AgentProfile

PROFILE_FIELDS = {f.name for f in AgentProfile._meta.get_fields()} - {"id", "updated_at"}


class InvalidProfiles(ValueError):
    pass


def repeated(names: list[Any]) -> Any:
    """The first of the names of a file's entries (in order) that names two of them, if any:
    loading both would keep the last."""
    return next((name for i, name in enumerate(names) if name in names[:i]), None)


@transaction.atomic
def load_profiles(*, entries: Any) -> tuple[int, int]:
    """Create or update profiles by name; all of them or none. Returns (created, updated)."""
    if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
        raise InvalidProfiles("A profiles file holds a list of objects.")
    if (twice := repeated([entry.get("name") for entry in entries])) is not None:
        raise InvalidProfiles(f"Profile {twice!r} is in the file twice.")
    created = updated = 0
    for entry in entries:
        if missing := {"name", "role", "model"} - set(entry):
            raise InvalidProfiles(f"Profile {entry.get('name', '?')!r} lacks {', '.join(sorted(missing))}.")
        if unknown := set(entry) - PROFILE_FIELDS:
            raise InvalidProfiles(f"Profile {entry['name']!r} has unknown keys: {', '.join(sorted(unknown))}.")
        if wrong := sorted(key for key, value in entry.items() if not PROFILE_TYPES[key](value)):
            raise InvalidProfiles(f"Profile {entry['name']!r}: wrong type for {', '.join(wrong)} ({WRONG_TYPE}).")
        fields = {k: v for k, v in entry.items() if k != "name"}
        profile = AgentProfile.objects.filter(name=entry["name"]).first() or AgentProfile(name=entry["name"])
        is_new = profile.pk is None
        for key, value in fields.items():
            setattr(profile, key, value)
        profile.full_clean()
        profile.save()
        created, updated = created + is_new, updated + (not is_new)
    return created, updated
