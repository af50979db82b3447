"""``joblease checkpoint`` and ``get`` showing it, as real processes against a real etcd."""

from __future__ import annotations

from joblease import EtcdConfig
from tests.support.cli import LONG_TTL, as_json, jl
from tests.support.etcd_keys import gateway_snapshot, writes


def test_checkpoint_is_stored_shown_and_refused_when_stale_or_bad(
    etcd_config: EtcdConfig,
) -> None:
    jl(etcd_config, "register", "ckpt", "--ttl", LONG_TTL, "--max-attempts", "0")
    claimed = as_json(jl(etcd_config, "claim", "ckpt", "--owner", "w1", "-o", "json"))
    token = claimed["token"]
    done = as_json(jl(etcd_config, "checkpoint", "ckpt", "--owner", "w1", "--token", str(token),
                      "--data", '{"offset": 7}', "-o", "json"))
    assert done["data"] == {"offset": 7} and done["token"] == token
    assert done["generation"] == claimed["generation"]

    state = as_json(jl(etcd_config, "get", "ckpt", "-o", "json"))
    assert state["checkpoint"]["data"] == {"offset": 7}
    assert state["checkpoint"]["token"] == token
    table = jl(etcd_config, "get", "ckpt").stdout
    assert 'checkpoint (generation 1' in table and '{"offset": 7}' in table

    endpoint = etcd_config.endpoints[0]
    prefix = f"{etcd_config.root}/default/ckpt/"
    before = gateway_snapshot(endpoint, prefix)
    stale = jl(etcd_config, "checkpoint", "ckpt", "--owner", "w1", "--token", str(token + 999),
               "--data", "1", check=7)
    assert stale.stderr.startswith("joblease: stale"), stale.stderr
    bad = jl(etcd_config, "checkpoint", "ckpt", "--owner", "w1", "--token", str(token),
             "--data", "{not json", check=2)
    assert bad.stderr.startswith("joblease: invalid"), bad.stderr
    big = jl(etcd_config, "checkpoint", "ckpt", "--owner", "w1", "--token", str(token),
             "--data", '"' + "x" * 70_000 + '"', check=2)
    assert "too large" in big.stderr
    assert writes(before, gateway_snapshot(endpoint, prefix)) == []

    jl(etcd_config, "complete", "ckpt", "--owner", "w1", "--token", str(token))
    kept = as_json(jl(etcd_config, "get", "ckpt", "-o", "json"))
    assert kept["phase"] == "Completed" and kept["checkpoint"]["data"] == {"offset": 7}
