#!/usr/bin/env python3
"""A worker that runs beside the joblease sidecar, using only the standard library.

1. wait until the sidecar holds the lease (token file + GET /v1/lease);
2. do the work, passing the fencing token to every external effect;
3. complete through the sidecar with that token.

Exit codes: 0 done (or the job was already completed: nothing to do), 7 the
sidecar refused the token as stale (someone else holds the job now: stop,
produce nothing), 8 the lease was lost or released before we could finish,
the sidecar's ``exitCode`` when the claim was refused for good (6 attempts
exhausted, 3 not registered, ...), 1 anything else.
SIGTERM (the sidecar's signal on loss) ends the process at once (Python's
default action), which is what we want: no effects after loss.

Environment: JOBLEASE_SIDECAR_URL (default http://127.0.0.1:8470),
JOBLEASE_TOKEN_FILE (default /run/joblease/token), JOBLEASE_API_TOKEN_FILE
(bearer token, optional), JOBLEASE_WORKER_PID_FILE (written so the sidecar
can signal us, optional), JOBLEASE_WAIT_SECONDS (how long to wait for the
lease, default 60), JOBLEASE_COMPLETE_RETRY_SECONDS (how long to retry a
completion whose outcome is not known yet, default 120). For demos and tests:
JOBLEASE_EXAMPLE_ITEMS (work items, default 3) and JOBLEASE_EXAMPLE_HOLD_FILE
(pretend the work lasts until this file exists).
"""

from __future__ import annotations

import json
import os
import sys
import time
import urllib.error
import urllib.request
from typing import Any

URL = os.environ.get("JOBLEASE_SIDECAR_URL", "http://127.0.0.1:8470").rstrip("/")
TOKEN_FILE = os.environ.get("JOBLEASE_TOKEN_FILE", "/run/joblease/token")


def say(event: str, **fields: Any) -> None:
    print(json.dumps({"event": event, **fields}), flush=True)


def bearer() -> dict[str, str]:
    path = os.environ.get("JOBLEASE_API_TOKEN_FILE")
    if not path:
        return {}
    with open(path) as f:
        return {"Authorization": "Bearer " + f.read().strip()}


def call(method: str, path: str, body: dict[str, Any] | None = None) -> tuple[int, dict[str, Any]]:
    """One request to the sidecar; (status, JSON body) for 2xx and 4xx/5xx alike."""
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(URL + path, data=data, method=method,
                                 headers={"Content-Type": "application/json", **bearer()})
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, json.loads(resp.read() or b"{}")
    except urllib.error.HTTPError as err:
        try:
            return err.code, json.loads(err.read() or b"{}")
        except ValueError:
            return err.code, {}


def wait_for_lease(timeout: float) -> dict[str, Any]:
    """Poll until the sidecar holds the lease and the token file agrees."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            status, lease = call("GET", "/v1/lease")
        except OSError:
            status, lease = 0, {}
        if status == 200:
            try:
                with open(TOKEN_FILE) as f:
                    file_token = int(f.read().strip())
            except (OSError, ValueError):
                file_token = None
            if file_token == lease["token"]:
                return lease
        elif status == 409:
            # The sidecar's final answer: nothing for us to do under this pod's claim.
            say("no_lease", status=status, body=lease)
            if lease.get("error") == "completed":  # already completed: success
                sys.exit(0)
            if lease.get("error") == "failed":  # refused for good: say why, fail the pod
                print(f"the job cannot run: {lease.get('reason')}: {lease.get('message')}",
                      file=sys.stderr, flush=True)
                code = lease.get("exitCode")
                sys.exit(code if isinstance(code, int) and 0 < code < 256 else 1)
            sys.exit(8)  # lost or released
        if time.monotonic() > deadline:
            say("timeout", status=status, body=lease)
            sys.exit(1)
        time.sleep(0.1)


def complete(token: int, result: Any) -> tuple[int, dict[str, Any]]:
    """POST /v1/complete, retried while its outcome is unknown: a 503, a 429 or
    no answer at all (the sidecar may still be reading the outcome back). The
    same request is safe to repeat: it commits at most once, and once etcd
    answers the retry gets the 200 of a completion that did commit."""
    deadline = time.monotonic() + float(os.environ.get("JOBLEASE_COMPLETE_RETRY_SECONDS", "120"))
    pause = 0.2
    while True:
        try:
            status, body = call("POST", "/v1/complete", {"token": token, "result": result})
        except OSError as exc:  # timed out or refused: the outcome is unknown
            status, body = 0, {"error": "no_answer", "message": str(exc)}
        if status not in (0, 429, 503) or time.monotonic() > deadline:
            return status, body
        say("complete_retry", status=status, body=body)
        time.sleep(pause)
        pause = min(5.0, pause * 2)


def main() -> int:
    pid_file = os.environ.get("JOBLEASE_WORKER_PID_FILE")
    if pid_file:
        with open(pid_file + ".tmp", "w") as f:
            f.write(f"{os.getpid()}\n")
        os.replace(pid_file + ".tmp", pid_file)
    lease = wait_for_lease(float(os.environ.get("JOBLEASE_WAIT_SECONDS", "60")))
    token = lease["token"]
    say("lease", token=token, generation=lease["generation"], job=lease["job"],
        owner=lease["owner"], tokenFile=TOKEN_FILE)

    # The work. Every external effect carries the token, e.g. as a header
    # ("X-Fencing-Token: <token>") that the destination's fencing gate checks.
    items = int(os.environ.get("JOBLEASE_EXAMPLE_ITEMS", "3"))
    for i in range(items):
        say("work", item=i, token=token)
    hold = os.environ.get("JOBLEASE_EXAMPLE_HOLD_FILE")
    while hold and not os.path.exists(hold):
        time.sleep(0.05)

    status, body = complete(token, {"items": items, "worker": os.getpid()})
    say("complete", status=status, body=body)
    if status == 200:
        return 0
    if status == 409 and body.get("error") == "stale":
        return 7
    return 1


if __name__ == "__main__":
    sys.exit(main())
