//go:build tools

// Package tools pins github.com/containerd/containerd/v2 so `go mod tidy`
// keeps it; containerd, containerd-shim-runc-v2 and ctr are built with
// `go build github.com/containerd/containerd/v2/cmd/<name>` from here.
package tools

import (
	_ "github.com/containerd/containerd/v2/cmd/containerd"
	_ "github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2"
	_ "github.com/containerd/containerd/v2/cmd/ctr"
)
