#!/usr/bin/env bash
# Sandbox runner entrypoint: start the Codex executor so that it dials out to the Agents API (L8).
#
#   codex exec-server --remote "$REMOTE_URL" --environment-id "$ENVIRONMENT_ID"
#   (CODEX_API_KEY in the environment; it is never printed)
#
# Why a wrapper: `codex exec-server` exits 1 on ANY registration failure and does not retry.
# Left to the kubelet, a couple of transient failures push the pod into CrashLoopBackOff, whose
# delay grows to minutes: longer than the API's 5-minute connection window. So exit status 1 is
# retried here, with jittered exponential backoff (RETRY_INITIAL_SECONDS doubling up to
# RETRY_MAX_SECONDS). Other statuses end the container with that status (2 = usage error).
#
# SIGTERM/SIGINT: forwarded to the executor (as SIGTERM; the npm wrapper passes it on), waited
# for, then exit 0 -- also when the signal arrives during a backoff sleep or while warm.
#
# Warm (late binding): a pod of a template's warm pool is started before any session exists, so
# it has no REMOTE_URL or ENVIRONMENT_ID. With BINDING_DIRECTORY set and both unset, the
# entrypoint waits until the files `environment-id` and `remote-url` in that directory (a
# downward-API volume of the pod's own annotations, which the controller sets when a session
# claims the pod) are both non-empty, then starts the executor with them. The key still comes
# only from CODEX_API_KEY (the Secret); the binding carries no secret.
#
# Environment:
#   REMOTE_URL, ENVIRONMENT_ID, CODEX_API_KEY   required (exit 64 naming what is missing), unless
#                             REMOTE_URL and ENVIRONMENT_ID come from BINDING_DIRECTORY
#   BINDING_DIRECTORY         warm pods: where the claimed binding appears (see above)
#   BINDING_POLL_SECONDS      how often a warm pod looks for its binding (default 0.1)
#   CODEX_BIN                 executor binary (default: codex)
#   RETRY_INITIAL_SECONDS     first backoff delay (default 1)
#   RETRY_MAX_SECONDS         backoff cap (default 30)
#   RETRY_MAX_ATTEMPTS        give up after this many failed runs, 0 = never (default 0)
#   RETRY_RESET_SECONDS       a run that lasted this long resets the backoff (default 60)
#   SANDBOX_SELF_TEST_SECONDS bound of the startup self-test of Codex's sandbox (default 30; 0 = off)
#
# Startup self-test of Codex's own sandbox: as the entrypoint starts (before a warm pod waits for
# its binding, beside the executor's start otherwise: it never delays or stops either), one
# command runs in `codex sandbox` (workspace-write, with /tmp and $TMPDIR not writable) in a
# directory of its own under $TMPDIR, and one JSON line on stderr says whether Codex's sandbox
# works on this node: {"message": "codex sandbox self-test", "sandbox": "works" | "unavailable",
# "why": ..., "seconds": ...}. Judged by what the command printed and was refused, never by
# codex's exit code (codex has been seen exiting 0 with no command run in hardened containers):
# it must have run, written its working directory, been refused a write to a sibling directory
# that is writable outside the sandbox, and been refused a socket. Bounded by `timeout`; any
# failure of the self-test itself is only logged. Its directory is removed (codex keeps its own
# codex-bwrap-synthetic-mount-targets-<uid> in $TMPDIR, as for any sandboxed command); it
# touches neither the workspace nor $HOME.
set -u

readonly EX_USAGE=64
stopping=0
child=

self_test=

on_signal() {
  stopping=1
  if [ -n "$child" ]; then
    kill -TERM "$child" 2>/dev/null
  fi
}
trap on_signal TERM INT

log() { printf 'runner-entrypoint: %s\n' "$*" >&2; }

# Seconds ("1", "0.25") to whole milliseconds, in plain bash (no awk/bc in slim images).
to_ms() {
  local value=$1 whole frac
  if ! [[ $value =~ ^[0-9]+([.][0-9]+)?$ ]]; then
    return 1
  fi
  whole=${value%%.*}
  frac=
  [[ $value == *.* ]] && frac=${value#*.}
  frac=${frac}000
  printf '%d' "$((10#$whole * 1000 + 10#${frac:0:3}))"
}

setting_ms() {
  local name=$1 default=$2 ms
  if ! ms=$(to_ms "${!name:-$default}"); then
    log "$name must be a number of seconds, got '${!name}'"
    exit "$EX_USAGE"
  fi
  printf '%d' "$ms"
}

initial_ms=$(setting_ms RETRY_INITIAL_SECONDS 1) || exit "$EX_USAGE"
max_ms=$(setting_ms RETRY_MAX_SECONDS 30) || exit "$EX_USAGE"
reset_ms=$(setting_ms RETRY_RESET_SECONDS 60) || exit "$EX_USAGE"
max_attempts=${RETRY_MAX_ATTEMPTS:-0}
if ! [[ $max_attempts =~ ^[0-9]+$ ]]; then
  log "RETRY_MAX_ATTEMPTS must be a whole number, got '$max_attempts'"
  exit "$EX_USAGE"
fi
[ "$initial_ms" -ge 1 ] || initial_ms=1
[ "$max_ms" -ge "$initial_ms" ] || max_ms=$initial_ms

codex=${CODEX_BIN:-codex}

now_ms() {
  local t
  t=$(date +%s%N)
  printf '%d' "$((t / 1000000))"
}

# Run one process in the background and wait for it; a trapped signal interrupts `wait`, so wait
# again until the process is really gone. Sets $status.
run_and_wait() {
  "$@" &
  child=$!
  if [ "$stopping" = 1 ]; then  # a signal that came between the fork and `child=`
    kill -TERM "$child" 2>/dev/null
  fi
  while :; do
    wait "$child"
    status=$?
    if ! kill -0 "$child" 2>/dev/null; then
      break
    fi
  done
  child=
}

# One JSON string: backslashes and quotes escaped, control characters dropped.
json_string() {
  local text
  text=$(printf '%s' "$1" | tr '\n\t' '  ' | tr -d '\000-\037')
  text=${text//\\/\\\\}
  printf '"%s"' "${text//\"/\\\"}"
}

# The startup self-test of Codex's sandbox (see the header); one JSON line on stderr.
sandbox_self_test() {
  local seconds=$1 started made dir= running= out status said why=
  # A stop (SIGTERM from the entrypoint's exit) ends it at once and silently; timeout passes the
  # signal on to codex and what it started.
  trap 'if [ -n "$running" ]; then kill -TERM "$running" 2>/dev/null; fi; if [ -n "$dir" ]; then rm -rf "$dir"; fi; exit 0' TERM
  started=$(now_ms)
  if made=$(mktemp -d "${TMPDIR:-/tmp}/codex-sandbox-self-test.XXXXXX" 2>&1); then
    dir=$made
  fi
  if [ -z "$dir" ] || ! mkdir "$dir/work" "$dir/outside" 2>/dev/null; then
    why="no directory for the self-test under ${TMPDIR:-/tmp}: $made"
    [ -z "$dir" ] || rm -rf "$dir"
  else
    # In the background, so that a stop need not wait for it.
    # shellcheck disable=SC2016  # expanded by the sandboxed bash
    (cd "$dir/work" && exec timeout -k 2 "$seconds" "$codex" sandbox -c 'sandbox_mode="workspace-write"' \
      -c sandbox_workspace_write.exclude_slash_tmp=true -c sandbox_workspace_write.exclude_tmpdir_env_var=true \
      -- bash -c 'echo self-test-ran; echo written > inside && cat inside; echo x > "$1/outside/probe";
                  : > /dev/tcp/127.0.0.1/9 && echo network-open' self-test "$dir") >"$dir/output" 2>&1 </dev/null &
    running=$!
    wait "$running"
    status=$?  # only to tell "no answer in time" (timeout's 124, or 137 after -k); never the verdict
    out=$(<"$dir/output")
    # What codex said: bubblewrap's error first, else its first line that is not a warning.
    said=$(grep -m1 bwrap <<<"$out") || said=$(grep -m1 -v -e '^WARNING' -e '^$' <<<"$out") || said=$(grep -m1 . <<<"$out")
    [ -n "$said" ] || said="codex printed nothing"
    if [ "$status" = 124 ] || [ "$status" = 137 ]; then
      why="codex sandbox gave no answer within ${seconds}s"
    elif ! grep -qx self-test-ran <<<"$out"; then
      why="nothing ran in Codex's sandbox: $said"
    elif [ "$(cat "$dir/work/inside" 2>/dev/null)" != written ]; then
      why="the sandboxed command could not write its working directory: $said"
    elif [ -e "$dir/outside/probe" ]; then
      why="the sandboxed command wrote outside its working directory: the file system is not confined"
    elif grep -qx network-open <<<"$out" || ! grep -q '/dev/tcp/127.0.0.1/9: Operation not permitted' <<<"$out"; then
      why="the sandboxed command was not refused a socket: the network is not confined"
    fi
    rm -rf "$dir"
    dir=
  fi
  local ms=$(( $(now_ms) - started ))
  local took
  took=$(printf '%d.%03d' "$((ms / 1000))" "$((ms % 1000))")
  if [ -z "$why" ]; then
    printf '{"message": "codex sandbox self-test", "sandbox": "works", "why": %s, "seconds": %s}\n' \
      "$(json_string "the sandboxed command wrote its working directory and was refused a write outside it and a socket")" "$took" >&2
  else
    printf '{"message": "codex sandbox self-test", "sandbox": "unavailable", "why": %s, "seconds": %s}\n' \
      "$(json_string "$why")" "$took" >&2
  fi
}

self_test_seconds=${SANDBOX_SELF_TEST_SECONDS:-30}
if ! [[ $self_test_seconds =~ ^[0-9]+$ ]]; then
  log "SANDBOX_SELF_TEST_SECONDS must be a whole number of seconds, got '$self_test_seconds'; self-test off"
  self_test_seconds=0
fi
if [ "$self_test_seconds" -gt 0 ]; then
  sandbox_self_test "$self_test_seconds" &
  self_test=$!
fi

# Whatever ends the entrypoint also ends a self-test still running (at once, silently).
stop_self_test() {
  if [ -n "$self_test" ] && kill -0 "$self_test" 2>/dev/null; then
    kill -TERM "$self_test" 2>/dev/null
    wait "$self_test" 2>/dev/null
  fi
}
trap stop_self_test EXIT

# A warm pod waits here for the session that claims it (see the header).
if [ -n "${BINDING_DIRECTORY:-}" ] && [ -z "${REMOTE_URL:-}" ] && [ -z "${ENVIRONMENT_ID:-}" ]; then
  poll_ms=$(setting_ms BINDING_POLL_SECONDS 0.1) || exit "$EX_USAGE"
  [ "$poll_ms" -ge 10 ] || poll_ms=10
  poll_s=$(printf '%d.%03d' "$((poll_ms / 1000))" "$((poll_ms % 1000))")
  log "warm: waiting for a session to claim this sandbox"
  while :; do
    if [ -s "$BINDING_DIRECTORY/environment-id" ] && [ -s "$BINDING_DIRECTORY/remote-url" ]; then
      ENVIRONMENT_ID=$(<"$BINDING_DIRECTORY/environment-id")
      REMOTE_URL=$(<"$BINDING_DIRECTORY/remote-url")
      if [ -n "$ENVIRONMENT_ID" ] && [ -n "$REMOTE_URL" ]; then
        break
      fi
    fi
    run_and_wait sleep "$poll_s"
    if [ "$stopping" = 1 ]; then
      log "stopped by signal while warm"
      exit 0
    fi
  done
  export REMOTE_URL ENVIRONMENT_ID
  log "claimed: starting the executor for environment $ENVIRONMENT_ID"
fi

missing=()
for name in REMOTE_URL ENVIRONMENT_ID CODEX_API_KEY; do
  if [ -z "${!name:-}" ]; then
    missing+=("$name")
  fi
done
if [ "${#missing[@]}" -gt 0 ]; then
  log "missing required environment variable(s): ${missing[*]}"
  exit "$EX_USAGE"
fi

delay_ms=$initial_ms
failures=0
while :; do
  if [ "$stopping" = 1 ]; then
    log "stopped by signal before the executor started"
    exit 0
  fi
  started=$(now_ms)
  run_and_wait "$codex" exec-server --remote "$REMOTE_URL" --environment-id "$ENVIRONMENT_ID"
  if [ "$stopping" = 1 ]; then
    log "stopped by signal; executor exited with status $status"
    exit 0
  fi
  if [ "$status" -ne 1 ]; then
    log "executor exited with status $status"
    exit "$status"
  fi
  failures=$((failures + 1))
  if [ "$max_attempts" -gt 0 ] && [ "$failures" -ge "$max_attempts" ]; then
    log "executor exited with status 1 (registration failed) $failures time(s); giving up"
    exit 1
  fi
  if [ $(( $(now_ms) - started )) -ge "$reset_ms" ]; then
    delay_ms=$initial_ms  # it ran for a while: this is a new failure, not the same one again
  fi
  # Equal jitter: half the delay fixed, the other half random.
  sleep_ms=$((delay_ms / 2 + (RANDOM * 32768 + RANDOM) % (delay_ms / 2 + 1)))
  sleep_s=$(printf '%d.%03d' "$((sleep_ms / 1000))" "$((sleep_ms % 1000))")
  log "executor exited with status 1 (registration failed); retry $failures in ${sleep_s}s"
  run_and_wait sleep "$sleep_s"
  if [ "$stopping" = 1 ]; then
    log "stopped by signal during backoff"
    exit 0
  fi
  delay_ms=$((delay_ms * 2))
  [ "$delay_ms" -le "$max_ms" ] || delay_ms=$max_ms
done
