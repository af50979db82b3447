#!/bin/sh
# A queue worker in shell beside the joblease sidecar in queue mode: curl only.
# One script for every shape (docs/sidecar.md, "Queue mode"): the sidecar decides
# which items this pod gets (its Indexed Job index, its CronJob slot, or one item
# after another while draining); the worker loops until the sidecar's final answer.
#
#   1. GET /v1/lease?wait=20 until it answers 200 with an item newer than the last one done
#      (503 "waiting": nothing claimable yet), or its final answer (409);
#   2. the work: one write to the ledger (examples/ledger.yaml) per item, fenced
#      by the item's token (resource <queue>-<item>, Joblease-Job ns/queue/item)
#      and, when the queue's items take semaphore slots, by each slot's token too
#      (Joblease-Slot ns/name/index=token, from the lease's "semaphores");
#   3. complete the item with that token, and go back to 1.
#
# Exit codes: 0 the sidecar has nothing more (the item was completed, by this pod
# or before it: a CronJob slot run twice; or a drained queue with
# JOBLEASE_EXIT_WHEN_EMPTY); 7 stale token (the item, or its slot, went to another
# pod: the sidecar or the ledger said so);
# 8 lease lost/released; the sidecar's "exitCode" when a claim was refused for
# good (6 attempts exhausted, 3 no such queue or item, ...); 1 anything else.
# SIGTERM (the sidecar's signal on loss) ends the shell at once.
set -eu

URL="${JOBLEASE_SIDECAR_URL:-http://127.0.0.1:8470}"
LEDGER="${LEDGER_URL:-}"   # empty: no external effect, complete only
AUTH=""
if [ -n "${JOBLEASE_API_TOKEN_FILE:-}" ]; then
  AUTH="Authorization: Bearer $(cat "$JOBLEASE_API_TOKEN_FILE")"
fi
if [ -n "${JOBLEASE_WORKER_PID_FILE:-}" ]; then
  echo $$ > "$JOBLEASE_WORKER_PID_FILE.tmp" && mv "$JOBLEASE_WORKER_PID_FILE.tmp" "$JOBLEASE_WORKER_PID_FILE"
fi

call() {  # call METHOD URL BODY [HEADER...] -> the body, then the status on the last line
  method="$1" url="$2" data="$3"
  shift 3
  if [ -n "$AUTH" ]; then set -- "$@" "$AUTH"; fi
  n=$#
  while [ "$n" -gt 0 ]; do h="$1"; shift; set -- "$@" -H "$h"; n=$((n - 1)); done
  if [ -n "$data" ]; then set -- "$@" --data "$data"; fi
  curl -sS --max-time 30 -X "$method" -H 'Content-Type: application/json' "$@" \
    -w '\n%{http_code}' "$url" || printf '\n000'
}

field() {  # field NAME JSON -> a top-level string or number field's value
  # The first "NAME": is the top-level one: the sidecar writes its own fields
  # before the checkpoint and the payload, whose keys may repeat those names.
  # (Parameter expansion, not sed: no process per field.)
  case "$2" in *"\"$1\":"*) ;; *) return 0 ;; esac
  v=${2#*"\"$1\":"}
  v=${v#\"}
  printf '%s\n' "${v%%[\",\}]*}"
}

split_answer() {  # split_answer OUT -> sets status (its last line) and body (the rest)
  status=${1##*"
"}
  body=${1%"
"*}
}

slot_fences() {  # slot_fences JSON -> "ns/name/index=token,..." of the slots held ("": none)
  # the lease's "semaphores": [{"semaphore":"ns/name","slots":[0,..],"token":T},..]
  case "$1" in *'"semaphores":['*) ;; *) return 0 ;; esac
  printf '%s\n' "$1" | sed -n '/"semaphores":\[/{s/.*"semaphores":\[//;s/{"semaphore"/\
&/g;p;}' |
    sed -n 's/^{"semaphore":"\([^"]*\)","slots":\[\([0-9,]*\)\],"token":\([0-9]*\)}.*/\1 \2 \3/p' |
    while read -r sem indexes tok; do
      for i in $(printf '%s\n' "$indexes" | tr ',' ' '); do printf '%s/%s=%s\n' "$sem" "$i" "$tok"; done
    done | tr '\n' , | sed 's/,$//'
}

done_token=0
waited=0
while :; do
  # 1. the next item, or the sidecar's final answer
  # ?wait=20: the sidecar holds the request until its answer changes (the next
  # item held, or a final answer), so waiting for an item is no poll
  out="$(call GET "$URL/v1/lease?wait=20" "")"
  split_answer "$out"
  case "$status" in
    200) TOKEN="$(field token "$body")"
         if [ "$TOKEN" -le "$done_token" ]; then sleep 0.05; continue; fi ;;
    409) case "$(field error "$body")" in
           completed) echo "nothing more to do: $body"; exit 0 ;;
           failed) echo "cannot run: $(field reason "$body"): $body" >&2
                   exit "$(field exitCode "$body" | grep . || echo 1)" ;;
           *) echo "no lease: $body" >&2; exit 8 ;;
         esac ;;
    503) # still waiting after 20 s in the sidecar (claiming, no item or slot yet)
       waited=$((waited + 1))
       [ $((waited % 3)) -eq 0 ] && echo "still waiting: $status $body"
       continue ;;
    *) # 429, or no answer yet (the sidecar is starting): ask again shortly
       sleep 0.1; continue ;;
  esac
  QUEUE="$(field queue "$body")"; ITEM="$(field item "$body")"
  GEN="$(field generation "$body")"; SLOTS="$(slot_fences "$body")"
  echo "item $ITEM generation $GEN token $TOKEN"
  [ -z "$SLOTS" ] || echo "item $ITEM slots $SLOTS"

  # (demos and tests: pretend the first attempt at an item lasts until this file
  # exists; JOBLEASE_EXAMPLE_HOLD_ITEMS limits that to the ids listed)
  if [ -n "${JOBLEASE_EXAMPLE_HOLD_FILE:-}" ] && [ "$GEN" = 1 ]; then
    case " ${JOBLEASE_EXAMPLE_HOLD_ITEMS:-$ITEM} " in
      *" $ITEM "*) echo "holding item $ITEM until $JOBLEASE_EXAMPLE_HOLD_FILE exists"
                   while [ ! -e "$JOBLEASE_EXAMPLE_HOLD_FILE" ]; do sleep 0.1; done ;;
    esac
  fi
  # (and JOBLEASE_EXAMPLE_WORK_SECONDS: pretend every attempt's work takes this long)
  [ -z "${JOBLEASE_EXAMPLE_WORK_SECONDS:-}" ] || sleep "$JOBLEASE_EXAMPLE_WORK_SECONDS"

  # 2. the work: its one external effect carries the item's token (and its slots')
  if [ -n "$LEDGER" ]; then
    RESOURCE="$(printf '%s' "${QUEUE#*/}-$ITEM" | tr ':' '.')"
    set --
    [ -z "$SLOTS" ] || set -- "Joblease-Slot: $SLOTS"
    out="$(call POST "$LEDGER/resources/$RESOURCE" "{\"item\":\"$ITEM\",\"pod\":\"${HOSTNAME:-}\"}" \
           "Joblease-Job: $QUEUE/$ITEM" "Joblease-Token: $TOKEN" \
           "Joblease-Idempotency-Key: $QUEUE/$ITEM#g$GEN.t$TOKEN" "$@")"
    split_answer "$out"
    case "$status" in
      2*) echo "write $ITEM -> $status" ;;
      409) # the ledger has seen a newer token for the item or its slot: this claim
           # has ended (another pod holds them now), so nothing is left to complete
           echo "write $ITEM -> 409 refused: $body" >&2; exit 7 ;;
      *) echo "write $ITEM -> $status $body" ;;
    esac
  fi

  # 3. complete; a 503/429 or no answer means "outcome not known yet": the same
  #    request is safe to repeat (it commits at most once)
  tries=0
  while :; do
    out="$(call POST "$URL/v1/complete" "{\"token\":$TOKEN,\"result\":{\"item\":\"$ITEM\"}}")"
    split_answer "$out"
    case "$status" in
      503|429|000) tries=$((tries + 1)); [ "$tries" -gt 60 ] && break; sleep 1 ;;
      *) break ;;
    esac
  done
  echo "complete $ITEM -> $status"
  case "$status" in
    200) done_token="$TOKEN" ;;
    409) exit 7 ;;
    *) exit 1 ;;
  esac
done
