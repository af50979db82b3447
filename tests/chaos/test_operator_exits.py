"""How the chaos runner judges the operator process exiting by itself.

Exit code 3 is the operator's documented answer to losing leadership (its etcd
traffic cut or delayed past the election's safety deadline, docs/operator.md): under
``partition`` and ``delay`` faults it is expected, is counted as a step-down and the
operator is restarted, as Kubernetes would restart the container. Any other exit is a
finding. Real processes (``python -c 'raise SystemExit(n)'``) stand in for the
operator; no etcd or API server is needed to judge an exit code.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from joblease.operator.main import EXIT_LEADERSHIP_LOST
from tests.chaos.runner import ChaosConfig, ChaosRunner


class ExitingOperator:
    """An operator process that exits with ``code``; records restarts."""

    def __init__(self, code: int) -> None:
        self.code, self.restarts = code, 0
        self.proc: subprocess.Popen[bytes] | None = None
        self.start()

    def start(self) -> None:
        self.proc = subprocess.Popen([sys.executable, "-c", f"raise SystemExit({self.code})"])
        self.proc.wait(30)

    def restart(self) -> None:
        self.restarts += 1
        self.start()


@pytest.mark.parametrize(("code", "stepdowns", "findings"), [
    (EXIT_LEADERSHIP_LOST, 1, 0),  # stepped down: expected under faults, restarted
    (1, 0, 1),  # a crash: a finding, restarted too
    (0, 0, 1),  # nothing asked it to stop
])
def test_an_operator_exit_is_a_step_down_only_with_code_3(
        tmp_path: Path, code: int, stepdowns: int, findings: int) -> None:
    runner = ChaosRunner(ChaosConfig(), run_dir=tmp_path)
    (tmp_path / "operator.log").write_text("the operator's last words\n")
    op: Any = ExitingOperator(code)
    runner.operator = op
    runner._check_operator()
    assert op.restarts == 1
    assert runner.operator_stepdowns == stepdowns
    assert len(runner.unexpected) == findings
    if findings:
        assert f"operator exited {code}" in runner.unexpected[0]
