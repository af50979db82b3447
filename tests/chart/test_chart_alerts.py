"""The chart's alerts and dashboard, checked by the real promtool and real scrapes.

What is guaranteed:

- the rendered ``PrometheusRule`` (``helm template`` with the pinned helm) passes
  ``promtool check rules``, and ``promtool test rules`` fires every alert from
  synthetic series (tests/chart/joblease-alerts.test.yaml) with the expected
  labels and annotations, and keeps it silent on healthy series;
- every alert in the chart has a unit test there;
- every metric name the rules and the dashboard use is one the operator and the
  sidecar really export. Both are scraped over HTTP for real: a sidecar process
  (the Go binary) holding a job on the test's etcd (its ``/metrics``), and the
  operator's metrics server (``joblease.operator.metrics.serve``, the code the
  operator runs) on a loopback port -- the operator itself (kopf) is not started:
  its metric names do not depend on a Kubernetes API being there;
- the dashboard ConfigMap carries ``grafana_dashboard: "1"``, its JSON is valid,
  and every panel query parses (each is put in a throwaway recording rule for
  ``promtool check rules``, Grafana's ``$__rate_interval``/``$namespace``
  replaced by a duration/regex first).

promtool is built from the Prometheus Go module pinned in hack/promtool/
(hack/build-promtool, cached under ~/.cache/joblease/bin/).
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from joblease import EtcdConfig, JobLeaseClient, JobRef, JobSpec
from tests.support.binaries import REPO_ROOT, BinaryNotFound, helm_binary, versions
from tests.support.waiting import wait_until

CHART = REPO_ROOT / "charts" / "joblease-operator"
UNIT_TESTS = REPO_ROOT / "tests" / "chart" / "joblease-alerts.test.yaml"
METRIC = re.compile(r"\bjoblease_[a-zA-Z0-9_]+\b")


@pytest.fixture(scope="session")
def promtool() -> str:
    """Build (or reuse) the pinned promtool; a missing Go toolchain fails, not skips."""
    done = subprocess.run([str(REPO_ROOT / "hack" / "build-promtool")], capture_output=True,
                          text=True, timeout=3600)
    assert done.returncode == 0, done.stderr
    path = done.stdout.strip().splitlines()[-1]
    assert f"promtool-{versions()['PROMETHEUS_VERSION']}" in path and os.access(path, os.X_OK)
    return path


@pytest.fixture(scope="session")
def helm() -> str:
    try:
        return helm_binary()
    except BinaryNotFound:
        subprocess.run([str(REPO_ROOT / "hack" / "build-test-binaries"), "helm"], check=True,
                       timeout=3600)
        return helm_binary()


def render(helm: str, *values: str) -> list[dict[str, Any]]:
    args = [a for v in values for a in ("--set", v)]
    done = subprocess.run([helm, "template", "t", str(CHART), "--namespace", "joblease",
                           *args], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return [d for d in yaml.safe_load_all(done.stdout) if d]


@pytest.fixture(scope="module")
def rendered(helm: str) -> list[dict[str, Any]]:
    return render(helm, "metrics.prometheusRule.enabled=true",
                  "metrics.grafanaDashboard.enabled=true")


def only(docs: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    found = [d for d in docs if d["kind"] == kind]
    assert len(found) == 1, [d["kind"] for d in docs]
    return found[0]


@pytest.fixture(scope="module")
def rules_file(rendered: list[dict[str, Any]], tmp_path_factory: pytest.TempPathFactory
               ) -> Path:
    rule = only(rendered, "PrometheusRule")
    path = tmp_path_factory.mktemp("rules") / "joblease-rules.yaml"
    path.write_text(yaml.safe_dump({"groups": rule["spec"]["groups"]}))
    return path


def dashboard(rendered: list[dict[str, Any]]) -> dict[str, Any]:
    cm = [d for d in rendered if d["kind"] == "ConfigMap"
          and d["metadata"]["labels"].get("grafana_dashboard") == "1"]
    assert len(cm) == 1
    board: dict[str, Any] = json.loads(cm[0]["data"]["joblease.json"])
    return board


def dashboard_exprs(board: dict[str, Any]) -> list[str]:
    exprs = [t["expr"] for p in board["panels"] for t in p.get("targets", [])]
    for var in board["templating"]["list"]:
        if var["type"] == "query":
            exprs.append(var["definition"])  # label_values(metric, label): Grafana's
    return exprs


def rule_exprs(rules_file: Path) -> list[str]:
    groups = yaml.safe_load(rules_file.read_text())["groups"]
    return [r["expr"] for g in groups for r in g["rules"]]


def promtool_run(promtool: str, *args: str, cwd: Path | None = None
                 ) -> subprocess.CompletedProcess[str]:
    return subprocess.run([promtool, *args], capture_output=True, text=True, timeout=300,
                          cwd=cwd)


# ----------------------------------------------------------------------------- rules


def test_disabled_by_default(helm: str) -> None:
    kinds = {d["kind"] for d in render(helm)}
    assert "PrometheusRule" not in kinds
    assert not [d for d in render(helm) if d["kind"] == "ConfigMap"
                and d["metadata"].get("labels", {}).get("grafana_dashboard")]


def test_rendered_rules_pass_promtool_check(promtool: str, rules_file: Path) -> None:
    done = promtool_run(promtool, "check", "rules", str(rules_file))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout


def test_every_alert_fires_in_promtool_unit_tests(promtool: str, rules_file: Path,
                                                  tmp_path: Path) -> None:
    tests = yaml.safe_load(UNIT_TESTS.read_text())
    tests["rule_files"] = [str(rules_file)]
    path = tmp_path / "alerts.test.yaml"
    path.write_text(yaml.safe_dump(tests, sort_keys=False))
    done = promtool_run(promtool, "test", "rules", str(path))
    assert done.returncode == 0, done.stdout + done.stderr

    alerts = {r["alert"] for g in yaml.safe_load(rules_file.read_text())["groups"]
              for r in g["rules"] if "alert" in r}
    fired = {t["alertname"] for g in tests["tests"] for t in g["alert_rule_test"]
             if t["exp_alerts"]}
    assert alerts == fired, f"alerts without a firing unit test: {alerts - fired}"


def test_alert_labels_and_lag_threshold_come_from_values(helm: str) -> None:
    docs = render(helm, "metrics.prometheusRule.enabled=true",
                  "metrics.prometheusRule.alertLabels.team=payments",
                  "metrics.prometheusRule.statusLagSeconds=3",
                  "metrics.prometheusRule.labels.release=kube-prometheus-stack")
    rule = only(docs, "PrometheusRule")
    assert rule["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    rules = [r for g in rule["spec"]["groups"] for r in g["rules"]]
    assert all(r["labels"]["team"] == "payments" for r in rules)
    lag = next(r for r in rules if r["alert"] == "JobLeaseOperatorStatusLag")
    assert lag["expr"].rstrip().endswith("> 3")


def test_semaphore_saturation_minutes_come_from_values(helm: str) -> None:
    docs = render(helm, "metrics.prometheusRule.enabled=true",
                  "metrics.prometheusRule.semaphoreSaturatedMinutes=7")
    rules = [r for g in only(docs, "PrometheusRule")["spec"]["groups"] for r in g["rules"]]
    saturated = next(r for r in rules if r["alert"] == "JobSemaphoreSaturated")
    assert saturated["for"] == "7m"
    assert "over 7 minutes" in saturated["annotations"]["description"]


def test_values_schema_refuses_unknown_keys_under_the_new_values(helm: str) -> None:
    for bad in ("metrics.prometheusRule.enabeld=true", "metrics.grafanaDashboard.nope=1",
                "metrics.prometheusRule.statusLagSeconds=-1",
                "metrics.prometheusRule.semaphoreSaturatedMinutes=0"):
        done = subprocess.run([helm, "template", "t", str(CHART), "--set", bad],
                              capture_output=True, text=True, timeout=120)
        assert done.returncode != 0 and "schema" in done.stderr.lower(), (bad, done.stderr)


# ----------------------------------------------------------------------------- dashboard


def test_dashboard_json_is_valid_and_its_queries_parse(
    promtool: str, rendered: list[dict[str, Any]], tmp_path: Path,
) -> None:
    board = dashboard(rendered)
    assert board["uid"] and board["panels"]
    assert all(t["expr"] for p in board["panels"] for t in p["targets"])
    panel_titles = " ".join(p["title"] for p in board["panels"]).lower()
    for topic in ("claims", "completions", "losses", "rejections", "lag", "phase"):
        assert topic in panel_titles, topic
    rules = []
    for i, expr in enumerate(dashboard_exprs(board)):
        m = re.fullmatch(r"label_values\((\w+),\s*(\w+)\)", expr)
        promql = m.group(1) if m else expr
        promql = promql.replace("$__rate_interval", "5m").replace("$namespace", ".*")
        assert "$" not in promql, f"unhandled Grafana variable in {expr!r}"
        rules.append({"record": f"dashboard:query_{i}", "expr": promql})
    path = tmp_path / "dashboard-queries.yaml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    done = promtool_run(promtool, "check", "rules", str(path))
    assert done.returncode == 0, done.stdout + done.stderr


# ----------------------------------------------------------------------------- metric names


async def _scrape_operator() -> str:
    from joblease.operator.metrics import OperatorMetrics, serve

    async def yes() -> bool:
        return True

    metrics = OperatorMetrics()
    runner = await serve(metrics, "127.0.0.1", 0, healthy=yes, ready=yes)
    try:
        port = runner.addresses[0][1]
        async with httpx.AsyncClient(timeout=30) as http:
            r = await http.get(f"http://127.0.0.1:{port}/metrics")
        r.raise_for_status()
        return r.text
    finally:
        await runner.cleanup()


@pytest.fixture
def sidecar_metrics(etcd_config: EtcdConfig, tmp_path: Path, sidecar_argv: list[str]
                    ) -> Iterator[str]:
    """``/metrics`` of a real sidecar process that holds a job."""
    job = JobRef("default", "alerts-" + uuid.uuid4().hex[:8])

    async def register() -> None:
        async with JobLeaseClient(etcd_config) as c:
            await c.register(job, JobSpec(lease_duration_seconds=5, max_attempts=0))

    asyncio.run(register())
    env = {k: v for k, v in os.environ.items() if not k.startswith("JOBLEASE_")}
    env.update({
        "JOBLEASE_ETCD_ENDPOINTS": ",".join(etcd_config.endpoints),
        "JOBLEASE_ROOT": etcd_config.root, "JOBLEASE_JOB_NAME": job.name,
        "JOBLEASE_JOB_NAMESPACE": job.namespace, "POD_NAME": "pod-alerts",
        "POD_UID": uuid.uuid4().hex[:8], "JOBLEASE_SIDECAR_PORT": "0",
        "JOBLEASE_SIDECAR_PORT_FILE": str(tmp_path / "port"),
        "JOBLEASE_SIDECAR_PROBE_PORT": "off", "JOBLEASE_TOKEN_FILE": str(tmp_path / "token"),
        "JOBLEASE_SIDECAR_ON_LOSS": "none",
    })
    log = (tmp_path / "sidecar.log").open("wb")
    proc = subprocess.Popen(sidecar_argv, env=env, stdout=log,
                            stderr=subprocess.STDOUT)
    try:
        def port() -> int | None:
            assert proc.poll() is None, (tmp_path / "sidecar.log").read_text()
            try:
                return int((tmp_path / "port").read_text())
            except (OSError, ValueError):
                return None
        url = f"http://127.0.0.1:{wait_until(port, 60, 'the sidecar port file')}/metrics"

        def held() -> str | None:
            text = httpx.get(url, timeout=10).text
            held = re.search(r'^joblease_sidecar_state\{state="held"\} 1(\.0)?$', text, re.M)
            return text if held else None
        yield wait_until(held, 60, "the sidecar to hold the job", interval=0.2)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


SUFFIXES = {"counter": ("_total", "_created"), "histogram": ("_bucket", "_count", "_sum"),
            "summary": ("_count", "_sum"), "gauge": ("",)}


def exported_names(text: str) -> set[str]:
    """Series names in an exposition: the samples, and what each declared family
    (HELP/TYPE) exports once it has a child -- a labelled metric nobody has
    touched yet, such as the operator's events by reason, has no sample."""
    names = set()
    for family in text_string_to_metric_families(text):
        names |= {s.name for s in family.samples}
        names |= {family.name + suffix for suffix in SUFFIXES.get(family.type, ("",))}
    return names


def test_rules_and_dashboard_use_only_metrics_that_are_exported(
    rules_file: Path, rendered: list[dict[str, Any]], sidecar_metrics: str,
) -> None:
    exported = exported_names(sidecar_metrics) | exported_names(asyncio.run(_scrape_operator()))
    used_by_rules = {n for e in rule_exprs(rules_file) for n in METRIC.findall(e)}
    used_by_board = {n for e in dashboard_exprs(dashboard(rendered)) for n in METRIC.findall(e)}
    assert used_by_rules and used_by_board
    assert used_by_rules - exported == set(), sorted(exported)
    assert used_by_board - exported == set(), sorted(exported)
