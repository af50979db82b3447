//go:build tools

// Package tools pins k8s.io/kubernetes so `go mod tidy` keeps it; the node and
// control-plane binaries are built with `go build k8s.io/kubernetes/cmd/<name>`
// from here (one pinned module, one go.sum, one version stamp).
package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-proxy"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
	_ "k8s.io/kubernetes/cmd/kubelet"
)
