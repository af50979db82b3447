#!/bin/sh
# A worker in shell beside the joblease sidecar: curl + the token file.
#
#   1. wait until the sidecar holds the lease (the token file appears and
#      GET /v1/lease answers 200 with the same token);
#   2. do the work, passing the token along with every external effect;
#   3. complete through the sidecar with that token.
#
# Exit codes: 0 done, 7 stale token (someone else holds the job: stop),
# 8 lease lost/released, 1 anything else. Needs curl and a POSIX sh.
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

# 1. wait for the lease (the token file is written only while it is held)
i=0
while :; do
  if [ -s "$TOKEN_FILE" ]; then
    TOKEN="$(cat "$TOKEN_FILE")"
    out="$(api GET /v1/lease || true)"
    status="$(printf '%s\n' "$out" | tail -n 1)"
    case "$status" in
      200) printf '%s\n' "$out" | grep -q "\"token\":$TOKEN[,}]" && break ;;
      409) echo "no lease: $out" >&2; exit 8 ;;
    esac
  fi
  i=$((i + 1))
  [ "$i" -gt $((WAIT * 10)) ] && { echo "timed out waiting for the lease" >&2; exit 1; }
  sleep 0.1
done
echo "holding the lease with token $TOKEN"

# 2. the work: every external effect carries the token
for item in 1 2 3; do
  echo "work item $item (X-Fencing-Token: $TOKEN)"
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
