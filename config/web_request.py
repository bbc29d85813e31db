"""What Twisted does with a request's body under daphne, before the app sees it: daphne builds each
request with its module's `WebRequest`, which config/web.py replaces with this one.

- Twisted parses every multipart POST body into arguments daphne never reads, and answers one it
  cannot parse with a bare `400` of its own (no body, no content type): the app never saw it, so a
  malformed upload got no problem+json and no code, and every upload was parsed twice. Twisted's
  switch for that parse (`parsePOSTFormSubmission`, hence the pin in requirements/base.txt) is off:
  Django parses the body, and refuses a malformed one as everything else is refused.
- Twisted takes in a body of any size (over 100 kB to a temporary file) and calls daphne only once
  it is whole, and Django copies it again before the app refuses it: anyone could make the server
  write gigabytes to disk, twice. A body declared over AGORA_MAX_BODY_BYTES, or a chunked one once
  it passes it, is answered 413 `payload_too_large` at once (problem+json where machines call, text
  elsewhere, as config/middleware.py refuses). Then the answer's end is sent (the server's half of
  the connection closes) and whatever else comes is read and dropped, unparsed, until the client
  closes its half or AGORA_BODY_LINGER_S pass: most clients send the whole body before they read
  the answer, and a connection closed with their body unread is reset under them, the 413 lost
  with it."""

import logging
from typing import Any

from daphne import http_protocol
from django.conf import settings
from twisted.internet import tcp
from twisted.web.http_headers import Headers

from config.problems import refusal_body

logger = logging.getLogger(__name__)


class WebRequest(http_protocol.WebRequest):
    refused = False
    received = 0

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, parsePOSTFormSubmission=False, **kwargs)

    def gotLength(self, length: int | None) -> None:  # the headers are in: the declared length, if any
        if length is not None and length > settings.AGORA_MAX_BODY_BYTES:
            self.refuse()
        else:
            super().gotLength(length)

    def handleContentChunk(self, data: bytes) -> None:
        if self.refused:
            return  # what came in the same read as the part that passed the limit
        self.received += len(data)
        if self.received > settings.AGORA_MAX_BODY_BYTES:
            self.refuse()
        else:
            super().handleContentChunk(data)

    def requestReceived(self, command: bytes, path: bytes, version: bytes) -> None:
        if not self.refused:  # a chunked body cut off may end in the read that passed the limit
            super().requestReceived(command, path, version)

    def refuse(self) -> None:
        self.refused = True
        self.requestHeaders.removeHeader(b"Expect")  # Twisted would send `100 Continue` after the answer
        detail = f"Limit is {settings.AGORA_MAX_BODY_BYTES} bytes for a request body."
        path = self.channel._path.split(b"?", 1)[0].decode("latin-1")  # the request line's: ours has none yet
        logger.warning("413 %s: a body over %d bytes, refused unread", path[:200], settings.AGORA_MAX_BODY_BYTES)
        kind, body = refusal_body(path, 413, "payload_too_large", "Payload too large", detail)
        head = {b"Content-Type": [kind.encode()], b"Content-Length": [b"%d" % len(body)], b"Connection": [b"close"]}
        self.channel.writeHeaders(b"HTTP/1.1", b"413", b"Payload Too Large", Headers(head))
        self.channel.write(body)
        self.linger()

    def linger(self) -> None:
        """Close the server's half of the connection once the answer is out, read what the client
        still sends without parsing it, and close the rest when the client does or after
        AGORA_BODY_LINGER_S."""
        channel, transport = self.channel, self.channel.transport
        if not isinstance(transport, tcp.Connection):  # TLS served by daphne itself: its close_notify first
            channel.loseConnection()
            return
        channel.dataReceived = lambda data: None  # as Twisted's upgrade to WebSockets swaps it
        transport.loseWriteConnection()
        channel.callLater(settings.AGORA_BODY_LINGER_S, transport.loseConnection)
