"""The kopf operator: registers JobLeases in etcd and mirrors etcd's truth into ``status``.

One module per concern:

- :mod:`~joblease.operator.status`       etcd state -> CR status (pure; never backwards)
- :mod:`~joblease.operator.registration` CR spec -> etcd registration, removal on delete
- :mod:`~joblease.operator.mirror`       one etcd watch -> status writes, coalesced per job
- :mod:`~joblease.operator.events`       Kubernetes Events derived from consecutive states
- :mod:`~joblease.operator.kube`         the few Kubernetes API calls the mirror makes
- :mod:`~joblease.operator.metrics`      Prometheus metrics, /healthz and /readyz
- :mod:`~joblease.operator.handlers`     thin kopf handlers over the modules above
- :mod:`~joblease.operator.main`         settings and ``run_operator``
- :mod:`~joblease.operator.command`      the ``joblease operator`` click command

etcd is the source of truth; the status is a mirror that may lag but never
moves backwards (it is written only from strictly newer etcd revisions).
"""

from joblease.operator.main import OperatorConfig, run_operator

__all__ = ["OperatorConfig", "run_operator"]
