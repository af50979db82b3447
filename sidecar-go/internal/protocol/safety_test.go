package protocol

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/joblease/joblease/sidecar-go/internal/errs"
	"github.com/joblease/joblease/sidecar-go/internal/etcd"
	"github.com/joblease/joblease/sidecar-go/internal/etcdtest"
)

// The safety conditions of the protocol, each against a real etcd, each
// written to fail when that one condition is taken out of the code (the
// sabotage list of issue 25, item 6). Faults, where a case needs them, are
// injected at the client's gRPC boundary (etcdtest.Faults): etcd applies
// every request; only its answer is lost on the way back.

// claimThenReclaim: a holds the job, its etcd lease goes (as on expiry), b claims.
func claimThenReclaim(t *testing.T, ep string, job JobRef) (a, b *Lease) {
	t.Helper()
	ctx := context.Background()
	admin := newStore(t, ep)
	register(t, admin, job, 2, 0)
	la, err := NewClient(newStore(t, ep), DefaultRoot).Claim(ctx, job, "worker-a")
	if err != nil {
		t.Fatal(err)
	}
	if err := admin.Revoke(ctx, la.Session().LeaseID); err != nil {
		t.Fatal(err)
	}
	lb, err := NewClient(newStore(t, ep), DefaultRoot).Claim(ctx, job, "worker-b")
	if err != nil {
		t.Fatal(err)
	}
	return la, lb
}

// same-condition (docs/protocol.md#same-condition): a checkpoint is written
// only while the holder key still carries this claim, even when the
// checkpoint key is exactly as the writer last saw it.
func TestACheckpointFromAReplacedHolderIsStaleAndStoresNothing(t *testing.T) {
	ep, _ := startEtcd(t)
	ctx := context.Background()
	job := JobRef{"default", "checkpoint-stale"}
	la, lb := claimThenReclaim(t, ep, job)
	_, err := la.Checkpoint(ctx, map[string]any{"step": 1})
	e, ok := err.(*errs.Error)
	if !ok || e.Kind != errs.KindStale || e.CurrentToken() != lb.Token {
		t.Fatalf("checkpoint from the replaced holder: %v (want stale naming token %d)", err, lb.Token)
	}
	if _, kv, _ := newStore(t, ep).Get(ctx, Keys(DefaultRoot, job).Checkpoint()); kv != nil {
		t.Fatalf("a stale checkpoint was stored: %s", kv.Value)
	}
}

// one-completion (docs/protocol.md#one-completion): a completion refused by
// etcd is ours only if the stored result carries our claim id; another
// holder's result is never taken as our own.
func TestACompletionAfterAnotherHolderCompletedIsStaleNotAccepted(t *testing.T) {
	ep, _ := startEtcd(t)
	ctx := context.Background()
	job := JobRef{"default", "complete-other"}
	la, lb := claimThenReclaim(t, ep, job)
	if _, err := lb.Complete(ctx, map[string]any{"by": "b"}); err != nil {
		t.Fatal(err)
	}
	rec, err := la.Complete(ctx, map[string]any{"by": "a"})
	e, ok := err.(*errs.Error)
	if !ok || e.Kind != errs.KindStale || e.CurrentToken() != lb.Token {
		t.Fatalf("completion after b's: got %+v, %v (want stale naming token %d)", rec, err, lb.Token)
	}
	if la.State() == Completed {
		t.Fatal("a's handle says completed")
	}
	_, kv, _ := newStore(t, ep).Get(ctx, Keys(DefaultRoot, job).Result())
	stored, err := DecodeResult(kv.Value, kv.ModRevision)
	if err != nil || stored.ClaimID != lb.ClaimID {
		t.Fatalf("stored result %+v (%v) is not b's", stored, err)
	}
}

// read-back (docs/protocol.md#read-back): a claim whose answer was lost is
// settled by reading back, and a holder without our claim id (another
// worker's) is never adopted: the claim ends as held, naming that holder.
func TestAnAmbiguousClaimNeverAdoptsAnotherWorkersHolder(t *testing.T) {
	ep, _ := startEtcd(t)
	ctx := context.Background()
	job := JobRef{"default", "ambiguous-held"}
	register(t, newStore(t, ep), job, 5, 0)
	lb, err := NewClient(newStore(t, ep), DefaultRoot).Claim(ctx, job, "worker-b")
	if err != nil {
		t.Fatal(err)
	}
	store, faults := etcdtest.NewFaultyStore(t, ep)
	faults.LoseNextAnswers(etcdtest.Txn, 1) // the claim transaction's answer (refused: b holds)
	la, err := NewClient(store, DefaultRoot).Claim(ctx, job, "worker-a")
	if faults.LostAnswers(etcdtest.Txn) != 1 {
		t.Fatalf("the claim's answer was not lost (%d lost): the test did not test the read-back", faults.LostAnswers(etcdtest.Txn))
	}
	if la != nil {
		t.Fatalf("adopted a holder after an ambiguous claim: token %d owner %s (b holds token %d)", la.Token, la.Owner, lb.Token)
	}
	e, ok := err.(*errs.Error)
	if !ok || e.Kind != errs.KindHeld || heldToken(e) != lb.Token {
		t.Fatalf("ambiguous claim while b holds: %v (want held naming token %d)", err, lb.Token)
	}
	if !lb.Valid() {
		t.Fatal("b's claim was disturbed")
	}
}

// read-back, the other way round: a claim that committed but whose answer
// was lost is found by its claim id and used (not claimed twice).
func TestAnAmbiguousClaimThatCommittedIsFoundByItsClaimID(t *testing.T) {
	ep, _ := startEtcd(t)
	ctx := context.Background()
	job := JobRef{"default", "ambiguous-ours"}
	register(t, newStore(t, ep), job, 5, 0)
	store, faults := etcdtest.NewFaultyStore(t, ep)
	faults.LoseNextAnswers(etcdtest.Txn, 1)
	la, err := NewClient(store, DefaultRoot).Claim(ctx, job, "worker-a")
	if err != nil || faults.LostAnswers(etcdtest.Txn) != 1 {
		t.Fatalf("claim: %v (%d answers lost)", err, faults.LostAnswers(etcdtest.Txn))
	}
	_, kv, _ := newStore(t, ep).Get(ctx, Keys(DefaultRoot, job).Holder())
	if kv == nil || kv.CreateRevision != la.Token || la.Generation != 1 {
		t.Fatalf("handle token %d generation %d; holder %+v", la.Token, la.Generation, kv)
	}
}

// heldToken is the holder's token a Held error names.
func heldToken(e *errs.Error) int64 {
	for _, kv := range e.Details {
		if v, ok := kv.Value.(int64); ok && kv.Key == "token" {
			return v
		}
	}
	return 0
}

// renew-checks-holder (docs/protocol.md#renew-checks-holder) without
// spurious loss: a holder re-check that etcd answers late runs beside the
// keep-alives, which go on renewing the lease; the checks still catch a
// deleted holder once etcd answers in time again.
func TestASlowHolderCheckDoesNotStopKeepAlives(t *testing.T) {
	ep, _ := startEtcd(t)
	ctx := context.Background()
	job := JobRef{"default", "slow-check"}
	register(t, newStore(t, ep), job, 3, 0) // deadline 2.4 s after each keep-alive, one every second
	store, faults := etcdtest.NewFaultyStore(t, ep)
	l, err := NewClient(store, DefaultRoot).Claim(ctx, job, "worker-a")
	if err != nil {
		t.Fatal(err)
	}
	faults.Delay(etcdtest.Txn, 5*time.Second) // each check waits out the store's 2 s timeout, twice
	for end := time.Now().Add(5 * time.Second); time.Now().Before(end); time.Sleep(50 * time.Millisecond) {
		if !l.Valid() {
			t.Fatalf("lost while only the holder checks were slow: %s", l.LostReason())
		}
	}
	faults.Delay(etcdtest.Txn, 0)
	if _, err := newStore(t, ep).Txn(ctx, nil, []etcd.Op{etcd.Delete(Keys(DefaultRoot, job).Holder())}, nil); err != nil {
		t.Fatal(err)
	}
	select {
	case <-l.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("a deleted holder went unnoticed after the slow checks")
	}
	if why := l.LostReason(); !strings.Contains(why, "holder key deleted") {
		t.Fatalf("lost for %q", why)
	}
}
