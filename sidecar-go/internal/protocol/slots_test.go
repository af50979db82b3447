package protocol

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/joblease/joblease/sidecar-go/internal/errs"
	"github.com/joblease/joblease/sidecar-go/internal/etcd"
	"github.com/joblease/joblease/sidecar-go/internal/etcdtest"
)

// Semaphore slots against a real etcd (docs/semaphores.md): the limit holds
// at every revision with concurrent claimers, completion and release free
// slots, a claim needing two semaphores with room in one takes neither,
// waiters are served in arrival order (a plain claim never jumps the line),
// and the read-back of a claim whose answer was lost gives its lease the slots.

func createSemaphore(t *testing.T, s *etcd.Store, ref SemaphoreRef, limit int64) {
	t.Helper()
	value, err := SemaphoreSpec{Limit: limit}.Encode()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Txn(context.Background(), nil, []etcd.Op{etcd.Put(SemaphoreKeysOf(DefaultRoot, ref).Spec(), value, 0)}, nil); err != nil {
		t.Fatal(err)
	}
}

func registerWith(t *testing.T, s *etcd.Store, job JobRef, ttl int64, uses ...SemaphoreUse) {
	t.Helper()
	value, err := EncodeSpec(Spec{LeaseDurationSeconds: ttl, Semaphores: uses})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Txn(context.Background(), nil, []etcd.Op{etcd.Put(Keys(DefaultRoot, job).Spec(), value, 0)}, nil); err != nil {
		t.Fatal(err)
	}
}

func liveSlots(t *testing.T, s *etcd.Store, ref SemaphoreRef) []etcd.KV {
	t.Helper()
	_, kvs, err := s.GetPrefix(context.Background(), SemaphoreKeysOf(DefaultRoot, ref).Slots())
	if err != nil {
		t.Fatal(err)
	}
	return kvs
}

// maxLive replays etcd's history of the semaphore's slots from revision 1 to
// now: the most slot keys live at once (a claim's puts and a completion's
// deletes are each one transaction, so counting per event is per revision).
func maxLive(t *testing.T, s *etcd.Store, ref SemaphoreRef) int {
	t.Helper()
	prefix := SemaphoreKeysOf(DefaultRoot, ref).Slots()
	rev, _, err := s.Get(context.Background(), prefix+"~")
	if err != nil {
		t.Fatal(err)
	}
	// A marker write after everything: the replay stops when it is reached.
	marker := SemaphoreKeysOf(DefaultRoot, ref).Prefix + "history-end"
	if _, err := s.Txn(context.Background(), nil, []etcd.Op{etcd.Put(marker, []byte("x"), 0)}, nil); err != nil {
		t.Fatal(err)
	}
	live, most := map[string]bool{}, 0
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	reached, err := s.WatchUntil(ctx, SemaphoreKeysOf(DefaultRoot, ref).Prefix, etcd.PrefixEnd(SemaphoreKeysOf(DefaultRoot, ref).Prefix), 1,
		func(ev etcd.Event) bool {
			key := string(ev.Key)
			if key == marker {
				return true
			}
			if strings.HasPrefix(key, prefix) {
				if ev.Deleted {
					delete(live, key)
				} else {
					live[key] = true
				}
				most = max(most, len(live))
			}
			return false
		})
	if err != nil || !reached {
		t.Fatalf("replaying the slots' history up to revision %d: reached %v, %v", rev, reached, err)
	}
	return most
}

func TestTheLimitHoldsWithConcurrentClaimersAndCompletionFreesTheSlots(t *testing.T) {
	ep, _ := startEtcd(t)
	ctx := context.Background()
	admin := newStore(t, ep)
	sem := SemaphoreRef{"default", "billing-db"}
	createSemaphore(t, admin, sem, 2)
	const n = 8
	leases := make([]*Lease, n)
	errsOf := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		job := JobRef{"default", fmt.Sprintf("run-%d", i)}
		registerWith(t, admin, job, 5, SemaphoreUse{"billing-db", 1})
		c := NewClient(newStore(t, ep), DefaultRoot)
		wg.Add(1)
		go func() {
			defer wg.Done()
			leases[i], errsOf[i] = c.Claim(ctx, job, fmt.Sprintf("w-%d", i))
		}()
	}
	wg.Wait()
	var held []*Lease
	for i, l := range leases {
		switch {
		case errsOf[i] == nil:
			held = append(held, l)
		case !errs.Is(errsOf[i], errs.KindFull):
			t.Fatalf("claim %d: %v (want held or full)", i, errsOf[i])
		}
	}
	if len(held) != 2 {
		t.Fatalf("%d claims of %d hold a slot of a semaphore of limit 2", len(held), n)
	}
	seen := map[int64]bool{}
	for _, l := range held {
		if len(l.Slots) != 1 || len(l.Slots[0].Indexes) != 1 || l.Slots[0].Token != l.Token || l.Slots[0].Semaphore != sem {
			t.Fatalf("lease %s slots %+v", l.Job, l.Slots)
		}
		seen[l.Slots[0].Indexes[0]] = true
	}
	if !seen[0] || !seen[1] {
		t.Fatalf("two holders of a limit-2 semaphore hold slots %v", seen)
	}
	if kvs := liveSlots(t, admin, sem); len(kvs) != 2 || kvs[0].Lease == 0 {
		t.Fatalf("live slots in etcd: %+v", kvs)
	}
	// Completion frees its slot in its own transaction; release too.
	if _, err := held[0].Complete(ctx, map[string]any{"ok": true}); err != nil {
		t.Fatal(err)
	}
	if kvs := liveSlots(t, admin, sem); len(kvs) != 1 {
		t.Fatalf("after a completion %d slots live", len(kvs))
	}
	if err := held[1].Release(ctx); err != nil {
		t.Fatal(err)
	}
	if kvs := liveSlots(t, admin, sem); len(kvs) != 0 {
		t.Fatalf("after a release %d slots live", len(kvs))
	}
	// The freed slots are taken again, and never more than the limit at once.
	for i, l := range leases {
		if l != nil {
			continue
		}
		job := JobRef{"default", fmt.Sprintf("run-%d", i)}
		if leases[i], errsOf[i] = NewClient(newStore(t, ep), DefaultRoot).Claim(ctx, job, "again"); errsOf[i] == nil {
			break
		}
	}
	if got := maxLive(t, admin, sem); got != 2 {
		t.Fatalf("at most %d slots were live at once (want exactly the limit, 2)", got)
	}
}

func TestAClaimNeedingTwoSemaphoresWithRoomInOneTakesNeither(t *testing.T) {
	ep, _ := startEtcd(t)
	ctx := context.Background()
	admin := newStore(t, ep)
	roomy, full := SemaphoreRef{"default", "roomy"}, SemaphoreRef{"default", "tight"}
	createSemaphore(t, admin, roomy, 3)
	createSemaphore(t, admin, full, 1)
	registerWith(t, admin, JobRef{"default", "holder"}, 5, SemaphoreUse{"tight", 1})
	registerWith(t, admin, JobRef{"default", "both"}, 5, SemaphoreUse{"tight", 1}, SemaphoreUse{"roomy", 2})
	c := NewClient(newStore(t, ep), DefaultRoot)
	if _, err := c.Claim(ctx, JobRef{"default", "holder"}, "w1"); err != nil {
		t.Fatal(err)
	}
	_, err := NewClient(newStore(t, ep), DefaultRoot).Claim(ctx, JobRef{"default", "both"}, "w2")
	e, ok := errs.As(err)
	if !ok || e.Kind != errs.KindFull || e.Reason != "full" || e.ExitCode != 18 || e.Status != 409 ||
		!strings.Contains(e.Message, "semaphore default/tight has no room for default/both") {
		t.Fatalf("claim needing a full semaphore: %v", err)
	}
	if kvs := liveSlots(t, admin, roomy); len(kvs) != 0 {
		t.Fatalf("the roomy semaphore has %d slots of a refused claim", len(kvs))
	}
	if st, _ := c.ReadState(ctx, JobRef{"default", "both"}); st.HolderToken != 0 {
		t.Fatal("the refused claim holds its job")
	}
	// A weight above the limit, an unknown semaphore: clear errors, nothing written.
	registerWith(t, admin, JobRef{"default", "heavy"}, 5, SemaphoreUse{"roomy", 4})
	registerWith(t, admin, JobRef{"default", "nowhere"}, 5, SemaphoreUse{"absent", 1})
	if _, err := c.Claim(ctx, JobRef{"default", "heavy"}, "w3"); !errs.Is(err, errs.KindInvalid) ||
		!strings.Contains(err.Error(), "could never be granted") {
		t.Fatalf("weight above the limit: %v", err)
	}
	if _, err := c.Claim(ctx, JobRef{"default", "nowhere"}, "w3"); !errs.Is(err, errs.KindNotRegistered) ||
		err.Error() != "semaphore default/absent does not exist" {
		t.Fatalf("unknown semaphore: %v", err)
	}
}

func TestWaitersAreServedInArrivalOrderAndAPlainClaimNeverJumpsTheLine(t *testing.T) {
	ep, _ := startEtcd(t)
	ctx := context.Background()
	admin := newStore(t, ep)
	sem := SemaphoreRef{"default", "one"}
	createSemaphore(t, admin, sem, 1)
	jobs := map[string]JobRef{}
	clients := map[string]*Client{}
	for _, name := range []string{"a", "b", "c", "d"} {
		jobs[name] = JobRef{"default", "job-" + name}
		registerWith(t, admin, jobs[name], 5, SemaphoreUse{"one", 1})
		clients[name] = NewClient(newStore(t, ep), DefaultRoot)
	}
	la, err := clients["a"].Claim(ctx, jobs["a"], "a")
	if err != nil {
		t.Fatal(err)
	}
	_, err = clients["b"].Claim(ctx, jobs["b"], "b")
	full, _ := errs.As(err)
	if full == nil || full.Kind != errs.KindFull || full.Revision == 0 {
		t.Fatalf("b's claim: %v", err)
	}
	tb, err := clients["b"].TakeTicket(ctx, jobs["b"], "b")
	if err != nil {
		t.Fatal(err)
	}
	defer tb.Close(ctx)
	tc, err := clients["c"].TakeTicket(ctx, jobs["c"], "c")
	if err != nil {
		t.Fatal(err)
	}
	defer tc.Close(ctx)
	if tc.Revision <= tb.Revision {
		t.Fatalf("tickets %d then %d", tb.Revision, tc.Revision)
	}
	// b waits on a watch of the semaphore; a's release wakes it.
	watch, err := clients["b"].WatchSlots(ctx, "default", []SemaphoreUse{{"one", 1}})
	if err != nil {
		t.Fatal(err)
	}
	defer watch.Close()
	woke := make(chan bool, 1)
	go func() {
		changed, _ := watch.Wait(ctx, watch.From(), 10*time.Second)
		woke <- changed
	}()
	if err := la.Release(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case changed := <-woke:
		if !changed {
			t.Fatal("the watch of the semaphore ended without a change")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("a's release did not wake the waiter")
	}
	// The slot is free, but c (behind b) and d (not in line) are refused.
	if _, err := clients["c"].ClaimInLine(ctx, jobs["c"], "c", tc); !errs.Is(err, errs.KindFull) {
		t.Fatalf("c, second in line: %v", err)
	}
	if _, err := clients["d"].Claim(ctx, jobs["d"], "d"); !errs.Is(err, errs.KindFull) || !strings.Contains(err.Error(), "2 claim(s) waiting") {
		t.Fatalf("d, not in line: %v", err)
	}
	lb, err := clients["b"].ClaimInLine(ctx, jobs["b"], "b", tb)
	if err != nil {
		t.Fatalf("b, first in line: %v", err)
	}
	// b's claim deleted its waiter key in the same transaction: c is first now.
	_, waiters, _ := admin.GetPrefix(ctx, SemaphoreKeysOf(DefaultRoot, sem).Waiters())
	if len(waiters) != 1 || string(waiters[0].Key) != tc.Keys[0] {
		t.Fatalf("waiters after b's claim: %+v", waiters)
	}
	if _, err := lb.Complete(ctx, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := clients["c"].ClaimInLine(ctx, jobs["c"], "c", tc); err != nil {
		t.Fatalf("c, first in line now: %v", err)
	}
	if got := maxLive(t, admin, sem); got != 1 {
		t.Fatalf("at most %d slots live at once, limit 1", got)
	}
}

// read-back: a claim that committed with its slots but whose answer was lost
// is found by its claim id, and its lease knows its slots (so its completion frees them).
// A waiting phase's one watch wakes a wait for every change that can make
// room after the revision the wait names (a slot or a waiter deleted, the
// spec written), however many waits it serves, and for nothing else.
func TestASlotWatchKeptAcrossWaitsWakesForEachChangeAfterTheRevision(t *testing.T) {
	ep, _ := startEtcd(t)
	ctx := context.Background()
	admin := newStore(t, ep)
	sem := SemaphoreRef{"default", "kept"}
	keys := SemaphoreKeysOf(DefaultRoot, sem)
	createSemaphore(t, admin, sem, 1)
	c := NewClient(newStore(t, ep), DefaultRoot)
	uses := []SemaphoreUse{{"kept", 1}}
	w, err := c.WatchSlots(ctx, "default", uses)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	if !w.Serves(DefaultRoot, "default", uses) || w.Serves(DefaultRoot, "default", []SemaphoreUse{{"other", 1}}) {
		t.Fatal("the watch serves exactly the semaphores it was opened for")
	}
	put := func(key string) int64 {
		r, err := admin.Txn(ctx, nil, []etcd.Op{etcd.Put(key, []byte("{}"), 0)}, nil)
		if err != nil {
			t.Fatal(err)
		}
		return r.Revision
	}
	del := func(key string) int64 {
		r, err := admin.Txn(ctx, nil, []etcd.Op{etcd.Delete(key)}, nil)
		if err != nil {
			t.Fatal(err)
		}
		return r.Revision
	}
	wait := func(after int64, timeout time.Duration) bool {
		changed, err := w.Wait(ctx, after, timeout)
		if err != nil {
			t.Fatal(err)
		}
		return changed
	}
	// A new waiter or slot makes no room: the wait runs out.
	put(keys.Waiter("w1"))
	slot := put(keys.Slot(0))
	if wait(w.From(), 300*time.Millisecond) {
		t.Fatal("woke for a put of a waiter or a slot")
	}
	// Each change that can make room wakes the next wait on the same watch,
	// even one that began before it.
	for _, change := range []func() int64{
		func() int64 { return del(keys.Slot(0)) },
		func() int64 { return del(keys.Waiter("w1")) },
		func() int64 {
			createSemaphore(t, admin, sem, 2)
			_, kv, _ := admin.Get(ctx, keys.Spec())
			return kv.ModRevision
		},
	} {
		woke := make(chan bool, 1)
		go func() { woke <- wait(slot, 10*time.Second) }()
		at := change()
		if !<-woke {
			t.Fatalf("the change at %d did not wake the wait after %d", at, slot)
		}
		if wait(at, 200*time.Millisecond) {
			t.Fatalf("woke after %d with no change since", at)
		}
		slot = at
	}
}

func TestAnAmbiguousClaimThatCommittedGetsItsSlotsFromTheReadBack(t *testing.T) {
	ep, _ := startEtcd(t)
	ctx := context.Background()
	admin := newStore(t, ep)
	sem := SemaphoreRef{"default", "rb"}
	createSemaphore(t, admin, sem, 2)
	job := JobRef{"default", "ambiguous-slots"}
	registerWith(t, admin, job, 5, SemaphoreUse{"rb", 2})
	store, faults := etcdtest.NewFaultyStore(t, ep)
	c := NewClient(store, DefaultRoot)
	keys := Keys(DefaultRoot, job)
	specRev, spec, err := c.readSpec(ctx, job, keys, true)
	if err != nil {
		t.Fatal(err)
	}
	plan, err := c.planFor(ctx, job.String(), job.Namespace, spec.Semaphores, nil)
	if err != nil {
		t.Fatal(err)
	}
	s, err := c.sessionFor(ctx, spec.LeaseDurationSeconds)
	if err != nil {
		t.Fatal(err)
	}
	faults.LoseNextAnswers(etcdtest.Txn, 1) // the claim transaction's answer
	var revoked []string
	l, _, err := c.claimOn(ctx, job, keys, "w", specRev, spec, s, &revoked, 0, 0, plan)
	if faults.LostAnswers(etcdtest.Txn) != 1 {
		t.Fatalf("the claim's answer was not lost: the test did not test the read-back")
	}
	if err != nil || l == nil {
		t.Fatalf("read-back of a committed claim: %v", err)
	}
	if len(l.Slots) != 1 || len(l.Slots[0].Indexes) != 2 || l.Slots[0].Token != l.Token {
		t.Fatalf("slots of the read-back lease: %+v", l.Slots)
	}
	if kvs := liveSlots(t, admin, sem); len(kvs) != 2 || kvs[0].CreateRevision != l.Token {
		t.Fatalf("slots in etcd: %+v (token %d)", kvs, l.Token)
	}
	if _, err := l.Complete(ctx, nil); err != nil {
		t.Fatal(err)
	}
	if kvs := liveSlots(t, admin, sem); len(kvs) != 0 {
		t.Fatalf("the completion left %d slots", len(kvs))
	}
}
