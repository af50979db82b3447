package etcd_test

import (
	"context"
	"strings"
	"testing"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/joblease/joblease/sidecar-go/internal/etcd"
	"github.com/joblease/joblease/sidecar-go/internal/etcdtest"
)

// WatchChange against a real etcd (etcdtest): a change wakes it, a quiet key
// lets ctx end it, a compacted start revision ends it at once with an error.

func put(t *testing.T, s *etcd.Store, key, value string) int64 {
	r, err := s.Txn(context.Background(), nil, []etcd.Op{etcd.Put(key, []byte(value), 0)}, nil)
	if err != nil {
		t.Fatal(err)
	}
	return r.Revision
}

func TestWatchChange(t *testing.T) {
	ep, _ := etcdtest.Start(t)
	s := etcdtest.NewStore(t, ep)
	rev := put(t, s, "/w/key", "1")

	// Quiet: the context's deadline ends the wait, without an error.
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	changed, err := s.WatchChange(ctx, "/w/key", rev+1)
	cancel()
	if changed || err != nil {
		t.Fatalf("quiet key: changed %v, err %v", changed, err)
	}

	// A change made after the watch started wakes it promptly.
	go func() {
		time.Sleep(200 * time.Millisecond)
		if _, err := s.Txn(context.Background(), nil, []etcd.Op{etcd.Put("/w/key", []byte("2"), 0)}, nil); err != nil {
			t.Errorf("put: %v", err) // not Fatal: this is not the test's goroutine
		}
	}()
	ctx, cancel = context.WithTimeout(context.Background(), 10*time.Second)
	start := time.Now()
	changed, err = s.WatchChange(ctx, "/w/key", rev+1)
	cancel()
	if !changed || err != nil || time.Since(start) > 5*time.Second {
		t.Fatalf("changed %v, err %v after %v", changed, err, time.Since(start))
	}

	// A change made before the watch (but after its start revision) is not missed.
	rev = put(t, s, "/w/key", "3")
	put(t, s, "/w/key", "4")
	ctx, cancel = context.WithTimeout(context.Background(), 10*time.Second)
	changed, err = s.WatchChange(ctx, "/w/key", rev+1)
	cancel()
	if !changed || err != nil {
		t.Fatalf("earlier change: changed %v, err %v", changed, err)
	}

	// Compacted past the start revision: no retry can help; the wait ends now.
	last := put(t, s, "/w/other", "x")
	conn, err := grpc.NewClient("passthrough:///"+ep, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := pb.NewKVClient(conn).Compact(context.Background(), &pb.CompactionRequest{Revision: last, Physical: true}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel = context.WithTimeout(context.Background(), 10*time.Second)
	start = time.Now()
	changed, err = s.WatchChange(ctx, "/w/key", rev+1)
	cancel()
	if changed || err == nil || !strings.Contains(err.Error(), "compacted") || time.Since(start) > 5*time.Second {
		t.Fatalf("compacted: changed %v, err %v after %v", changed, err, time.Since(start))
	}
}
