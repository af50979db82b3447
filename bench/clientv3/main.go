// Command clientv3 sends bench/claims.py's raw transactions (the claim: 4 compares,
// 2 puts, 2 gets, bound to one lease granted once; the completion: 2 compares, 1 put,
// 1 delete) through etcd's own Go client, clientv3, so the Python gRPC layer's cost
// per transaction can be read against it on the same etcd (docs/benchmarks.md, issue 29).
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

func main() {
	endpoints := flag.String("endpoints", "127.0.0.1:2379", "etcd endpoints, comma separated")
	cycles := flag.Int("cycles", 3000, "claim+complete cycles (one fresh job each)")
	concurrency := flag.Int("concurrency", 8, "workers")
	flag.Parse()
	cli, err := clientv3.New(clientv3.Config{Endpoints: strings.Split(*endpoints, ","),
		DialTimeout: 5 * time.Second})
	if err != nil {
		fail(err)
	}
	defer cli.Close()
	ctx := context.Background()
	root := fmt.Sprintf("/bench/go-%d", time.Now().UnixNano())
	spec, _ := json.Marshal(map[string]any{"leaseDurationSeconds": 30, "maxAttempts": 3,
		"parameters": map[string]any{}})
	specRev := make([]int64, *cycles)
	for i := range specRev {
		r, err := cli.Put(ctx, fmt.Sprintf("%s/bench/job-%d/spec", root, i), string(spec))
		if err != nil {
			fail(err)
		}
		specRev[i] = r.Header.Revision
	}
	lease, err := cli.Grant(ctx, 30)
	if err != nil {
		fail(err)
	}
	holder, _ := json.Marshal(map[string]any{"owner": "bench-worker",
		"claimId": strings.Repeat("x", 32), "ttl": 30, "claimedAt": float64(time.Now().UnixNano()) / 1e9})
	result, _ := json.Marshal(map[string]any{"owner": "bench-worker",
		"claimId": strings.Repeat("x", 32), "token": 0, "generation": 1,
		"result": map[string]any{"ok": true}, "completedAt": float64(time.Now().UnixNano()) / 1e9})
	var next atomic.Int64
	var wg sync.WaitGroup
	start := time.Now()
	for w := 0; w < *concurrency; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1) - 1)
				if i >= *cycles {
					return
				}
				p := fmt.Sprintf("%s/bench/job-%d/", root, i)
				r, err := cli.Txn(ctx).If(
					clientv3.Compare(clientv3.ModRevision(p+"spec"), "=", specRev[i]),
					clientv3.Compare(clientv3.CreateRevision(p+"holder"), "=", 0),
					clientv3.Compare(clientv3.Version(p+"result"), "=", 0),
					clientv3.Compare(clientv3.Version(p+"claims"), "<", 3),
				).Then(
					clientv3.OpPut(p+"holder", string(holder), clientv3.WithLease(lease.ID)),
					clientv3.OpPut(p+"claims", "{}"), clientv3.OpGet(p+"claims"),
					clientv3.OpGet(p+"checkpoint"),
				).Else(clientv3.OpGet(p+"spec"), clientv3.OpGet(p+"holder"),
					clientv3.OpGet(p+"result"), clientv3.OpGet(p+"claims")).Commit()
				if err != nil || !r.Succeeded {
					fail(fmt.Errorf("claim %d: %v", i, err))
				}
				r2, err := cli.Txn(ctx).If(
					clientv3.Compare(clientv3.CreateRevision(p+"holder"), "=", r.Header.Revision),
					clientv3.Compare(clientv3.Value(p+"holder"), "=", string(holder)),
				).Then(clientv3.OpPut(p+"result", string(result)), clientv3.OpDelete(p+"holder")).
					Else(clientv3.OpGet(p+"holder"), clientv3.OpGet(p+"result")).Commit()
				if err != nil || !r2.Succeeded {
					fail(fmt.Errorf("complete %d: %v", i, err))
				}
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start).Seconds()
	_, _ = cli.Revoke(ctx, lease.ID)
	fmt.Printf("{\"side\": \"clientv3\", \"c\": %d, \"cycles\": %d, \"seconds\": %.3f, \"cycles_per_s\": %.1f}\n",
		*concurrency, *cycles, elapsed, float64(*cycles)/elapsed)
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "clientv3 bench:", err)
	os.Exit(1)
}
