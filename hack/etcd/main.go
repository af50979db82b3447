// Command etcd is the upstream etcd server, built from etcd's Go modules at
// the version pinned in go.mod, so tests get a recent etcd (kube-apiserver's
// watch cache needs 3.5.13+) without downloading release tarballs.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	etcdmain.Main(os.Args)
}
