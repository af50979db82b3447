"""Where a job's state lives in etcd.

Every job owns the prefix ``<root>/<namespace>/<name>/`` (root defaults to
``/joblease/v1``). Under it:

- ``spec``    registration written by the operator (or ``joblease register``);
- ``holder``  bound to an etcd lease: its existence means "owned and unexpired";
              its create revision is the fencing token;
- ``claims``  put once per successful claim: its ``version`` is the generation
              (and the attempts used);
- ``result``  written once, by the completion transaction;
- ``checkpoint`` the last progress checkpoint, written only by the holder
              (same compares as renew); kept after completion, deleted with
              the job on unregister.
"""

from __future__ import annotations

from dataclasses import dataclass

DEFAULT_ROOT = "/joblease/v1"
#: The namespace of a job named without one (``name`` rather than ``ns/name``).
DEFAULT_NAMESPACE = "default"


@dataclass(frozen=True, order=True)
class JobRef:
    """A job's identity: the Kubernetes namespace and name of its JobLease."""

    namespace: str
    name: str

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}"

    @classmethod
    def parse(cls, text: str, default_namespace: str = DEFAULT_NAMESPACE) -> JobRef:
        """``ns/name`` or ``name`` (in ``default_namespace``)."""
        if "/" in text:
            ns, _, name = text.partition("/")
            return cls(ns, name)
        return cls(default_namespace, text)


@dataclass(frozen=True)
class JobKeys:
    """The etcd keys of one job."""

    prefix: bytes

    @property
    def spec(self) -> bytes:
        return self.prefix + b"spec"

    @property
    def holder(self) -> bytes:
        return self.prefix + b"holder"

    @property
    def claims(self) -> bytes:
        return self.prefix + b"claims"

    @property
    def result(self) -> bytes:
        return self.prefix + b"result"

    @property
    def checkpoint(self) -> bytes:
        return self.prefix + b"checkpoint"


@dataclass(frozen=True)
class KeySpace:
    """Maps jobs to keys and keys back to jobs, under one configurable root."""

    root: str = DEFAULT_ROOT

    def __post_init__(self) -> None:
        object.__setattr__(self, "root", "/" + self.root.strip("/"))

    def job(self, ref: JobRef) -> JobKeys:
        return JobKeys(f"{self.root}/{ref.namespace}/{ref.name}/".encode())

    def namespace_prefix(self, namespace: str | None = None) -> bytes:
        """All jobs (``None``) or all jobs of one namespace."""
        if namespace is None:
            return f"{self.root}/".encode()
        return f"{self.root}/{namespace}/".encode()

    def parse(self, key: bytes) -> tuple[JobRef, str] | None:
        """``(job, field)`` for a key under the root, else ``None``."""
        text = key.decode(errors="replace")
        if not text.startswith(self.root + "/"):
            return None
        parts = text[len(self.root) + 1 :].split("/")
        if len(parts) != 3:
            return None
        return JobRef(parts[0], parts[1]), parts[2]
