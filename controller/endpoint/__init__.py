"""The public endpoint: the one part of the product that faces the internet.

- ``app.py``: the webhook receiver, a Starlette app (``create_app(ReceiverServices)``): the
  deliveries' signatures, bodies, classification and the inbox;
- ``server.py``: the HTTP/1.1 server it runs on (``run``, ``serve``), built for clients that
  attack it: every byte counted against a limit, every phase on a clock;
- ``framing.py``: where a request's head, body and trailers end (httptools, that is llhttp),
  bytes in, decisions out.

This module is the package's one face: the wiring, the cli, the tests of the endpoint's promises
and bench/ import from here; only tests of the internals import the modules themselves.
"""

from controller.endpoint.app import ReceiverServices, create_app
from controller.endpoint.server import REFUSAL_REASONS, Limits, Server, run, serve

__all__ = ["REFUSAL_REASONS", "Limits", "ReceiverServices", "Server", "create_app", "run", "serve"]
