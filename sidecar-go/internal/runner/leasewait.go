package runner

import (
	"context"
	"time"
)

// MaxLeaseWait bounds GET /v1/lease?wait=S (docs/sidecar.md): long enough
// that a waiting worker asks about once a minute, short enough for any HTTP
// client's default timeout to allow it.
const MaxLeaseWait = 60 * time.Second

// LeaseWait is LeaseView held back up to wait while its answer is one the
// sidecar will change by itself: still claiming, waiting for an item or a
// slot, a completion being settled, and, while draining a queue, the item
// that just ended (completed, released, or lost with on-loss "none") until
// the next one is claimed. So a worker waits for its lease, or a draining
// worker for its next item, without polling: the answer comes when the phase
// changes (a claim committed, a final answer). It answers at once while the
// lease is held or the state is final, when ctx ends (the client went away)
// and when the sidecar is asked to stop; after wait, it answers what
// LeaseView would (503 while still claiming or waiting).
//
// Nothing here decides anything: it is LeaseView asked again at each change
// of phase, so its answers are LeaseView's, checked against the monotonic
// clock the same way.
func (r *Runner) LeaseWait(ctx context.Context, wait time.Duration) Outcome {
	deadline := time.Now().Add(min(wait, MaxLeaseWait))
	for {
		r.mu.Lock()
		o := r.leaseViewLocked()
		moving := o.Answer != Done && r.movingOnLocked()
		changed := r.changed
		r.mu.Unlock()
		left := time.Until(deadline)
		if !moving || left <= 0 || ctx.Err() != nil || r.stopping() {
			return o
		}
		t := time.NewTimer(left)
		select {
		case <-changed:
		case <-t.C:
		case <-ctx.Done():
		case <-r.stop:
		}
		t.Stop()
	}
}

// movingOnLocked: the phase is one the sidecar leaves by itself, without a
// request (call with mu held, after currentLocked).
func (r *Runner) movingOnLocked() bool {
	draining := r.Draining()
	switch r.phase {
	case Claiming, Waiting, Completing:
		return true
	case Completed:
		return draining && !r.drained
	case Released:
		return draining
	case Lost:
		return draining && r.cfg.OnLoss == "none"
	}
	return false
}

// CompleteNext is POST /v1/complete?next=S for a sidecar draining a queue
// (docs/sidecar.md, "The next item in the completion's answer"): the
// completion first, decided and answered exactly as Complete answers it;
// only when it is Done does the same answer also carry the lease as
// LeaseWait(wait) finds it then: the next item held (its token files written
// before, as for GET /v1/lease), the queue drained, or, the wait run out,
// still claiming or waiting. A completion refused, unsettled or failed gets
// Complete's answer alone and claims nothing for this request: the claim
// loop goes on as it would without next, and GET /v1/lease?wait=S finds its
// outcome.
func (r *Runner) CompleteNext(ctx context.Context, token int64, result any, wait time.Duration) Outcome {
	o := r.Complete(token, result)
	if o.Err != nil || o.Answer != Done {
		return o
	}
	next := r.LeaseWait(ctx, wait)
	o.Next = &next
	return o
}

// Draining: a sidecar in queue mode without JOBLEASE_ITEM, the only one that
// claims a next item (and so the only one that takes next=S).
func (r *Runner) Draining() bool { return r.cfg.Queue != nil && r.cfg.Item == "" }
