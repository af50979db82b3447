//go:build tools

// Package tools pins helm.sh/helm/v3 so `go mod tidy` keeps it; the binary
// is built with `go build helm.sh/helm/v3/cmd/helm` from here.
package tools

import _ "helm.sh/helm/v3/cmd/helm"
