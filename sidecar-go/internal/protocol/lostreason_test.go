package protocol

import (
	"context"
	"strings"
	"testing"
)

// A lease's LostReason is the session's loss from the moment the session is
// lost, also before the session's callback has reached this lease: Lose
// closes Lost() first and runs the callbacks after it, and a runner woken by
// Lost() asks LostReason at once. Reading it in that window once said "no
// keep-alive succeeded before the safety deadline" for a keep-alive etcd had
// refused for revoked credentials (tests/security/test_sidecar_security.py,
// the revoked-credentials case, failed on it).
func TestALeasesLostReasonIsTheSessionsBeforeItsCallbackRuns(t *testing.T) {
	ep, _ := startEtcd(t)
	ctx := context.Background()
	admin := newStore(t, ep)
	first, second := JobRef{"default", "lost-reason-1"}, JobRef{"default", "lost-reason-2"}
	register(t, admin, first, 30, 0)
	register(t, admin, second, 30, 0)
	c := NewClient(newStore(t, ep), DefaultRoot)
	l1, err := c.Claim(ctx, first, "worker")
	if err != nil {
		t.Fatal(err)
	}
	s := l1.Session()
	var l2 *Lease
	var seen string
	// registered before l2's own callback, so it runs while l2 has not heard of the loss
	s.OnLoss(func(string) { seen = l2.LostReason() })
	if l2, err = c.Claim(ctx, second, "worker"); err != nil {
		t.Fatal(err)
	}
	if l2.Session() != s {
		t.Fatal("the second claim is on another session; the test needs one")
	}
	s.Lose("keep-alive refused: etcd refused the credentials: authentication failed", false)
	if !strings.Contains(seen, "authentication failed") {
		t.Fatalf("LostReason before the lease's callback: %q, want the session's reason", seen)
	}
	if got := l2.LostReason(); got != "etcd lease lost: keep-alive refused: etcd refused the credentials: authentication failed" {
		t.Fatalf("LostReason after the callback: %q", got)
	}
}
