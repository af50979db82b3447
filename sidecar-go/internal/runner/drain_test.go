package runner

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/joblease/joblease/sidecar-go/internal/config"
	"github.com/joblease/joblease/sidecar-go/internal/etcd"
	"github.com/joblease/joblease/sidecar-go/internal/etcdtest"
	"github.com/joblease/joblease/sidecar-go/internal/protocol"
)

// A draining runner against a real etcd: the test is its worker, through the
// same operations the HTTP API calls (LeaseView, Complete).

func createQueue(t *testing.T, s *etcd.Store, q protocol.QueueRef, spec protocol.QueueSpec) {
	value, err := spec.Encode()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Txn(context.Background(), nil, []etcd.Op{etcd.Put(protocol.QueueKeysOf(protocol.DefaultRoot, q).Spec(), value, 0)}, nil); err != nil {
		t.Fatal(err)
	}
}

// newQueue creates queue name (spec) on a real etcd at ep and returns it with a
// producer client; enqueue puts each id as an item whose payload is its id.
func newQueue(t *testing.T, ep, name string, spec protocol.QueueSpec) (protocol.QueueRef, *protocol.Client) {
	q := protocol.QueueRef{Namespace: "default", Name: name}
	createQueue(t, etcdtest.NewStore(t, ep), q, spec)
	return q, protocol.NewClient(etcdtest.NewStore(t, ep), protocol.DefaultRoot)
}

func enqueue(t *testing.T, producer *protocol.Client, q protocol.QueueRef, ids ...string) {
	for _, id := range ids {
		if _, err := producer.Enqueue(context.Background(), protocol.ItemRef{Queue: q, ID: id}, id); err != nil {
			t.Fatal(err)
		}
	}
}

func drainer(t *testing.T, ep string, q protocol.QueueRef, exitWhenEmpty bool) (*Runner, chan End) {
	return drainerOnLoss(t, ep, q, exitWhenEmpty, "none")
}

func drainerOnLoss(t *testing.T, ep string, q protocol.QueueRef, exitWhenEmpty bool, onLoss string) (*Runner, chan End) {
	cfg := config.Config{Queue: &q, ExitWhenEmpty: exitWhenEmpty, Owner: "drainer", OnLoss: onLoss, OnFinal: "serve",
		Backoff: config.Backoff{Initial: 0.05, Maximum: 0.2, Multiplier: 2}, RegistrationWait: 5}
	r := New(cfg, protocol.NewClient(etcdtest.NewStore(t, ep), protocol.DefaultRoot), slog.New(slog.NewTextHandler(io.Discard, nil)))
	t.Cleanup(func() { r.RequestStop(""); r.cancel() })
	done := make(chan End, 1)
	go r.Lifecycle(done)
	return r, done
}

// heldView waits for the runner to hold an item with a token above after.
func heldView(t *testing.T, r *Runner, after int64) (string, int64, any) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		o := r.LeaseView()
		if o.Answer == Done {
			var item string
			var token int64
			var payload any
			for _, kv := range o.Body {
				switch kv.Key {
				case "item":
					item, _ = kv.Value.(string)
				case "token":
					token, _ = kv.Value.(int64)
				case "payload":
					payload = kv.Value
				}
			}
			if token > after {
				return item, token, payload
			}
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("no item held within 10 s (phase %s)", r.PhaseNow())
	return "", 0, nil
}

func TestADrainingRunnerCompletesEachItemOnceThenEndsWhenEmpty(t *testing.T) {
	ep, _ := etcdtest.Start(t)
	admin := etcdtest.NewStore(t, ep)
	q, producer := newQueue(t, ep, "drain", protocol.QueueSpec{LeaseDurationSeconds: 5, MaxAttempts: 3})
	want := map[string]bool{}
	for i := range 5 {
		id := fmt.Sprintf("i%d", i)
		want[id] = true
		enqueue(t, producer, q, id)
	}
	r, done := drainer(t, ep, q, true)
	var token int64
	for range len(want) {
		item, tok, payload := heldView(t, r, token)
		if !want[item] || payload != item {
			t.Fatalf("held %q (payload %v): not one of the items left %v", item, payload, want)
		}
		delete(want, item)
		token = tok
		if o := r.Complete(token, item); o.Answer != Done {
			t.Fatalf("complete %s: %+v", item, o)
		}
	}
	select {
	case end := <-done:
		if end.ExitNow || end.Code != 0 {
			t.Fatalf("drained: %+v", end)
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("not drained (phase %s)", r.PhaseNow())
	}
	if o := r.LeaseView(); o.Answer != Refused || r.PhaseNow() != Completed || !r.Ready() {
		t.Fatalf("drained view %+v, phase %s", o, r.PhaseNow())
	}
	// A completion repeated under the last item's token gets its result again.
	if o := r.Complete(token, "again"); o.Answer != Done {
		t.Fatalf("repeated completion: %+v", o)
	}
	_, results, _ := admin.GetPrefix(context.Background(), protocol.QueueKeysOf(protocol.DefaultRoot, q).FieldPrefix("results"))
	if len(results) != 5 {
		t.Fatalf("%d results", len(results))
	}
}

func TestAStopEndsTheWaitForAnItemAtOnce(t *testing.T) {
	ep, _ := etcdtest.Start(t)
	q := protocol.QueueRef{Namespace: "default", Name: "empty"}
	createQueue(t, etcdtest.NewStore(t, ep), q, protocol.QueueSpec{LeaseDurationSeconds: 5})
	r, done := drainer(t, ep, q, false)
	deadline := time.Now().Add(10 * time.Second)
	for r.PhaseNow() != Waiting {
		if time.Now().After(deadline) {
			t.Fatalf("not waiting (phase %s)", r.PhaseNow())
		}
		time.Sleep(10 * time.Millisecond)
	}
	if r.Ready() || r.LeaseView().Answer != NotYet {
		t.Fatal("a waiting sidecar must not be ready, and its lease view is 'not yet'")
	}
	r.RequestStop("SIGTERM")
	select {
	case end := <-done:
		if !end.ExitNow || end.Code != 0 {
			t.Fatalf("stopped while waiting: %+v", end)
		}
	case <-time.After(2 * time.Second):
		t.Fatal("the wait did not end on the stop")
	}
}

// viewToken is the token of a lease view (0: none).
func viewToken(o Outcome) int64 {
	for _, kv := range o.Body {
		if kv.Key == "token" {
			tok, _ := kv.Value.(int64)
			return tok
		}
	}
	return 0
}

// GET /v1/lease?wait=... of a draining worker: asked right after a
// completion, it answers the next item once claimed, not the 409 of the item
// just completed; with nothing left it waits its whole wait and answers
// "waiting"; a stop ends a wait at once.
func TestALeaseWaitAnswersTheNextItemNotTheOneJustCompleted(t *testing.T) {
	ep, _ := etcdtest.Start(t)
	q := protocol.QueueRef{Namespace: "default", Name: "longpoll"}
	createQueue(t, etcdtest.NewStore(t, ep), q, protocol.QueueSpec{LeaseDurationSeconds: 5, MaxAttempts: 3})
	producer := protocol.NewClient(etcdtest.NewStore(t, ep), protocol.DefaultRoot)
	for _, id := range []string{"a", "b", "c"} {
		if _, err := producer.Enqueue(context.Background(), protocol.ItemRef{Queue: q, ID: id}, id); err != nil {
			t.Fatal(err)
		}
	}
	r, _ := drainer(t, ep, q, false)
	o := r.LeaseWait(context.Background(), 10*time.Second)
	for i := range 3 {
		token := viewToken(o)
		if o.Answer != Done || token == 0 {
			t.Fatalf("long poll for an item: %+v (phase %s)", o, r.PhaseNow())
		}
		if c := r.Complete(token, nil); c.Answer != Done {
			t.Fatalf("complete: %+v", c)
		}
		if i == 2 {
			break
		}
		o = r.LeaseWait(context.Background(), 10*time.Second)
		if o.Answer == Done && viewToken(o) <= token {
			t.Fatalf("the long poll answered the item just completed: %+v", o)
		}
	}
	asked := time.Now()
	o = r.LeaseWait(context.Background(), 300*time.Millisecond)
	if o.Answer != NotYet || r.PhaseNow() != Waiting || time.Since(asked) < 300*time.Millisecond {
		t.Fatalf("a wait with nothing to claim: %+v after %v (phase %s)", o, time.Since(asked), r.PhaseNow())
	}
	stopped := make(chan Outcome, 1)
	go func() { stopped <- r.LeaseWait(context.Background(), 30*time.Second) }()
	r.RequestStop("SIGTERM")
	select {
	case o := <-stopped:
		if o.Answer != NotYet {
			t.Fatalf("stopped: %+v", o)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("a stop did not end the long poll")
	}
}

// A lost item ends that item, not the draining (docs/sidecar.md, "Queue mode"):
// with on-loss "signal" the runner claims the next item under a new token, and
// the lost item's token is refused.
func TestADrainingRunnerThatLostAnItemClaimsTheNextWithSignal(t *testing.T) {
	ep, _ := etcdtest.Start(t)
	admin := etcdtest.NewStore(t, ep)
	q, producer := newQueue(t, ep, "lossy", protocol.QueueSpec{LeaseDurationSeconds: 3, MaxAttempts: 0})
	enqueue(t, producer, q, "x", "y")
	r, _ := drainerOnLoss(t, ep, q, false, "signal")
	first, token, _ := heldView(t, r, 0)
	r.mu.Lock()
	leaseID := r.lease.Session().LeaseID
	r.mu.Unlock()
	// etcd ends the lease (as at expiry): the holder key goes with it
	if err := admin.Revoke(context.Background(), leaseID); err != nil {
		t.Fatal(err)
	}
	next, nextToken, _ := heldView(t, r, token)
	if next == first || nextToken <= token {
		t.Fatalf("after losing %s (token %d) the runner holds %s (token %d)", first, token, next, nextToken)
	}
	if o := r.Complete(token, "late"); o.Answer == Done {
		t.Fatalf("completion under the lost item's token accepted: %+v", o)
	}
	if o := r.Complete(nextToken, next); o.Answer != Done {
		t.Fatalf("complete %s: %+v", next, o)
	}
}

// A draining sidecar holds item after item on one session: each ended item's
// lease unregisters its loss callback, so the session keeps the held item's
// alone, not one per item ever held (which kept every ended lease, its
// payload and records, in memory for as long as the session lived: ~1.4 KB
// an item, BenchmarkDrain's heapB/item). Ended by completion, by release, and
// by loss (the holder key deleted behind the sidecar's back).
func TestADrainingRunnersSessionKeepsOnlyTheHeldItemsLossCallback(t *testing.T) {
	ep, _ := etcdtest.Start(t)
	admin := etcdtest.NewStore(t, ep)
	q, producer := newQueue(t, ep, "listeners", protocol.QueueSpec{LeaseDurationSeconds: 30, MaxAttempts: 3})
	for i := range 12 {
		enqueue(t, producer, q, fmt.Sprintf("i%02d", i))
	}
	r, _ := drainer(t, ep, q, false)
	heldLease := func(after int64) *protocol.Lease {
		t.Helper()
		_, token, _ := heldView(t, r, after)
		r.mu.Lock()
		defer r.mu.Unlock()
		if r.lease == nil || r.lease.Token != token {
			t.Fatalf("held token %d, lease %+v", token, r.lease)
		}
		return r.lease
	}
	var token int64
	for i := range 11 {
		l := heldLease(token)
		token = l.Token
		if n := l.Session().Listening(); n != 1 {
			t.Fatalf("item %d held: the session has %d loss callbacks, want 1 (the held lease's)", i, n)
		}
		switch i % 3 {
		case 0, 1:
			if o := r.Complete(token, nil); o.Answer != Done {
				t.Fatalf("complete: %+v", o)
			}
		case 2:
			if i == 2 {
				if o := r.Release(token); o.Answer != Done {
					t.Fatalf("release: %+v", o)
				}
			} else { // lost: the holder deleted under it; the next holder check notices
				if _, err := admin.Txn(context.Background(), nil, []etcd.Op{etcd.Delete(
					protocol.QueueKeysOf(protocol.DefaultRoot, q).Item(l.Item.ID).Holder())}, nil); err != nil {
					t.Fatal(err)
				}
				l.Check(context.Background())
				if l.State() != protocol.LostState {
					t.Fatalf("lease not lost after its holder key went: %v", l.State())
				}
			}
		}
	}
	l := heldLease(token)
	if n := l.Session().Listening(); n != 1 {
		t.Fatalf("after 11 items the session has %d loss callbacks, want 1", n)
	}
}

// Every etcd request a draining sidecar sends, counted at its gRPC client.
// With the fused path (protocol.CompleteAndClaimNext), one transaction per
// item: each completion claims the next item of the pool in the same
// transaction, except the one that empties the pool (a completion alone,
// then a candidate read and a claim); no range read, no read of the item's
// state, no second lease. Guards the per-item path (docs/benchmarks.md,
// "Where an item's time goes"): a read-back, a holder check or a new
// session per item added to it fails here.
func TestADrainingRunnerSendsOneTransactionPerItem(t *testing.T) {
	const items = 2 * protocol.ReadAhead
	calls := drainCounted(t, protocol.QueueSpec{LeaseDurationSeconds: 60, MaxAttempts: 3}, items)
	// per pool of ReadAhead items: a candidate read, a claim, ReadAhead-1 fused
	// completions and one completion alone; then the last read, which finds none.
	if want := items + 2*(items/protocol.ReadAhead) + 1; calls["Txn"] != want {
		t.Fatalf("%d transactions for %d items, want %d (all calls: %v)", calls["Txn"], items, want, calls)
	}
	if calls["Range"] != 1 || calls["LeaseGrant"] != 1 || len(calls) != 3 {
		t.Fatalf("calls besides the transactions: %v; want one Range (the queue's spec) and one LeaseGrant", calls)
	}
}

// A queue that keeps a tenure history is drained in two transactions per
// item, as before the fused path (docs/queues.md: the fused shape carries no
// history): a claim and a completion, plus a candidate read per pool.
func TestADrainingRunnerSendsTwoTransactionsPerItemWithAHistory(t *testing.T) {
	const items = 2 * protocol.ReadAhead
	calls := drainCounted(t, protocol.QueueSpec{LeaseDurationSeconds: 60, MaxAttempts: 3, HistoryLimit: 2}, items)
	if want := 2*items + items/protocol.ReadAhead + 1; calls["Txn"] != want {
		t.Fatalf("%d transactions for %d items, want %d (all calls: %v)", calls["Txn"], items, want, calls)
	}
}

// drainCounted drains items items of a new queue with spec through a runner
// whose every etcd call is counted by method.
func drainCounted(t *testing.T, spec protocol.QueueSpec, items int) map[string]int {
	t.Helper()
	ep, _ := etcdtest.Start(t)
	// TTL 60: the session's first keep-alive (and the holder check after it,
	// a transaction) comes 20 s in, long after the drain
	q, producer := newQueue(t, ep, "per-item", spec)
	for i := range items {
		enqueue(t, producer, q, fmt.Sprintf("i%02d", i))
	}
	var mu sync.Mutex
	calls := map[string]int{}
	store, err := etcd.New(etcd.Config{Endpoints: []string{ep}, RequestTimeout: 5 * time.Second,
		UnaryInterceptor: func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn,
			invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
			mu.Lock()
			calls[method[strings.LastIndexByte(method, '/')+1:]]++
			mu.Unlock()
			return invoker(ctx, method, req, reply, cc, opts...)
		}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(store.Close)
	cfg := config.Config{Queue: &q, ExitWhenEmpty: true, Owner: "drainer", OnLoss: "none", OnFinal: "serve",
		Backoff: config.Backoff{Initial: 0.05, Maximum: 0.2, Multiplier: 2}, RegistrationWait: 5}
	r := New(cfg, protocol.NewClient(store, protocol.DefaultRoot), slog.New(slog.NewTextHandler(io.Discard, nil)))
	t.Cleanup(func() { r.RequestStop(""); r.cancel() })
	done := make(chan End, 1)
	go r.Lifecycle(done)
	var token int64
	for range items {
		_, token, _ = heldView(t, r, token)
		if o := r.Complete(token, nil); o.Answer != Done {
			t.Fatalf("complete: %+v", o)
		}
	}
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatalf("not drained (phase %s)", r.PhaseNow())
	}
	mu.Lock()
	defer mu.Unlock()
	return calls
}

// A worker completes its item as the stop comes (pod deletion): the drain has
// already stopped, the completion is answered and claims the next item in the
// same transaction (ahead), and that item is never served. Shutdown gives it
// back (dropAhead), whatever release-on-term says: another owner claims it at
// once (the TTL is 60 s), and no token file or holder of ours is left.
func TestAnItemClaimedAheadIsGivenBackWhenTheDrainStops(t *testing.T) {
	ep, _ := etcdtest.Start(t)
	admin := etcdtest.NewStore(t, ep)
	q, producer := newQueue(t, ep, "ahead", protocol.QueueSpec{LeaseDurationSeconds: 60, MaxAttempts: 3})
	enqueue(t, producer, q, "a", "b")
	dir := t.TempDir()
	cfg := config.Config{Queue: &q, Owner: "drainer", OnLoss: "none", OnFinal: "serve", TokenFile: dir + "/token",
		Backoff: config.Backoff{Initial: 0.05, Maximum: 0.2, Multiplier: 2}, RegistrationWait: 5}
	r := New(cfg, protocol.NewClient(etcdtest.NewStore(t, ep), protocol.DefaultRoot), slog.New(slog.NewTextHandler(io.Discard, nil)))
	t.Cleanup(func() { r.RequestStop(""); r.cancel() })
	done := make(chan End, 1)
	go r.Lifecycle(done)
	held, token, _ := heldView(t, r, 0)
	r.RequestStop("SIGTERM")
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("the drain did not stop")
	}
	if o := r.Complete(token, held); o.Answer != Done {
		t.Fatalf("complete %s: %+v", held, o)
	}
	r.mu.Lock()
	ahead := r.ahead
	r.mu.Unlock()
	if ahead == nil {
		t.Fatal("the completion claimed nothing ahead: the test does not reach dropAhead")
	}
	next := ahead.Item.ID
	r.Shutdown()
	keys := protocol.QueueKeysOf(protocol.DefaultRoot, q).Item(next)
	if _, kv, err := admin.Get(context.Background(), keys.Holder()); err != nil || kv != nil {
		t.Fatalf("the item claimed ahead is still held after the stop: %v (%v)", kv != nil, err)
	}
	rival, err := protocol.NewClient(etcdtest.NewStore(t, ep), protocol.DefaultRoot).ClaimItem(
		context.Background(), protocol.ItemRef{Queue: q, ID: next}, "rival")
	if err != nil || rival.Token <= ahead.Token {
		t.Fatalf("another owner could not claim %s at once: %v", next, err)
	}
	for _, f := range []string{cfg.TokenFile, cfg.TokenJSONFile()} {
		if _, err := os.Stat(f); !os.IsNotExist(err) {
			t.Fatalf("%s left after the stop (%v)", f, err)
		}
	}
}
