package session

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/joblease/joblease/sidecar-go/internal/etcdtest"
)

// The session against a real etcd (etcdtest). Where a case needs etcd to be
// slow or silent, etcdtest.Faults delays or withholds etcd's real answers at
// the client's gRPC boundary; every request still reaches etcd.

// conservative-deadline (docs/protocol.md#conservative-deadline): the
// deadline counts from when the keep-alive was *sent*, so an answer delayed
// by D leaves at most TTL - margin - D of local safety, never more.
func TestDelayedKeepAliveAnswersShortenTheDeadlineNeverLengthenIt(t *testing.T) {
	ep, _ := etcdtest.Start(t)
	store, faults := etcdtest.NewFaultyStore(t, ep)
	const ttl, delay = 6, time.Second
	faults.Delay(etcdtest.LeaseGrant, delay)
	faults.Delay(etcdtest.KeepAlive, delay)
	s, err := Start(context.Background(), store, ttl)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close(context.Background(), true)
	bound := ttl*time.Second - DefaultMargin(ttl) - delay // what an answer D late can leave at most
	// Watch until a keep-alive has renewed the session (the remaining time
	// jumps up), noting the most local safety it ever claimed.
	var most, last time.Duration
	renewed := false
	for end := time.Now().Add(3 * ttl * time.Second); time.Now().Before(end) && !renewed; time.Sleep(10 * time.Millisecond) {
		r := s.Remaining()
		if r == 0 {
			t.Fatalf("lost: %s", s.LostReason())
		}
		renewed = last != 0 && r > last+delay/2
		last, most = r, max(most, r)
	}
	if !renewed {
		t.Fatal("no keep-alive renewed the session")
	}
	if most > bound+50*time.Millisecond {
		t.Fatalf("%v of local safety after answers %v late: more than TTL - margin - delay = %v (counted from the answer, not the send)",
			most, delay, bound)
	}
}

// A keep-alive answered with TTL 0 (etcd no longer knows the lease: it
// expired or was revoked) ends the session at that answer, not at the local
// deadline.
func TestAKeepAliveAnsweredWithTTLZeroEndsTheSessionAtOnce(t *testing.T) {
	ep, _ := etcdtest.Start(t)
	const ttl = 10 // deadline 8 s away; the next keep-alive is due within 3.3 s
	s, err := Start(context.Background(), etcdtest.NewStore(t, ep), ttl)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close(context.Background(), false)
	if err := etcdtest.NewStore(t, ep).Revoke(context.Background(), s.LeaseID); err != nil {
		t.Fatal(err)
	}
	select {
	case <-s.Lost():
	case <-time.After(7 * time.Second):
		t.Fatalf("still alive 7 s after its lease was revoked (remaining %v)", s.Remaining())
	}
	if why := s.LostReason(); !strings.Contains(why, "etcd reports the lease expired") {
		t.Fatalf("lost for %q, not for etcd's TTL 0", why)
	}
}

// A keep-alive stream whose open hangs (a connection that accepts and never
// answers) ends in a loss at the safety deadline, said as such, not later.
func TestAHangingKeepAliveStreamOpenIsALossAtTheSafetyDeadline(t *testing.T) {
	ep, _ := etcdtest.Start(t)
	store, faults := etcdtest.NewFaultyStore(t, ep)
	faults.HangOpen(etcdtest.KeepAlive, true)
	const ttl = 3
	sent := time.Now()
	s, err := Start(context.Background(), store, ttl)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close(context.Background(), true)
	deadline := sent.Add(ttl*time.Second - DefaultMargin(ttl))
	select {
	case <-s.Lost():
	case <-time.After(time.Until(deadline) + 2*time.Second):
		t.Fatalf("not lost 2 s after the safety deadline with the keep-alive stream never open")
	}
	if late := time.Since(deadline); late > time.Second {
		t.Fatalf("lost %v after the safety deadline", late)
	}
	if why := s.LostReason(); !strings.Contains(why, "safety deadline") {
		t.Fatalf("lost for %q", why)
	}
}

// OnLoss's unregister: an unregistered callback is not run at the loss, the
// others still are; registering on a lost session runs the callback at once.
func TestAnUnregisteredLossCallbackIsNotRunAndTheOthersAre(t *testing.T) {
	ep, _ := etcdtest.Start(t)
	s, err := Start(context.Background(), etcdtest.NewStore(t, ep), 10)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close(context.Background(), true)
	ran := map[string]bool{}
	var unregister []func()
	for _, name := range []string{"a", "b", "c"} {
		unregister = append(unregister, s.OnLoss(func(string) { ran[name] = true }))
	}
	unregister[1]()
	unregister[1]() // twice is fine
	if n := s.Listening(); n != 2 {
		t.Fatalf("%d callbacks registered, want 2", n)
	}
	s.Lose("test", true)
	if !ran["a"] || ran["b"] || !ran["c"] {
		t.Fatalf("ran %v, want a and c", ran)
	}
	late := false
	s.OnLoss(func(string) { late = true })()
	if !late || s.Listening() != 0 {
		t.Fatalf("a callback registered after the loss: ran %v, %d registered", late, s.Listening())
	}
}
