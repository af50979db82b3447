package protocol

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"

	"github.com/joblease/joblease/sidecar-go/internal/errs"
	"github.com/joblease/joblease/sidecar-go/internal/etcd"
	"github.com/joblease/joblease/sidecar-go/internal/etcdtest"
)

// The completion fused with the next claim (fused.go) against a real etcd:
// its effects are the two-step path's, a lost race for the next item still
// completes the held one, a lost answer is read back truthfully, and a queue
// that keeps a history takes the two-step path.

// itemState is what an item left in etcd, without revisions and wall clocks:
// its keys (relative to the queue), its generation and its result's owner and generation.
func itemState(t *testing.T, s *etcd.Store, q QueueRef) map[string]string {
	t.Helper()
	keys := QueueKeysOf(DefaultRoot, q)
	_, kvs, err := s.GetPrefix(context.Background(), keys.Prefix)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, kv := range kvs {
		rel := strings.TrimPrefix(string(kv.Key), keys.Prefix)
		switch {
		case strings.HasPrefix(rel, "claims/"):
			out[rel] = fmt.Sprintf("version %d", kv.Version)
		case strings.HasPrefix(rel, "results/"):
			rec, err := DecodeResult(kv.Value, kv.ModRevision)
			if err != nil {
				t.Fatal(err)
			}
			out[rel] = fmt.Sprintf("owner %s generation %d result %v", rec.Owner, rec.Generation, rec.Result)
		case rel == "spec":
		default:
			out[rel] = "present"
		}
	}
	return out
}

// drainQueue claims and completes until nothing is claimable, at most limit
// items (a broken completion that leaves items claimable fails, not hangs).
func drainQueue(t *testing.T, ep string, q QueueRef, fused bool, limit int) []int64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c := NewClient(newStore(t, ep), DefaultRoot)
	var tokens []int64
	l, _, err := c.ClaimNext(ctx, q, "worker")
	for l != nil && err == nil {
		if len(tokens) == limit {
			t.Fatalf("fused %t: still claiming after %d items", fused, limit)
		}
		tokens = append(tokens, l.Token)
		var next *Lease
		if fused {
			_, next, err = c.CompleteAndClaimNext(ctx, l, map[string]any{"id": l.Item.ID})
		} else {
			_, err = l.Complete(ctx, map[string]any{"id": l.Item.ID})
		}
		if err != nil {
			t.Fatal(err)
		}
		if next == nil {
			next, _, err = c.ClaimNext(ctx, q, "worker")
		}
		l = next
	}
	if err != nil {
		t.Fatal(err)
	}
	return tokens
}

func TestTheFusedPathLeavesWhatTheTwoStepPathLeaves(t *testing.T) {
	ep, _ := startEtcd(t)
	admin := newStore(t, ep)
	producer := NewClient(newStore(t, ep), DefaultRoot)
	states := map[bool]map[string]string{}
	for _, fused := range []bool{false, true} {
		q := QueueRef{"default", fmt.Sprintf("fused-%t", fused)}
		createQueue(t, admin, q, QueueSpec{LeaseDurationSeconds: 30, MaxAttempts: 3})
		var ids []string
		for i := range ReadAhead + 5 { // two pools: a fused completion empties the first
			ids = append(ids, fmt.Sprintf("i%02d", i))
		}
		enqueue(t, producer, q, ids...)
		tokens := drainQueue(t, ep, q, fused, len(ids))
		if len(tokens) != len(ids) || !sort.SliceIsSorted(tokens, func(i, j int) bool { return tokens[i] < tokens[j] }) {
			t.Fatalf("fused %t: tokens %v for %d items", fused, tokens, len(ids))
		}
		states[fused] = itemState(t, admin, q)
		results := 0
		for key := range states[fused] {
			results += map[bool]int{true: 1}[strings.HasPrefix(key, "results/")]
			if strings.HasPrefix(key, "pending/") || strings.HasPrefix(key, "held/") || strings.HasPrefix(key, "failed/") {
				t.Fatalf("fused %t: %s left", fused, key)
			}
		}
		if results != len(ids) {
			t.Fatalf("fused %t: %d results for %d items", fused, results, len(ids))
		}
	}
	if fmt.Sprint(states[true]) != fmt.Sprint(states[false]) {
		t.Fatalf("fused:\n%v\ntwo-step:\n%v", states[true], states[false])
	}
}

// One fused completion, with the next candidate taken or left to the claim.
func fusedSetup(t *testing.T, ep string, q QueueRef, spec QueueSpec, c *Client) *Lease {
	t.Helper()
	createQueue(t, newStore(t, ep), q, spec)
	enqueue(t, NewClient(newStore(t, ep), DefaultRoot), q, "a", "b")
	l, _, err := c.ClaimNext(context.Background(), q, "worker")
	if err != nil || l == nil {
		t.Fatalf("claim: %v", err)
	}
	return l
}

func other(l *Lease) string {
	if l.Item.ID == "a" {
		return "b"
	}
	return "a"
}

func TestAFusedCompletionClaimsTheNextItemWithTheCommitRevisionAsItsToken(t *testing.T) {
	ep, _ := startEtcd(t)
	admin := newStore(t, ep)
	q := QueueRef{"default", "next"}
	c := NewClient(newStore(t, ep), DefaultRoot)
	l := fusedSetup(t, ep, q, QueueSpec{LeaseDurationSeconds: 30, MaxAttempts: 3}, c)
	rec, next, err := c.CompleteAndClaimNext(context.Background(), l, 7)
	if err != nil || next == nil {
		t.Fatalf("fused: %v, next %v", err, next)
	}
	keys := QueueKeysOf(DefaultRoot, q)
	res := getKV(t, admin, keys.Item(l.Item.ID).Result())
	holder := getKV(t, admin, keys.Item(next.Item.ID).Holder())
	if res == nil || holder == nil || holder.ModRevision != res.ModRevision || next.Token != holder.CreateRevision ||
		next.Generation != 1 || rec.Token != l.Token || next.Item.ID != other(l) {
		t.Fatalf("result %+v holder %+v next %+v", res, holder, next)
	}
	if p, ok := next.Payload.(map[string]any); !ok || p["id"] != next.Item.ID {
		t.Fatalf("payload %#v", next.Payload)
	}
	if _, err := next.Complete(context.Background(), 8); err != nil {
		t.Fatal(err)
	}
}

func TestALostRaceForTheNextItemStillCompletesTheHeldOne(t *testing.T) {
	ep, _ := startEtcd(t)
	admin := newStore(t, ep)
	q := QueueRef{"default", "race"}
	c := NewClient(newStore(t, ep), DefaultRoot)
	l := fusedSetup(t, ep, q, QueueSpec{LeaseDurationSeconds: 30, MaxAttempts: 3}, c)
	rival, err := NewClient(newStore(t, ep), DefaultRoot).ClaimItem(context.Background(), ItemRef{q, other(l)}, "rival")
	if err != nil {
		t.Fatal(err)
	}
	rec, next, err := c.CompleteAndClaimNext(context.Background(), l, 7)
	if err != nil || next != nil || rec.Token != l.Token {
		t.Fatalf("fused: %+v, next %v, %v", rec, next, err)
	}
	keys := QueueKeysOf(DefaultRoot, q)
	if getKV(t, admin, keys.Item(l.Item.ID).Result()) == nil || getKV(t, admin, keys.Item(l.Item.ID).Pending()) != nil {
		t.Fatal("the held item is not completed")
	}
	if h := getKV(t, admin, keys.Item(other(l)).Holder()); h == nil || h.CreateRevision != rival.Token {
		t.Fatalf("the rival's claim was touched: %+v", h)
	}
}

func TestAFusedCompletionWhoseAnswerWasLostIsReadBackWithItsClaim(t *testing.T) {
	_, admin, q, c, faults, l := faultyFused(t, "lost", 30)
	faults.LoseNextAnswers(etcdtest.Txn, 1)
	rec, next, err := c.CompleteAndClaimNext(context.Background(), l, 7)
	if err != nil || faults.LostAnswers(etcdtest.Txn) != 1 {
		t.Fatalf("fused: %v (%d answers lost)", err, faults.LostAnswers(etcdtest.Txn))
	}
	keys := QueueKeysOf(DefaultRoot, q)
	res := getKV(t, admin, keys.Item(l.Item.ID).Result())
	if res == nil || rec.ClaimID != l.ClaimID || next == nil {
		t.Fatalf("result %+v rec %+v next %v", res, rec, next)
	}
	holder := getKV(t, admin, keys.Item(next.Item.ID).Holder())
	if holder == nil || holder.CreateRevision != next.Token || next.Token != res.ModRevision || next.Generation != 1 {
		t.Fatalf("next %+v holder %+v result rev %d", next, holder, res.ModRevision)
	}
	if p, ok := next.Payload.(map[string]any); !ok || p["id"] != next.Item.ID {
		t.Fatalf("payload after read-back %#v", next.Payload)
	}
	if _, err := next.Complete(context.Background(), 8); err != nil {
		t.Fatal(err)
	}
}

// The answer lost and the next item taken by another claimer meanwhile: the
// read-back says completed, with no next item (not the rival's holder).
func TestAReadBackNeverAdoptsAnotherClaimersHolderOfTheNextItem(t *testing.T) {
	ep, _, q, c, faults, l := faultyFused(t, "lost-race", 30)
	if _, err := NewClient(newStore(t, ep), DefaultRoot).ClaimItem(context.Background(), ItemRef{q, other(l)}, "rival"); err != nil {
		t.Fatal(err)
	}
	faults.LoseNextAnswers(etcdtest.Txn, 1)
	rec, next, err := c.CompleteAndClaimNext(context.Background(), l, 7)
	if err != nil || next != nil || rec.ClaimID != l.ClaimID || faults.LostAnswers(etcdtest.Txn) != 1 {
		t.Fatalf("fused: %+v next %v, %v", rec, next, err)
	}
}

func TestAQueueWithAHistoryCompletesWithoutAFusedClaim(t *testing.T) {
	ep, _ := startEtcd(t)
	q := QueueRef{"default", "history"}
	c := NewClient(newStore(t, ep), DefaultRoot)
	l := fusedSetup(t, ep, q, QueueSpec{LeaseDurationSeconds: 30, MaxAttempts: 3, HistoryLimit: 2}, c)
	if _, next, err := c.CompleteAndClaimNext(context.Background(), l, 7); err != nil || next != nil {
		t.Fatalf("fused on a history queue: next %v, %v", next, err)
	}
	if l.State() != Completed {
		t.Fatalf("state %v", l.State())
	}
}

// isFused: the fused transaction (a nested transaction in its success branch).
func isFused(req any) bool {
	txn, ok := req.(*pb.TxnRequest)
	if !ok {
		return false
	}
	for _, op := range txn.Success {
		if op.GetRequestTxn() != nil {
			return true
		}
	}
	return false
}

// isReadOnly: a transaction without compares that only reads (a read-back).
func isReadOnly(req any) bool {
	txn, ok := req.(*pb.TxnRequest)
	if !ok || len(txn.Compare) > 0 {
		return false
	}
	for _, op := range append(append([]*pb.RequestOp{}, txn.Success...), txn.Failure...) {
		if op.GetRequestRange() == nil {
			return false
		}
	}
	return true
}

// assertSessionRevoked: etcd no longer knows the session's lease, and no
// holder of the queue is left (neither the held item's nor the next's).
func assertSessionRevoked(t *testing.T, ep string, admin *etcd.Store, q QueueRef, leaseID int64) {
	t.Helper()
	if _, remaining := leaseTTL(t, ep, leaseID); remaining != -1 {
		t.Fatalf("the session's lease %x still lives (%d s left)", leaseID, remaining)
	}
	_, held, err := admin.GetPrefix(context.Background(), QueueKeysOf(DefaultRoot, q).FieldPrefix("held"))
	if err != nil || len(held) != 0 {
		t.Fatalf("holders left: %v (%v)", held, err)
	}
}

// The fused transaction commits, its answer is lost and etcd cannot be read
// back (for the client's ReadBackTimeout): the claim sent with it may have
// committed (it has), so the session's lease is revoked before "outcome
// unknown" is answered, and answered once that timeout is spent, not the default's.
func TestAFusedCompletionWhoseReadBackFailsRevokesTheSession(t *testing.T) {
	ep, admin, q, c, faults, l := faultyFused(t, "readback-fails", 60)
	faults.LoseNextAnswers(etcdtest.Txn, 1)
	faults.DropRequests(etcdtest.Txn, isReadOnly)
	start := time.Now()
	_, next, err := c.CompleteAndClaimNext(context.Background(), l, 7)
	took := time.Since(start)
	faults.DropRequests(etcdtest.Txn, nil)
	if took < fusedReadBack || took > DefaultReadBackTimeout/2 {
		t.Fatalf("outcome unknown after %v: the client's read-back timeout is %v", took, fusedReadBack)
	}
	if !errs.Is(err, errs.KindOutcomeUnknown) || next != nil || !strings.Contains(err.Error(), "revoked (confirmed: true)") {
		t.Fatalf("fused with no read-back: next %v, %v", next, err)
	}
	if getKV(t, admin, QueueKeysOf(DefaultRoot, q).Item(l.Item.ID).Result()) == nil {
		t.Fatal("the fused transaction did not commit: the test lost the wrong answer")
	}
	assertSessionRevoked(t, ep, admin, q, l.session.LeaseID)
}

// Every copy is lost on its way (one may still be in flight and commit):
// after three read-backs that find the held item still ours, the session's
// lease is revoked before "outcome unknown" is answered.
func TestThreeFusedCopiesThatFindTheItemStillOursRevokeTheSession(t *testing.T) {
	ep, admin, q, c, faults, l := faultyFused(t, "three-copies", 60)
	var dropped atomic.Int64
	faults.DropRequests(etcdtest.Txn, func(req any) bool {
		if isFused(req) {
			dropped.Add(1)
			return true
		}
		return false
	})
	_, next, err := c.CompleteAndClaimNext(context.Background(), l, 7)
	faults.DropRequests(etcdtest.Txn, nil)
	if !errs.Is(err, errs.KindOutcomeUnknown) || next != nil || dropped.Load() != 3 ||
		!strings.Contains(err.Error(), "revoked (confirmed: true)") {
		t.Fatalf("three copies lost: next %v, %d dropped, %v", next, dropped.Load(), err)
	}
	assertSessionRevoked(t, ep, admin, q, l.session.LeaseID)
}

// fusedReadBack is faultyFused's client's read-back timeout.
const fusedReadBack = 2 * time.Second

// faultyFused: a fresh etcd, a plain store of it, and a client of it behind
// etcdtest.Faults holding the first of queue name's two items (fusedSetup,
// lease TTL ttl seconds). Its read-backs give up after fusedReadBack: etcd
// answers at once here unless a test drops the reads.
func faultyFused(t *testing.T, name string, ttl int64) (string, *etcd.Store, QueueRef, *Client,
	*etcdtest.Faults, *Lease) {
	t.Helper()
	ep, _ := startEtcd(t)
	admin := newStore(t, ep)
	q := QueueRef{"default", name}
	store, faults := etcdtest.NewFaultyStore(t, ep)
	c := NewClient(store, DefaultRoot)
	c.ReadBackTimeout = fusedReadBack
	return ep, admin, q, c, faults, fusedSetup(t, ep, q, QueueSpec{LeaseDurationSeconds: ttl, MaxAttempts: 3}, c)
}
