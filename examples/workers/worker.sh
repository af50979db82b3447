#!/bin/sh
# A worker in shell beside the joblease sidecar: curl + the token file.
#
#   1. wait until the sidecar holds the lease (GET /v1/lease answers 200 and the
#      token file holds the same token), or gives its final answer (409);
#   2. do the work, passing the token along with every external effect;
#   3. complete through the sidecar with that token.
#
# Exit codes: 0 done, or the job was already completed (nothing to do);
# 7 stale token (someone else holds the job: stop); 8 lease lost/released;
# the sidecar's "exitCode" when the claim was refused for good (6 attempts
# exhausted, 3 not registered, ...); 1 anything else. SIGTERM (the sidecar's
# signal on loss) ends the shell at once. Needs curl and a POSIX sh.
set -eu

URL="${JOBLEASE_SIDECAR_URL:-http://127.0.0.1:8470}"
TOKEN_FILE="${JOBLEASE_TOKEN_FILE:-/run/joblease/token}"
WAIT="${JOBLEASE_WAIT_SECONDS:-60}"
AUTH=""
if [ -n "${JOBLEASE_API_TOKEN_FILE:-}" ]; then
  AUTH="Authorization: Bearer $(cat "$JOBLEASE_API_TOKEN_FILE")"
fi
if [ -n "${JOBLEASE_WORKER_PID_FILE:-}" ]; then
  echo $$ > "$JOBLEASE_WORKER_PID_FILE.tmp" && mv "$JOBLEASE_WORKER_PID_FILE.tmp" "$JOBLEASE_WORKER_PID_FILE"
fi

api() {  # api METHOD PATH [BODY] -> prints the body, then the status on the last line
  if [ -n "$AUTH" ]; then
    curl -sS -X "$1" -H "Content-Type: application/json" -H "$AUTH" \
      ${3:+--data "$3"} -w '\n%{http_code}' "$URL$2"
  else
    curl -sS -X "$1" -H "Content-Type: application/json" \
      ${3:+--data "$3"} -w '\n%{http_code}' "$URL$2"
  fi
}

field() {  # field NAME JSON -> a top-level string or number field's value (the
  # sidecar's error bodies: "error" comes first, the others are not nested)
  printf '%s\n' "$2" | sed -n "s/.*\"$1\":\"*\([^\",}]*\).*/\1/p" | head -n 1
}

# 1. wait for the lease, or for the sidecar's final answer: ?wait=5 holds each
#    request in the sidecar until its answer changes (at most 5 s), so this is no poll
i=0  # tenths of a second waited (roughly)
while :; do
  out="$(api GET '/v1/lease?wait=5' || printf '\n000')"
  status="$(printf '%s\n' "$out" | tail -n 1)"
  body="$(printf '%s\n' "$out" | sed '$d')"
  case "$status" in
    200) if [ -s "$TOKEN_FILE" ]; then
           TOKEN="$(cat "$TOKEN_FILE")"
           printf '%s\n' "$body" | grep -q "\"token\":$TOKEN[,}]" && break
         fi ;;
    409) case "$(printf '%s\n' "$body" | sed -n 's/^{"error":"\([a-z_]*\)".*/\1/p')" in
           completed) echo "the job is already completed: nothing to do ($body)"; exit 0 ;;
           failed) code="$(field exitCode "$body")"
                   echo "the job cannot run: $(field reason "$body"): $body" >&2
                   exit "${code:-1}" ;;
           *) echo "no lease: $body" >&2; exit 8 ;;
         esac ;;
  esac
  # a 503 has waited in the sidecar; anything else (no answer yet while the sidecar
  # starts, or held before the token file matches) is asked again after 0.1 s
  if [ "$status" = 503 ]; then i=$((i + 50)); else i=$((i + 1)); fi
  [ "$i" -gt $((WAIT * 10)) ] && { echo "timed out waiting for the lease: $out" >&2; exit 1; }
  [ "$status" = 503 ] || sleep 0.1
done
echo "holding the lease with token $TOKEN"

# 2. the work: every external effect carries the token
for item in 1 2 3; do
  echo "work item $item (X-Fencing-Token: $TOKEN)"
done
# (demos and tests: pretend the work lasts until this file exists)
while [ -n "${JOBLEASE_EXAMPLE_HOLD_FILE:-}" ] && [ ! -e "$JOBLEASE_EXAMPLE_HOLD_FILE" ]; do
  sleep 0.1
done

# 3. complete through the sidecar; a 503/429 or no answer means "outcome not known
#    yet": the same request is safe to repeat (it commits at most once)
tries=0
while :; do
  out="$(api POST /v1/complete "{\"token\":$TOKEN,\"result\":{\"items\":3}}" || printf '\n000')"
  status="$(printf '%s\n' "$out" | tail -n 1)"
  case "$status" in
    503|429|000) tries=$((tries + 1)); [ "$tries" -gt 60 ] && break
                 echo "complete -> $status, retrying" >&2; sleep 2 ;;
    *) break ;;
  esac
done
echo "complete -> $status $(printf '%s\n' "$out" | sed '$d')"
case "$status" in
  200) exit 0 ;;
  409) exit 7 ;;
  *) exit 1 ;;
esac
