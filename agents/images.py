"""Images in model messages. A prompt's images go to the models that can see them as OpenAI content
parts, `{"type": "image_url", "image_url": {"url": ...}}`, after the text. A saga artifact's part
names it (`artifact:<name>`) wherever messages are stored, and becomes a data URL only in the
request sent, so that transcripts stay small; an artifact deleted since then becomes a line of
text that says so."""

import base64
from typing import Any

from sagas.models import Artifact

VISION = "vision"
ARTIFACT = "artifact:"


def with_images(text: str, images: list[str]) -> str | list[dict[str, Any]]:
    """A message's content: the text, then a part per image (the text alone when there is none)."""
    if not images:
        return text
    return [{"type": "text", "text": text}, *({"type": "image_url", "image_url": {"url": url}} for url in images)]


def artifact_names(messages: list[dict[str, Any]]) -> set[str]:
    """The artifacts the messages' image parts name."""
    return {url.removeprefix(ARTIFACT) for url in image_urls(messages) if url.startswith(ARTIFACT)}


def for_request(
    messages: list[dict[str, Any]], *, saga_id: Any, found: dict[str, str] | None = None
) -> list[dict[str, Any]]:
    """The messages as sent: each artifact's part as a data URL, the saga's artifacts read once
    (`found`: the data URLs already made, by name, which this adds to: a task's later calls)."""
    found = {} if found is None else found
    if missing := artifact_names(messages) - set(found):
        found.update(
            (name, f"data:{content_type};base64,{base64.b64encode(bytes(content)).decode('ascii')}")
            for name, content_type, content in Artifact.objects.filter(saga_id=saga_id, name__in=missing).values_list(
                "name", "content_type", "content"
            )
        )

    def sent(part: Any) -> Any:
        url = part_url(part)
        if not url.startswith(ARTIFACT):
            return part
        name = url.removeprefix(ARTIFACT)
        if name not in found:
            return {"type": "text", "text": f"[The image artifact {name} was deleted.]"}
        return {"type": "image_url", "image_url": {"url": found[name]}}

    return [
        {**m, "content": [sent(p) for p in m["content"]]} if isinstance(m.get("content"), list) else m for m in messages
    ]


def image_urls(messages: list[dict[str, Any]]) -> list[str]:
    return [
        url for m in messages if isinstance(m.get("content"), list) for part in m["content"] if (url := part_url(part))
    ]


def part_url(part: Any) -> str:
    if not isinstance(part, dict) or part.get("type") != "image_url" or not isinstance(part.get("image_url"), dict):
        return ""
    return str(part["image_url"].get("url") or "")
