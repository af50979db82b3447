package protocol

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/joblease/joblease/sidecar-go/internal/errs"
	"github.com/joblease/joblease/sidecar-go/internal/etcd"
)

// The tenure history on a real etcd (docs/protocol.md, "Tenure history"):
// the same keys and records the Python library writes and reads
// (tests/core/test_history.py; the bytes are pinned by tests/vectors/history.json).

func registerWithHistory(t *testing.T, s *etcd.Store, job JobRef, ttl, max, limit int64) {
	value, err := EncodeSpec(Spec{LeaseDurationSeconds: ttl, MaxAttempts: max, HistoryLimit: limit})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Txn(context.Background(), nil, []etcd.Op{etcd.Put(Keys(DefaultRoot, job).Spec(), value, 0)}, nil); err != nil {
		t.Fatal(err)
	}
}

// historyKeys: every key of the job's history, by its path under the history prefix.
func historyKeys(t *testing.T, s *etcd.Store, keys JobKeys) map[string]etcd.KV {
	_, kvs, err := s.GetPrefix(context.Background(), keys.History())
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]etcd.KV{}
	for _, kv := range kvs {
		out[strings.TrimPrefix(string(kv.Key), keys.History())] = kv
	}
	return out
}

func field(t *testing.T, kv etcd.KV, name string) any {
	var obj map[string]any
	if err := json.Unmarshal(kv.Value, &obj); err != nil {
		t.Fatalf("%s: %v", kv.Key, err)
	}
	return obj[name]
}

func TestEveryTenureIsRecordedByTheTransactionsThemselves(t *testing.T) {
	ep, _ := startEtcd(t)
	ctx := context.Background()
	job := JobRef{"default", "history-seed"}
	keys := Keys(DefaultRoot, job)
	admin := newStore(t, ep)
	registerWithHistory(t, admin, job, 2, 5, 10)

	a := NewClient(newStore(t, ep), DefaultRoot)
	la, err := a.Claim(ctx, job, "worker-a")
	if err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if _, err := la.Checkpoint(ctx, map[string]any{"done": 1}); err != nil {
			t.Fatal(err)
		}
	}
	if err := admin.Revoke(ctx, la.Session().LeaseID); err != nil { // as on expiry
		t.Fatal(err)
	}
	b := NewClient(newStore(t, ep), DefaultRoot)
	lb, err := b.Claim(ctx, job, "worker-b")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := la.Complete(ctx, "late"); !errs.Is(err, errs.KindStale) {
		t.Fatalf("late completion: %v", err)
	}
	if _, err := lb.Complete(ctx, "done"); err != nil {
		t.Fatal(err)
	}

	h := historyKeys(t, admin, keys)
	g1, g2 := "000000000001", "000000000002"
	want := []string{g1, g1 + "/checkpoints", g1 + "/refused", g2}
	if len(h) != len(want) {
		t.Fatalf("history keys %v, want %v", h, want)
	}
	for _, k := range want {
		if _, ok := h[k]; !ok {
			t.Fatalf("no %s in %v", k, h)
		}
	}
	// A tenure key's create revision is its claim's token; a mark's version counts.
	if h[g1].CreateRevision != la.Token || h[g2].CreateRevision != lb.Token {
		t.Fatalf("tenure revisions %d, %d; tokens %d, %d", h[g1].CreateRevision, h[g2].CreateRevision, la.Token, lb.Token)
	}
	if field(t, h[g1], "owner") != "worker-a" || field(t, h[g1], "claimId") != la.ClaimID {
		t.Fatalf("tenure 1: %s", h[g1].Value)
	}
	if h[g1+"/checkpoints"].Version != 2 || h[g1+"/refused"].Version != 1 {
		t.Fatalf("checkpoints %d, refused %d", h[g1+"/checkpoints"].Version, h[g1+"/refused"].Version)
	}
	// Neither tenure has an end: A's expired (etcd wrote nothing), B's completed
	// (the result, which carries B's token, says so).
	_, res, _ := admin.Get(ctx, keys.Result())
	if rec, err := DecodeResult(res.Value, res.ModRevision); err != nil || rec.Token != h[g2].CreateRevision {
		t.Fatalf("result %+v (%v)", rec, err)
	}
}

func TestTheHistoryKeepsTheLastNTenuresAndAStaleGenerationGuessIsCorrected(t *testing.T) {
	ep, _ := startEtcd(t)
	ctx := context.Background()
	job := JobRef{"default", "history-retention"}
	keys := Keys(DefaultRoot, job)
	admin := newStore(t, ep)
	const limit = 3
	registerWithHistory(t, admin, job, 5, 0, limit)
	late := NewClient(newStore(t, ep), DefaultRoot)
	if _, _, err := late.readSpec(ctx, job, keys, false); err != nil { // caches generation 0
		t.Fatal(err)
	}
	c := NewClient(newStore(t, ep), DefaultRoot)
	for range limit + 10 {
		l, err := c.Claim(ctx, job, "worker")
		if err != nil {
			t.Fatal(err)
		}
		if err := l.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	// The late client's guess (0) is 13 claims behind: its first claim is refused by
	// the compare and retried with the generation its failure branch read.
	l, err := late.Claim(ctx, job, "late")
	if err != nil {
		t.Fatal(err)
	}
	if l.Generation != limit+11 {
		t.Fatalf("generation %d", l.Generation)
	}
	h := historyKeys(t, admin, keys)
	tenures := 0
	for k, kv := range h {
		if !strings.Contains(k, "/") {
			tenures++
			if k < "000000000012" {
				t.Fatalf("tenure %s kept past the limit", k)
			}
		} else if field(t, kv, "how") != nil && field(t, kv, "how") != EndReleased {
			t.Fatalf("%s: %s", k, kv.Value)
		}
	}
	// the last 3: 12 and 13 released (with their ends), 14 open
	if tenures != limit || len(h) != 2*limit-1 {
		t.Fatalf("%d tenures, %d keys: %v", tenures, len(h), h)
	}
	if h["000000000014"].CreateRevision != l.Token {
		t.Fatal("the open tenure is not the late claim's")
	}
}

// A queue item's history (docs/history.md, "Queue items"): the sidecar's
// claims of an item write the keys the Python library reads
// (tests/core/test_queue_history.py), under Q/history/<id>/, and keep only the
// queue's historyLimit of them.
func TestAnItemsTenuresAreRecordedUnderItsQueueAndBounded(t *testing.T) {
	ep, _ := startEtcd(t)
	ctx := context.Background()
	admin := newStore(t, ep)
	q := QueueRef{"default", "item-history"}
	spec, err := QueueSpec{LeaseDurationSeconds: 2, MaxAttempts: 0, HistoryLimit: 2}.Encode()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := admin.Txn(ctx, nil, []etcd.Op{etcd.Put(QueueKeysOf(DefaultRoot, q).Spec(), spec, 0)}, nil); err != nil {
		t.Fatal(err)
	}
	item := ItemRef{q, "x"}
	keys := QueueKeysOf(DefaultRoot, q).Item("x")
	if keys.History() != "/joblease/v1/default/_queues/item-history/history/x/" {
		t.Fatalf("history prefix %q", keys.History())
	}
	a := NewClient(newStore(t, ep), DefaultRoot)
	if _, err := a.Enqueue(ctx, item, map[string]any{"n": 1}); err != nil {
		t.Fatal(err)
	}
	la, _, err := a.ClaimNext(ctx, q, "worker-a")
	if err != nil || la == nil {
		t.Fatalf("claim: %v", err)
	}
	if _, err := la.Checkpoint(ctx, map[string]any{"done": 1}); err != nil {
		t.Fatal(err)
	}
	if err := admin.Revoke(ctx, la.Session().LeaseID); err != nil { // as on expiry
		t.Fatal(err)
	}
	// B's first guess of the generation (the round's 0) is refused by the
	// compare; the claim reads the right one and commits generation 2.
	b := NewClient(newStore(t, ep), DefaultRoot)
	lb, _, err := b.ClaimNext(ctx, q, "worker-b")
	if err != nil || lb == nil || lb.Generation != 2 {
		t.Fatalf("claim: %v %+v", err, lb)
	}
	if _, err := la.Complete(ctx, "late"); !errs.Is(err, errs.KindStale) {
		t.Fatalf("late completion: %v", err)
	}
	if err := lb.Release(ctx); err != nil {
		t.Fatal(err)
	}
	g1, g2, g3 := "000000000001", "000000000002", "000000000003"
	h := historyKeys(t, admin, keys)
	want := []string{g1, g1 + "/checkpoints", g1 + "/refused", g2, g2 + "/end"}
	if len(h) != len(want) {
		t.Fatalf("history keys %v, want %v", h, want)
	}
	for _, k := range want {
		if _, ok := h[k]; !ok {
			t.Fatalf("no %s in %v", k, h)
		}
	}
	if h[g1].CreateRevision != la.Token || h[g2].CreateRevision != lb.Token || field(t, h[g2+"/end"], "how") != EndReleased {
		t.Fatalf("tenures %v; tokens %d, %d", h, la.Token, lb.Token)
	}
	// a third claim (of the named item: its generation read first) keeps the
	// last 2 (the queue's limit), in its own transaction
	lc, err := b.ClaimItem(ctx, item, "worker-c")
	if err != nil {
		t.Fatal(err)
	}
	h = historyKeys(t, admin, keys)
	if _, ok := h[g1]; ok || len(h) != 3 || h[g3].CreateRevision != lc.Token {
		t.Fatalf("after the third claim: %v", h)
	}
	if _, err := lc.Complete(ctx, "done"); err != nil {
		t.Fatal(err)
	}
	// the queue's counts are unaffected: no field prefix holds a history key
	for _, f := range []string{"items", "pending", "held", "claims", "results", "checkpoints", "failed"} {
		if strings.HasPrefix(keys.History(), QueueKeysOf(DefaultRoot, q).FieldPrefix(f)) {
			t.Fatalf("history under %s/", f)
		}
	}
}
