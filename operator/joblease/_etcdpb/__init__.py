"""Generated etcd v3 gRPC stubs (go.etcd.io/etcd/api/v3 v3.6.16); do not edit.

Regenerate with hack/gen-etcd-protos.
"""
