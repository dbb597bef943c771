"""``sandbox-controller webhook register|rotate|test|list|delete``: the Agents API webhook endpoint.

The API calls are ``webhook_endpoints.HttpWebhookEndpoints``; where the receiver's secrets
go (a 0600 file, a Kubernetes Secret, or printed once) is ``webhook_secrets``. The event
types are ``events.handled_types``: ``HANDLED_TYPES``, plus ``agent.session.created`` when
``CONTROLLER_PRESTART_AGENT_IDS`` is set. Secrets are never taken as arguments and never logged.

A new secret is never lost: the API shows it once, so ``register`` and ``rotate`` check their
input and prove the destination writable (``SecretStore.prepare``) *before* they ask the API
for one, and if saving it still fails afterwards they print it once with the reason and exit 1.
Every error is one line and a non-zero exit (``UsageError``: 2; an API or Kubernetes failure: 1).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from controller import logs, wiring
from controller.config import Secret, Settings
from controller.errors import ControllerError, UsageError
from controller.events import HANDLED_TYPES, SESSION_CREATED, handled_types
from controller.webhook_endpoints import DEFAULT_NAME, OVERLAP_SECONDS, Endpoint, HttpWebhookEndpoints, register
from controller.webhook_secrets import DEFAULT_SECRET_KEY, KubeSecret, SecretFile, SecretStore, kube_api


def _handled() -> tuple[str, ...]:
    """The event types the controller configured by this environment enqueues."""
    return handled_types(Settings.from_env(os.environ).lifecycle.prestarts)


def _webhook_api() -> HttpWebhookEndpoints:
    settings = Settings.from_env(os.environ)
    settings.require("webhook")
    logs.setup(settings.log_level, secrets=wiring.secret_values(settings))
    assert settings.api.api_key is not None
    return HttpWebhookEndpoints(settings.api.base_url, settings.api.api_key.reveal(), settings.api.timeout_seconds)


def _text_argument(option: str, value: str | None) -> None:
    """An argument the API or a path will carry must be text: one that holds bytes that are not
    UTF-8 (a lone surrogate from the command line) or control characters is refused here."""
    if value is None:
        return
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise UsageError(f"{option} holds bytes that are not UTF-8 text") from None
    if not value.isprintable():
        raise UsageError(f"{option} holds control characters")


def _check_arguments(args: argparse.Namespace) -> None:
    for option in ("url", "id", "name", "secret_file", "kube_secret", "kube_secret_key", "event_type"):
        _text_argument("--" + option.replace("_", "-"), getattr(args, option, None))


def _secret_store(args: argparse.Namespace) -> SecretStore | None:
    _check_arguments(args)
    if args.secret_file:
        return SecretFile(Path(args.secret_file))
    if args.kube_secret:
        namespace, _, name = args.kube_secret.partition("/")
        if not namespace or not name:
            raise UsageError(f"--kube-secret takes NAMESPACE/NAME, got {args.kube_secret!r}")
        return KubeSecret(kube_api(), namespace, name, args.kube_secret_key)
    return None


def _endpoint(api: HttpWebhookEndpoints, args: argparse.Namespace) -> Endpoint:
    if args.id:
        return api.retrieve(args.id)
    found = api.find(args.url)
    if found is None:
        raise UsageError(f"no webhook endpoint is registered for {args.url}")
    return found


def _keep(store: SecretStore, secrets: list[Secret], what: str) -> bool:
    """Write ``secrets`` to ``store``; if that fails after all (``prepare`` passed), print them
    once with the reason, since the API will not show them again. Whether they were written."""
    try:
        store.write(secrets)
    except ControllerError as exc:  # UsageError, KubernetesUnavailable, Permanent: each one line
        print(f"sandbox-controller: could not save the {what}: {exc}", file=sys.stderr)
        print(f"{what} (shown once, since it was not saved; keep it, e.g. as CONTROLLER_WEBHOOK_SECRETS):")
        print(",".join(s.reveal() for s in secrets))
        return False
    print(f"{what} written to {store.describe()}")
    return True


def cmd_webhook_register(args: argparse.Namespace) -> int:
    store = _secret_store(args)
    if store is not None:
        store.prepare()  # before the API makes a secret it shows only once
    api = _webhook_api()
    try:
        done = register(api, args.url, _handled(), args.name)
    finally:
        api.close()
    endpoint = done.endpoint
    types = ", ".join(endpoint.event_types)
    if done.secret is None:
        state = "updated" if done.changed else "already registered, unchanged"
        print(f"webhook endpoint {endpoint.id} for {endpoint.url}: {state}; event types: {types}")
        print("its signing secret stands and is not shown again (`sandbox-controller webhook rotate` makes a new one)")
        if store is not None and not store.read():
            print(f"note: {store.describe()} holds no secret; if it was lost, `webhook rotate` makes a new one")
        return 0
    print(f"webhook endpoint {endpoint.id} for {endpoint.url}: created; event types: {types}")
    if store is None:
        print("signing secret (shown once; set it as CONTROLLER_WEBHOOK_SECRETS):")
        print(done.secret.reveal())
        return 0
    return 0 if _keep(store, [done.secret], "signing secret") else 1


def cmd_webhook_rotate(args: argparse.Namespace) -> int:
    store = _secret_store(args)
    if args.finish:
        if store is None:
            raise UsageError("--finish needs --secret-file or --kube-secret")
        current = store.read()
        if not current:
            raise UsageError(f"{store.describe()} holds no secret")
        store.write(current[:1])  # the newest is in the store already: a failure loses nothing
        print(f"kept only the newest signing secret: written to {store.describe()}")
        print(
            "a receiver reading that file takes it up by itself; one given CONTROLLER_WEBHOOK_SECRETS needs a restart"
        )
        return 0
    current = store.read() if store is not None else []
    if store is not None:
        store.prepare()  # before the API makes a secret it shows only once
    api = _webhook_api()
    try:
        endpoint = _endpoint(api, args)
        rotated = api.rotate_secret(endpoint.id, keep_old=not args.no_overlap)
    finally:
        api.close()
    overlap = not args.no_overlap
    until = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(time.time() + OVERLAP_SECONDS))
    value = [rotated.secret, *current[:1]] if overlap else [rotated.secret]
    print(f"rotated the signing secret of webhook endpoint {endpoint.id}")
    if store is None:
        print("new signing secret (shown once):")
        print(rotated.secret.reveal())
        if overlap:
            print("set CONTROLLER_WEBHOOK_SECRETS to NEW,OLD (the new one first) and restart the receiver")
    elif not _keep(store, value, "receiver secrets (new, old)" if overlap else "receiver secret"):
        return 1
    else:
        print(
            "a receiver reading that file takes them up by itself; one given CONTROLLER_WEBHOOK_SECRETS needs a restart"
        )
    if overlap:
        print(f"the API signs with both until {until}; after that, drop the old one:")
        print("  sandbox-controller webhook rotate --finish --secret-file … | --kube-secret …")
    else:
        print("the old secret is no longer used: deliveries fail until the receiver has the new one")
    return 0


def cmd_webhook_test(args: argparse.Namespace) -> int:
    _check_arguments(args)
    api = _webhook_api()
    try:
        result = api.test(_endpoint(api, args).id, args.event_type)
    finally:
        api.close()
    verdict = "received" if result.received else "NOT received (is the receiver's secret the endpoint's current one?)"
    where = f"webhook endpoint {result.endpoint_id}"
    print(f"test {result.event_type} to {where}: the receiver answered {result.status_code}: {verdict}")
    return 0 if result.received else 1


def cmd_webhook_list(args: argparse.Namespace) -> int:
    api = _webhook_api()
    try:
        endpoints = api.list()
    finally:
        api.close()
    if args.json:
        print(json.dumps([e.to_json() for e in endpoints], indent=2))
        return 0
    handled = sorted(_handled())
    for e in endpoints:
        fit = "" if sorted(e.event_types) == handled else "  (event types differ from what the controller handles)"
        print(f"{e.id}  {e.url}  {e.name}  {','.join(e.event_types)}{fit}")
    print(f"{len(endpoints)} endpoint(s)")
    return 0


def cmd_webhook_delete(args: argparse.Namespace) -> int:
    _check_arguments(args)
    api = _webhook_api()
    try:
        endpoint = _endpoint(api, args)
        deleted = api.delete(endpoint.id)
    finally:
        api.close()
    print(f"webhook endpoint {endpoint.id} for {endpoint.url}: {'deleted' if deleted else 'not deleted'}")
    return 0 if deleted else 1


def add_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    webhook = sub.add_parser(
        "webhook",
        help="register and manage the Agents API webhook endpoint",
        description="Manage the webhook endpoint that sends this controller its events. Reads "
        "CONTROLLER_API_KEY (or CONTROLLER_API_KEY_FILE) and CONTROLLER_API_BASE_URL. Secrets are never "
        "taken on the command line and never logged.",
    )
    commands = webhook.add_subparsers(dest="webhook_command", required=True)

    def secret_options(parser: argparse.ArgumentParser) -> None:
        where = parser.add_mutually_exclusive_group()
        where.add_argument("--secret-file", metavar="PATH", help="write the receiver's secrets to PATH (mode 0600)")
        where.add_argument(
            "--kube-secret",
            metavar="NAMESPACE/NAME",
            help="write them to this Kubernetes Secret (the chart's webhook.existingSecret)",
        )
        parser.add_argument(
            "--kube-secret-key",
            default=DEFAULT_SECRET_KEY,
            metavar="KEY",
            help=f"key in that Secret (the chart's webhook.existingSecretKey; default {DEFAULT_SECRET_KEY})",
        )

    def which(parser: argparse.ArgumentParser) -> None:
        chosen = parser.add_mutually_exclusive_group(required=True)
        chosen.add_argument("--url", help="the endpoint registered for this URL")
        chosen.add_argument("--id", help="the endpoint with this id (we_…)")

    handled = ", ".join(HANDLED_TYPES)
    reg = commands.add_parser(
        "register",
        help="create the endpoint for a URL, or update the one that exists (idempotent)",
        description=f"Subscribes exactly the event types the controller handles ({handled}; with "
        f"CONTROLLER_PRESTART_AGENT_IDS set, {SESSION_CREATED} too). The signing "
        "secret is printed once, or written with --secret-file / --kube-secret.",
    )
    reg.add_argument("--url", required=True, help="the receiver's public URL, e.g. https://hooks.example.com/webhooks")
    reg.add_argument("--name", default=DEFAULT_NAME, help=f"endpoint name (default {DEFAULT_NAME})")
    secret_options(reg)
    reg.set_defaults(func=cmd_webhook_register)

    rotate = commands.add_parser(
        "rotate",
        help="rotate the signing secret; both are valid for 24 hours",
        description="Asks the API for a new secret and to keep signing with the old one for 24 hours, and "
        "writes NEW,OLD for the receiver. After the overlap, --finish keeps only the new one.",
    )
    which_group = rotate.add_mutually_exclusive_group(required=True)
    which_group.add_argument("--url", help="the endpoint registered for this URL")
    which_group.add_argument("--id", help="the endpoint with this id (we_…)")
    which_group.add_argument(
        "--finish", action="store_true", help="after the overlap: keep only the newest secret (no API call)"
    )
    rotate.add_argument("--no-overlap", action="store_true", help="invalidate the old secret at once")
    secret_options(rotate)
    rotate.set_defaults(func=cmd_webhook_rotate)

    test = commands.add_parser("test", help="ask the API to send a test event; report whether the receiver took it")
    which(test)
    test.add_argument("--event-type", default=HANDLED_TYPES[0], help=f"event type to send (default {HANDLED_TYPES[0]})")
    test.set_defaults(func=cmd_webhook_test)

    listing = commands.add_parser("list", help="list the project's webhook endpoints")
    listing.add_argument("--json", action="store_true", help="print JSON")
    listing.set_defaults(func=cmd_webhook_list)

    delete = commands.add_parser("delete", help="delete an endpoint")
    which(delete)
    delete.set_defaults(func=cmd_webhook_delete)
