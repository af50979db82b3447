//go:build tools

// Package tools pins k8s.io/kubernetes so `go mod tidy` keeps it; the binary
// is built with `go build k8s.io/kubernetes/cmd/kube-apiserver` from here.
package tools

import _ "k8s.io/kubernetes/cmd/kube-apiserver"
