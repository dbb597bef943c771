"""The catalogue of faults and session actions, and the seeded schedule drawn from it (pure).

``draw(seed, minutes, faults)`` returns the same steps, at the same times, for the same
arguments. Session actions come from one random stream and faults from another, so that
switching a fault on or off leaves the sessions' own story alone (only the sessions a fault
makes for itself, a link drop's fresh session or a pre-start burst, come and go with it). A step names sessions by their
place in the story (``s0``, ``s1``, …), never by the ids the API gives them at run time.

Faults (``FAULTS``; ``--faults`` picks among them, see ``select``):

==================  =============================================================================
api-404             session reads answer 404 for 1–4 s: one session, or every session at once
                    for 2–5 s; at least 8 s apart, so that no session's reads answer 404 for
                    as long as the deletion confirmation (6 s in these runs)
api-404-flap        one session's next read answers 404, and the next read 2–4 s later too, the
                    session readable between them (a flapping API): never a deletion
api-429             session or environment reads answer 429 (Retry-After 1 s) for 2–8 s
api-5xx             session or environment reads answer 500/502/503 for 2–8 s
api-timeout         session or environment reads hang past the controller's API timeout, 2–8 s
link-drop           one executor's link is down 0.5–10 s (WebSockets closed, upgrades answered
                    503): at any time, just after the session's input (during its turn),
                    2–5 s after a session made for it was created (before the controller's
                    first look; that session is deleted 30–45 s later), or twice (1–4 s, up
                    3–5 s, then long enough to cover the moment the grace would end if timed
                    from the first drop, each with input just before: each shorter than the
                    grace, together longer)
kill-executor       SIGKILL of one executor: its whole process group, or its leader only (the
                    npm launcher; the native codex lives on), then given input just before (its
                    executor running when the launcher dies: the stop or replacement that
                    follows must end the native codex too, 1, 7)
kill-worker         SIGKILL of one Celery worker (main process and pool), restarted 0.5–3 s later
kill-scheduler      the same for one of the two schedulers
kill-receiver       the same for one of the two receivers
redis-kill          SIGKILL of redis-server, restarted from its append-only file 1–4 s later
redis-pause         SIGSTOP of redis-server for 1–5 s, then SIGCONT
role-flip           a failover and back for 2.5–3.5 s: the live replica promoted, redis-server
                    made its replica (read-only at the address the controller uses), then
                    promoted again
skew                a worker or scheduler restarted with its wall clock off by ±30 s
                    (``tests/support/faketime.py``) for 15–40 s, then restarted with the true time
webhook-duplicate   a session's latest events delivered again, same webhook-id
webhook-late        deliveries starting in the next 1–8 s held until then, then sent in order
webhook-reorder     the same, then sent newest first or shuffled
prestart-burst      5 sessions of the pre-started agent created at once, none given input;
                    deleted 20–40 s later
executor-missing    the executor binary is missing for 3–12 s (a node image update, an unmounted
                    volume): every start fails meanwhile, and must be retried once it is back; a
                    session made for it is created while it is missing (so at least one start
                    fails), and deleted 60–75 s later (unless one made for a fault is alive):
                    long after the 30 s within which invariant 5 excuses a request
api-404-partial     (opt-in: ``+api-404-partial``) a partial 404 storm: the reads of some of the
                    sessions, at least two and never all of those alive, answer 404 for 2–5 s at
                    once (shorter than the deletion confirmation); nothing of theirs may be
                    stopped, replaced or discarded (3, 4, 7)
delete-several      (opt-in: ``+delete-several``) 2–3 sessions deleted at the same moment, never
                    more than half of those alive (so the others, still readable, outvote them):
                    each must be released by the end (5), the others' work kept (4)
api-404-recheck     (opt-in) one session's next read answers 404, then its reads answer 503 for
                    7.5–10 s (a partial incident: no read finds it), then one more one-shot 404
                    lands on the re-check past the confirmation period, then it is readable: two
                    404 reads, not three spread over the period, so never a deletion (4, 7)
lone-404            (opt-in) an opening before the story: one session created alone and, once
                    its executor runs and its turn is done, every read of it answers 404 for
                    10–14 s (a wrong key with one mapped session, nothing to compare with): it
                    must be held, not released (4, 7); the story starts 32 s later than usual
wrong-key           (opt-in) every session read answers 404 for 28–34 s (a wrong key or base
                    URL); one session, given input just before, is deleted at the API once the
                    window opens, and once its hold shows in the worker log the harness runs
                    ``sandbox-controller release SID --yes`` as an operator would: its executor
                    must be gone within 10 s, during the window (9); nothing else released (4)
stale-worker        (opt-in) a session made for it, whose first read the simulator holds 1 s
                    while the worker pool process waiting for it (found by its socket) is
                    frozen with SIGSTOP; its lease lapses, another worker connects the session,
                    the session is failed, and 10 s later the frozen process is thawed: acting
                    on its stale read, it must start nothing (5: no executor starts more than
                    8 s after its session ended)
crash-loop          (opt-in) a session made for it (webhooks held 1 s, so that no start comes
                    first) whose environment's registrations answer 503 for 12–18 s: codex
                    exits at each refusal, so each start fails at once (a revoked key, an API
                    incident); its starts must back off (11: refused registrations of one
                    environment, at most 8 in any 20 s: ``checker.CRASH_LOOP_MOST``),
                    and once they are accepted its turn runs (2); it lives on to the final turns
failing-start-404   (opt-in) one session's reads answer 404 for 5.5 s, until a worker logs two
                    of the three spread reads a deletion needs; then, at once, its executor
                    is SIGKILLed, the executor binary goes missing and the session is given
                    input, so that it reads fine in rounds whose start fails; once the
                    confirmation period since the first 404 is over, one more one-shot 404, and
                    the binary comes back: three 404s with good reads between are no deletion,
                    its workspace stays (4, 7)
wedged-link         (opt-in) one session given input, then its executor's link down for
                    40–45 s (a wedged executor: the process lives, its link does not come
                    back), while its environment's reads answer 503 for 5 s of every 8 s (each
                    a blind spot for the grace clock): it must be replaced within
                    ``WEDGED_BOUND_SECONDS`` of the drop, whatever the API does (12)
suspend-cycles      (opt-in; the run checkpoints idle sandboxes: ``CHECKPOINT_FAULTS``) a session
                    made for it, 4.5 s in: its first turn starts a background process that keeps
                    a token only in memory (``tests/support/keeper.py``); then, ``SUSPEND_CYCLES``
                    times, once its sandbox is suspended at the idle timeout, input at once:
                    each restore must reconnect within ``checker.RESTORE_CONNECT_SECONDS`` of
                    the restored executor's appearance, and every turn must find the same
                    token, unless a worker logged the restore impossible (13)
corrupt-checkpoint  (opt-in; checkpoints too) a session made for it, 9 s in, given input; once
                    its sandbox is suspended, the largest pages image of its checkpoint is cut
                    to half its length (a disk that filled during the dump), then input: a
                    fresh start on the same workspace must be connected within
                    ``schedule.FALLBACK_SECONDS`` of the input (13), its workspace kept (4),
                    nothing of the cut tree left running (6)
fill-volume         (opt-in; checkpoints too; the state directory is a tmpfs of
                    ``world.VOLUME_MIB``) 12 s in, two sessions made for it whose turns each
                    start a background process holding ``HOLD_MIB`` (an image larger than the
                    images' cap); once both are idle and their sandboxes gone, a third session
                    made for it writes ``WRITE_MIB`` to its workspace: the write must succeed
                    (15: images never take the room live workspaces need)
lifetime-cycles     (opt-in; checkpoints too, and the run's world sets a maximum lifetime of
                    ``LIFETIME_SECONDS``: ``LIFETIME_FAULTS``) a session made for it, 2 s in: its
                    first turn starts the background process of ``suspend-cycles``; then,
                    ``LIFETIME_CYCLES`` times, once its sandbox is suspended or stopped, input at
                    once, each turn asking that process for its token: no turn posted
                    ``LINEAGE_SLACK_SECONDS`` past the lineage's maximum lifetime (counted from
                    its first executor) may find it (16: a restore never renews the lifetime)
orphan-child        (opt-in) a session made for it, 7 s in, whose turn starts a detached child
                    (``setsid -f sleep``: a session of its own, as a dev server an agent starts);
                    then SIGKILL of its executor's process group (an OOM kill) and input: the
                    child must be gone ``schedule.ORPHAN_SECONDS`` after the kill, with the
                    sandbox it belonged to (14)
==================  =============================================================================

The five faults made for issue 37's sandboxes (``suspend-cycles``, ``corrupt-checkpoint``,
``fill-volume``, ``orphan-child``, ``lifetime-cycles``) are not drawn among the others: each is one step at a fixed
time after the start (``PLACED_FAULTS``) with sessions made for it, so that naming them leaves
the other faults a seed draws as they were. ``CHECKPOINT_FAULTS`` in a run turn checkpointing on
(``CONTROLLER_IDLE_SUSPEND=checkpoint``, CRIU) for its whole world, with an idle timeout of
``world.CHECKPOINT_IDLE_TIMEOUT_SECONDS`` and its state directory on a tmpfs of
``world.VOLUME_MIB`` (checkpoint images capped at 25 % of it, the default): every idle sandbox
of that run is suspended, and every turn after it restores one.

The opt-in faults are not in ``DEFAULT_FAULTS``: adding them to the default set would change
what CI's fixed seeds draw (a seed's faults are drawn from the weights of the whole set), so
they are named with ``--faults +api-404-partial,+delete-several`` until CI's seeds are moved.
CI's third run (``CI_RUNS``) names ``lone-404``, ``api-404-recheck`` and ``wrong-key`` alone:
they reach the deletion defects the default set cannot (issue 25, defects 1, 2 and 5); its
fourth names ``stale-worker``, ``crash-loop``, ``wedged-link``, ``failing-start-404`` and
``orphan-child`` (the lease checked before a start; the crash loop's back-off; blind spots
bounded; a good read forgetting the 404s; a sandbox's processes contained: issue 37, defects 2,
3, 1 and 4); its fifth adds ``suspend-cycles``, ``corrupt-checkpoint`` and ``fill-volume`` to the
default set, in a world that checkpoints its idle sandboxes (defects 8, 5 and 6); its sixth
names ``lifetime-cycles`` alone, in a world that checkpoints and has a maximum lifetime (defect
7: every lifetime stop of the story's sessions is one too, excused by the workers' logs).

Runs of 3 minutes or more leave a fault-free stretch of 50 s (after the last fault is over)
every 150 s, so that invariants 2 and 7 are judged during the run as well as at its end.

Session actions: ``create`` (then ``input``), ``input`` (a turn whose command reads and extends
the workspace's marker file), ``delete`` (the API's DELETE), ``fail`` (the simulator's admin
fail). Sessions go idle by themselves between inputs, and their sandboxes stop after the idle
timeout.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable
from dataclasses import dataclass

CI_SEEDS = (93, 2)
"""The seeds CI runs with the default faults (``tests/chaos/test_chaos.py``), ``CI_MINUTES`` of
faults each. Chosen so that together they draw each fault a mutant of ``tests/chaos/mutants.py``
needs to be seen: two link drops in one turn, the executor binary missing while a session is
created, a pre-start burst, one-shot and flapping 404s, deletions
(``tests/unit/test_chaos_schedule.py`` fails when a change to the catalogue takes one of them
away)."""
CI_MINUTES = 0.75
DELETION_SEED = 0
DELETION_MINUTES = 0.5
DELETION_FAULTS = "lone-404,api-404-recheck,wrong-key"
"""The faults of CI's third run: the deletion defects the default set cannot reach."""
STALE_SEED = 173
STALE_MINUTES = 0.3
STALE_FAULTS = "stale-worker,crash-loop,wedged-link,failing-start-404,orphan-child"
"""The faults of CI's fourth run: a worker that lost its lease mid-round (the lease mutant), an
executor that exits at start for a while (the crash loop's back-off), a wedged executor while
its environment's reads fail now and then (blind spots bounded), 404s with good reads in
failing rounds between them (a good read forgets the 404s), and a detached child of a sandbox
whose executor is SIGKILLed (contained: it ends with its sandbox)."""
SUSPEND_SEED = 5
SUSPEND_MINUTES = 0.75
SUSPEND_FAULTS = "+suspend-cycles,+corrupt-checkpoint,+fill-volume"
"""The faults of CI's fifth run: the default set in a world that checkpoints its idle sandboxes,
with many short suspensions of one session, a cut checkpoint and big images beside a big
workspace write (issue 37, defects 8, 5 and 6)."""
LIFETIME_SEED = 7
LIFETIME_MINUTES = 0.25
LIFETIME_RUN_FAULTS = "lifetime-cycles"
"""The faults of CI's sixth run: suspensions and restores of one session across its maximum
lifetime (issue 37, defect 7), in a world whose every sandbox has that lifetime."""
CI_RUNS: tuple[tuple[int, str, float], ...] = (
    (93, "default", CI_MINUTES),
    (2, "default", CI_MINUTES),
    (DELETION_SEED, DELETION_FAULTS, DELETION_MINUTES),
    (STALE_SEED, STALE_FAULTS, STALE_MINUTES),
    (SUSPEND_SEED, SUSPEND_FAULTS, SUSPEND_MINUTES),
    (LIFETIME_SEED, LIFETIME_RUN_FAULTS, LIFETIME_MINUTES),
)
"""Every run CI makes, and ``scripts/test chaos --mutants`` too: (seed, ``--faults`` value,
minutes of faults)."""
MAX_LIVE_SESSIONS = 5
"""Sessions given input at once at most (each is a codex executor on a 2-core machine)."""
FIRST_SESSIONS = 3
BURST_SESSIONS = 5
SKEW_SECONDS = 30
GRACE_SECONDS = 10.0
"""``CONTROLLER_EXECUTOR_GRACE_SECONDS`` of the runs (``world.py`` sets it from here)."""
DELETION_CONFIRM_SECONDS = 6.0
"""``CONTROLLER_DELETION_CONFIRM_SECONDS`` of the runs (``world.py`` sets it from here)."""
NO_404_SECONDS = DELETION_CONFIRM_SECONDS + 2.0
"""Between two 404 windows: back to back they would add up to a deletion by the rules."""
QUIET_SECONDS = 50.0
"""A fault-free stretch this long (after the last fault's own duration) comes every
``QUIET_EVERY_SECONDS`` in runs of ``QUIET_FROM_MINUTES`` or more: long enough for the checker
to judge, during the run, a request unanswered 30 s after the faults ended (2) and an idle
sandbox still running 15 s past its 20 s timeout (7). CI's 45-s runs have none (they are judged
at their quiet end)."""
QUIET_EVERY_SECONDS = 150.0
QUIET_SLACK_SECONDS = 10.0
"""A fault that would last past the moment a stretch is due by more than this is left out, so
a stretch starts at most this late (a 40-s skew would otherwise push it back)."""
QUIET_FROM_MINUTES = 3.0
# The catalogue's ranges, in seconds: the draws below use them, and ``catalogue_text`` states
# them (RELIABILITY.md carries that text; tests/unit/test_docs.py keeps it and README true).
ONE_404 = (1.0, 4.0)
"""One session's reads answering 404."""
ALL_404 = (2.0, 5.0)
"""Every session's reads answering 404."""
API_WINDOW = (2.0, 8.0)
"""Session or environment reads answering 429 or 5xx, or hanging."""
FLAP_GAP = (2.0, 4.0)
"""Between a session's two one-shot 404s."""
PARTIAL_404 = (2.0, 5.0)
"""Some sessions' reads answering 404 at once (opt-in)."""
LINK_DOWN = (0.5, 10.0)
FIRST_DROP = (1.0, 4.0)
"""The first of two drops in one turn."""
UP_BETWEEN = (3.0, 5.0)
"""The link up between two drops in one turn."""
RESTART_AFTER = (0.5, 3.0)
"""A killed worker, scheduler or receiver is restarted this much later."""
REDIS_DOWN = (1.0, 4.0)
REDIS_PAUSE = (1.0, 5.0)
ROLE_FLIP = (2.5, 3.5)
SKEW_FOR = (15.0, 40.0)
HOLD = (1.0, 8.0)
"""Webhooks held, then sent late."""
BINARY_MISSING = (3.0, 12.0)
STALE_AFTER_END_SECONDS = 10.0
"""The stale-worker fault thaws the frozen worker this long after its session failed."""
STALE_WORKER_SECONDS = 45.0
"""The stale-worker fault ends by then (it usually takes 20–30 s)."""
LEADER_AFTER_INPUT_SECONDS = 1.0
"""A leader-only executor kill comes this long after an input to its session (the injector
then waits, bounded, for the session's executor to run)."""
FAILING_START_SECONDS = 40.0
"""The failing-start-404 fault ends by then (its three 404s and the binary's gap take 10–25 s)."""
FIRST_404S_SECONDS = 5.5
"""Its session's reads answer 404 this long first (less than the confirmation period; a read
comes every 3 s at most, and the one a third of the period after it counts as the second)."""
WEDGED = (40.0, 45.0)
"""A wedged executor's link down (longer than ``WEDGED_BOUND_SECONDS``)."""
WEDGED_FAILS_SECONDS = 5.0
WEDGED_EVERY_SECONDS = 8.0
"""During a wedged link, the environment's reads answer 503 this long, this often: longer than a
look's retries and than the looks' interval (2.5 s while the grace clock runs), so that every
8 s holds a look that cannot read the link (a blind spot) and a clock that blind spots restart
without bound never reaches the 10-s grace (``blind-spots-unbounded``). With 3 s of every 8 s
a look's retries can outlast a window, and whether the mutant's clock runs out is left to the
looks' timing."""
WEDGED_BOUND_SECONDS = 35.0
"""Invariant 12: a wedged executor is gone within this of its link's drop (two graces after the
first look that saw it down, a look's interval and the reads' retries: about 25 s)."""
SUSPEND_CYCLES = 5
"""Suspensions of the suspend-cycles session, each resumed by input at once (codex's reconnect
backoff, kept asleep in the image, grew past 7 s by the fourth before issue 37's fix)."""
SUSPEND_CYCLES_SECONDS = 150.0
"""The suspend-cycles fault ends by then (each cycle takes the idle timeout and a turn)."""
FALLBACK_SECONDS = 20.0
"""Invariant 13: a session whose checkpoint was cut is connected this long after its input at
most (the cut refused at once, a fresh start; CRIU left to spin took 120 s before the fix)."""
CORRUPT_SECONDS = 60.0
"""The corrupt-checkpoint fault ends by then."""
ORPHAN_SECONDS = 30.0
"""Invariant 14: a sandbox's detached child is gone this long after its executor was killed
(the controller sees the dead executor at its next look, replaces it, and the stop of the old
sandbox ends all of it)."""
ORPHAN_FAULT_SECONDS = 45.0
"""The orphan-child fault ends by then."""
LIFETIME_SECONDS = 20.0
"""``CONTROLLER_MAX_LIFETIME_SECONDS`` of a world with ``LIFETIME_FAULTS``: two idle timeouts of a
checkpointing world, so that the lifetime-cycles session's second restore comes past it."""
LIFETIME_CYCLES = 4
"""Suspensions (or stops) of the lifetime-cycles session, each followed by input at once: the
first restore comes inside the lifetime; at an idle timeout and a turn a cycle, the third and
fourth turns come past it and the slack (with restores renewing it, both find the first
lineage)."""
LIFETIME_CYCLES_SECONDS = 120.0
"""The lifetime-cycles fault ends by then (each cycle takes the idle timeout and a turn)."""
LINEAGE_SLACK_SECONDS = 5.0
"""Invariant 16: a turn posted this long past the lineage's maximum lifetime (from its first
executor's sighting) finds the lineage's processes gone (the lifetime's timer fires a second
past it; a restore past it is refused)."""
PLACED_AT = {
    "lifetime-cycles": 2.0,
    "suspend-cycles": 4.5,
    "orphan-child": 7.0,
    "corrupt-checkpoint": 9.0,
    "fill-volume": 12.0,
}
"""Seconds after the start (and any opening) of each placed fault's one step."""
HOLDERS = 2
HOLD_MIB = 224
"""Each fill-volume holder's memory: more than the images' cap of the checkpointing world
(``world.VOLUME_MIB`` × 25 %), so its image is never written; with no cap (the mutant), the
two images and the others leave too little room for the write."""
WRITE_MIB = 300
"""What the fill-volume writer writes to its workspace (and removes): it fits beside the
capped images, not beside uncapped ones."""
FILL_SECONDS = 75.0
"""The fill-volume fault ends by then."""
CHECKPOINT_FAULTS = frozenset({"suspend-cycles", "corrupt-checkpoint", "fill-volume", "lifetime-cycles"})
"""Faults that turn checkpointing on for the whole world of their run."""
LIFETIME_FAULTS = frozenset({"lifetime-cycles"})
"""Faults that give every sandbox of their run's world a maximum lifetime (``LIFETIME_SECONDS``)."""
CRASH_LOOP = (12.0, 18.0)
"""A crash-loop session's registrations answering 503."""
MADE_LIVES = (60.0, 75.0)
"""The session made for a binary gap is deleted this long after its creation."""
RECHECK_FAILS = (7.5, 10.0)
"""After a one-shot 404, one session's reads answer 503 this long (longer than the deletion
confirmation plus a margin, so that the next one-shot 404 lands on a re-check past its end)."""
LONE_404 = (10.0, 14.0)
"""The lone session's reads answering 404 (longer than the deletion confirmation)."""
LONE_OPENING_SECONDS = 32.0
"""With ``lone-404``, the story and the other faults start this much later."""
WRONG_KEY = (28.0, 34.0)
"""Every session read answering 404 (a wrong key or base URL)."""
OPERATOR_RELEASE_SECONDS = 10.0
"""An operator's release of a held deletion must end its executor within this (invariant 9)."""
RANGES = (
    ONE_404,
    ALL_404,
    API_WINDOW,
    FLAP_GAP,
    PARTIAL_404,
    LINK_DOWN,
    FIRST_DROP,
    UP_BETWEEN,
    RESTART_AFTER,
    REDIS_DOWN,
    REDIS_PAUSE,
    ROLE_FLIP,
    SKEW_FOR,
    HOLD,
    BINARY_MISSING,
    CRASH_LOOP,
    WEDGED,
    RECHECK_FAILS,
    LONE_404,
    WRONG_KEY,
)


def _span(span: tuple[float, float]) -> str:
    return f"{span[0]:g}–{span[1]:g} s"


def catalogue_text() -> str:
    """The catalogue in words, its ranges from the constants the draws use (RELIABILITY.md's
    "Seeded fault schedule" section carries this text, kept true by tests/unit/test_docs.py)."""
    return (
        f"session reads (never an environment's) answering 404 for one session {_span(ONE_404)} or "
        f"for every session {_span(ALL_404)}, each shorter than the deletion confirmation and "
        f"{NO_404_SECONDS:g} s at least after the last; session or environment reads answering 429, "
        f"5xx or hanging past the API timeout for {_span(API_WINDOW)}; one session's next read "
        f"answering 404 and the next one {_span(FLAP_GAP)} later too, the session readable between "
        f"them; executor links down {_span(LINK_DOWN)} (WebSockets closed, upgrades answered 503) at "
        "any time, during a turn, or before the controller's first look; two link drops in one turn "
        f"(the first {_span(FIRST_DROP)}, the link up {_span(UP_BETWEEN)}), each shorter than the "
        "grace, the second covering the moment a clock run from the first would pass it; SIGKILL of "
        "an executor (its group, or its npm launcher alone just after input to its session), a worker, "
        "a scheduler or a receiver "
        f"(restarted {_span(RESTART_AFTER)} later); Redis SIGKILLed and restarted from its AOF "
        f"{_span(REDIS_DOWN)} later, or SIGSTOPped {_span(REDIS_PAUSE)}, or failed over and back "
        "(its live replica promoted and redis-server made that replica's replica, read-only at the "
        f"address the controller uses, for {_span(ROLE_FLIP)}); the executor binary missing for "
        f"{_span(BINARY_MISSING)} (renamed away: every start fails meanwhile) while a session made "
        f"for it is created; a worker's or scheduler's wall clock ±{SKEW_SECONDS} s for "
        f"{_span(SKEW_FOR)}; webhooks delivered again, or held {_span(HOLD)} and sent late, in "
        f"order, reversed or shuffled; {BURST_SESSIONS} sessions of a pre-started agent created at "
        "once. Opt-in (`--faults +name`): a partial 404 storm (some sessions' reads, never all, "
        f"{_span(PARTIAL_404)} at once) and 2–3 sessions deleted at one moment; one session's read "
        f"answering 404, then its reads 503 for {_span(RECHECK_FAILS)}, then one more 404 on the "
        "re-check past the confirmation period (two 404s, not three spread over it); an opening with "
        f"one session alone whose reads answer 404 for {_span(LONE_404)}; every session read answering "
        f"404 for {_span(WRONG_KEY)} (a wrong key) while one session is deleted at the API and, once "
        "its hold shows, released by the harness with `sandbox-controller release SESSION_ID --yes` "
        "as an operator would; a worker frozen (SIGSTOP) between its first read of a session made "
        f"for it and its start, past its lease, and thawed {STALE_AFTER_END_SECONDS:g} s after that "
        "session, connected by another worker meanwhile, failed; a crash loop: a session made for it "
        f"whose environment's registrations answer 503 for {_span(CRASH_LOOP)} (codex exits at each "
        "refusal); "
        f"one executor's link down {_span(WEDGED)} after input while its environment's reads answer 503 "
        f"for {WEDGED_FAILS_SECONDS:g} s of every {WEDGED_EVERY_SECONDS:g} s; one session's reads answering "
        f"404 for {FIRST_404S_SECONDS:g} s (two spread reads), then its executor killed and the executor binary "
        "missing while it is given input (good reads in rounds whose start fails), then one more 404 "
        "past the confirmation period; a session made for it whose turn starts a detached child "
        "(`setsid -f`), then its executor SIGKILLed and input given. With checkpointing on (idle "
        f"sandboxes suspended with CRIU): one session suspended and resumed {SUSPEND_CYCLES} times in "
        "a row, a background process keeping a token in its memory; one session's checkpoint cut to "
        "half its largest pages image (a disk that filled during the dump) before its next turn; "
        f"{HOLDERS} sessions holding {HOLD_MIB} MiB each gone idle, then {WRITE_MIB} MiB written to "
        "another session's workspace on the same state volume; with a maximum lifetime of "
        f"{LIFETIME_SECONDS:g} s too, one session suspended and resumed {LIFETIME_CYCLES} times across it, "
        "a background process keeping a token in its memory."
    )


PROCESSES = {
    "kill-worker": ("worker0", "worker1"),
    "kill-scheduler": ("scheduler0", "scheduler1"),
    "kill-receiver": ("receiver0", "receiver1"),
}
SKEWABLE = ("worker0", "worker1", "scheduler0", "scheduler1")
API_TARGETS = ("retrieve_session", "retrieve_session", "retrieve_session", "retrieve_environment")


@dataclass(frozen=True, order=True)
class Step:
    """One thing the schedule does, ``at`` seconds after the run started."""

    at: float
    kind: str
    subject: str = ""
    """A session (``s3``), a process (``worker1``), ``*`` (every session), or empty."""
    seconds: float = 0.0
    """How long the fault lasts (0: at once)."""
    value: str = ""
    """What the kind needs besides: ``retrieve_session:404``, ``+30``, ``reverse``, ``leader``…"""

    def describe(self) -> str:
        parts = [self.kind]
        if self.subject:
            parts.append(self.subject)
        if self.value:
            parts.append(self.value)
        if self.seconds:
            parts.append(f"for {self.seconds:.1f}s")
        return " ".join(parts)


SESSION_ACTIONS = frozenset({"create", "input", "delete", "fail"})


@dataclass(frozen=True)
class Schedule:
    seed: int
    minutes: float
    faults: frozenset[str]
    steps: tuple[Step, ...]
    opening: float = 0.0
    """Seconds before the story and the drawn faults start (``lone-404``'s opening)."""

    @property
    def seconds(self) -> float:
        """When the last fault is over (the quiet end of the run starts then)."""
        return max([self.opening + self.minutes * 60, *(s.at + s.seconds for s in self.steps)])

    def fault_steps(self) -> list[Step]:
        return [s for s in self.steps if s.kind not in SESSION_ACTIONS]

    def counts(self) -> dict[str, int]:
        found: dict[str, int] = {}
        for step in self.steps:
            found[step.kind] = found.get(step.kind, 0) + 1
        return dict(sorted(found.items()))


class _Story:
    """The sessions' side of a schedule: who exists when (by the schedule's own clock)."""

    def __init__(self) -> None:
        self.steps: list[Step] = []
        self.born: dict[str, float] = {}
        self.gone: dict[str, float] = {}
        self.burst: set[str] = set()
        self.fresh: set[str] = set()
        self.no_404_before = 0.0

    def create(self, at: float, agent: str = "", fresh: bool = False) -> str:
        name = self.made_by_fault(at)
        self.fresh.discard(name)
        self.steps.append(Step(at, "create", name, value=agent))
        if fresh:
            self.fresh.add(name)
        if agent:
            self.burst.add(name)
        else:
            self.steps.append(Step(at + 0.2, "input", name))
        return name

    def made_by_fault(self, at: float) -> str:
        """A session the fault itself creates, at ``at`` (no create step: its handler does it)."""
        name = f"s{len(self.born)}"
        self.born[name] = at
        self.fresh.add(name)
        return name

    def end(self, at: float, name: str, how: str) -> None:
        self.gone[name] = at
        self.steps.append(Step(at, how, name))

    def end_now(self, at: float, name: str, step: bool = True) -> None:
        """Delete ``name`` at ``at``, before the end its story had for it (then dropped: a
        session ends once; its later inputs are refused by the API and logged as not taken).
        ``step=False``: a fault deletes it itself (the story only learns it is gone)."""
        later = self.gone.get(name)
        if later is not None:
            self.steps = [
                s for s in self.steps if not (s.subject == name and s.at == later and s.kind in ("delete", "fail"))
            ]
        if step:
            self.end(at, name, "delete")
        else:
            self.gone[name] = at

    def copy(self) -> _Story:
        """A copy to go back to (its steps are immutable; the containers are copied)."""
        other = _Story()
        other.steps, other.born, other.gone = list(self.steps), dict(self.born), dict(self.gone)
        other.burst, other.fresh, other.no_404_before = set(self.burst), set(self.fresh), self.no_404_before
        return other

    def fresh_pending(self, at: float) -> bool:
        """Whether a session made for a fault is alive at ``at``, or made to be born later."""
        return any(self.gone.get(n, float("inf")) > at for n in self.fresh)

    def alive(self, at: float, bursts: bool = False) -> list[str]:
        """Sessions created before ``at`` and not yet deleted or failed (not the burst's ones
        unless asked: nobody gives those input)."""
        return [
            n
            for n, born in self.born.items()
            if born <= at and self.gone.get(n, float("inf")) > at and (bursts or n not in self.burst)
        ]


def draw(seed: int, minutes: float, faults: Iterable[str]) -> Schedule:
    """The schedule of a run: faults from ``faults`` (names of ``FAULTS``) for ``minutes``."""
    chosen = frozenset(faults)
    unknown = chosen - FAULTS.keys()
    if unknown:
        raise ValueError(f"unknown faults: {', '.join(sorted(unknown))}")
    opening = LONE_OPENING_SECONDS if "lone-404" in chosen else 0.0
    duration = opening + minutes * 60.0
    story = _Story()
    steps: list[Step] = []
    if opening:
        steps.append(_lone(random.Random(f"{seed}:lone"), story))
    _story(random.Random(f"{seed}:sessions"), duration, story, opening)
    for name in sorted(chosen & PLACED_FAULTS.keys(), key=PLACED_AT.__getitem__):
        steps += PLACED_FAULTS[name](round(opening + PLACED_AT[name], 2), story)
    rng = random.Random(f"{seed}:faults")
    names = [n for n in sorted(chosen) if FAULTS[n].weight > 0]  # an opening is not drawn
    weights = [FAULTS[n].weight for n in names]
    at = opening + rng.uniform(3.0, 6.0)
    quiet_after = opening + QUIET_EVERY_SECONDS if minutes >= QUIET_FROM_MINUTES else float("inf")
    while names and at < duration:
        name = rng.choices(names, weights)[0]
        before = story.copy()
        drawn = FAULTS[name].draw(rng, round(at, 2), story)  # may add to the story too
        if any(s.at + s.seconds > quiet_after + QUIET_SLACK_SECONDS for s in drawn):
            # Drawn all the same (the steps after it do not change), but left out with what it
            # added to the story: it would eat the stretch.
            drawn, story = [], before
        steps += drawn
        at += rng.uniform(2.0, 7.0)
        if at >= quiet_after:  # a fault-free stretch: invariants 2 and 7 are judged during the run
            busy_until = max([at, *(s.at + s.seconds for s in steps)])
            at = busy_until + QUIET_SECONDS
            quiet_after = at + QUIET_EVERY_SECONDS
    return Schedule(seed, minutes, chosen, tuple(sorted(steps + story.steps)), opening)


def _story(rng: random.Random, duration: float, story: _Story, start: float = 0.0) -> _Story:
    for index in range(FIRST_SESSIONS):
        story.create(round(start + 0.5 * index, 2))
    at = start + 4.0
    while True:
        at = round(at + rng.uniform(2.5, 7.0), 2)
        if at >= duration:
            return story
        alive = story.alive(at)
        options: dict[str, float] = {"input": 6.0}
        if len(alive) < MAX_LIVE_SESSIONS:
            options["create"] = 2.0
        if len(alive) > 2:
            options["delete"] = 1.0
            options["fail"] = 0.7
        action = rng.choices(list(options), list(options.values()))[0]
        if action == "create":
            story.create(at)
        elif action == "input" and alive:
            story.steps.append(Step(at, "input", rng.choice(alive)))
        elif action in ("delete", "fail"):
            story.end(at, rng.choice(alive), action)


def _lone(rng: random.Random, story: _Story) -> Step:
    """``lone-404``'s opening: one session alone (``s0``, given input), then every read of it
    answering 404 for longer than the deletion confirmation; the injector starts the window
    once its executor runs and its turn is done, and holds the story back until it is over."""
    name = story.create(0.0)
    return Step(1.0, "lone-404", name, _seconds(rng, *LONE_404), "retrieve_session:404")


# -- the faults -------------------------------------------------------------------------------

Draw = Callable[[random.Random, float, _Story], list[Step]]


@dataclass(frozen=True)
class Fault:
    name: str
    weight: float
    draw: Draw


def _seconds(rng: random.Random, low: float, high: float) -> float:
    return round(rng.uniform(low, high), 1)


def _session(rng: random.Random, story: _Story, at: float) -> str | None:
    alive = story.alive(at)
    return rng.choice(alive) if alive else None


def _api(status: str) -> Draw:
    def draw(rng: random.Random, at: float, story: _Story) -> list[Step]:
        target = rng.choice(API_TARGETS)
        code = rng.choice(("500", "502", "503")) if status == "5xx" else status
        if status == "404":
            target = "retrieve_session"  # an environment's 404 says nothing about the session
            one = _session(rng, story, at)
            if one is not None and rng.random() < 0.6:
                step = Step(at, "api-fault", one, _seconds(rng, *ONE_404), f"{target}:{code}")
            else:
                step = Step(at, "api-fault", "*", _seconds(rng, *ALL_404), f"{target}:{code}")
            if at < story.no_404_before:
                return []  # drawn all the same, so that the steps after it do not change
            story.no_404_before = at + step.seconds + NO_404_SECONDS
            return [step]
        return [Step(at, "api-fault", "*", _seconds(rng, *API_WINDOW), f"{target}:{code}")]

    return draw


def _flap(rng: random.Random, at: float, story: _Story) -> list[Step]:
    """Two one-shot 404s of one session, the session readable between them."""
    one = _session(rng, story, at)
    gap = _seconds(rng, *FLAP_GAP)
    if one is None or at < story.no_404_before:
        return []
    story.no_404_before = at + gap + NO_404_SECONDS
    return [Step(at, "api-flap", one, gap, "retrieve_session:404")]


def _partial_404(rng: random.Random, at: float, story: _Story) -> list[Step]:
    """Some sessions' reads answer 404 at once (at least two, never all alive), for less than
    the deletion confirmation: a partial incident at the API, never a deletion."""
    alive = story.alive(at)
    seconds = _seconds(rng, *PARTIAL_404)
    if len(alive) < 3:
        return []
    chosen = sorted(rng.sample(alive, rng.randint(2, len(alive) - 1)))
    if at < story.no_404_before:
        return []  # drawn all the same, so that the steps after it do not change
    story.no_404_before = at + seconds + NO_404_SECONDS
    return [Step(at, "api-fault", name, seconds, "retrieve_session:404") for name in chosen]


def _recheck(rng: random.Random, at: float, story: _Story) -> list[Step]:
    """One session's next read answers 404, its reads then answer 503 for 7.5–10 s, and one
    more one-shot 404 lands on the re-check past the confirmation period (issue 25, defect 1:
    two 404 reads a period apart are not three spread over it); the session outlives it."""
    one = _session(rng, story, at)
    fails = _seconds(rng, *RECHECK_FAILS)
    if one is None or at < story.no_404_before or story.gone.get(one, float("inf")) < at + fails + 15.0:
        return []
    story.no_404_before = at + fails + 5.0 + NO_404_SECONDS  # the second one-shot, then readable
    return [Step(at, "api-404-recheck", one, fails, "retrieve_session:503")]


def _wrong_key(rng: random.Random, at: float, story: _Story) -> list[Step]:
    """Every session read answers 404 for 28–34 s; one session (given input just before, so
    that its executor runs) is deleted at the API once the window opens, and released by the
    operator once its hold shows (the injector does both: the story only learns it is gone)."""
    alive = story.alive(at)
    seconds = _seconds(rng, *WRONG_KEY)
    if len(alive) < 2 or at < story.no_404_before:
        return []
    victim = rng.choice(alive)
    opens = round(at + 0.5, 2)
    story.end_now(opens, victim, step=False)
    story.no_404_before = opens + seconds + NO_404_SECONDS
    return [Step(at, "input", victim), Step(opens, "wrong-key", victim, seconds, "retrieve_session:404")]


def _delete_several(rng: random.Random, at: float, story: _Story) -> list[Step]:
    """2–3 sessions deleted at the same moment, at most half of those alive: the sessions
    still readable outvote them, so each deletion is confirmed and released (not held)."""
    alive = story.alive(at)
    most = min(3, len(alive) // 2)
    if most < 2:
        return []
    for name in sorted(rng.sample(alive, rng.randint(2, most))):
        story.end_now(at, name)
    return []  # the story holds the steps


def _executor_missing(rng: random.Random, at: float, story: _Story) -> list[Step]:
    """The binary missing for 3–12 s, and a session made for it created while it is (its first
    start fails, and must be retried once the binary is back), deleted 60–75 s later (a request
    lost for good is judged by invariant 5, which excuses sessions ended within 30 s); unless a
    session made for a fault is still alive (one at a time, as for a link drop's)."""
    seconds = _seconds(rng, *BINARY_MISSING)
    created, ends = round(at + rng.uniform(0.5, seconds - 1.5), 2), rng.uniform(*MADE_LIVES)
    if not story.fresh_pending(at):
        fresh = story.create(created, fresh=True)
        story.end(round(created + ends, 2), fresh, "delete")
    return [Step(at, "executor-missing", "", seconds)]


def _stale_worker(rng: random.Random, at: float, story: _Story) -> list[Step]:
    """A session made for it, whose first read freezes the worker making it (SIGSTOP) past its
    lease; the session is failed once another worker connected it, and the frozen worker
    thawed well after that (``inject.Injector._stale_worker``); at most ``STALE_WORKER_SECONDS``
    in all. One at a time with the other sessions made for faults."""
    if story.fresh_pending(at):
        return []
    name = story.made_by_fault(at)
    story.gone[name] = at + STALE_WORKER_SECONDS
    return [Step(at, "stale-worker", name, STALE_WORKER_SECONDS)]


def _crash_loop(rng: random.Random, at: float, story: _Story) -> list[Step]:
    """A session made for it whose environment's registrations answer 503 for a while (codex
    exits at each refusal); it lives on (not one of the sessions made for faults one at a time:
    nothing else waits for it), with no story steps of its own."""
    seconds = _seconds(rng, *CRASH_LOOP)
    name = story.made_by_fault(at)
    story.fresh.discard(name)
    story.gone[name] = at  # the story gives it nothing; the harness's final turn does
    return [Step(at, "crash-loop", name, seconds)]


def _made_alone(at: float, story: _Story) -> str:
    """A session made for a placed fault at ``at``: no other fault picks it and the story gives
    it nothing (its handler gives it input; the harness, its final turn)."""
    name = story.made_by_fault(at)
    story.fresh.discard(name)
    story.gone[name] = at
    return name


def _suspend_cycles(at: float, story: _Story) -> list[Step]:
    """Many short suspensions of one session, each resumed at once (issue 37, defect 8)."""
    name = _made_alone(at, story)
    return [Step(at, "suspend-cycles", name, SUSPEND_CYCLES_SECONDS, str(SUSPEND_CYCLES))]


def _lifetime_cycles(at: float, story: _Story) -> list[Step]:
    """Suspensions and restores of one session across its maximum lifetime (issue 37, defect 7)."""
    name = _made_alone(at, story)
    return [Step(at, "lifetime-cycles", name, LIFETIME_CYCLES_SECONDS, str(LIFETIME_CYCLES))]


def _corrupt_checkpoint(at: float, story: _Story) -> list[Step]:
    """A suspended session's checkpoint cut in half, then input (issue 37, defect 5)."""
    return [Step(at, "corrupt-checkpoint", _made_alone(at, story), CORRUPT_SECONDS)]


def _fill_volume(at: float, story: _Story) -> list[Step]:
    """Two holders of big memory idle, then a big workspace write (issue 37, defect 6)."""
    return [Step(at, "fill-volume", _made_alone(at, story), FILL_SECONDS, str(HOLDERS))]


def _orphan_child(at: float, story: _Story) -> list[Step]:
    """A detached child in a sandbox whose executor is SIGKILLed (issue 37, defect 4)."""
    return [Step(at, "orphan-child", _made_alone(at, story), ORPHAN_FAULT_SECONDS)]


PLACED_FAULTS: dict[str, Callable[[float, _Story], list[Step]]] = {
    "suspend-cycles": _suspend_cycles,
    "corrupt-checkpoint": _corrupt_checkpoint,
    "orphan-child": _orphan_child,
    "fill-volume": _fill_volume,
    "lifetime-cycles": _lifetime_cycles,
}
"""Faults that are one step at a fixed time (``PLACED_AT``), never drawn (weight 0)."""


def _failing_start_404(rng: random.Random, at: float, story: _Story) -> list[Step]:
    """404, 404, good reads in rounds whose start fails, 404 (issue 37, defect 1): one session
    alive well past it, no other 404 window near it."""
    name = _session(rng, story, at)
    if name is None or at < story.no_404_before or story.gone.get(name, float("inf")) < at + FAILING_START_SECONDS:
        return []
    story.no_404_before = at + FAILING_START_SECONDS + NO_404_SECONDS
    return [Step(at, "failing-start-404", name, FAILING_START_SECONDS, "retrieve_session:404")]


def _wedged(rng: random.Random, at: float, story: _Story) -> list[Step]:
    """Input to one session, then its link down 40–45 s while its environment's reads fail now
    and then: a wedged executor that blind spots must not keep (issue 37, defect 3)."""
    name = _session(rng, story, at)
    seconds = _seconds(rng, *WEDGED)
    drop_at = round(at + 1.0, 2)
    if name is None or story.gone.get(name, float("inf")) < drop_at + seconds + 5.0:
        return []
    return [Step(at, "input", name), Step(drop_at, "wedged-link", name, seconds)]


def _link_drop(rng: random.Random, at: float, story: _Story) -> list[Step]:
    name = _session(rng, story, at)
    if name is None:
        return []
    seconds = _seconds(rng, *LINK_DOWN)
    phase = rng.choice(("any", "turn", "fresh", "twice"))
    if phase == "twice":  # two short drops in one turn, the link up between them (issue 25, item 4)
        first, up = _seconds(rng, *FIRST_DROP), _seconds(rng, *UP_BETWEEN)
        # The second drop covers the moment a clock run from the first drop would pass the grace.
        second = round(max(2.0, GRACE_SECONDS + 1.5 - first - up) + rng.uniform(0.0, 1.5), 1)
        drop_at = round(at + rng.uniform(0.5, 1.5), 2)
        again = round(drop_at + first + up, 2)
        if story.gone.get(name, float("inf")) > again + second:
            return [
                Step(at, "input", name),
                Step(drop_at, "link-drop", name, first, "1 of 2"),
                Step(round(again - 0.3, 2), "input", name),  # busy again: the API asks at the drop
                Step(again, "link-drop", name, second, "2 of 2"),
            ]
        phase = "turn"
    if phase == "turn":  # input first, so the drop comes while its turn runs
        return [Step(at, "input", name), Step(round(at + rng.uniform(0.5, 2.5), 2), "link-drop", name, seconds)]
    if phase == "fresh" and not story.fresh_pending(at):  # before the controller's first look
        fresh = story.create(at, fresh=True)
        story.end(round(at + rng.uniform(30.0, 45.0), 2), fresh, "delete")  # one such session at a time
        return [Step(round(at + rng.uniform(2.0, 5.0), 2), "link-drop", fresh, seconds)]
    return [Step(at, "link-drop", name, seconds)]


def _kill_executor(rng: random.Random, at: float, story: _Story) -> list[Step]:
    name = _session(rng, story, at)
    if name is None:
        return []
    how = rng.choice(("group", "group", "leader"))
    if how == "leader" and story.gone.get(name, float("inf")) > at + LEADER_AFTER_INPUT_SECONDS:
        # Input first, so that its executor runs when the launcher is killed: the native codex
        # then outlives its leader, and the stop or replacement that follows must end it.
        return [
            Step(at, "input", name),
            Step(round(at + LEADER_AFTER_INPUT_SECONDS, 2), "kill-executor", name, value=how),
        ]
    return [Step(at, "kill-executor", name, value=how)]


def _kill(kind: str) -> Draw:
    def draw(rng: random.Random, at: float, story: _Story) -> list[Step]:
        return [Step(at, "kill", rng.choice(PROCESSES[kind]), _seconds(rng, *RESTART_AFTER))]

    return draw


def _redis(kind: str, low: float, high: float) -> Draw:
    def draw(rng: random.Random, at: float, story: _Story) -> list[Step]:
        return [Step(at, kind, "redis", _seconds(rng, low, high))]

    return draw


def _skew(rng: random.Random, at: float, story: _Story) -> list[Step]:
    offset = rng.choice((SKEW_SECONDS, -SKEW_SECONDS))
    return [Step(at, "skew", rng.choice(SKEWABLE), _seconds(rng, *SKEW_FOR), f"{offset:+d}")]


def _duplicate(rng: random.Random, at: float, story: _Story) -> list[Step]:
    name = _session(rng, story, at)
    if name is None:
        return []
    return [Step(at, "webhook-duplicate", name, value=str(rng.randint(1, 3)))]


def _hold(orders: tuple[str, ...]) -> Draw:
    def draw(rng: random.Random, at: float, story: _Story) -> list[Step]:
        return [Step(at, "webhook-hold", "", _seconds(rng, *HOLD), rng.choice(orders))]

    return draw


def _burst(rng: random.Random, at: float, story: _Story) -> list[Step]:
    if story.burst & set(story.alive(at, bursts=True)):  # one burst at a time
        return []
    names = [story.create(at, agent="prestart") for _ in range(BURST_SESSIONS)]
    ends = round(at + rng.uniform(20.0, 40.0), 2)
    for name in names:
        story.end(ends, name, "delete")
    return []  # the story holds the steps


FAULTS: dict[str, Fault] = {
    f.name: f
    for f in (
        Fault("api-404", 1.0, _api("404")),
        Fault("api-429", 1.0, _api("429")),
        Fault("api-5xx", 1.0, _api("5xx")),
        Fault("api-timeout", 1.0, _api("timeout")),
        Fault("link-drop", 3.0, _link_drop),
        Fault("kill-executor", 1.5, _kill_executor),
        Fault("kill-worker", 1.0, _kill("kill-worker")),
        Fault("kill-scheduler", 0.7, _kill("kill-scheduler")),
        Fault("kill-receiver", 0.7, _kill("kill-receiver")),
        Fault("redis-kill", 0.7, _redis("redis-kill", *REDIS_DOWN)),
        Fault("redis-pause", 0.7, _redis("redis-pause", *REDIS_PAUSE)),
        Fault("role-flip", 0.5, _redis("role-flip", *ROLE_FLIP)),
        Fault("skew", 1.0, _skew),
        Fault("webhook-duplicate", 1.0, _duplicate),
        Fault("webhook-late", 0.7, _hold(("fifo",))),
        Fault("webhook-reorder", 0.7, _hold(("reverse", "shuffle"))),
        Fault("prestart-burst", 0.3, _burst),
        Fault("api-404-flap", 0.7, _flap),
        Fault("executor-missing", 0.4, _executor_missing),
    )
}
OPT_IN_FAULTS = frozenset(
    {
        "api-404-partial",
        "delete-several",
        "api-404-recheck",
        "lone-404",
        "wrong-key",
        "stale-worker",
        "crash-loop",
        "wedged-link",
        "failing-start-404",
        "suspend-cycles",
        "corrupt-checkpoint",
        "orphan-child",
        "fill-volume",
        "lifetime-cycles",
    }
)
"""Faults a run injects only when ``--faults`` names them (see the table above)."""
FAULTS.update(
    {
        f.name: f
        for f in (
            Fault("api-404-partial", 0.7, _partial_404),
            Fault("delete-several", 0.5, _delete_several),
            Fault("api-404-recheck", 1.0, _recheck),
            Fault("lone-404", 0.0, lambda rng, at, story: []),  # an opening (``_lone``), never drawn
            Fault("wrong-key", 1.0, _wrong_key),
            Fault("stale-worker", 0.5, _stale_worker),
            Fault("crash-loop", 1.0, _crash_loop),
            Fault("wedged-link", 1.0, _wedged),
            Fault("failing-start-404", 1.0, _failing_start_404),
            Fault("suspend-cycles", 0.0, lambda rng, at, story: []),  # placed (``PLACED_FAULTS``)
            Fault("corrupt-checkpoint", 0.0, lambda rng, at, story: []),
            Fault("orphan-child", 0.0, lambda rng, at, story: []),
            Fault("fill-volume", 0.0, lambda rng, at, story: []),
            Fault("lifetime-cycles", 0.0, lambda rng, at, story: []),
        )
    }
)
DEFAULT_FAULTS = frozenset(FAULTS) - OPT_IN_FAULTS
"""What a run injects unless ``--faults`` says otherwise: the whole catalogue but the opt-in faults."""


def select(spec: str | None) -> frozenset[str]:
    """The faults a ``--faults`` value names: empty or ``default`` → the default set;
    ``+name`` / ``-name`` (comma-separated) add to or take from it; bare names → exactly those."""
    words = [w.strip() for w in (spec or "").split(",") if w.strip() and w.strip() != "default"]
    bare = [w for w in words if w[0] not in "+-"]
    if bare and len(bare) != len(words):
        raise ValueError("--faults: either list faults, or change the default set with +name/-name, not both")
    chosen = set(bare) if bare else set(DEFAULT_FAULTS)
    for word in words:
        if word[0] == "+":
            chosen.add(word[1:])
        elif word[0] == "-":
            chosen.discard(word[1:])
    named = {w.lstrip("+-") for w in words}
    unknown = named - FAULTS.keys()
    if unknown:
        raise ValueError(f"--faults: unknown {', '.join(sorted(unknown))}; known: {', '.join(FAULTS)}")
    return frozenset(chosen)
