"""The chaos tier: the whole system under a seeded schedule of everyday faults, judged from outside.

``scripts/test chaos [--seed N] [--minutes M] [--faults SPEC]`` runs it; ``scripts/test all``
(what CI runs) runs a fixed set of seeds for a few minutes in all.

* ``schedule.py`` — the catalogue of faults and session actions, and ``draw(seed, minutes,
  faults)``: the same seed gives the same steps at the same times (the system's own timing
  varies, so a replay is close, not identical).
* ``world.py`` — the system from real parts on loopback: redis-server with its append-only
  file, the Agents API simulator sending signed webhooks to 2 receivers, 2 Celery workers,
  2 schedulers, the local runner with the real ``codex exec-server`` (the labelled stand-in
  when codex is not installed).
* ``inject.py`` — carries the steps out against the world and writes each into the event log
  with its time, and the windows during which a fault disturbed the system.
* ``observe.py`` and ``checker.py`` — the judge. It never imports the controller: it reads
  ``/proc``, the simulator's admin endpoints and what the turns' commands wrote, samples twice
  a second, and checks the invariants (``checker.INVARIANTS``) throughout and at the end.
* ``eventlog.py`` — every fault, session action and violation with its time; printed with the
  seed when a run fails, so it can be replayed.
"""
