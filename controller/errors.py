"""The controller's exceptions, grouped by what the caller should do.

    ControllerError
    ├── ConfigError          bad settings: report all problems at start-up, exit 2
    │   ├── RedisPasswordRefused  Redis or a sentinel refused the password a setting gives:
    │   │                    raised at the first refusal, never retried (only the setting can fix it)
    │   └── RedisCertificateRefused  a Redis or sentinel certificate the CA file does not
    │                        verify: the same, at the first TLS handshake
    ├── UsageError           a command's input (an argument, a file or place it names) cannot
    │                        be used: say so in one line, exit 2, change nothing
    ├── RejectDelivery       the webhook delivery is bad: answer 4xx, change nothing
    │   ├── SignatureError   401: missing, garbled, stale or unmatched signature
    │   ├── BadPayload       400: not JSON, not an event envelope
    │   ├── BodyTimeout      408: the body did not arrive within its deadline
    │   ├── BodyTooLarge     413: more than the body limit was declared or sent
    │   └── Unqueueable      422: verified, but its job can never be queued (not encodable)
    ├── Transient            try again later (503 to a sender, Celery retry in a task)
    │   ├── StoreUnavailable Redis cannot be reached
    │   ├── QueueUnavailable the broker refused the job
    │   ├── ApiUnavailable   the Agents API timed out, throttled or failed (5xx)
    │   ├── KubernetesUnavailable  the API server cannot be reached, or answered 429/5xx
    │   └── StartFailed      a sandbox could not be started for a reason that may pass (the
    │                        executor binary missing, an exec error, the uid range full, the
    │                        API server's 403 or quota): retried while the session asks
    ├── Permanent            give up on this job, log it; retrying will not help
    │   ├── ApiRejected      the Agents API said 4xx (other than 404/429)
    │   └── RunnerRejected   the runner backend refused the spec (bad config); raised while
    │       │                starting a sandbox it becomes ``StartFailed``, unless it is a
    │       └── SpecRefused  the spec itself is unsafe (an id, the remote URL): never started
    ├── KubernetesError      the API server refused a request with an answer the caller did
    │                        not expect (no idempotency signal, not 401/403/429/5xx): a bug,
    │                        or input to check; said loudly, neither retried as Transient nor
    │                        given up on as Permanent
    └── Fenced               a stale decision (the lease was lost): drop it, look again later
        └── LeadershipLost   the scheduler no longer leads: its leader actions are refused

Third-party exceptions are translated once, in the adapter that sees them, with
``raise ... from exc``. Messages carry ids, never secrets.
"""

from __future__ import annotations


class ControllerError(Exception):
    """Base of every error the controller raises on purpose."""


class ConfigError(ControllerError):
    """Settings are invalid; ``problems`` lists every one found."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = list(problems)
        super().__init__("invalid configuration:\n" + "\n".join(f"  - {p}" for p in problems))


class RedisPasswordRefused(ConfigError):
    """Redis, or a sentinel, refused the credentials ``setting`` gives (a wrong password, or none
    where one is required). Retrying cannot help, so the clients raise it at the first refusal
    instead of retrying it as a lost connection. The message names the setting and the server,
    never the password."""

    def __init__(self, setting: str, where: str, reply: str) -> None:
        self.setting = setting
        super().__init__(
            [f"{setting}: {where} refused its credentials ({reply}); fix the setting, retrying cannot help"]
        )


class RedisCertificateRefused(ConfigError):
    """A ``rediss://`` server (Redis or a sentinel) presented a certificate that does not verify
    against the CA bundle ``setting`` names (or the system's): retrying cannot help, so the
    clients raise it at the first handshake instead of retrying it as a lost connection."""

    def __init__(self, setting: str, where: str, reason: str) -> None:
        self.setting = setting
        super().__init__([f"{setting}: {where} presented a certificate it does not verify ({reason}); fix it"])


class UsageError(ControllerError):
    """A command's argument, or a file or place it names, cannot be used (the message says
    which and why, in one line, never quoting a secret)."""


class RejectDelivery(ControllerError):
    status_code = 400


class SignatureError(RejectDelivery):
    status_code = 401


class BadPayload(RejectDelivery):
    status_code = 400


class BodyTimeout(RejectDelivery):
    status_code = 408


class Unqueueable(RejectDelivery):
    """A verified event whose job the queue can never hold: retrying cannot help."""

    status_code = 422


class BodyTooLarge(RejectDelivery):
    status_code = 413


class Transient(ControllerError):
    """Worth retrying; ``retry_after`` (seconds) is a hint when the other side gave one."""

    def __init__(self, message: str, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class StoreUnavailable(Transient):
    pass


class QueueUnavailable(Transient):
    pass


class ApiUnavailable(Transient):
    pass


class KubernetesUnavailable(Transient):
    pass


class StartFailed(Transient):
    """A sandbox could not be started for a reason that may pass: the work stays wanted, the
    task retries with backoff, and the recovery pass enqueues it again until the session no
    longer asks (``lifecycle``)."""


class Permanent(ControllerError):
    pass


class ApiRejected(Permanent):
    pass


class RunnerRejected(Permanent):
    pass


class SpecRefused(RunnerRejected):
    """The spec is unsafe to start (an id or the remote URL, L2): retrying cannot help."""


class KubernetesError(ControllerError):
    """An answer of the API server no caller expects (translated by ``runners.kubernetes.api``):
    its HTTP ``status`` and ``reason`` ride along."""

    def __init__(self, message: str, status: int, reason: str) -> None:
        super().__init__(message)
        self.status = status
        self.reason = reason


class Fenced(ControllerError):
    """The caller no longer holds the session's lease; its decision is stale."""


class LeadershipLost(Fenced):
    """The scheduler's leadership term is over (renew deadline missed, or another leads): what it
    was about to do as the leader is not done."""
