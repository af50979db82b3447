package runner

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/joblease/joblease/sidecar-go/internal/etcdtest"
	"github.com/joblease/joblease/sidecar-go/internal/protocol"
)

// CompleteNext against a real etcd (the runner as the HTTP API drives it):
// each completion's answer carries the next item, already held with its
// token file written; once the queue is drained, the final answer; a
// refused completion gets Complete's answer alone.

func field(o *Outcome, key string) any {
	for _, kv := range o.Body {
		if kv.Key == key {
			return kv.Value
		}
	}
	return nil
}

func TestEachCompletionAnswersWithTheNextItemUntilTheQueueIsDrained(t *testing.T) {
	ep, _ := etcdtest.Start(t)
	q, producer := newQueue(t, ep, "chain", protocol.QueueSpec{LeaseDurationSeconds: 5, MaxAttempts: 3})
	want := map[string]bool{}
	for i := range 4 {
		id := fmt.Sprintf("i%d", i)
		want[id] = true
		enqueue(t, producer, q, id)
	}
	r, _ := drainer(t, ep, q, true)
	item, token, _ := heldView(t, r, 0)
	for {
		delete(want, item)
		o := r.CompleteNext(context.Background(), token, item, 5*time.Second)
		if o.Answer != Done || o.Next == nil || field(&o, "token") != token {
			t.Fatalf("complete %s: %+v", item, o)
		}
		if o.Next.Answer != Done {
			if len(want) != 0 || o.Next.Answer != Refused || field(o.Next, "exitCode") != 0 {
				t.Fatalf("after %s (left %v): next %+v", item, want, o.Next)
			}
			break
		}
		next, _ := field(o.Next, "token").(int64)
		item, _ = field(o.Next, "item").(string)
		if next <= token || !want[item] {
			t.Fatalf("next after token %d: %+v (left %v)", token, o.Next, want)
		}
		token = next
	}
	// Refused: a stale token gets Complete's answer and nothing beside it.
	if o := r.CompleteNext(context.Background(), token+1000, "x", time.Second); o.Answer != Refused || o.Next != nil {
		t.Fatalf("stale completion with next: %+v", o)
	}
}

func TestTheNextWaitRunsOutWithTheWaitingAnswer(t *testing.T) {
	ep, _ := etcdtest.Start(t)
	admin := etcdtest.NewStore(t, ep)
	q := protocol.QueueRef{Namespace: "default", Name: "one"}
	createQueue(t, admin, q, protocol.QueueSpec{LeaseDurationSeconds: 5, MaxAttempts: 3})
	producer := protocol.NewClient(etcdtest.NewStore(t, ep), protocol.DefaultRoot)
	if _, err := producer.Enqueue(context.Background(), protocol.ItemRef{Queue: q, ID: "only"}, nil); err != nil {
		t.Fatal(err)
	}
	r, _ := drainer(t, ep, q, false)
	_, token, _ := heldView(t, r, 0)
	start := time.Now()
	o := r.CompleteNext(context.Background(), token, nil, 300*time.Millisecond)
	if o.Answer != Done || o.Next == nil || o.Next.Answer != NotYet || field(o.Next, "state") != "waiting" {
		t.Fatalf("complete the only item: %+v, next %+v", o, o.Next)
	}
	if waited := time.Since(start); waited < 300*time.Millisecond {
		t.Fatalf("answered after %v, before the wait ran out", waited)
	}
}
