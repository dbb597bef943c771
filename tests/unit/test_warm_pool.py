"""Warm pools as pure decisions (``runners/kubernetes/pool.py``), the warm pod's manifest and
its claim (``make_warm_pod``, ``claim_patch``), and the ``warmPool`` template field."""

from __future__ import annotations

import json

import pytest

from controller.errors import ConfigError
from controller.model import PoolState, SandboxSpec
from controller.runners.kubernetes import names
from controller.runners.kubernetes.manifests import (
    BINDING_DIRECTORY,
    PodSettings,
    SandboxTemplate,
    binding_refresh_patch,
    claim_patch,
    make_pod,
    make_warm_pod,
    shape,
)
from controller.runners.kubernetes.objects import Pod
from controller.runners.kubernetes.pool import (
    BINDING_REFRESH_AFTER_SECONDS,
    WarmPod,
    binding_refresh_due,
    census,
    claim_order,
    peak,
    plan,
    settling,
    target,
)
from controller.runners.kubernetes.templates import parse

NOW = 10_000.0
SHAPE = "abc"
MAX_AGE = 3600.0
SPEC = SandboxSpec("sess_1", "env_1", "https://api.example.test/v1", "/workspace")


def pod(name: str, age: float, running: bool = True, **more: object) -> WarmPod:
    fields: dict[str, object] = {"shape": SHAPE, "dead": False, "terminating": False, **more}
    return WarmPod(name, f"uid-{name}", "1", NOW - age, running=running, **fields)  # type: ignore[arg-type]


# -- which pod a session claims ----------------------------------------------------------------


def test_claim_order_prefers_running_then_oldest() -> None:
    pods = [pod("young", 10), pod("old", 100), pod("pending-old", 500, running=False), pod("mid", 50)]
    assert [p.name for p in claim_order(pods, SHAPE, NOW, MAX_AGE)] == ["old", "mid", "young", "pending-old"]


def test_a_bursts_claims_start_at_pods_of_their_own_and_each_may_try_every_pod() -> None:
    """Ten claims at once (``spread``: each session's id) begin at different running pods, not
    all at the oldest; each order is a rotation of the oldest-first running pods (none left out,
    so a claim that loses races still reaches every pod), pending pods after them; the same
    session always gets the same order."""
    running = [pod(f"r{age}", age) for age in (60, 50, 40, 30, 20, 10, 5, 4, 3, 2)]
    pods = [*running, pod("pending", 100, running=False)]
    oldest_first = [p.name for p in claim_order(pods, SHAPE, NOW, MAX_AGE)]
    orders = [[p.name for p in claim_order(pods, SHAPE, NOW, MAX_AGE, spread=f"sess_{i}")] for i in range(10)]
    assert len({order[0] for order in orders}) >= 5  # most of a burst's claims start apart
    for order in orders:
        turn = oldest_first.index(order[0])
        assert order[:10] == oldest_first[turn:10] + oldest_first[:turn] and order[10] == "pending"
    assert [p.name for p in claim_order(pods, SHAPE, NOW, MAX_AGE, spread="sess_3")] == orders[3]


def test_claim_order_never_offers_dead_terminating_misshapen_or_too_old_pods() -> None:
    pods = [
        pod("dead", 10, dead=True),
        pod("going", 10, terminating=True),
        pod("other-shape", 10, shape="xyz"),
        pod("too-old", MAX_AGE + 1),
        pod("good", 20),
    ]
    assert [p.name for p in claim_order(pods, SHAPE, NOW, MAX_AGE)] == ["good"]
    assert claim_order([], SHAPE, NOW, MAX_AGE) == []


# -- what keeps a pool at its size -------------------------------------------------------------


def test_an_empty_pool_is_filled_to_its_size() -> None:
    todo = plan([], 3, SHAPE, NOW, MAX_AGE)
    assert (todo.create, todo.delete) == (3, ())


def test_a_full_pool_is_left_alone() -> None:
    todo = plan([pod("a", 1), pod("b", 2, running=False)], 2, SHAPE, NOW, MAX_AGE)
    assert (todo.create, todo.delete) == (0, ())


def test_dead_misshapen_and_too_old_pods_are_replaced() -> None:
    pods = [pod("dead", 5, dead=True), pod("other", 5, shape="xyz"), pod("old", MAX_AGE + 5), pod("ok", 5)]
    todo = plan(pods, 2, SHAPE, NOW, MAX_AGE)
    assert todo.create == 1
    assert {p.name for p in todo.delete} == {"dead", "other", "old"}


def test_census_counts_what_a_session_could_claim_now_and_soon() -> None:
    """Ready: running and usable; starting: usable, not running yet; the dead, the terminating,
    the misshapen and the too old count for nothing (a claim would skip them)."""
    pods = [
        pod("a", 10),
        pod("b", 20, running=False),
        pod("dead", 5, dead=True),
        pod("going", 5, terminating=True),
        pod("other", 5, shape="xyz"),
        pod("old", MAX_AGE + 1),
    ]
    assert census("fast", pods, 4, SHAPE, NOW, MAX_AGE) == PoolState("fast", size=4, ready=1, starting=1)
    assert census("fast", [], 2, SHAPE, NOW, MAX_AGE) == PoolState("fast", size=2, ready=0, starting=0)


def test_terminating_pods_count_for_nothing_and_are_not_deleted_again() -> None:
    todo = plan([pod("going", 5, terminating=True)], 1, SHAPE, NOW, MAX_AGE)
    assert (todo.create, todo.delete) == (1, ())


def test_excess_pods_go_youngest_first() -> None:
    todo = plan([pod("a", 30), pod("b", 20), pod("c", 10)], 1, SHAPE, NOW, MAX_AGE)
    assert todo.create == 0
    assert [p.name for p in todo.delete] == ["c", "b"]


def test_size_zero_empties_the_pool() -> None:
    todo = plan([pod("a", 30)], 0, SHAPE, NOW, MAX_AGE)
    assert (todo.create, [p.name for p in todo.delete]) == (0, ["a"])


def test_a_held_pool_creates_nothing_and_still_sheds_what_it_must() -> None:
    """While its sessions are being placed (``hold``) a pool adds no pod, however short it is;
    the dead and the excess still go."""
    assert plan([], 3, SHAPE, NOW, MAX_AGE, hold=True) == plan([], 0, SHAPE, NOW, MAX_AGE)
    todo = plan([pod("dead", 5, dead=True), pod("a", 30), pod("b", 10)], 1, SHAPE, NOW, MAX_AGE, hold=True)
    assert (todo.create, [p.name for p in todo.delete]) == (0, ["dead", "b"])


def test_a_pool_waits_while_a_burst_is_placed_and_never_longer_than_the_longest_hold() -> None:
    """A burst's claims (placements a second apart) hold its pool's refills until a quiet spell
    of ``quiet`` seconds; a steady stream (one every 4 s, each within ``quiet`` of the last)
    holds them no longer than ``longest`` from its first; nothing placed, or only long ago (or
    not yet on the clock read), holds nothing."""
    burst = [100.0, 100.2, 100.5, 101.0]
    assert settling(burst, now=101.5, quiet=5.0, longest=30.0)
    assert settling(burst, now=105.9, quiet=5.0, longest=30.0)
    assert not settling(burst, now=106.0, quiet=5.0, longest=30.0)  # 5 s quiet: the pool grows
    stream = [100.0 + 4 * i for i in range(20)]  # 100, 104, ... 176
    assert settling(stream, now=125.0, quiet=5.0, longest=30.0)
    assert not settling(stream, now=131.0, quiet=5.0, longest=30.0)  # the run began 31 s ago
    # a burst after a quiet spell is a new run: it holds again
    assert settling([*burst, 200.0], now=201.0, quiet=5.0, longest=30.0)
    assert not settling([], now=101.0, quiet=5.0, longest=30.0)
    assert not settling([300.0], now=101.0, quiet=5.0, longest=30.0)
    assert settling(burst, now=101.5)  # the defaults: SETTLE_SECONDS, SETTLE_LONGEST_SECONDS


# -- a pool sized by demand --------------------------------------------------------------------


def test_the_peak_is_the_most_placements_within_any_interval_of_the_window() -> None:
    """A burst counts whole wherever it falls (here across a 10 s boundary: 5 at 98-99 s and 5
    at 101-102 s are one burst of 10 within 10 s); placements older than the window, or not yet
    due on the clock read, count for nothing."""
    burst = [98.0, 98.2, 98.4, 98.6, 99.0, 101.0, 101.5, 101.7, 101.8, 102.0]
    assert peak(burst, now=110.0, interval=10.0, window=60.0) == 10
    assert peak(burst, now=110.0, interval=2.0, window=60.0) == 5
    trickle = [float(t) for t in range(0, 100, 20)]  # one every 20 s
    assert peak(trickle, now=100.0, interval=10.0, window=100.0) == 1
    assert peak([*burst, 30.0, 31.0], now=110.0, interval=10.0, window=20.0) == 10
    assert peak(burst, now=170.0, interval=10.0, window=60.0) == 0  # the burst left the window
    assert peak([200.0], now=110.0, interval=10.0, window=60.0) == 0
    assert peak([], now=110.0, interval=10.0, window=60.0) == 0
    assert peak([5.0, 5.0, 5.0], now=10.0, interval=1.0, window=10.0) == 3  # the same instant


def test_the_target_is_the_peak_plus_headroom_within_min_and_max() -> None:
    assert target(10, minimum=0, maximum=20, headroom_percent=25) == 13  # 10 + ceil(2.5)
    assert target(1, minimum=0, maximum=20, headroom_percent=25) == 2  # any headroom keeps one more
    assert target(10, minimum=0, maximum=20, headroom_percent=0) == 10
    assert target(30, minimum=0, maximum=20, headroom_percent=25) == 20  # never above max
    assert target(0, minimum=0, maximum=20, headroom_percent=25) == 0  # demand stopped: to min, 0 allowed
    assert target(0, minimum=2, maximum=20, headroom_percent=25) == 2
    assert target(1, minimum=5, maximum=5, headroom_percent=100) == 5


def test_a_pool_sized_by_demand_follows_a_burst_up_at_once_and_down_once_it_left_the_window() -> None:
    """The decision over a day: quiet, a burst of 10, quiet: the target rises at the first look
    after the burst, holds for the whole window (a second burst within it is served warm), and
    falls to min once the burst has left it."""
    burst = [1000.0 + i * 0.1 for i in range(10)]

    def aim(now: float) -> int:
        return target(peak(burst, now, interval=10.0, window=300.0), minimum=0, maximum=12, headroom_percent=25)

    assert aim(999.0) == 0
    assert aim(1002.0) == 12  # 10 + 3, capped at max
    assert aim(1200.0) == 12  # held within the window: scales down slowly
    assert aim(1301.0) == 0  # gone from the window: down to min


# -- the warm pod and its claim ----------------------------------------------------------------

WARM = SandboxTemplate(name="fast", image="runner:1", warm_pool_size=2)


def test_a_warm_pod_has_the_cold_shape_without_the_session() -> None:
    """L2, L8: same security context, key only from the Secret, no service-account token; no
    REMOTE_URL or ENVIRONMENT_ID; the binding comes from its own annotations (downward API)."""
    settings = PodSettings(workspace_directory="/workspace")
    warm = make_warm_pod(WARM, settings)
    cold = make_pod(SPEC, 1, WARM, settings)
    assert warm["metadata"]["generateName"] == "warm-fast-"
    assert warm["metadata"]["labels"] == names.pool_labels("fast")
    assert warm["metadata"]["labels"][names.POOL_STATE_LABEL] == names.READY
    assert names.SESSION_HASH_LABEL not in warm["metadata"]["labels"]
    assert names.SESSION_ID_ANNOTATION not in warm["metadata"]["annotations"]
    assert warm["metadata"]["annotations"][names.SHAPE_ANNOTATION] == shape(warm["spec"])
    [container], [cold_container] = warm["spec"]["containers"], cold["spec"]["containers"]
    env = {e["name"]: e for e in container["env"]}
    assert "REMOTE_URL" not in env and "ENVIRONMENT_ID" not in env
    assert env["BINDING_DIRECTORY"]["value"] == BINDING_DIRECTORY
    assert env["CODEX_API_KEY"] == {
        "name": "CODEX_API_KEY",
        "valueFrom": {"secretKeyRef": {"name": "sandbox-executor-key", "key": "executor-key"}},
    }
    for key in ("securityContext", "image", "resources", "workingDir"):
        assert container[key] == cold_container[key]
    for key in ("securityContext", "automountServiceAccountToken", "enableServiceLinks", "restartPolicy"):
        assert warm["spec"][key] == cold["spec"][key]
    assert warm["spec"]["automountServiceAccountToken"] is False
    [binding] = [v for v in warm["spec"]["volumes"] if v["name"] == "binding"]
    paths = {i["path"]: i["fieldRef"]["fieldPath"] for i in binding["downwardAPI"]["items"]}
    assert paths == {
        "environment-id": f"metadata.annotations['{names.ENVIRONMENT_ID_ANNOTATION}']",
        "remote-url": f"metadata.annotations['{names.REMOTE_URL_ANNOTATION}']",
    }
    assert {"name": "binding", "mountPath": BINDING_DIRECTORY, "readOnly": True} in container["volumeMounts"]
    assert "sk-" not in json.dumps(warm)


def test_the_shape_changes_with_the_template_or_the_settings() -> None:
    settings = PodSettings()
    base = shape(make_warm_pod(WARM, settings)["spec"])
    assert base == shape(make_warm_pod(WARM, settings)["spec"])
    assert base != shape(make_warm_pod(SandboxTemplate(name="fast", image="runner:2"), settings)["spec"])
    assert base != shape(make_warm_pod(WARM, PodSettings(executor_key_secret="other"))["spec"])
    assert base != shape(make_warm_pod(WARM, PodSettings(workspace_directory="/w"))["spec"])
    assert base != shape(make_warm_pod(WARM, PodSettings(ca_bundle_configmap="proxy-ca"))["spec"])


def test_a_warm_pod_trusts_the_ca_bundle_as_a_cold_one_does() -> None:
    """A warm pod serves a session as a cold pod does: the same CA bundle mount and SSL_CERT_FILE."""
    settings = PodSettings(ca_bundle_configmap="proxy-ca")
    warm = make_warm_pod(WARM, settings)["spec"]
    cold = make_pod(SPEC, 1, WARM, settings)["spec"]
    for spec in (warm, cold):
        [volume] = [v for v in spec["volumes"] if v["name"] == "ca-bundle"]
        assert volume["configMap"]["name"] == "proxy-ca"
        env = {e["name"]: e.get("value") for e in spec["containers"][0]["env"]}
        assert env["SSL_CERT_FILE"] == "/etc/sandbox-ca/ca-bundle.crt"


def test_a_claim_applies_only_to_a_ready_pod_and_binds_the_session() -> None:
    """L1, L2: the patch tests the pod is still ready, then gives it the session's labels and
    annotations (as a cold pod has them) and the remote URL; the key is not in it."""
    patch = claim_patch(SPEC, 3, 1234.5)
    assert patch[0] == {"op": "test", "path": "/metadata/labels/sandbox-controller.dev~1pool-state", "value": "ready"}
    applied: dict[str, str] = {op["path"]: op["value"] for op in patch[1:]}
    cold = make_pod(SPEC, 3, WARM, PodSettings())["metadata"]
    for key, value in cold["labels"].items():
        if key.startswith(names.PREFIX):
            assert applied[f"/metadata/labels/{key.replace('/', '~1')}"] == value
    for key in (names.SESSION_ID_ANNOTATION, names.ENVIRONMENT_ID_ANNOTATION):
        assert applied[f"/metadata/annotations/{key.replace('/', '~1')}"] == cold["annotations"][key]
    assert applied["/metadata/annotations/sandbox-controller.dev~1remote-url"] == SPEC.remote_url
    assert applied["/metadata/labels/sandbox-controller.dev~1pool-state"] == "claimed"


def test_a_claims_binding_is_refreshed_once_the_claim_is_old_enough_unless_its_pod_is_going() -> None:
    """A claimed pod's binding is refreshed once its claim is ``BINDING_REFRESH_AFTER_SECONDS``
    old, not before (by then the kubelet has the claimed pod); a claim whose time is unknown
    (unreadable, or a pod claimed before its stamp existed) at once; a pod being deleted never."""
    after = BINDING_REFRESH_AFTER_SECONDS
    assert not binding_refresh_due(NOW, False, NOW)
    assert not binding_refresh_due(NOW - after + 0.01, False, NOW)
    assert binding_refresh_due(NOW - after, False, NOW)
    assert binding_refresh_due(NOW - 3600, False, NOW)
    assert not binding_refresh_due(NOW + 1, False, NOW)  # the claiming worker's clock ahead: it waits
    assert binding_refresh_due(None, False, NOW)
    assert not binding_refresh_due(NOW - 3600, True, NOW)
    assert not binding_refresh_due(None, True, NOW)


def test_a_pods_claim_time_is_its_stamp_when_readable() -> None:
    """``claimed_at`` reads the claim's stamp (``claim_patch``); an unclaimed pod's, or an
    unreadable one, is None, and such a pod started when it was created."""
    stamp = {names.CLAIMED_AT_ANNOTATION: "1234.500"}
    assert Pod("p", "u", annotations=stamp, created_at=7.0).claimed_at == 1234.5
    assert Pod("p", "u", annotations=stamp, created_at=7.0).started_at == 1234.5
    for unread in ({}, {names.CLAIMED_AT_ANNOTATION: ""}, {names.CLAIMED_AT_ANNOTATION: "soon"}):
        assert Pod("p", "u", annotations=unread, created_at=7.0).claimed_at is None
        assert Pod("p", "u", annotations=unread, created_at=7.0).started_at == 7.0


def test_a_binding_refresh_applies_only_to_that_pod_while_claimed_and_marks_it() -> None:
    """The refresh's patch tests the pod's UID (not a newer pod of its name) and that it is
    still claimed, then adds the label that keeps it out of the next tending's list."""
    assert binding_refresh_patch("uid-1") == [
        {"op": "test", "path": "/metadata/uid", "value": "uid-1"},
        {"op": "test", "path": "/metadata/labels/sandbox-controller.dev~1pool-state", "value": "claimed"},
        {"op": "add", "path": "/metadata/labels/sandbox-controller.dev~1binding-refreshed", "value": "true"},
    ]
    assert names.unrefreshed_selector("fast").endswith(
        f"{names.POOL_STATE_LABEL}=claimed,!{names.BINDING_REFRESHED_LABEL}"
    )


# -- the template field ------------------------------------------------------------------------

BASE = SandboxTemplate()


def test_warm_pool_is_off_by_default() -> None:
    templates = parse({"plain": {}}, BASE)
    assert templates.pooled() == ()
    assert not templates.get("plain").pooled


def test_warm_pool_is_parsed() -> None:
    templates = parse({"fast": {"warmPool": {"size": 2, "maxAgeSeconds": 600}}}, BASE)
    fast = templates.get("fast")
    assert (fast.warm_pool_size, fast.warm_max_age_seconds, fast.pooled) == (2, 600, True)
    assert templates.pooled() == (fast,)


def test_a_pool_sized_by_demand_is_parsed() -> None:
    templates = parse({"burst": {"warmPool": {"min": 0, "max": 20}}, "tuned": {"warmPool": {
        "min": 2, "max": 8, "windowSeconds": 120, "intervalSeconds": 5, "headroomPercent": 50, "maxAgeSeconds": 900,
    }}}, BASE)  # fmt: skip
    burst, tuned = templates.get("burst"), templates.get("tuned")
    assert (burst.pooled, burst.sized_by_demand, burst.warm_pool_min, burst.warm_pool_max) == (True, True, 0, 20)
    assert (burst.warm_window_seconds, burst.warm_interval_seconds, burst.warm_headroom_percent) == (600, 10, 25)
    assert (tuned.warm_pool_min, tuned.warm_pool_max, tuned.warm_window_seconds) == (2, 8, 120)
    assert (tuned.warm_interval_seconds, tuned.warm_headroom_percent, tuned.warm_max_age_seconds) == (5, 50, 900)
    assert templates.pooled() == (burst, tuned)
    assert not templates.get("default").sized_by_demand
    assert not parse({"fixed": {"warmPool": {"size": 2}}}, BASE).get("fixed").sized_by_demand


@pytest.mark.parametrize(
    ("pool", "problem"),
    [
        ({"size": "2"}, "warmPool.size must be an integer"),
        ({"size": -1}, "warmPool.size must be at least 0"),
        ({"size": 1, "maxAgeSeconds": 5}, "warmPool.maxAgeSeconds must be at least 60"),
        ({"size": 1, "extra": True}, "warmPool has unknown fields: extra"),
        ({"min": 5, "max": 2}, "warmPool.min (5) must not exceed warmPool.max (2)"),
        ({"min": 1}, "warmPool.max is required with min"),
        ({"windowSeconds": 60}, "warmPool.max is required with windowSeconds"),
        ({"min": 0, "max": 0}, "warmPool.max must be at least 1"),
        ({"min": -1, "max": 2}, "warmPool.min must be at least 0"),
        ({"max": "3"}, "warmPool.max must be an integer"),
        ({"size": 2, "max": 4}, "size (a fixed pool) or min and max (sized by demand), not both"),
        ({"max": 4, "windowSeconds": 5, "intervalSeconds": 10}, "windowSeconds (5) must be at least"),
        ({"max": 4, "intervalSeconds": 0}, "warmPool.intervalSeconds must be at least 1"),
        ({"max": 4, "headroomPercent": 5000}, "warmPool.headroomPercent must be at most 1000"),
    ],
)
def test_a_bad_warm_pool_is_refused(pool: dict[str, object], problem: str) -> None:
    with pytest.raises(ConfigError) as refused:
        parse({"fast": {"warmPool": pool}}, BASE)
    assert any(problem in p for p in refused.value.problems), refused.value.problems


@pytest.mark.parametrize("pool", [{"size": 1}, {"min": 0, "max": 3}])
def test_a_warm_pool_with_a_persistent_workspace_is_refused(pool: dict[str, int]) -> None:
    with pytest.raises(ConfigError) as refused:
        parse({"kept": {"warmPool": pool, "workspacePersistence": {"enabled": True}}}, BASE)
    assert any("workspacePersistence" in p for p in refused.value.problems)
