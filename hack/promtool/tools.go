//go:build tools

// Package tools pins github.com/prometheus/prometheus so `go mod tidy` keeps
// it; the binary is built with
// `go build github.com/prometheus/prometheus/cmd/promtool` from here.
package tools

import _ "github.com/prometheus/prometheus/cmd/promtool"
