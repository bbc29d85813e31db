from typing import Any

from django.db import transaction

from agents.models import AgentProfile

PROFILE_FIELDS = {f.name for f in AgentProfile._meta.get_fields()} - {"id", "updated_at"}


class InvalidProfiles(ValueError):
    pass


@transaction.atomic
def load_profiles(*, entries: Any) -> tuple[int, int]:
    """Create or update profiles by name; all of them or none. Returns (created, updated)."""
    if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
        raise InvalidProfiles("A profiles file holds a list of objects.")
    created = updated = 0
    for entry in entries:
        if missing := {"name", "role", "model"} - set(entry):
            raise InvalidProfiles(f"Profile {entry.get('name', '?')!r} lacks {', '.join(sorted(missing))}.")
        if unknown := set(entry) - PROFILE_FIELDS:
            raise InvalidProfiles(f"Profile {entry['name']!r} has unknown keys: {', '.join(sorted(unknown))}.")
        fields = {k: v for k, v in entry.items() if k != "name"}
        profile = AgentProfile.objects.filter(name=entry["name"]).first() or AgentProfile(name=entry["name"])
        is_new = profile.pk is None
        for key, value in fields.items():
            setattr(profile, key, value)
        profile.full_clean()
        profile.save()
        created, updated = created + is_new, updated + (not is_new)
    return created, updated
