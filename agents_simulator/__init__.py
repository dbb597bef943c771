"""A local simulator of OpenAI's Agents API: sessions, signed webhooks, executors and their work.

Users run the whole loop on one machine with it, and every test tier uses it as the
Agents API. Production modules never import it. One port serves everything (``--tls-listen``
adds a second one serving the same over TLS, see ``cli.py``)::

    python -m agents_simulator --port 8100 --environment-key KEY \\
        --webhook-url http://127.0.0.1:8000/webhooks --webhook-secret whsec_...

In-process: ``create_app(SimulatorConfig(...))`` and serve it with uvicorn;
``app.state.simulator`` is the engine.

Public API (``Authorization: Bearer <non-empty>``, or exactly ``--api-key``)
    POST   /v1/agents/sessions                  create (``environment`` required)
    GET    /v1/agents/sessions                  cursor list (after, limit, order, agent_id, metadata[k])
    GET    /v1/agents/sessions/{id}             retrieve
    DELETE /v1/agents/sessions/{id}             delete (no webhook; closes the executor's WebSockets)
    POST   /v1/agents/sessions/{id}/events      input → 202 (honours Idempotency-Key)
    GET    /v1/agents/environments/{id}         ``agent.environment`` with ``status``
    POST   /v1/webhook_endpoints                create {name, url, event_types} → with ``signing_secret``
    GET    /v1/webhook_endpoints                cursor list, newest first (after, limit)
    GET    /v1/webhook_endpoints/{id}           retrieve (``signing_secret_hint`` only)
    POST   /v1/webhook_endpoints/{id}           update name / url / event_types
    DELETE /v1/webhook_endpoints/{id}           delete
    POST   /v1/webhook_endpoints/{id}/rotate_secret   new secret; ``keep_old_secret_active_for_24_hours``
                                                signs with both meanwhile
    POST   /v1/webhook_endpoints/{id}/test      post one signed sample event now → its status code
    GET    /v1/webhook_event_types              the event types an endpoint may subscribe to
    (Events reach every configured --webhook-url and every endpoint subscribed to their type.)

Executor side (what ``codex exec-server --remote <remote_url>`` calls)
    POST   /cloud/environment/{id}/register     Bearer <environment key>; 401 / 404 / 200
    POST   /cloud/environment/{id}/validate     Bearer <environment key>; {"valid": true} only
                                                for the harness key and an authorization the
                                                simulator issued for that executor registration
    WS     /cloud/environment/{id}/connect?token=…   ``connected`` while open; the simulator is
                                                the harness on it (``harness.py``): relay
                                                streams, Noise handshake, JSON-RPC commands

Admin (no auth; loopback only)
    GET    /healthz
    GET    /admin/registrations[?environment_id=]   every register call: id, environment_id,
                                                    received_at, key_matched, environment_known,
                                                    status_code, security_profile,
                                                    executor_public_key_present, scheme
                                                    (https: over TLS) (never the key)
    GET    /admin/deliveries[?event_id=&type=]       each (event, URL) delivery with its attempts
    GET    /admin/events                             every event envelope sent
    POST   /admin/webhooks/resend/{event_id}         deliver an event again (same webhook-id) → 202
    POST   /admin/webhooks/hold  {"seconds", "order", "seed"}   deliveries starting in the next
               ``seconds`` wait, then go out one by one in ``order``: fifo | reverse | shuffle
    GET    /admin/faults                             armed faults
    POST   /admin/faults  {"target", "status", "count" | "seconds", "retry_after", "kind",
                           "hold_seconds", "object_id"}
               the next ``count`` calls of ``target`` (or every call for ``seconds``) answer
               ``status`` (429/5xx with Retry-After when given); ``kind: "timeout"`` holds the
               answer ``hold_seconds`` instead (/v1 calls only); ``object_id`` narrows the fault
               to one session or environment (``faults.py``). Targets: create_session,
               retrieve_session, list_sessions, delete_session, create_events,
               retrieve_environment, register, validate, create_webhook_endpoint,
               list_webhook_endpoints, retrieve_webhook_endpoint, update_webhook_endpoint,
               delete_webhook_endpoint, rotate_webhook_secret, test_webhook_endpoint,
               list_webhook_event_types
    DELETE /admin/faults                             disarm all
    GET    /admin/held                               calls a ``timeout`` fault holds now: target,
                                                    object_id, client (host:port), since
    GET    /admin/sessions                           every session: status, wants_connection, since
    GET    /admin/sessions/{id}/history              every change of its state, with its time
    POST   /admin/sessions/{id}/fail  {"error"}      force a session to ``failed`` (+ webhook)
    POST   /admin/sessions/{id}/remote_url  {"remote_url"}   the session names this remote_url
                                                    from now on (no webhook; tests of L2)
    GET    /admin/environments                       every environment with its status and link: open
                                                    connections, connected_since / disconnected_since,
                                                    every stretch it was up (links)
    POST   /admin/environments/{id}/disconnect       close the executor's WebSockets
    POST   /admin/environments/{id}/drop  {"seconds"}   an outage of the link: close its WebSockets
                                                    and answer upgrades 503 for ``seconds`` (the
                                                    executor retries the same URL, no new registration)
    POST   /admin/sessions/{id}/turns  {"commands": [argv | {"argv", "cwd", "env", "timeout_seconds"}]}
               input whose turn runs the commands in the sandbox → 202 the turn
    GET    /admin/sessions/{id}/turns                scripted turns with stdout, stderr, exit code, timing
    POST   /admin/environments/{id}/exec  {"argv", …, "new_stream"}   one command now, outside turns
    GET    /admin/validations                        every /validate call and its verdict
    GET    /admin/links[?environment_id=]            open executor links: streams, frames, records
    POST   /admin/harness/impostor  {"count"}        the next handshakes present a key never published

Every list answer is ``{"object": "list", "data": [...]}``. See ``engine.py`` for the
session state machine and ``webhooks.py`` for delivery and retry behaviour.
"""

from agents_simulator.app import create_app
from agents_simulator.config import SimulatorConfig

__all__ = ["SimulatorConfig", "create_app"]
