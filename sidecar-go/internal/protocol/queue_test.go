package protocol

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"google.golang.org/grpc"

	"github.com/joblease/joblease/sidecar-go/internal/errs"
	"github.com/joblease/joblease/sidecar-go/internal/etcd"
	"github.com/joblease/joblease/sidecar-go/internal/etcdtest"
)

// Queue items against a real etcd (docs/queues.md): the claim of an item and
// its refusals, completion leaving the pending set, exhausted items marked
// failed, claim-next over many items and two claimers, the watch a waiter
// sleeps on, claim-or-create, and read-back after a lost claim answer.

func createQueue(t *testing.T, s *etcd.Store, q QueueRef, spec QueueSpec) {
	t.Helper()
	value, err := spec.Encode()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Txn(context.Background(), nil, []etcd.Op{etcd.Put(QueueKeysOf(DefaultRoot, q).Spec(), value, 0)}, nil); err != nil {
		t.Fatal(err)
	}
}

func enqueue(t *testing.T, c *Client, q QueueRef, ids ...string) {
	t.Helper()
	for _, id := range ids {
		if added, err := c.Enqueue(context.Background(), ItemRef{q, id}, map[string]any{"id": id}); err != nil || !added {
			t.Fatalf("enqueue %s: added %v, %v", id, added, err)
		}
	}
}

func getKV(t *testing.T, s *etcd.Store, key string) *etcd.KV {
	t.Helper()
	_, kv, err := s.Get(context.Background(), key)
	if err != nil {
		t.Fatal(err)
	}
	return kv
}

func TestAnItemIsClaimedHeldCompletedOnceAndLeavesThePendingSet(t *testing.T) {
	ep, _ := startEtcd(t)
	ctx := context.Background()
	admin := newStore(t, ep)
	q := QueueRef{"default", "files"}
	createQueue(t, admin, q, QueueSpec{LeaseDurationSeconds: 2, MaxAttempts: 3})
	a := NewClient(newStore(t, ep), DefaultRoot)
	enqueue(t, a, q, "x")
	item := ItemRef{q, "x"}
	keys := QueueKeysOf(DefaultRoot, q).Item("x")

	la, err := a.ClaimItem(ctx, item, "worker-a")
	if err != nil {
		t.Fatal(err)
	}
	if la.Generation != 1 || la.Item == nil || *la.Item != item || la.Job.String() != "default/files/x" {
		t.Fatalf("lease %+v item %v", la, la.Item)
	}
	if p, ok := la.Payload.(map[string]any); !ok || p["id"] != "x" {
		t.Fatalf("payload %#v", la.Payload)
	}
	if kv := getKV(t, admin, keys.Holder()); kv == nil || kv.CreateRevision != la.Token {
		t.Fatalf("holder %+v, token %d", kv, la.Token)
	}
	b := NewClient(newStore(t, ep), DefaultRoot)
	if _, err := b.ClaimItem(ctx, item, "worker-b"); !errs.Is(err, errs.KindHeld) || !strings.Contains(err.Error(), "default/files/x") {
		t.Fatalf("second claim: %v", err)
	}
	// The seed example per item: A's etcd lease goes, B claims with a larger token, A's completion is stale.
	if err := admin.Revoke(ctx, la.Session().LeaseID); err != nil {
		t.Fatal(err)
	}
	lb, err := b.ClaimItem(ctx, item, "worker-b")
	if err != nil {
		t.Fatal(err)
	}
	if lb.Token <= la.Token || lb.Generation != 2 {
		t.Fatalf("b: token %d (a had %d), generation %d", lb.Token, la.Token, lb.Generation)
	}
	if _, err := la.Complete(ctx, "from a"); !errs.Is(err, errs.KindStale) {
		t.Fatalf("a's completion after b's claim: %v", err)
	}
	if kv := getKV(t, admin, keys.Result()); kv != nil {
		t.Fatalf("a stale completion wrote %s", kv.Value)
	}
	res, err := lb.Complete(ctx, map[string]any{"ok": true})
	if err != nil {
		t.Fatal(err)
	}
	if res.Token != lb.Token || res.Generation != 2 {
		t.Fatalf("result %+v", res)
	}
	if getKV(t, admin, keys.Pending()) != nil || getKV(t, admin, keys.Holder()) != nil {
		t.Fatal("the completion left the pending or holder key")
	}
	// Completed is final: claiming again says so, with who and which token.
	_, err = NewClient(newStore(t, ep), DefaultRoot).ClaimItem(ctx, item, "worker-c")
	if !errs.Is(err, errs.KindCompleted) || !strings.Contains(err.Error(), fmt.Sprintf("token %d", lb.Token)) {
		t.Fatalf("claim of a completed item: %v", err)
	}
	// Re-enqueueing the same payload is a no-op even now; another payload is a conflict that writes nothing.
	if added, err := a.Enqueue(ctx, item, map[string]any{"id": "x"}); err != nil || added {
		t.Fatalf("re-enqueue: %v %v", added, err)
	}
	before := getKV(t, admin, keys.Item())
	if _, err := a.Enqueue(ctx, item, "other"); !errs.Is(err, errs.KindConflict) {
		t.Fatalf("enqueue with another payload: %v", err)
	} else if e, _ := errs.As(err); e.Status != 409 || e.ExitCode != 16 || e.Reason != "conflict" {
		t.Fatalf("conflict error %+v", e)
	}
	if after := getKV(t, admin, keys.Item()); after.ModRevision != before.ModRevision || getKV(t, admin, keys.Pending()) != nil {
		t.Fatal("a refused enqueue wrote something")
	}
}

func TestRefusalsSayWhyBeforeWritingAnything(t *testing.T) {
	ep, _ := startEtcd(t)
	ctx := context.Background()
	admin := newStore(t, ep)
	c := NewClient(newStore(t, ep), DefaultRoot)
	q := QueueRef{"default", "refusals"}
	if _, err := c.ClaimItem(ctx, ItemRef{q, "x"}, "w"); !errs.Is(err, errs.KindNotRegistered) || !hasDetail(err, "queue") {
		t.Fatalf("no queue: %v", err)
	}
	createQueue(t, admin, q, QueueSpec{LeaseDurationSeconds: 5})
	if _, err := c.ClaimItem(ctx, ItemRef{q, "x"}, "w"); !errs.Is(err, errs.KindNotRegistered) || !hasDetail(err, "item") {
		t.Fatalf("no item: %v", err)
	} else if e, _ := errs.As(err); e.Status != 404 || e.Reason != "not_found" {
		t.Fatalf("not found %+v", e)
	}
	for _, bad := range []string{"", "a/b", "x y"} {
		if _, err := c.ClaimItem(ctx, ItemRef{q, bad}, "w"); !errs.Is(err, errs.KindInvalid) {
			t.Fatalf("id %q: %v", bad, err)
		}
	}
	enqueue(t, c, q, "x")
	createQueue(t, admin, q, QueueSpec{LeaseDurationSeconds: 5, Suspend: true})
	rev, _, _ := admin.GetPrefix(ctx, QueueKeysOf(DefaultRoot, q).Prefix)
	for _, claim := range []func() error{
		func() error { _, err := c.ClaimItem(ctx, ItemRef{q, "x"}, "w"); return err },
		func() error { _, _, err := c.ClaimNext(ctx, q, "w"); return err },
	} {
		err := claim()
		if e, ok := errs.As(err); !ok || e.Kind != errs.KindSuspended || e.Status != 409 || e.ExitCode != 17 || e.Reason != "suspended" {
			t.Fatalf("suspended queue: %v", err)
		}
	}
	if now, _, _ := admin.GetPrefix(ctx, QueueKeysOf(DefaultRoot, q).Prefix); now != rev {
		t.Fatalf("a refused claim wrote (revision %d -> %d)", rev, now)
	}
}

func TestAnExhaustedItemIsMarkedFailedAndSkippedByClaimNext(t *testing.T) {
	ep, _ := startEtcd(t)
	ctx := context.Background()
	admin := newStore(t, ep)
	q := QueueRef{"default", "exhaust"}
	createQueue(t, admin, q, QueueSpec{LeaseDurationSeconds: 5, MaxAttempts: 1})
	c := NewClient(newStore(t, ep), DefaultRoot)
	enqueue(t, c, q, "a")
	l, err := c.ClaimItem(ctx, ItemRef{q, "a"}, "w")
	if err != nil {
		t.Fatal(err)
	}
	if err := admin.Revoke(ctx, l.Session().LeaseID); err != nil { // its one attempt ends without a result
		t.Fatal(err)
	}
	enqueue(t, c, q, "b")
	keys := QueueKeysOf(DefaultRoot, q).Item("a")
	_, err = NewClient(newStore(t, ep), DefaultRoot).ClaimItem(ctx, ItemRef{q, "a"}, "w2")
	if !errs.Is(err, errs.KindExhausted) {
		t.Fatalf("claim of an exhausted item: %v", err)
	}
	failed := getKV(t, admin, keys.Failed())
	if failed == nil || getKV(t, admin, keys.Pending()) != nil {
		t.Fatal("the exhausted item was not marked failed")
	}
	if rec, err := DecodeFailed(failed.Value); err != nil || rec.Generation != 1 {
		t.Fatalf("failed record %+v %v", rec, err)
	}
	next, _, err := NewClient(newStore(t, ep), DefaultRoot).ClaimNext(ctx, q, "w3")
	if err != nil || next == nil || next.Item.ID != "b" {
		t.Fatalf("claim next: %v %v", next, err)
	}
}

func TestTwoClaimersDrainAQueueAndEachItemIsCompletedOnce(t *testing.T) {
	ep, _ := startEtcd(t)
	ctx := context.Background()
	admin := newStore(t, ep)
	q := QueueRef{"default", "drain"}
	createQueue(t, admin, q, QueueSpec{LeaseDurationSeconds: 10, MaxAttempts: 3})
	producer := NewClient(newStore(t, ep), DefaultRoot)
	var ids []string
	for i := range 50 { // more than PickFrom and ReadAhead
		ids = append(ids, fmt.Sprintf("item-%02d", i))
	}
	enqueue(t, producer, q, ids...)
	var mu sync.Mutex
	done := map[string]int{}
	var wg sync.WaitGroup
	errc := make(chan error, 2)
	for w := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := NewClient(newStore(t, ep), DefaultRoot)
			for {
				l, miss, err := c.ClaimNext(ctx, q, fmt.Sprintf("worker-%d", w))
				if err != nil {
					errc <- err
					return
				}
				if l == nil {
					if !miss.Empty { // the other claimer holds the rest: wait for its completions
						if _, err := c.WaitForClaimable(ctx, q, miss.Revision, 5*time.Second); err != nil {
							errc <- err
							return
						}
						continue
					}
					return
				}
				if _, err := l.Complete(ctx, l.Item.ID); err != nil {
					errc <- err
					return
				}
				mu.Lock()
				done[l.Item.ID]++
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	close(errc)
	for err := range errc {
		t.Fatal(err)
	}
	for _, id := range ids {
		if done[id] != 1 {
			t.Fatalf("item %s completed %d times", id, done[id])
		}
	}
	_, kvs, _ := admin.GetPrefix(ctx, QueueKeysOf(DefaultRoot, q).FieldPrefix("pending"))
	_, results, _ := admin.GetPrefix(ctx, QueueKeysOf(DefaultRoot, q).FieldPrefix("results"))
	if len(kvs) != 0 || len(results) != len(ids) {
		t.Fatalf("%d pending, %d results left", len(kvs), len(results))
	}
}

func TestAWaiterWakesOnAnEnqueueOrAHolderGoingNotOnAPoll(t *testing.T) {
	ep, _ := startEtcd(t)
	ctx := context.Background()
	admin := newStore(t, ep)
	q := QueueRef{"default", "wake"}
	createQueue(t, admin, q, QueueSpec{LeaseDurationSeconds: 5})
	c := NewClient(newStore(t, ep), DefaultRoot)
	l, miss, err := c.ClaimNext(ctx, q, "w")
	if err != nil || l != nil || !miss.Empty {
		t.Fatalf("an empty queue: %v %+v %v", l, miss, err)
	}
	// Nothing happens: the wait ends by its timeout, having sent no claim.
	if woke, err := c.WaitForClaimable(ctx, q, miss.Revision, 300*time.Millisecond); woke || err != nil {
		t.Fatalf("woke %v (%v) with nothing enqueued", woke, err)
	}
	// An enqueue after the revision read wakes it, even one made before the wait began.
	enqueue(t, NewClient(newStore(t, ep), DefaultRoot), q, "x")
	start := time.Now()
	if woke, err := c.WaitForClaimable(ctx, q, miss.Revision, 10*time.Second); !woke || err != nil {
		t.Fatalf("no wake on an enqueue: %v %v", woke, err)
	}
	other := NewClient(newStore(t, ep), DefaultRoot)
	held, _, err := other.ClaimNext(ctx, q, "other")
	if err != nil || held == nil {
		t.Fatalf("claim: %v %v", held, err)
	}
	l, miss, err = c.ClaimNext(ctx, q, "w")
	if err != nil || l != nil || miss.Empty {
		t.Fatalf("all held: %v %+v %v (held items are not an empty queue)", l, miss, err)
	}
	// The holder's release wakes the waiter, which then claims the item.
	woke := make(chan bool, 1)
	go func() {
		ok, _ := c.WaitForClaimable(ctx, q, miss.Revision, 10*time.Second)
		woke <- ok
	}()
	if err := held.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if !<-woke {
		t.Fatal("no wake on the holder's release")
	}
	if time.Since(start) > 5*time.Second {
		t.Fatalf("the wakes took %v", time.Since(start))
	}
	if l, _, err := c.ClaimNext(ctx, q, "w"); err != nil || l == nil || l.Item.ID != "x" || l.Generation != 2 {
		t.Fatalf("claim after the wake: %v %v", l, err)
	}
}

func TestClaimOrCreateEnqueuesTheSlotOnceAndACompletedSlotIsFinal(t *testing.T) {
	ep, _ := startEtcd(t)
	ctx := context.Background()
	admin := newStore(t, ep)
	q := QueueRef{"default", "nightly"}
	createQueue(t, admin, q, QueueSpec{LeaseDurationSeconds: 5, MaxAttempts: 3})
	slot := ItemRef{q, "2026-12-01T23:00:00Z"}
	c := NewClient(newStore(t, ep), DefaultRoot)
	l, err := c.ClaimOrCreateItem(ctx, slot, "pod-a")
	if err != nil {
		t.Fatal(err)
	}
	if l.Payload != nil || l.Generation != 1 {
		t.Fatalf("slot payload %#v generation %d", l.Payload, l.Generation)
	}
	if _, err := NewClient(newStore(t, ep), DefaultRoot).ClaimOrCreateItem(ctx, slot, "pod-b"); !errs.Is(err, errs.KindHeld) {
		t.Fatalf("a second pod for the slot: %v", err)
	}
	if _, err := l.Complete(ctx, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := NewClient(newStore(t, ep), DefaultRoot).ClaimOrCreateItem(ctx, slot, "pod-c"); !errs.Is(err, errs.KindCompleted) {
		t.Fatalf("a late pod for a completed slot: %v", err)
	}
	_, items, _ := admin.GetPrefix(ctx, QueueKeysOf(DefaultRoot, q).FieldPrefix("items"))
	if len(items) != 1 || items[0].Version != 1 {
		t.Fatalf("the slot's item was written %d times / %d items", items[0].Version, len(items))
	}
	if _, err := c.ClaimOrCreateItem(ctx, ItemRef{QueueRef{"default", "absent"}, "s"}, "pod"); !errs.Is(err, errs.KindNotRegistered) {
		t.Fatalf("a slot of no queue: %v", err)
	}
}

// read-back: an item claim that committed but whose answer was lost is found
// by its claim id and used, with the item's payload.
func TestAnAmbiguousItemClaimThatCommittedIsFoundByItsClaimID(t *testing.T) {
	ep, _ := startEtcd(t)
	ctx := context.Background()
	admin := newStore(t, ep)
	q := QueueRef{"default", "ambiguous"}
	createQueue(t, admin, q, QueueSpec{LeaseDurationSeconds: 5})
	enqueue(t, NewClient(newStore(t, ep), DefaultRoot), q, "x")
	keys := QueueKeysOf(DefaultRoot, q).Item("x")
	pending := getKV(t, admin, keys.Pending())
	store, faults := etcdtest.NewFaultyStore(t, ep)
	c := NewClient(store, DefaultRoot)
	faults.LoseNextAnswers(etcdtest.Txn, 1) // the claim is the first transaction (pending given, spec read by Range)
	l, err := c.claimItem(ctx, ItemRef{q, "x"}, "worker-a", pending)
	if err != nil || faults.LostAnswers(etcdtest.Txn) != 1 {
		t.Fatalf("claim: %v (%d answers lost)", err, faults.LostAnswers(etcdtest.Txn))
	}
	kv := getKV(t, admin, keys.Holder())
	if kv == nil || kv.CreateRevision != l.Token || l.Generation != 1 {
		t.Fatalf("handle token %d generation %d; holder %+v", l.Token, l.Generation, kv)
	}
	if p, ok := l.Payload.(map[string]any); !ok || p["id"] != "x" {
		t.Fatalf("payload after read-back %#v", l.Payload)
	}
	if _, err := l.Complete(ctx, 1); err != nil || getKV(t, admin, keys.Pending()) != nil {
		t.Fatalf("complete after read-back: %v", err)
	}
}

// The oldest pending keys a claimer reads are all exhausted: it marks those
// it meets failed and reads again (a pending delete wakes no waiter) rather
// than answering NoItem while an item beyond them is claimable.
func TestAWindowOfExhaustedItemsDoesNotHideAClaimableOne(t *testing.T) {
	ep, _ := startEtcd(t)
	ctx := context.Background()
	admin := newStore(t, ep)
	q := QueueRef{"default", "window"}
	createQueue(t, admin, q, QueueSpec{LeaseDurationSeconds: 5, MaxAttempts: 1})
	c := NewClient(newStore(t, ep), DefaultRoot)
	var old []string
	for i := range ReadAhead + 4 {
		old = append(old, fmt.Sprintf("old-%03d", i))
	}
	enqueue(t, c, q, old...)
	enqueue(t, c, q, "fresh")
	for _, id := range old { // each uses its one attempt and is given back without a result
		l, err := c.ClaimItem(ctx, ItemRef{q, id}, "exhauster")
		if err != nil {
			t.Fatal(err)
		}
		if err := l.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	l, miss, err := NewClient(newStore(t, ep), DefaultRoot).ClaimNext(ctx, q, "worker")
	if err != nil || l == nil || l.Item.ID != "fresh" {
		t.Fatalf("claim next: %v %+v %v", l, miss, err)
	}
	// It got past the window: "fresh" is beyond the oldest ReadAhead pending
	// keys until len(old)+1-ReadAhead of them are marked. Every exhausted item
	// it met is marked failed (it may read again before meeting them all: a
	// pool is dropped once refusals cost a read), the rest is still pending
	// (and so is "fresh", held).
	_, failed, _ := admin.GetPrefix(ctx, QueueKeysOf(DefaultRoot, q).FieldPrefix("failed"))
	_, pending, _ := admin.GetPrefix(ctx, QueueKeysOf(DefaultRoot, q).FieldPrefix("pending"))
	if len(failed) < len(old)+1-ReadAhead || len(failed)+len(pending) != len(old)+1 {
		t.Fatalf("%d of %d exhausted items marked failed, %d pending", len(failed), len(old), len(pending))
	}
}

// countingStore is a client of ep that counts the read-only transactions it
// sends (no compares, only ranges): the candidate reads of ClaimNext, and
// nothing else a claim-and-complete cycle sends.
func countingStore(t *testing.T, ep string) (*etcd.Store, *atomic.Int64) {
	var reads atomic.Int64
	s, err := etcd.New(etcd.Config{Endpoints: []string{ep}, RequestTimeout: 5 * time.Second,
		UnaryInterceptor: func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn,
			invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
			if txn, ok := req.(*pb.TxnRequest); ok && len(txn.Compare) == 0 {
				readOnly := true
				for _, op := range txn.Success {
					readOnly = readOnly && op.GetRequestRange() != nil
				}
				if readOnly {
					reads.Add(1)
				}
			}
			return invoker(ctx, method, req, reply, cc, opts...)
		}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return s, &reads
}

// One claimer draining a queue keeps what a candidate read found for its
// next claims (joblease.queue's pool): one read per ReadAhead items, not one
// per item, and every item still claimed and completed exactly once.
func TestADrainingClaimerReadsTheQueueOncePerPoolNotPerItem(t *testing.T) {
	ep, _ := startEtcd(t)
	ctx := context.Background()
	admin := newStore(t, ep)
	q := QueueRef{"default", "pool"}
	createQueue(t, admin, q, QueueSpec{LeaseDurationSeconds: 10, MaxAttempts: 3})
	var ids []string
	for i := range ReadAhead + 8 {
		ids = append(ids, fmt.Sprintf("item-%02d", i))
	}
	enqueue(t, NewClient(newStore(t, ep), DefaultRoot), q, ids...)
	store, reads := countingStore(t, ep)
	c := NewClient(store, DefaultRoot)
	done := map[string]bool{}
	for {
		l, miss, err := c.ClaimNext(ctx, q, "drainer")
		if err != nil {
			t.Fatal(err)
		}
		if l == nil {
			if !miss.Empty {
				t.Fatalf("nothing claimable but the queue is not empty: %+v", miss)
			}
			break
		}
		if done[l.Item.ID] {
			t.Fatalf("item %s claimed again after its completion", l.Item.ID)
		}
		if _, err := l.Complete(ctx, nil); err != nil {
			t.Fatal(err)
		}
		done[l.Item.ID] = true
	}
	if len(done) != len(ids) {
		t.Fatalf("%d of %d items completed", len(done), len(ids))
	}
	// ReadAhead candidates, then the 8 left, then the read that finds none.
	if got := reads.Load(); got != 3 {
		t.Fatalf("%d candidate reads for %d items, want 3", got, len(ids))
	}
}

// The read-ahead grows with the backlog as joblease.queue's does (one in
// ReadAheadShare of the pending keys the previous read counted), so a deep
// queue's sort-everything read is paid about once per ReadAheadShare claims.
func TestTheReadAheadGrowsWithTheBacklog(t *testing.T) {
	ep, _ := startEtcd(t)
	ctx := context.Background()
	admin := newStore(t, ep)
	q := QueueRef{"default", "deep"}
	createQueue(t, admin, q, QueueSpec{LeaseDurationSeconds: 10})
	const backlog = 40 * ReadAheadShare // read-ahead 40 once counted
	item, _ := ItemRecord{Payload: nil, EnqueuedAt: 1}.Encode()
	pending, _ := PendingRecord{Since: 1}.Encode()
	keys := QueueKeysOf(DefaultRoot, q)
	for lo := 0; lo < backlog; lo += 60 { // the enqueue's records, written in bulk (set-up only)
		var ops []etcd.Op
		for i := lo; i < min(lo+60, backlog); i++ {
			k := keys.Item(fmt.Sprintf("i%05d", i))
			ops = append(ops, etcd.Put(k.Item(), item, 0), etcd.Put(k.Pending(), pending, 0))
		}
		if _, err := admin.Txn(ctx, nil, ops, nil); err != nil {
			t.Fatal(err)
		}
	}
	c := NewClient(newStore(t, ep), DefaultRoot)
	claimAndComplete := func() {
		t.Helper()
		l, _, err := c.ClaimNext(ctx, q, "drainer")
		if err != nil || l == nil {
			t.Fatalf("claim next: %v %v", l, err)
		}
		if _, err := l.Complete(ctx, nil); err != nil {
			t.Fatal(err)
		}
	}
	claimAndComplete()
	pool := c.pools[q]
	// The first read knew no backlog: ReadAhead, one of them claimed.
	if len(pool.candidates) != ReadAhead-1 || pool.pendingHint != backlog {
		t.Fatalf("after the first read: %d candidates, %d pending counted", len(pool.candidates), pool.pendingHint)
	}
	for range ReadAhead - 1 {
		claimAndComplete()
	}
	claimAndComplete() // the second read, sized by the first read's count
	if want := backlog/ReadAheadShare - 1; len(pool.candidates) != want || pool.pendingHint != backlog-ReadAhead {
		t.Fatalf("after the second read: %d candidates (want %d), %d pending counted", len(pool.candidates), want,
			pool.pendingHint)
	}
}

// A pool whose candidates other claimers keep taking (several pods draining
// one queue) is read again once its refusals cost as long as its read took,
// not tried to the end: on a shallow queue (cheap reads) after a refusal or
// two, on a deep one (reads that sort it all) much later.
func TestAPoolIsReadAgainOnceItsRefusalsCostARead(t *testing.T) {
	kvs := func(n int) []etcd.KV { return make([]etcd.KV, n) }
	p := &candidatePool{candidates: kvs(10), readCost: 10 * time.Millisecond}
	p.refused(4 * time.Millisecond)
	p.refused(4 * time.Millisecond)
	if len(p.candidates) != 10 {
		t.Fatalf("dropped after refusals worth less than a read: %d left", len(p.candidates))
	}
	p.refused(4 * time.Millisecond)
	if len(p.candidates) != 0 || p.refusedCost != 0 {
		t.Fatalf("kept %d candidates after refusals worth more than a read", len(p.candidates))
	}
	deep := &candidatePool{candidates: kvs(1000), readCost: 400 * time.Millisecond}
	for range 100 {
		deep.refused(time.Millisecond)
	}
	if len(deep.candidates) != 1000 {
		t.Fatal("a deep queue's pool was dropped for refusals far cheaper than its read")
	}
}

// completedButPending enqueues and completes ids, then puts each one's pending
// key back as it was: a pending key outliving its item's completion, a state
// joblease never writes (written here by hand, as a tenant could).
func completedButPending(t *testing.T, admin *etcd.Store, c *Client, q QueueRef, ids ...string) {
	t.Helper()
	ctx := context.Background()
	enqueue(t, c, q, ids...)
	for _, id := range ids {
		key := QueueKeysOf(DefaultRoot, q).Item(id).Pending()
		saved := getKV(t, admin, key)
		l, err := c.ClaimItem(ctx, ItemRef{q, id}, "done-before")
		if err != nil {
			t.Fatal(err)
		}
		if _, err := l.Complete(ctx, nil); err != nil {
			t.Fatal(err)
		}
		if _, err := admin.Txn(ctx, nil, []etcd.Op{etcd.Put(key, saved.Value, 0)}, nil); err != nil {
			t.Fatal(err)
		}
	}
}

// ClaimNext over stuck pending keys (joblease.queue's claim_next, tests/core/
// test_queue_stuck.py): it skips them, claims what else is claimable, and
// when nothing else is, says so (corrupt, naming them) after a bounded number
// of reads, instead of reading and being refused without end.
func TestStuckPendingKeysAreAClearErrorNotALoop(t *testing.T) {
	ep, _ := startEtcd(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	admin := newStore(t, ep)
	q := QueueRef{"default", "stuck"}
	createQueue(t, admin, q, QueueSpec{LeaseDurationSeconds: 30, MaxAttempts: 3})
	completedButPending(t, admin, NewClient(newStore(t, ep), DefaultRoot), q, "a", "b")
	store, reads := countingStore(t, ep)
	c := NewClient(store, DefaultRoot)
	l, _, err := c.ClaimNext(ctx, q, "worker")
	if l != nil || !errs.Is(err, errs.KindCorrupt) || !strings.Contains(err.Error(), "item(s) a, b are pending but already completed") ||
		!strings.Contains(err.Error(), "default/stuck") {
		t.Fatalf("claim next over stuck keys only: %v, %v", l, err)
	}
	// the spec and a candidate read, a refused claim of each, one more read that skips both
	if n := reads.Load(); n > 3 {
		t.Fatalf("%d read-only transactions for two stuck keys", n)
	}
	for _, id := range []string{"a", "b"} { // nothing changed
		if getKV(t, admin, QueueKeysOf(DefaultRoot, q).Item(id).Pending()) == nil {
			t.Fatalf("the pending key of %s was removed", id)
		}
	}
	enqueue(t, c, q, "c")
	l, _, err = c.ClaimNext(ctx, q, "worker")
	if err != nil || l == nil || l.Item.ID != "c" {
		t.Fatalf("a claimable item beside stuck keys: %v, %v", l, err)
	}
	if _, err := l.Complete(ctx, nil); err != nil {
		t.Fatal(err)
	}
	if _, _, err := c.ClaimNext(ctx, q, "worker"); !errs.Is(err, errs.KindCorrupt) {
		t.Fatalf("stuck keys only, again: %v", err)
	}
}

// A pending key whose value does not decode (written by hand: joblease writes
// none) is skipped like a stuck key, not returned as ClaimNext's error at every
// call while it is the oldest (joblease.queue, tests/core/test_queue_stuck.py):
// what else is claimable is claimed, and when nothing is, the error names it.
func TestAnUndecodablePendingKeyIsSkippedNotAStop(t *testing.T) {
	ep, _ := startEtcd(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	admin := newStore(t, ep)
	q := QueueRef{"default", "bad-pending"}
	createQueue(t, admin, q, QueueSpec{LeaseDurationSeconds: 30, MaxAttempts: 3})
	c := NewClient(newStore(t, ep), DefaultRoot)
	enqueue(t, c, q, "a", "b")
	bad := QueueKeysOf(DefaultRoot, q).Item("a").Pending()
	if _, err := admin.Txn(ctx, nil, []etcd.Op{etcd.Put(bad, []byte("not json"), 0)}, nil); err != nil {
		t.Fatal(err)
	}
	l, _, err := c.ClaimNext(ctx, q, "worker")
	if err != nil || l == nil || l.Item.ID != "b" {
		t.Fatalf("the claimable item beside an undecodable pending key: %v, %v", l, err)
	}
	if _, err := l.Complete(ctx, nil); err != nil {
		t.Fatal(err)
	}
	l, _, err = c.ClaimNext(ctx, q, "worker")
	if l != nil || !errs.Is(err, errs.KindCorrupt) || !strings.Contains(err.Error(), "item(s) a are pending") ||
		!strings.Contains(err.Error(), "does not decode") {
		t.Fatalf("only the undecodable key left: %v, %v", l, err)
	}
	if kv := getKV(t, admin, bad); kv == nil || string(kv.Value) != "not json" {
		t.Fatalf("the undecodable pending key was changed: %v", kv)
	}
	untouched(t, admin, q, "a", getKV(t, admin, bad).ModRevision)
}

// withoutRecord deletes the item records of ids by hand, their pending keys
// left (a state joblease never writes; a tenant with write access to its
// prefix could), and returns each one's pending key's mod revision.
func withoutRecord(t *testing.T, admin *etcd.Store, q QueueRef, ids ...string) map[string]int64 {
	t.Helper()
	revs := map[string]int64{}
	for _, id := range ids {
		keys := QueueKeysOf(DefaultRoot, q).Item(id)
		if _, err := admin.Txn(context.Background(), nil, []etcd.Op{etcd.Delete(keys.Item())}, nil); err != nil {
			t.Fatal(err)
		}
		revs[id] = getKV(t, admin, keys.Pending()).ModRevision
	}
	return revs
}

// untouched: nothing was written for id (no holder, no claim, no result, the
// same pending key).
func untouched(t *testing.T, admin *etcd.Store, q QueueRef, id string, pendingRev int64) {
	t.Helper()
	keys := QueueKeysOf(DefaultRoot, q).Item(id)
	for _, key := range []string{keys.Holder(), keys.Claims(), keys.Result()} {
		if kv := getKV(t, admin, key); kv != nil {
			t.Fatalf("%s was written: %s", key, kv.Value)
		}
	}
	if kv := getKV(t, admin, keys.Pending()); kv == nil || kv.ModRevision != pendingRev {
		t.Fatalf("the pending key of %s changed: %v", id, kv)
	}
}

// A pending item whose record is gone is refused by the claim's own compare
// (version(item) > 0): nothing written, a clear error, and ClaimNext skips it
// as it skips a pending key refused as completed (joblease.queue does the
// same: tests/core/test_queue_stuck.py).
func TestPendingItemsWithoutTheirRecordAreRefusedNotClaimed(t *testing.T) {
	ep, _ := startEtcd(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	admin := newStore(t, ep)
	q := QueueRef{"default", "no-record"}
	createQueue(t, admin, q, QueueSpec{LeaseDurationSeconds: 30, MaxAttempts: 3})
	store, reads := countingStore(t, ep)
	c := NewClient(store, DefaultRoot)
	enqueue(t, c, q, "a", "b")
	revs := withoutRecord(t, admin, q, "a")
	l, err := c.ClaimItem(ctx, ItemRef{q, "a"}, "worker")
	if l != nil || !errs.Is(err, errs.KindCorrupt) || !isItemRecordMissing(err, ItemRef{q, "a"}) ||
		!strings.Contains(err.Error(), QueueKeysOf(DefaultRoot, q).Item("a").Item()) {
		t.Fatalf("claim of a pending item without its record: %v, %v", l, err)
	}
	untouched(t, admin, q, "a", revs["a"])
	l, _, err = c.ClaimNext(ctx, q, "worker")
	if err != nil || l == nil || l.Item.ID != "b" {
		t.Fatalf("the claimable item beside one without its record: %v, %v", l, err)
	}
	if _, err := l.Complete(ctx, nil); err != nil {
		t.Fatal(err)
	}
	reads.Store(0)
	l, _, err = c.ClaimNext(ctx, q, "worker")
	if l != nil || !errs.Is(err, errs.KindCorrupt) ||
		!strings.Contains(err.Error(), "item(s) a are pending but already completed, without their item record") {
		t.Fatalf("claim next over an item without its record only: %v, %v", l, err)
	}
	if n := reads.Load(); n > 3 {
		t.Fatalf("%d read-only transactions for one item without its record", n)
	}
	untouched(t, admin, q, "a", revs["a"])
}

// The fused claim compares the next item's record too: when it is gone, the
// completion commits alone and nothing is claimed.
func TestACompletionFusedWithAClaimOfAnItemWithoutItsRecordClaimsNothing(t *testing.T) {
	ep, _ := startEtcd(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	admin := newStore(t, ep)
	q := QueueRef{"default", "no-record-fused"}
	createQueue(t, admin, q, QueueSpec{LeaseDurationSeconds: 30})
	c := NewClient(newStore(t, ep), DefaultRoot)
	enqueue(t, c, q, "a", "b")
	l, _, err := c.ClaimNext(ctx, q, "worker")
	if err != nil || l == nil {
		t.Fatalf("claim next: %v, %v", l, err)
	}
	other := map[string]string{"a": "b", "b": "a"}[l.Item.ID]
	if pool := c.poolOf(q); len(pool.candidates) != 1 ||
		string(pool.candidates[0].Key) != QueueKeysOf(DefaultRoot, q).Item(other).Pending() {
		t.Fatalf("the fused claim's candidate is not %s: %v", other, pool.candidates)
	}
	revs := withoutRecord(t, admin, q, other)
	r, next, err := c.CompleteAndClaimNext(ctx, l, 1)
	if err != nil || next != nil || r.Token != l.Token {
		t.Fatalf("completion fused with the claim of an item without its record: %v, %v, %v", r, next, err)
	}
	untouched(t, admin, q, other, revs[other])
}
