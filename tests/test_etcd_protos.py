"""The generated etcd stubs (``operator/joblease/_etcdpb/``) match the pinned etcd's protos.

``hack/gen-etcd-protos --descriptor-set`` strips the pinned ``go.etcd.io/etcd/api``
module's ``.proto`` files as it does when generating, and protoc compiles them to
a FileDescriptorSet; each committed module's descriptor must equal it. Comparing
descriptors, not generated text, judges the schema (messages, fields, numbers,
services) and not the generator's version banner. The module comes from the Go
module cache (``GOPROXY=file://`` of the cache: no network here), which ``hack/test`` fills when it
builds the pinned etcd; it also says that the stubs and the etcd the tests run are
one version (``ETCD_VERSION`` in hack/versions.env).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from google.protobuf import descriptor_pb2

from joblease._etcdpb import auth_pb2, kv_pb2, rpc_pb2

REPO = Path(__file__).resolve().parents[1]


def _versions() -> dict[str, str]:
    pairs = (line.split("=", 1) for line in (REPO / "hack/versions.env").read_text().splitlines()
             if "=" in line and not line.lstrip().startswith("#"))
    return {k.strip(): v.strip() for k, v in pairs}


def _schema(file: descriptor_pb2.FileDescriptorProto) -> descriptor_pb2.FileDescriptorProto:
    """``file`` without ``json_name``: protoc's descriptor sets carry it, the descriptors
    it embeds in generated Python do not; it names JSON fields, not the wire schema."""
    copy = descriptor_pb2.FileDescriptorProto()
    copy.CopyFrom(file)
    messages = list(copy.message_type)
    while messages:
        message = messages.pop()
        for f in (*message.field, *message.extension):
            f.ClearField("json_name")
        messages.extend(message.nested_type)
    return copy


def test_stubs_name_the_pinned_etcd_version() -> None:
    banner = (REPO / "operator/joblease/_etcdpb/__init__.py").read_text()
    assert f"go.etcd.io/etcd/api/v3 {_versions()['ETCD_VERSION']}" in banner


def test_stub_descriptors_equal_the_pinned_protos(tmp_path: Path) -> None:
    go = shutil.which("go") or ("/usr/local/go/bin/go" if Path("/usr/local/go/bin/go").exists()
                                else None)
    if go is None:
        pytest.fail("no Go toolchain: hack/test needs one to build etcd, and this check too")
    modcache = subprocess.run([go, "env", "GOMODCACHE"], capture_output=True, text=True,
                              check=True).stdout.strip()
    # The module cache as the only proxy, no checksum database: nothing leaves the machine.
    env = {**os.environ, "GOPROXY": f"file://{modcache}/cache/download", "GOSUMDB": "off",
           "GOFLAGS": "-mod=mod", "GOTOOLCHAIN": "local",
           "PATH": f"{Path(sys.executable).parent}:{Path(go).parent}:{os.environ['PATH']}"}
    out = tmp_path / "etcd.pb"
    done = subprocess.run([str(REPO / "hack/gen-etcd-protos"), "--descriptor-set", str(out)],
                          env=env, capture_output=True, text=True, timeout=240, check=False)
    assert done.returncode == 0, (
        "hack/gen-etcd-protos --descriptor-set failed (is the pinned etcd built, so its "
        f"api module is in the Go module cache?):\n{done.stdout}\n{done.stderr}")
    pinned = descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes())
    expected = {f.name: f for f in pinned.file}
    for module in (kv_pb2, auth_pb2, rpc_pb2):
        committed = descriptor_pb2.FileDescriptorProto.FromString(module.DESCRIPTOR.serialized_pb)
        assert committed.name in expected, f"{committed.name} not among {sorted(expected)}"
        assert _schema(committed) == _schema(expected[committed.name]), (
            f"{module.__name__} differs from the pinned etcd's {committed.name}: "
            "run hack/gen-etcd-protos")
