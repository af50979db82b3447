// Command coredns is upstream CoreDNS, built from its Go module at the version
// pinned in go.mod (and COREDNS_VERSION in hack/versions.env), with the plugin
// set upstream registers in core/plugin/zplugin.go. It is the main of
// coredns.go in the CoreDNS repository, so the cluster's DNS image needs no
// release download.
package main

import (
	_ "github.com/coredns/coredns/core/plugin" // registers the upstream plugin list
	"github.com/coredns/coredns/coremain"
)

func main() {
	coremain.Run()
}
