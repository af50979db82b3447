package protocol

import (
	"context"
	"fmt"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/joblease/joblease/sidecar-go/internal/errs"
	"github.com/joblease/joblease/sidecar-go/internal/etcd"
	"github.com/joblease/joblease/sidecar-go/internal/etcdtest"
)

// These tests run the protocol against a real etcd (etcdtest: the pinned
// build, on free loopback ports). Nothing is mocked.

func startEtcd(t *testing.T) (string, *os.Process) { return etcdtest.Start(t) }

func newStore(t *testing.T, ep string) *etcd.Store { return etcdtest.NewStore(t, ep) }

func register(t *testing.T, s *etcd.Store, job JobRef, ttl, max int64) {
	value, err := EncodeSpec(Spec{LeaseDurationSeconds: ttl, MaxAttempts: max})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Txn(context.Background(), nil, []etcd.Op{etcd.Put(Keys(DefaultRoot, job).Spec(), value, 0)}, nil); err != nil {
		t.Fatal(err)
	}
}

func TestClaimCompleteAndAStaleCompletionIsRefusedAfterReclaim(t *testing.T) {
	ep, _ := startEtcd(t)
	ctx := context.Background()
	job := JobRef{"default", "seed"}
	admin := newStore(t, ep)
	register(t, admin, job, 2, 3)

	a := NewClient(newStore(t, ep), DefaultRoot)
	la, err := a.Claim(ctx, job, "worker-a")
	if err != nil {
		t.Fatal(err)
	}
	if la.Generation != 1 || la.Token <= 0 {
		t.Fatalf("token %d generation %d", la.Token, la.Generation)
	}
	// A second claimer is told who holds the job, with which token.
	b := NewClient(newStore(t, ep), DefaultRoot)
	if _, err := b.Claim(ctx, job, "worker-b"); !errs.Is(err, errs.KindHeld) || !strings.Contains(err.Error(), fmt.Sprintf("token %d", la.Token)) {
		t.Fatalf("second claim: %v", err)
	}
	// A's etcd lease goes (as on expiry): B claims with a later token.
	if err := admin.Revoke(ctx, la.Session().LeaseID); err != nil {
		t.Fatal(err)
	}
	lb, err := b.Claim(ctx, job, "worker-b")
	if err != nil {
		t.Fatal(err)
	}
	if lb.Token <= la.Token || lb.Generation != 2 {
		t.Fatalf("reclaim: token %d (was %d), generation %d", lb.Token, la.Token, lb.Generation)
	}
	// A's completion is refused by etcd itself, naming B's token; nothing is stored.
	_, err = la.Complete(ctx, map[string]any{"by": "a"})
	e, ok := err.(*errs.Error)
	if !ok || e.Kind != errs.KindStale || e.CurrentToken() != lb.Token || e.ExitCode != 7 {
		t.Fatalf("stale completion: %v", err)
	}
	if _, kv, _ := admin.Get(ctx, Keys(DefaultRoot, job).Result()); kv != nil {
		t.Fatalf("a stale completion stored %s", kv.Value)
	}
	// B completes; its record decodes as Python's ResultRecord; the job is done for everyone.
	rec, err := lb.Complete(ctx, map[string]any{"by": "b"})
	if err != nil {
		t.Fatal(err)
	}
	_, kv, _ := admin.Get(ctx, Keys(DefaultRoot, job).Result())
	stored, err := DecodeResult(kv.Value, kv.ModRevision)
	if err != nil || stored.Token != lb.Token || stored.ClaimID != rec.ClaimID || stored.Revision != rec.Revision {
		t.Fatalf("stored result %+v (%v), returned %+v", stored, err, rec)
	}
	if _, err := NewClient(newStore(t, ep), DefaultRoot).Claim(ctx, job, "worker-c"); !errs.Is(err, errs.KindCompleted) {
		t.Fatalf("claim after completion: %v", err)
	}
}

func TestAPausedEtcdLosesTheLeaseLocallyAndLossIsFinal(t *testing.T) {
	ep, proc := startEtcd(t)
	ctx := context.Background()
	job := JobRef{"default", "paused"}
	register(t, newStore(t, ep), job, 2, 0)
	c := NewClient(newStore(t, ep), DefaultRoot)
	l, err := c.Claim(ctx, job, "worker-a")
	if err != nil {
		t.Fatal(err)
	}
	if !l.Valid() {
		t.Fatal("not valid right after the claim")
	}
	// No keep-alive can succeed while etcd is stopped: the local deadline
	// (TTL 2 s minus a 0.4 s margin, from the last send) must pass by itself.
	if err := proc.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	select {
	case <-l.Session().Lost():
	case <-time.After(10 * time.Second):
		t.Fatal("still valid 10 s into an etcd pause with TTL 2 s")
	}
	if took := time.Since(start); took > 5*time.Second { // generous: a loaded machine wakes timers late
		t.Fatalf("lost only after %v; the deadline is at most 1.6 s after the last keep-alive was sent", took)
	}
	if l.Valid() || l.State() != LostState || l.Remaining() != 0 {
		t.Fatalf("valid %v state %v remaining %v after loss", l.Valid(), l.State(), l.Remaining())
	}
	// etcd comes back (its lease may even still live): the handle stays lost.
	if err := proc.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	time.Sleep(1500 * time.Millisecond) // several keep-alive periods: anything that could revive it has had its chance
	if l.Valid() || !strings.Contains(l.LostReason(), "safety deadline") {
		t.Fatalf("revived after etcd resumed: valid %v, reason %q", l.Valid(), l.LostReason())
	}
}
