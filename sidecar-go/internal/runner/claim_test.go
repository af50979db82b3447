package runner

import (
	"context"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/joblease/joblease/sidecar-go/internal/config"
	"github.com/joblease/joblease/sidecar-go/internal/etcd"
	"github.com/joblease/joblease/sidecar-go/internal/etcdtest"
	"github.com/joblease/joblease/sidecar-go/internal/protocol"
)

// These tests run the claim loop against a real etcd (etcdtest: the pinned
// build on loopback); the holder is a second protocol client. Nothing is faked.

func registerJob(t *testing.T, s *etcd.Store, job protocol.JobRef, ttl int64) {
	value, err := protocol.EncodeSpec(protocol.Spec{LeaseDurationSeconds: ttl})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Txn(context.Background(), nil, []etcd.Op{etcd.Put(protocol.Keys(protocol.DefaultRoot, job).Spec(), value, 0)}, nil); err != nil {
		t.Fatal(err)
	}
}

type claimed struct {
	lease *protocol.Lease
	code  int
	at    time.Time
}

// waiter starts a sidecar runner claiming job while holder has it and returns
// once it has been refused twice: from the second refusal on its backoff
// (initial 0.2 s, multiplier 100, max 30 s) is 15-30 s, so only a wake on the
// holder's change can make it claim within a second of the holder going.
func waiter(t *testing.T, ep string, job protocol.JobRef) (*Runner, chan claimed) {
	cfg := config.Config{Job: job, Owner: "worker-b", Backoff: config.Backoff{Initial: 0.2, Maximum: 30, Multiplier: 100}}
	r := New(cfg, protocol.NewClient(etcdtest.NewStore(t, ep), protocol.DefaultRoot), slog.New(slog.NewTextHandler(io.Discard, nil)))
	t.Cleanup(func() { r.RequestStop(""); r.cancel() })
	done := make(chan claimed, 1)
	go func() {
		l, code := r.claim()
		done <- claimed{l, code, time.Now()}
	}()
	deadline := time.Now().Add(20 * time.Second)
	for r.Metrics.Value(r.Metrics.ClaimAttempts) < 2 {
		select {
		case c := <-done:
			t.Fatalf("claim ended while the job was held: lease %v, code %d", c.lease, c.code)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatal("the waiter was not refused twice within 20 s")
		}
		time.Sleep(20 * time.Millisecond)
	}
	time.Sleep(300 * time.Millisecond) // now inside the long wait (still correct if not: the watch starts at the refusal's revision)
	return r, done
}

func await(t *testing.T, done chan claimed, within time.Duration) claimed {
	select {
	case c := <-done:
		return c
	case <-time.After(within):
		t.Fatalf("nothing within %v of the holder going (a backoff-only wait is 15-30 s here)", within)
	}
	return claimed{}
}

func TestAWaiterClaimsAsSoonAsTheHolderGoes(t *testing.T) {
	ep, _ := etcdtest.Start(t)
	admin := etcdtest.NewStore(t, ep)
	for _, how := range []string{"released", "expired"} {
		t.Run(how, func(t *testing.T) {
			ctx := context.Background()
			job := protocol.JobRef{Namespace: "default", Name: "wake-" + how}
			registerJob(t, admin, job, 3)
			holder, err := protocol.NewClient(etcdtest.NewStore(t, ep), protocol.DefaultRoot).Claim(ctx, job, "worker-a")
			if err != nil {
				t.Fatal(err)
			}
			_, done := waiter(t, ep, job)
			gone := time.Now()
			if how == "released" {
				err = holder.Release(ctx)
			} else { // etcd drops the holder's lease, as when its TTL runs out
				err = admin.Revoke(ctx, holder.Session().LeaseID)
			}
			if err != nil {
				t.Fatal(err)
			}
			// 1 s: the wake itself is milliseconds, plus a jitter of at most 0.1 s;
			// the rest is room for a loaded machine.
			c := await(t, done, 1500*time.Millisecond)
			if c.lease == nil {
				t.Fatalf("no lease after the holder %s: exit code %d", how, c.code)
			}
			if c.lease.Token <= holder.Token || c.lease.Generation != 2 {
				t.Fatalf("token %d (holder had %d), generation %d", c.lease.Token, holder.Token, c.lease.Generation)
			}
			t.Logf("claimed %v after the holder %s", c.at.Sub(gone), how)
		})
	}
}

func TestAStopInterruptsTheWaitForTheHolder(t *testing.T) {
	ep, _ := etcdtest.Start(t)
	ctx := context.Background()
	job := protocol.JobRef{Namespace: "default", Name: "wake-stop"}
	registerJob(t, etcdtest.NewStore(t, ep), job, 3)
	if _, err := protocol.NewClient(etcdtest.NewStore(t, ep), protocol.DefaultRoot).Claim(ctx, job, "worker-a"); err != nil {
		t.Fatal(err)
	}
	r, done := waiter(t, ep, job)
	r.RequestStop("SIGTERM")
	if c := await(t, done, 1500*time.Millisecond); c.lease != nil || c.code != 0 {
		t.Fatalf("a stopped waiter returned lease %v, code %d", c.lease, c.code)
	}
}
