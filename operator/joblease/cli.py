"""The ``joblease`` command: a thin shell over the library.

Every verb takes the etcd connection as flags or ``JOBLEASE_ETCD_*``
environment variables. Errors are one line on stderr and a distinct exit code
(see ``joblease.errors``): 2 invalid input, 3 not found, 4 held, 5 completed,
6 attempts exhausted, 7 stale, 8 lost, 10 store unreachable, 11 outcome
unknown, 12 permission denied, 16 item conflict, 17 queue suspended, 18 semaphore
full.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
import json
import os
import signal
import sys
from collections.abc import Awaitable, Callable, Coroutine, Iterable
from typing import Any, TypeVar

import click

from joblease import validation
from joblease.client import JobLeaseClient
from joblease.envvars import read_str
from joblease.errors import (
    CorruptRecordError,
    InvalidInputError,
    JobLeaseError,
    LeaseLostError,
    NotRegisteredError,
    StoreUnavailableError,
)
from joblease.etcd_store import (
    EtcdConfig,
    parse_endpoints,
    read_password_file,
)
from joblease.keys import DEFAULT_NAMESPACE, ItemRef, JobRef, QueueRef, SemaphoreRef
from joblease.lease import LeaseState
from joblease.queue import ItemPhase, Queues
from joblease.records import (
    CheckpointRecord,
    History,
    JobSpec,
    JobState,
    Phase,
    QueueSpec,
    ResultRecord,
    SemaphoreUse,
)

F = TypeVar("F", bound=Callable[..., Any])

_ETCD_DEFAULTS = EtcdConfig()


def etcd_options(fn: F) -> F:
    """The etcd connection options shared by every verb that talks to etcd.

    No click ``envvar=`` and no click defaults: a flag not given is ``None`` and
    :meth:`EtcdConfig.from_env` reads the ``JOBLEASE_ETCD_*`` variables and falls back
    to the dataclass defaults, the one path every component uses (an empty variable
    counts as unset there, as in :mod:`joblease.envvars`). ``--help`` shows the
    dataclass defaults."""
    options = [
        click.option("--endpoints", default=None,
                     help="Comma-separated etcd endpoints [JOBLEASE_ETCD_ENDPOINTS; "
                          f"default: {','.join(_ETCD_DEFAULTS.endpoints)}]."),
        click.option("--ca-file", default=None,
                     help="CA bundle (enables TLS) [JOBLEASE_ETCD_CA_FILE]."),
        click.option("--cert-file", default=None,
                     help="Client certificate (mutual TLS) [JOBLEASE_ETCD_CERT_FILE]."),
        click.option("--key-file", default=None,
                     help="Client key (mutual TLS) [JOBLEASE_ETCD_KEY_FILE]."),
        click.option("--server-name", default=None,
                     help="TLS server name override [JOBLEASE_ETCD_SERVER_NAME]."),
        click.option("--user", default=None, help="etcd user name [JOBLEASE_ETCD_USERNAME]."),
        click.option("--password-file", default=None,
                     type=click.Path(exists=True, dir_okay=False),
                     help="File holding the etcd password [JOBLEASE_ETCD_PASSWORD_FILE; "
                          "JOBLEASE_ETCD_PASSWORD also works]."),
        click.option("--root", default=None,
                     help=f"Key prefix under which jobs live [JOBLEASE_ROOT; "
                          f"default: {_ETCD_DEFAULTS.root}]."),
        click.option("--timeout", "request_timeout", type=float, default=None,
                     help="Per-request timeout in seconds "
                          f"[default: {_ETCD_DEFAULTS.request_timeout}]."),
    ]
    for option in reversed(options):
        fn = option(fn)
    return fn


def output_option(fn: F) -> F:
    return click.option("-o", "--output", type=click.Choice(["table", "json", "yaml"]),
                        default="table", show_default=True, help="Output format.")(fn)


def make_config(endpoints: str | None, ca_file: str | None, cert_file: str | None,
                key_file: str | None, server_name: str | None, user: str | None,
                password_file: str | None, root: str | None,
                request_timeout: float | None) -> EtcdConfig:
    """The flags given (``None``: not given) as overrides of ``EtcdConfig.from_env``,
    which reads the environment and the defaults the way every other component does.
    A password file given as a flag wins over a password in the environment."""
    return EtcdConfig.from_env(
        endpoints=parse_endpoints(endpoints) if endpoints is not None else None,
        ca_file=ca_file, cert_file=cert_file, key_file=key_file, server_name=server_name,
        username=user,
        password=(read_password_file(password_file) or None) if password_file else None,
        root=root, request_timeout=request_timeout)


ETCD_KEYS = ("endpoints", "ca_file", "cert_file", "key_file", "server_name", "user",
             "password_file", "root", "request_timeout")


def split_etcd(kwargs: dict[str, Any]) -> EtcdConfig:
    return make_config(**{k: kwargs.pop(k) for k in ETCD_KEYS})


T = TypeVar("T")


def run(coro: Coroutine[Any, Any, T]) -> T:
    """Run ``coro``; a JobLeaseError becomes one stderr line and its exit code."""
    try:
        return asyncio.run(coro)
    except JobLeaseError as e:
        click.echo(f"joblease: {e.reason}: {e}", err=True)
        sys.exit(e.exit_code)
    except KeyboardInterrupt:
        sys.exit(130)


def emit(data: Any, output: str, table: Callable[[Any], Iterable[Iterable[Any]]] | None = None,
         headers: Iterable[str] = ()) -> None:
    if output == "json":
        click.echo(json.dumps(data, indent=2, sort_keys=True, default=str))
    elif output == "yaml":
        try:
            import yaml
        except ImportError:  # PyYAML is optional; JSON is valid YAML
            click.echo(json.dumps(data, indent=2, sort_keys=True, default=str))
        else:
            click.echo(yaml.safe_dump(data, sort_keys=True).rstrip())
    else:
        rows = [list(map(str, r)) for r in (table(data) if table else [])]
        heads = list(headers)
        widths = [max(len(x) for x in col) for col in zip(heads, *rows, strict=False)]
        for row in [heads, *rows]:
            click.echo("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=False))
                       .rstrip())


STATE_HEADERS = ("JOB", "PHASE", "HOLDER", "GENERATION", "TOKEN", "ATTEMPTS", "TTL")


def state_rows(states: list[dict[str, Any]]) -> Iterable[list[Any]]:
    for s in states:
        holder = s["holder"]["owner"] if s["holder"] else "-"
        limit = "-" if s["maxAttempts"] is None else s["maxAttempts"] or "∞"  # None: no spec
        yield [s["job"], s["phase"], holder,
               s["generation"], s["token"] or "-", f'{s["attempts"]}/{limit}',
               s["leaseDurationSeconds"] or "-"]


def job_argument(fn: F) -> F:
    fn = click.option("-n", "--namespace", default=None,
                      help=f"The job's namespace [{NAMESPACE_VARIABLE}; "
                           f"default: {DEFAULT_NAMESPACE}].")(fn)
    return click.argument("job")(fn)


#: Where the job's namespace comes from when ``-n`` is not given (a pod's own namespace).
NAMESPACE_VARIABLE = "JOBLEASE_JOB_NAMESPACE"
#: Where the owner comes from when ``--owner`` is not given.
OWNER_VARIABLE = "JOBLEASE_OWNER"


def owner_of(owner: str | None) -> str | None:
    """``--owner`` if given, else ``JOBLEASE_OWNER`` (empty is unset, as in
    joblease.envvars), else None."""
    return owner or read_str(os.environ, OWNER_VARIABLE)


def required_owner(owner: str | None) -> str:
    """:func:`owner_of`, or a usage error (exit 2) naming both ways to give it."""
    found = owner_of(owner)
    if found is None:
        raise click.UsageError(f"Missing option '--owner' (or {OWNER_VARIABLE}).")
    return found


def job_ref(job: str, namespace: str | None) -> JobRef:
    """``-n`` if given, else ``JOBLEASE_JOB_NAMESPACE`` (read as joblease.envvars reads
    every variable: empty is unset), else the default namespace."""
    ref = JobRef.parse(job, namespace or read_str(os.environ, NAMESPACE_VARIABLE)
                       or DEFAULT_NAMESPACE)
    try:
        return validation.job_ref(ref)
    except InvalidInputError as e:
        click.echo(f"joblease: invalid: {e}", err=True)
        sys.exit(e.exit_code)


def _json_option(text: str, option: str, what: str, limit: int) -> Any:
    """A result or checkpoint given as JSON on the command line, checked before
    anything is sent (docs/protocol.md, "Stored values"); else one stderr line
    and the bad-input exit code."""
    try:
        return validation.json_text(text, what, limit)
    except InvalidInputError as e:
        click.echo(f"joblease: invalid: {option}: {e}", err=True)
        sys.exit(e.exit_code)


def _semaphore_use(ctx: click.Context | None, param: click.Parameter | None,
                   values: tuple[str, ...]) -> tuple[SemaphoreUse, ...]:
    uses = []
    for text in values:
        name, _, weight = text.partition(":")
        try:
            uses.append(SemaphoreUse(name, int(weight) if weight else 1))
        except ValueError:
            raise click.BadParameter(f"{text!r}: NAME or NAME:WEIGHT") from None
    return tuple(uses)


def semaphore_option(fn: F) -> F:
    return click.option(
        "--semaphore", "semaphores", multiple=True, callback=_semaphore_use,
        help="NAME[:WEIGHT]: every claim takes WEIGHT slots of this semaphore (same "
             "namespace) in its transaction (repeatable; docs/semaphores.md).")(fn)


class _Commands(click.Group):
    """The ``joblease`` group, whose heavier commands load when they are used.

    ``operator`` (kopf, aiohttp), ``ledger`` (the web stack) and ``demo`` are
    imported only when one of them is run, or its own help asked for: every other
    command (``claim``, ``get``, ``queue ...``) starts without them, about a second
    less on each start (docs/cli.md). ``joblease --help`` lists them by the
    help in ``LAZY_COMMANDS``, which tests/cli/test_cli.py holds equal to the
    loaded commands' own."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *LAZY_COMMANDS})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name in LAZY_COMMANDS and cmd_name not in self.commands:
            self.add_command(_load_optional(cmd_name), cmd_name)
        return super().get_command(ctx, cmd_name)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        limit = formatter.width - 6 - max(len(name) for name in self.list_commands(ctx))
        rows = []
        for name in self.list_commands(ctx):
            if name in LAZY_COMMANDS and name not in self.commands:
                # without importing it: its help's first paragraph, shortened as click does
                summary = click.Command(name, help=LAZY_COMMANDS[name][1])
                rows.append((name, summary.get_short_help_str(limit)))
                continue
            command = super().get_command(ctx, name)
            if command is not None and not command.hidden:
                rows.append((name, command.get_short_help_str(limit)))
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)


@click.group(cls=_Commands, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="joblease")
def main() -> None:
    """Job leases with fencing tokens on etcd.

    A claim is one etcd transaction; the revision at which it commits is the
    job's fencing token. Completion is accepted only from the current holder.
    """


@main.command()
@job_argument
@click.option("--ttl", "lease_duration_seconds", type=int, required=True,
              help="Lease duration in whole seconds (>= 2).")
@click.option("--max-attempts", type=int, default=3, show_default=True,
              help="Claims allowed before the job fails (0 = unlimited).")
@click.option("--parameters", default="{}", help="The job's input as a JSON object.")
@click.option("--history-limit", type=int, default=validation.DEFAULT_HISTORY_LIMIT,
              show_default=True,
              help="Tenures kept in the job's history (`joblease history`; 0 = none).")
@semaphore_option
@etcd_options
@output_option
def register(job: str, namespace: str | None, lease_duration_seconds: int, max_attempts: int,
             parameters: str, history_limit: int, semaphores: tuple[SemaphoreUse, ...],
             output: str, **kw: Any) -> None:
    """Register JOB in etcd (what the operator does for each JobLease)."""
    config, ref = split_etcd(kw), job_ref(job, namespace)
    try:
        params = json.loads(parameters)
        if not isinstance(params, dict):
            raise ValueError("not an object")
    except (ValueError, RecursionError) as e:
        click.echo(f"joblease: invalid: --parameters must be a JSON object ({e})", err=True)
        sys.exit(InvalidInputError.exit_code)

    async def go() -> dict[str, Any]:
        async with JobLeaseClient(config) as c:
            revision = await c.register(ref, JobSpec(lease_duration_seconds, max_attempts, params,
                                                     semaphores, history_limit))
            return {"job": str(ref), "registered": True, "revision": revision}

    data = run(go())
    emit(data, output, lambda d: [[d["job"], d["revision"]]], ("JOB", "REVISION"))


@main.command()
@job_argument
@etcd_options
@output_option
def unregister(job: str, namespace: str | None, output: str, **kw: Any) -> None:
    """Remove JOB's keys from etcd; a live holder loses it at its next check."""
    config, ref = split_etcd(kw), job_ref(job, namespace)

    async def go() -> dict[str, Any]:
        async with JobLeaseClient(config) as c:
            return {"job": str(ref), "registered": False, "revision": await c.unregister(ref)}

    emit(run(go()), output, lambda d: [[d["job"], d["revision"]]], ("JOB", "REVISION"))


LEASE_HEADERS = ("JOB", "OWNER", "GENERATION", "TOKEN", "TTL", "STATE")


def lease_rows(d: dict[str, Any]) -> list[list[Any]]:
    return [[d["job"], d["owner"], d["generation"], d["token"], d["ttl"], d["state"]]]


@main.command()
@job_argument
@click.option("--owner", default=None, help=f"Who claims [{OWNER_VARIABLE}; required].")
@click.option("--hold", is_flag=True,
              help="Keep the lease alive until interrupted (Ctrl-C releases it).")
@click.option("--wait", "wait_seconds", type=float, default=0.0, show_default=True,
              help="Wait for up to this many seconds while someone else holds the job "
                   "('inf': forever). Gives up with exit 9 if its own etcd session is lost "
                   "while waiting.")
@etcd_options
@output_option
def claim(job: str, namespace: str, owner: str | None, hold: bool, wait_seconds: float, output: str,
          **kw: Any) -> None:
    """Claim JOB for OWNER and print the generation and fencing token.

    Without --hold the lease is not renewed: it expires after its TTL unless
    completed or released first (joblease complete/release --token).
    """
    owner = required_owner(owner)
    config, ref = split_etcd(kw), job_ref(job, namespace)

    async def go() -> None:
        from joblease.errors import HeldError

        def held(e: HeldError) -> None:  # progress, once per holder
            click.echo(f"waiting: {ref} is held by {e.owner!r} (token {e.token}); "
                       f"waiting for up to {wait_seconds:g}s", err=True)

        client = JobLeaseClient(config)
        loop = asyncio.get_running_loop()
        try:
            lease = await client.claim_waiting(ref, owner, wait_seconds, on_held=held)
            emit(lease.to_dict(), output, lease_rows, LEASE_HEADERS)
            sys.stdout.flush()
            if not hold:
                await client.close(revoke=False)
                return
            stop = asyncio.Event()
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.add_signal_handler(sig, stop.set)
            done = asyncio.create_task(lease.wait_done())
            stopper = asyncio.create_task(stop.wait())
            await asyncio.wait({done, stopper}, return_when=asyncio.FIRST_COMPLETED)
            if lease.state is LeaseState.HELD:
                await lease.release()
                click.echo(f"released {ref} (token {lease.token})", err=True)
            elif lease.state is LeaseState.LOST:
                click.echo(f"joblease: {LeaseLostError.reason}: {lease.lost_reason}", err=True)
                await client.close()
                sys.exit(LeaseLostError.exit_code)
            await client.close()
        except BaseException:
            await client.close(revoke=not isinstance(sys.exc_info()[1], JobLeaseError))
            raise

    run(go())


def _on_behalf(verb: str) -> Callable[[F], F]:
    def decorate(fn: F) -> F:
        fn = click.option("--owner", default=None,
                          help=f"The holder's owner identity [{OWNER_VARIABLE}; required].")(fn)
        fn = click.option("--token", type=int, required=True,
                          help=f"The fencing token of the claim to {verb}.")(fn)
        return fn
    return decorate


@main.command()
@job_argument
@_on_behalf("complete")
@click.option("--result", default="null", help="The result as JSON.")
@etcd_options
@output_option
def complete(job: str, namespace: str | None, owner: str | None, token: int, result: str,
             output: str,
             **kw: Any) -> None:
    """Complete JOB under OWNER's claim with TOKEN (same condition as the holder's)."""
    value = _json_option(result, "--result", "result", validation.MAX_RESULT_BYTES)
    _as_holder(job, namespace, owner, token, kw, output,
               lambda c, ref, owner: c.complete_for(ref, owner, token, value))


@main.command()
@job_argument
@_on_behalf("checkpoint")
@click.option("--data", required=True, help="The checkpoint as JSON.")
@etcd_options
@output_option
def checkpoint(job: str, namespace: str | None, owner: str | None, token: int, data: str,
               output: str,
               **kw: Any) -> None:
    """Store DATA as JOB's checkpoint under OWNER's claim with TOKEN (refused as
    stale, exit 7, unless that claim holds the job now)."""
    value = _json_option(data, "--data", "checkpoint", validation.MAX_CHECKPOINT_BYTES)
    async def write(c: JobLeaseClient, ref: JobRef, owner: str) -> CheckpointRecord:
        return await (await c.lease_for(ref, owner, token)).checkpoint(value)

    _as_holder(job, namespace, owner, token, kw, output, write)


def _as_holder(job: str, namespace: str | None, owner: str | None, token: int,
               kw: dict[str, Any], output: str,
               write: Callable[[JobLeaseClient, JobRef, str],
                               Awaitable[ResultRecord | CheckpointRecord]]) -> None:
    """``complete`` and ``checkpoint``: one write under OWNER's claim with TOKEN, the
    record it stored printed (the same conditions as the holder's own write)."""
    owner = required_owner(owner)
    config, ref = split_etcd(kw), job_ref(job, namespace)

    async def go() -> dict[str, Any]:
        async with JobLeaseClient(config) as c:
            record = await write(c, ref, owner)
            return {"job": str(ref), **record.to_dict()}

    emit(run(go()), output, lambda d: [[d["job"], d["owner"], d["generation"], d["token"],
                                        d["revision"]]],
         ("JOB", "OWNER", "GENERATION", "TOKEN", "REVISION"))


@main.command()
@job_argument
@_on_behalf("release")
@etcd_options
@output_option
def release(job: str, namespace: str | None, owner: str | None, token: int, output: str,
            **kw: Any) -> None:
    """Release JOB held by OWNER with TOKEN; it becomes claimable at once."""
    owner = required_owner(owner)
    config, ref = split_etcd(kw), job_ref(job, namespace)

    async def go() -> dict[str, Any]:
        async with JobLeaseClient(config) as c:
            lease = await c.lease_for(ref, owner, token)
            await lease.release()
            return {"job": str(ref), "released": True, "token": token}

    emit(run(go()), output, lambda d: [[d["job"], d["token"]]], ("JOB", "RELEASED-TOKEN"))


@main.command("run")
@job_argument
@click.option("--owner", default=None,
              help=f"Who claims [{OWNER_VARIABLE}; default: HOSTNAME:PID].")
@click.option("--wait", "wait_seconds", type=float, default=0.0, show_default=True,
              help="Retry for up to this many seconds while someone else holds the job "
                   "('inf': forever). Gives up with exit 9 if the wrapper's own session "
                   "is lost while waiting.")
@click.option("--grace", type=float, default=None,
              help="Seconds between SIGTERM and SIGKILL when the lease is lost (default: "
                   "half the lease's safety margin, so the command is dead before another "
                   "worker can claim the job).")
@click.option("--result-file", type=click.Path(dir_okay=False), default=None,
              help="Complete with this file's JSON (default: the last JSON line of the "
                   "command's stdout, which is passed through).")
@etcd_options
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
def run_(job: str, namespace: str, owner: str | None, wait_seconds: float, grace: float | None,
         result_file: str | None, command: tuple[str, ...], **kw: Any) -> None:
    """Run COMMAND holding JOB's lease: joblease run JOB -- COMMAND [ARGS...].

    The command gets JOBLEASE_JOB, JOBLEASE_TOKEN, JOBLEASE_GENERATION and
    JOBLEASE_OWNER. Exit 0 completes the job; any other exit releases it and is
    propagated; losing the lease stops the command's process group (SIGTERM,
    SIGKILL after --grace) and exits 8. See docs/cli.md.
    """
    import os
    import socket
    from pathlib import Path

    from joblease.run import RunOptions, run_with_config

    config, ref = split_etcd(kw), job_ref(job, namespace)
    opts = RunOptions(job=ref, owner=owner_of(owner) or f"{socket.gethostname()}:{os.getpid()}",
                      command=command, wait=wait_seconds, grace=grace,
                      result_file=Path(result_file) if result_file else None)
    sys.exit(run(run_with_config(lambda: JobLeaseClient(config, revoke_on_loss=False), opts)))


@main.command()
@job_argument
@etcd_options
@output_option
def get(job: str, namespace: str | None, output: str, **kw: Any) -> None:
    """Show JOB's state as etcd holds it (exit 3 if it is not registered, 14 if a
    stored record of it cannot be decoded: what did decode is shown)."""
    config, ref = split_etcd(kw), job_ref(job, namespace)

    async def go() -> JobState:
        async with JobLeaseClient(config) as c:
            return await c.get(ref)

    state = run(go())
    if state.phase is Phase.NOT_REGISTERED:
        click.echo(f"joblease: {NotRegisteredError.reason}: job {ref} is not registered",
                   err=True)
        sys.exit(NotRegisteredError.exit_code)
    emit(state.to_dict(), output, lambda d: state_rows([d]), STATE_HEADERS)
    if output == "table" and state.checkpoint is not None:
        cp = state.checkpoint
        click.echo(f"checkpoint (generation {cp.generation}, token {cp.token}, by "
                   f"{cp.owner}): {json.dumps(cp.data, sort_keys=True)}")
    if state.corrupt is not None:
        # What did decode is shown above; the exit code says the state is incomplete.
        click.echo(f"joblease: {CorruptRecordError.reason}: job {ref}: {state.corrupt}",
                   err=True)
        sys.exit(CorruptRecordError.exit_code)


HISTORY_HEADERS = ("GENERATION", "TOKEN", "OWNER", "CLAIMED", "ENDED", "END", "CHECKPOINTS",
                   "REFUSED")


def _utc(at: float | None) -> str:
    """A record's informational wall-clock time, as UTC to the millisecond."""
    if at is None:
        return "-"
    stamp = datetime.datetime.fromtimestamp(at, datetime.UTC)
    return stamp.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def history_rows(d: dict[str, Any]) -> Iterable[list[Any]]:
    for t in d["tenures"]:
        yield [t["generation"], t["token"], t["owner"], _utc(t["claimedAt"]),
               _utc(t["endedAt"]), t["end"], t["checkpoints"], t["refusedCompletions"]]


def _history_target(name: str, namespace: str | None, is_item: bool) -> JobRef | ItemRef:
    """``history``'s argument: JOB (``[NS/]NAME``), or with ``--queue`` an item,
    ``QUEUE/ITEM``; ``NS/QUEUE/ITEM`` (how errors and the sidecar name an item)
    is always an item. Job and queue names and item ids have no ``/``."""
    parts = name.split("/")
    if len(parts) == 3:
        return ItemRef(queue_ref(f"{parts[0]}/{parts[1]}", namespace), _item_id(parts[2]))
    if is_item:
        if len(parts) != 2:
            raise click.UsageError("With --queue, give QUEUE/ITEM (or NS/QUEUE/ITEM).")
        return ItemRef(queue_ref(parts[0], namespace), _item_id(parts[1]))
    return job_ref(name, namespace)


@main.command()
@job_argument
@click.option("-q", "--queue", "is_item", is_flag=True,
              help="JOB is QUEUE/ITEM: show a queue item's history (NS/QUEUE/ITEM always is).")
@etcd_options
@output_option
def history(job: str, namespace: str | None, is_item: bool, output: str, **kw: Any) -> None:
    """Show JOB's last tenures, oldest first: who held it (generation, token,
    owner), when, how each ended (completed, released, revoked, expired, or
    open), the checkpoints written and the stale completions refused under it
    (docs/history.md). With --queue, JOB is QUEUE/ITEM: the same for one item
    of a queue (its last historyLimit claims, the queue's limit). Exit 3 if
    JOB (the queue, or the item) is not registered, 14 if a tenure record
    cannot be decoded (the others are shown)."""
    config = split_etcd(kw)
    ref = _history_target(job, namespace, is_item)
    what = f"item {ref}" if isinstance(ref, ItemRef) else f"job {ref}"

    async def go() -> History:
        async with JobLeaseClient(config) as c:
            if isinstance(ref, ItemRef):
                return await Queues(c).history(ref)
            return await c.history(ref)

    found = run(go())
    if not found.registered:
        click.echo(f"joblease: {NotRegisteredError.reason}: {what} is not registered",
                   err=True)
        sys.exit(NotRegisteredError.exit_code)
    emit(found.to_dict(), output, history_rows, HISTORY_HEADERS)
    if output == "table" and found.history_limit == 0:
        owner = "queue " + str(ref.queue) if isinstance(ref, ItemRef) else what
        click.echo(f"{owner} keeps no history (historyLimit 0)", err=True)
    for generation, why in found.corrupt:
        click.echo(f"joblease: {CorruptRecordError.reason}: {what}: tenure {generation}: "
                   f"{why}", err=True)
    if found.corrupt:
        sys.exit(CorruptRecordError.exit_code)


@main.command("list")
@click.option("-n", "--namespace", default=None, help="Only this namespace.")
@etcd_options
@output_option
def list_(namespace: str | None, output: str, **kw: Any) -> None:
    """List jobs (all namespaces unless -n)."""
    config = split_etcd(kw)

    async def go() -> list[JobState]:
        async with JobLeaseClient(config) as c:
            return await c.list(namespace)

    states = [s.to_dict() for s in run(go())]
    emit(states, output, state_rows, STATE_HEADERS)
    for s in states:  # listed with phase Corrupt; say why on stderr, keep exit 0
        if s["corrupt"] is not None:
            click.echo(f"joblease: {CorruptRecordError.reason}: job {s['job']}: {s['corrupt']}",
                       err=True)


@main.command()
@click.option("-n", "--namespace", default=None, help="Only this namespace.")
@click.option("--count", type=int, default=0, help="Stop after this many states (0: never).")
@etcd_options
def watch(namespace: str | None, count: int, **kw: Any) -> None:
    """Print every job's state, then each change, as JSON lines."""
    config = split_etcd(kw)

    async def go() -> None:
        seen = 0
        async with JobLeaseClient(config) as c:
            async for state in c.watch(namespace):
                click.echo(json.dumps(state.to_dict(), sort_keys=True, default=str))
                seen += 1
                if count and seen >= count:
                    return

    run(go())


@main.command()
@click.option("--members", type=int, default=1, show_default=True, help="Cluster size.")
def dev(members: int) -> None:
    """Run a throwaway etcd on free loopback ports until Ctrl-C."""
    from joblease.embedded import EtcdCluster

    cluster = EtcdCluster(members)
    try:
        cluster.start()
    except Exception as e:
        click.echo(f"joblease: {StoreUnavailableError.reason}: {e}", err=True)
        cluster.stop()
        sys.exit(StoreUnavailableError.exit_code)
    endpoints = ",".join(cluster.endpoints)
    click.echo(f"etcd is ready: export JOBLEASE_ETCD_ENDPOINTS={endpoints}")
    click.echo(f"data dir {cluster.base_dir} (removed on exit); Ctrl-C to stop", err=True)
    # Block SIGINT/SIGTERM (after etcd started, so it does not inherit the
    # mask) and take them synchronously: no handler races with the loop.
    stop_signals = {signal.SIGINT, signal.SIGTERM}
    signal.pthread_sigmask(signal.SIG_BLOCK, stop_signals)
    try:
        while all(m.running for m in cluster.members):
            if signal.sigtimedwait(stop_signals, 0.5) is not None:
                break
    finally:
        cluster.stop()
        click.echo("etcd stopped", err=True)


@main.command()
@click.argument("shell", type=click.Choice(["bash", "zsh", "fish"]))
def completion(shell: str) -> None:
    """Print the shell completion script: eval "$(joblease completion bash)"."""
    from click.shell_completion import get_completion_class

    cls = get_completion_class(shell)
    assert cls is not None
    click.echo(cls(main, {}, "joblease", "_JOBLEASE_COMPLETE").source())


def _demo_command() -> click.Command:
    from joblease.demo import demo_command

    return demo_command


def _ledger_command() -> click.Command:
    from joblease.fencing.command import ledger_command

    return ledger_command


def _operator_command() -> click.Command:
    from joblease.operator.command import operator_command

    return operator_command


#: The commands with heavier dependencies (the operator needs the ``operator``
#: extra: kopf), loaded by ``_Commands`` when used: their loader and the first
#: paragraph of their help.
#: Plain imports inside the loaders, not ``importlib``, so the import contracts
#: (``.importlinter``: ``cli`` on top) see what the CLI loads.
LAZY_COMMANDS: dict[str, tuple[Callable[[], click.Command], str]] = {
    "demo": (_demo_command, "Run the seed example: A pauses past its TTL, B takes over, "
             "A's late completion and A's late write are both rejected. Exit 0 only if "
             "they are."),
    "ledger": (_ledger_command, "Serve the example ledger destination: writes with a stale "
               "fencing token get 409 (docs/fencing.md; examples/ledger.yaml runs it in a "
               "cluster)."),
    "operator": (_operator_command,
                 "Register JobLeases in etcd and mirror etcd's decisions into their status."),
}


def _load_optional(name: str) -> click.Command:
    """The lazy command ``name``, or, when its dependency is not installed, a
    command that says which and exits."""
    try:
        return LAZY_COMMANDS[name][0]()
    except ImportError as e:
        missing = f"{e} (pip install 'joblease[operator]')"

    @click.command(name, context_settings={"ignore_unknown_options": True},
                   add_help_option=False)
    @click.argument("args", nargs=-1, type=click.UNPROCESSED)
    def unavailable(args: tuple[str, ...]) -> None:
        click.echo(f"joblease: {name} needs an optional dependency: {missing}", err=True)
        sys.exit(JobLeaseError.exit_code)
    return unavailable

__all__ = ["main"]


# -- queues (docs/queues.md) ------------------------------------------------------------------

QUEUE_HEADERS = ("QUEUE", "TOTAL", "PENDING", "HELD", "COMPLETED", "FAILED", "OLDEST-PENDING")
ITEM_HEADERS = ("ITEM", "PHASE", "GENERATION", "TOKEN", "HOLDER")


def queue_ref(queue: str, namespace: str | None) -> QueueRef:
    """As :func:`job_ref`, for a queue."""
    return QueueRef(*dataclasses.astuple(job_ref(queue, namespace)))


def _item_id(item: str) -> str:
    try:
        return validation.item_id(item)
    except InvalidInputError as e:
        click.echo(f"joblease: invalid: {e}", err=True)
        sys.exit(e.exit_code)


def queue_argument(fn: F) -> F:
    fn = click.option("-n", "--namespace", default=None,
                      help=f"The queue's namespace [{NAMESPACE_VARIABLE}; "
                           f"default: {DEFAULT_NAMESPACE}].")(fn)
    return click.argument("queue")(fn)


def item_rows(items: list[dict[str, Any]]) -> Iterable[list[Any]]:
    for i in items:
        yield [i["item"], i["phase"], i["generation"], i["token"] or "-",
               i["holder"]["owner"] if i["holder"] else "-"]


@main.group()
def queue() -> None:
    """Work queues: many items under one name, every claim fenced."""


@queue.command("create")
@queue_argument
@click.option("--ttl", "lease_duration_seconds", type=int, required=True,
              help="Lease duration of each item's claims, in whole seconds (>= 2).")
@click.option("--max-attempts", type=int, default=3, show_default=True,
              help="Claims an item gets before it fails (0 = unlimited).")
@click.option("--shards", type=int, default=0, show_default=True,
              help="Create items 0..N-1 (an Indexed Job's completion indexes).")
@click.option("--suspend/--no-suspend", default=False, show_default=True,
              help="A suspended queue claims nothing.")
@click.option("--history-limit", type=int, default=validation.DEFAULT_QUEUE_HISTORY_LIMIT,
              show_default=True,
              help="Tenures kept per item (`joblease history --queue QUEUE/ITEM`; 0 = none).")
@semaphore_option
@etcd_options
@output_option
def queue_create(queue: str, namespace: str | None, lease_duration_seconds: int,
                 max_attempts: int, shards: int, suspend: bool, history_limit: int,
                 semaphores: tuple[SemaphoreUse, ...], output: str, **kw: Any) -> None:
    """Create QUEUE in etcd, or change its spec (what the operator does for each JobQueue)."""
    config, ref = split_etcd(kw), queue_ref(queue, namespace)

    async def go() -> dict[str, Any]:
        async with JobLeaseClient(config) as c:
            spec = QueueSpec(lease_duration_seconds, max_attempts, suspend, shards, semaphores,
                             history_limit)
            return {"queue": str(ref), "revision": await Queues(c).create(ref, spec)}

    emit(run(go()), output, lambda d: [[d["queue"], d["revision"]]], ("QUEUE", "REVISION"))


@queue.command("delete")
@queue_argument
@etcd_options
@output_option
def queue_delete(queue: str, namespace: str | None, output: str, **kw: Any) -> None:
    """Delete QUEUE and every item of it from etcd."""
    config, ref = split_etcd(kw), queue_ref(queue, namespace)

    async def go() -> dict[str, Any]:
        async with JobLeaseClient(config) as c:
            return {"queue": str(ref), "deleted": True, "revision": await Queues(c).delete(ref)}

    emit(run(go()), output, lambda d: [[d["queue"], d["revision"]]], ("QUEUE", "REVISION"))


def _read_items(item_options: tuple[str, ...], payload: str | None, file: str | None
                ) -> list[tuple[str | None, Any]]:
    """``--item ID`` (with one ``--payload`` for all), or JSON lines of
    ``{"id": ..., "payload": ...}`` from ``--file`` (``-``: stdin)."""
    items: list[tuple[str | None, Any]] = []
    value = None if payload is None else _json_option(payload, "--payload", "payload",
                                                        validation.MAX_PAYLOAD_BYTES)
    items += [(i, value) for i in item_options]
    if file is not None:
        stream = sys.stdin if file == "-" else open(file, encoding="utf-8")
        with stream:
            for number, line in enumerate(stream, start=1):
                if not line.strip():
                    continue
                try:
                    entry = validation.json_text(line, f"line {number}", 1 << 20)
                    if not isinstance(entry, dict) or not set(entry) <= {"id", "payload"}:
                        raise InvalidInputError(
                            'expected an object {"id": ..., "payload": ...}')
                    item_id = entry.get("id")
                    if item_id is not None and not isinstance(item_id, str):
                        raise InvalidInputError("'id' must be a string")
                except InvalidInputError as e:
                    click.echo(f"joblease: invalid: {file} line {number}: {e}", err=True)
                    sys.exit(e.exit_code)
                items.append((item_id, entry.get("payload")))
    if not items:
        raise click.UsageError("Give --item ID (repeatable) or --file FILE.")
    return items


@queue.command("enqueue")
@queue_argument
@click.option("--item", "item_options", multiple=True,
              help="An item id (repeatable); its payload is --payload.")
@click.option("--payload", default=None, help="The payload of the --item items, as JSON.")
@click.option("--file", type=click.Path(dir_okay=False, allow_dash=True), default=None,
              help='JSON lines {"id": ..., "payload": ...} ("id" optional: generated); '
                   "'-' reads stdin.")
@etcd_options
@output_option
def queue_enqueue(queue: str, namespace: str | None, item_options: tuple[str, ...],
                  payload: str | None, file: str | None, output: str, **kw: Any) -> None:
    """Add items to QUEUE. Re-enqueueing an id with the same payload is a no-op;
    with another payload the whole batch is refused (exit 16) and nothing written."""
    config, ref = split_etcd(kw), queue_ref(queue, namespace)
    items = _read_items(item_options, payload, file)

    async def go() -> dict[str, Any]:
        async with JobLeaseClient(config) as c:
            return {"queue": str(ref), **(await Queues(c).enqueue(ref, items)).to_dict()}

    emit(run(go()), output, lambda d: [[d["queue"], d["added"], d["existing"]]],
         ("QUEUE", "ADDED", "ALREADY-THERE"))


@queue.command("get")
@queue_argument
@etcd_options
@output_option
def queue_get(queue: str, namespace: str | None, output: str, **kw: Any) -> None:
    """QUEUE's spec and counts, read from etcd at one revision."""
    config, ref = split_etcd(kw), queue_ref(queue, namespace)

    async def go() -> dict[str, Any]:
        async with JobLeaseClient(config) as c:
            queues = Queues(c)
            counts = await queues.counts(ref)
            _, spec = await queues.spec(ref)
            return {"queue": str(ref), **counts.to_dict(),
                    "leaseDurationSeconds": spec.lease_duration_seconds,
                    "maxAttempts": spec.max_attempts, "suspend": spec.suspend,
                    "shards": spec.shards, "historyLimit": spec.history_limit}

    def rows(d: dict[str, Any]) -> list[list[Any]]:
        age = d["oldestPendingAgeSeconds"]
        return [[d["queue"], d["total"], d["pending"], d["held"], d["completed"], d["failed"],
                 "-" if age is None else f"{age:.0f}s"]]

    emit(run(go()), output, rows, QUEUE_HEADERS)


@queue.command("list")
@click.option("-n", "--namespace", default=None,
              help=f"The namespace [{NAMESPACE_VARIABLE}; default: {DEFAULT_NAMESPACE}].")
@etcd_options
@output_option
def queue_list(namespace: str | None, output: str, **kw: Any) -> None:
    """The queues of a namespace with their counts (each read at one revision)."""
    config = split_etcd(kw)
    ns = namespace or read_str(os.environ, NAMESPACE_VARIABLE) or DEFAULT_NAMESPACE

    async def go() -> list[dict[str, Any]]:
        async with JobLeaseClient(config) as c:
            queues = Queues(c)
            return [{"queue": str(q), **(await queues.counts(q)).to_dict()}
                    for q in await queues.queues_of(ns)]

    def rows(qs: list[dict[str, Any]]) -> Iterable[list[Any]]:
        for d in qs:
            age = d["oldestPendingAgeSeconds"]
            yield [d["queue"], d["total"], d["pending"], d["held"], d["completed"],
                   d["failed"], "-" if age is None else f"{age:.0f}s"]

    emit(run(go()), output, rows, QUEUE_HEADERS)


@click.command("items")
@queue_argument
@click.option("--phase", type=click.Choice([p.value for p in ItemPhase]), default=None,
              help="Only items in this phase.")
@click.option("--limit", type=click.IntRange(1, 100_000), default=1000, show_default=True,
              help="At most this many items, in enqueue order.")
@etcd_options
@output_option
def queue_items(queue: str, namespace: str | None, phase: str | None, limit: int, output: str,
                **kw: Any) -> None:
    """QUEUE's items in enqueue order: phase, generation, token, holder."""
    config, ref = split_etcd(kw), queue_ref(queue, namespace)

    async def go() -> list[dict[str, Any]]:
        async with JobLeaseClient(config) as c:
            states = await Queues(c).items(ref, limit=limit,
                                           phase=ItemPhase(phase) if phase else None)
            return [s.to_dict() for s in states]

    emit(run(go()), output, item_rows, ITEM_HEADERS)


queue.add_command(queue_items)
#: ``joblease items QUEUE`` (``kubectl joblease items QUEUE``) is ``joblease queue items``.
main.add_command(queue_items)


@queue.command("retry")
@queue_argument
@click.argument("item")
@etcd_options
@output_option
def queue_retry(queue: str, namespace: str | None, item: str, output: str, **kw: Any) -> None:
    """Put failed ITEM of QUEUE back with maxAttempts new claims."""
    config, ref = split_etcd(kw), queue_ref(queue, namespace)
    item_ref = ItemRef(ref, _item_id(item))

    async def go() -> dict[str, Any]:
        async with JobLeaseClient(config) as c:
            return {"item": str(item_ref), "retried": True,
                    "revision": await Queues(c).retry(item_ref)}

    emit(run(go()), output, lambda d: [[d["item"], d["revision"]]], ("ITEM", "REVISION"))


@queue.command("claim")
@queue_argument
@click.option("--item", default=None, help="Claim this item (default: the next one).")
@click.option("--create", is_flag=True,
              help="With --item: enqueue it first if absent (a CronJob slot).")
@click.option("--owner", default=None, help=f"Who claims [{OWNER_VARIABLE}; required].")
@click.option("--wait", "wait_seconds", type=float, default=0.0, show_default=True,
              help="Without --item: wait up to this many seconds for a claimable item.")
@etcd_options
@output_option
def queue_claim(queue: str, namespace: str | None, item: str | None, create: bool,
                owner: str | None, wait_seconds: float, output: str, **kw: Any) -> None:
    """Claim an item of QUEUE and print it with its fencing token (not renewed:
    complete or release it with `joblease queue complete/release --token`).
    Nothing claimable within --wait: exit 3."""
    owner = required_owner(owner)
    config, ref = split_etcd(kw), queue_ref(queue, namespace)
    if create and item is None:
        raise click.UsageError("--create needs --item.")
    item_id = None if item is None else _item_id(item)

    async def go() -> dict[str, Any]:
        client = JobLeaseClient(config)
        try:
            queues = Queues(client)
            if item_id is None:
                lease = await queues.claim_next(ref, owner, wait=wait_seconds)
                if lease is None:
                    raise NotRegisteredError(f"claimable item in queue {ref} (none within "
                                             f"{wait_seconds:g}s)")
            elif create:
                lease = await queues.claim_or_create(ItemRef(ref, item_id), owner)
            else:
                lease = await queues.claim(ItemRef(ref, item_id), owner)
            data = lease.to_dict()
        except BaseException:
            await client.close(revoke=not isinstance(sys.exc_info()[1], JobLeaseError))
            raise
        await client.close(revoke=False)
        return data

    emit(run(go()), output, lambda d: [[d["item"], d["owner"], d["generation"], d["token"],
                                        d["ttl"]]],
         ("ITEM", "OWNER", "GENERATION", "TOKEN", "TTL"))


def _item_verb(verb: str) -> Callable[[F], F]:
    def decorate(fn: F) -> F:
        fn = _on_behalf(verb)(fn)
        fn = click.argument("item")(fn)
        return queue_argument(fn)
    return decorate


@queue.command("complete")
@_item_verb("complete")
@click.option("--result", default="null", help="The result as JSON.")
@etcd_options
@output_option
def queue_complete(queue: str, namespace: str | None, item: str, owner: str | None, token: int,
                   result: str, output: str, **kw: Any) -> None:
    """Complete ITEM of QUEUE under OWNER's claim with TOKEN."""
    owner = required_owner(owner)
    config, ref = split_etcd(kw), queue_ref(queue, namespace)
    item_ref = ItemRef(ref, _item_id(item))
    value = _json_option(result, "--result", "result", validation.MAX_RESULT_BYTES)

    async def go() -> dict[str, Any]:
        async with JobLeaseClient(config) as c:
            done = await Queues(c).complete_for(item_ref, owner, token, value)
            return {"item": str(item_ref), **done.to_dict()}

    emit(run(go()), output, lambda d: [[d["item"], d["owner"], d["generation"], d["token"],
                                        d["revision"]]],
         ("ITEM", "OWNER", "GENERATION", "TOKEN", "REVISION"))


@queue.command("release")
@_item_verb("release")
@etcd_options
@output_option
def queue_release(queue: str, namespace: str | None, item: str, owner: str | None, token: int,
                  output: str, **kw: Any) -> None:
    """Release ITEM of QUEUE held by OWNER with TOKEN; it is claimable again at once."""
    owner = required_owner(owner)
    config, ref = split_etcd(kw), queue_ref(queue, namespace)
    item_ref = ItemRef(ref, _item_id(item))

    async def go() -> dict[str, Any]:
        async with JobLeaseClient(config) as c:
            await (await Queues(c).lease_for(item_ref, owner, token)).release()
            return {"item": str(item_ref), "released": True, "token": token}

    emit(run(go()), output, lambda d: [[d["item"], d["token"]]], ("ITEM", "RELEASED-TOKEN"))



@queue.command("prune")
@queue_argument
@click.option("--older-than", type=float, required=True,
              help="Delete completed and failed items that finished more than this many "
                   "seconds ago (by the finisher's clock).")
@etcd_options
@output_option
def queue_prune(queue: str, namespace: str | None, older_than: float, output: str,
                **kw: Any) -> None:
    """Forget QUEUE's finished items past their retention (re-enqueueing a pruned
    id makes a new item)."""
    config, ref = split_etcd(kw), queue_ref(queue, namespace)

    async def go() -> dict[str, Any]:
        async with JobLeaseClient(config) as c:
            return {"queue": str(ref), "pruned": await Queues(c).prune(ref, older_than)}

    emit(run(go()), output, lambda d: [[d["queue"], d["pruned"]]], ("QUEUE", "PRUNED"))


@queue.command("run")
@queue_argument
@click.option("--item", default=None,
              help="Run for this item only (an Indexed Job: $JOB_COMPLETION_INDEX).")
@click.option("--create", is_flag=True,
              help="With --item: enqueue it first if absent (a CronJob slot).")
@click.option("--owner", default=None,
              help=f"Who claims [{OWNER_VARIABLE}; default: HOSTNAME:PID].")
@click.option("--wait", "wait_seconds", type=float, default=0.0, show_default=True,
              help="Draining: wait up to this many seconds for a claimable item before "
                   "ending ('inf': forever).")
@click.option("--grace", type=float, default=None,
              help="Seconds between SIGTERM and SIGKILL when an item's lease is lost "
                   "(default: half the lease's safety margin).")
@click.option("--result-file", type=click.Path(dir_okay=False), default=None,
              help="Complete each item with this file's JSON (default: the last JSON line "
                   "of the command's stdout).")
@etcd_options
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
def queue_run(queue: str, namespace: str | None, item: str | None, create: bool,
              owner: str | None, wait_seconds: float, grace: float | None,
              result_file: str | None, command: tuple[str, ...], **kw: Any) -> None:
    """Run COMMAND once per item of QUEUE, each under its item's lease:
    joblease queue run QUEUE -- COMMAND [ARGS...].

    Each run gets JOBLEASE_QUEUE, JOBLEASE_ITEM, JOBLEASE_PAYLOAD (the item's
    payload as JSON), JOBLEASE_TOKEN, JOBLEASE_GENERATION, JOBLEASE_OWNER and
    JOBLEASE_JOB (QUEUE/ITEM), with `joblease run`'s rules per item: exit 0
    completes it, another exit releases it, a lost lease stops the command and
    ends with exit 8. Without --item, items are run one after another until
    none is claimable within --wait. See docs/queues.md.
    """
    import os
    import socket
    from pathlib import Path

    from joblease.run import QueueRunOptions, run_with_config

    config, ref = split_etcd(kw), queue_ref(queue, namespace)
    if create and item is None:
        raise click.UsageError("--create needs --item.")
    opts = QueueRunOptions(
        queue=ref, owner=owner_of(owner) or f"{socket.gethostname()}:{os.getpid()}",
        command=command, item=None if item is None else _item_id(item), create=create,
        wait=wait_seconds, grace=grace, result_file=Path(result_file) if result_file else None)
    sys.exit(run(run_with_config(lambda: JobLeaseClient(config, revoke_on_loss=False), opts)))


# -- semaphores (docs/semaphores.md) ----------------------------------------------------------


@main.group()
def semaphore() -> None:
    """Fenced concurrency limits: a job's claim takes its slots in its transaction."""


def semaphore_ref(name: str, namespace: str | None) -> SemaphoreRef:
    return SemaphoreRef(*dataclasses.astuple(job_ref(name, namespace)))


@semaphore.command("create")
@click.argument("name")
@click.option("-n", "--namespace", default=None, help="The semaphore's namespace.")
@click.option("--limit", type=int, required=True, help="Slots live at once (1..10000).")
@etcd_options
@output_option
def semaphore_create(name: str, namespace: str | None, limit: int, output: str,
                     **kw: Any) -> None:
    """Create semaphore NAME, or change its limit (raising it lets waiters in at
    once; lowering it revokes nobody)."""
    config, ref = split_etcd(kw), semaphore_ref(name, namespace)

    async def go() -> dict[str, Any]:
        from joblease.semaphore import Semaphores
        async with JobLeaseClient(config) as c:
            return {"semaphore": str(ref), "limit": limit,
                    "revision": await Semaphores(c).create(ref, limit)}

    emit(run(go()), output, lambda d: [[d["semaphore"], d["limit"], d["revision"]]],
         ("SEMAPHORE", "LIMIT", "REVISION"))


@semaphore.command("get")
@click.argument("name")
@click.option("-n", "--namespace", default=None, help="The semaphore's namespace.")
@etcd_options
@output_option
def semaphore_get(name: str, namespace: str | None, output: str, **kw: Any) -> None:
    """Limit, live slots with their holders and tokens, and waiters (also: holders)."""
    config, ref = split_etcd(kw), semaphore_ref(name, namespace)

    async def go() -> dict[str, Any]:
        from joblease.semaphore import Semaphores
        async with JobLeaseClient(config) as c:
            return (await Semaphores(c).status(ref)).to_dict()

    def rows(d: dict[str, Any]) -> list[list[Any]]:
        return [[d["semaphore"], h["slot"], h["holder"], h["owner"], h["token"]]
                for h in d["holders"]] or [[d["semaphore"], "-", "-", "-", "-"]]

    emit(run(go()), output, rows, ("SEMAPHORE", "SLOT", "HOLDER", "OWNER", "TOKEN"))


semaphore.add_command(semaphore_get, "holders")


@semaphore.command("delete")
@click.argument("name")
@click.option("-n", "--namespace", default=None, help="The semaphore's namespace.")
@etcd_options
@output_option
def semaphore_delete(name: str, namespace: str | None, output: str, **kw: Any) -> None:
    """Delete semaphore NAME (claims needing it are refused until it exists again)."""
    config, ref = split_etcd(kw), semaphore_ref(name, namespace)

    async def go() -> dict[str, Any]:
        from joblease.semaphore import Semaphores
        async with JobLeaseClient(config) as c:
            return {"semaphore": str(ref), "revision": await Semaphores(c).delete(ref)}

    emit(run(go()), output, lambda d: [[d["semaphore"], d["revision"]]],
         ("SEMAPHORE", "REVISION"))

if __name__ == "__main__":
    main()
