package runner

import (
	"context"
	"time"

	"github.com/joblease/joblease/sidecar-go/internal/errs"
	"github.com/joblease/joblease/sidecar-go/internal/protocol"
)

// A claim refused for want of a semaphore slot (docs/semaphores.md,
// "Waiting") waits in phase "waiting" (readiness 503, GET /v1/lease 503
// "waiting for a slot: ..."), as claim_waiting does: a job's sidecar gets in
// line once (a ticket: waiter keys in every semaphore its job needs, in one
// transaction, bound to a session of its own) and claims only when first; a
// queue's sidecar (one item, or draining) waits without a place in line, as
// joblease.queue's claimers do. Between tries it waits on a watch of the
// semaphores (a slot or a waiter deleted, the limit changed), never a poll:
// one watch per semaphore for the whole waiting phase (protocol.SlotWatch),
// opened at the first wait and kept across the retries, so a wake-up never
// waits for etcd's catch-up of a watch opened from a past revision.

// waitForSlot waits after the refusal full; true when a change came (claim
// again at once), false to claim again after the usual backoff.
func (r *Runner) waitForSlot(full *errs.Error) bool {
	var uses []protocol.SemaphoreUse
	var ttl int64
	var err error
	namespace := r.cfg.Job.Namespace
	if r.cfg.Queue == nil {
		if r.ticket != nil && !r.ticket.Alive() {
			// Its session was lost (etcd away, the sidecar paused past its
			// TTL): the waiter keys expire with it, so the place is gone; get
			// in line again, at the back, rather than claim as if still first.
			r.log.Warn("lost its place in line for a semaphore slot; getting in line again", "job", r.name())
			r.leaveLine()
		}
		if r.ticket == nil {
			t, err := r.client.TakeTicket(r.ctx, r.cfg.Job, r.cfg.Owner)
			if err != nil {
				r.log.Warn("could not get in line for a semaphore slot; retrying", "job", r.name(), "reason", err.Error())
				return false
			}
			r.ticket = t
			r.log.Info("in line for a semaphore slot", "job", r.name(), "ticket", t.Revision)
		}
		uses, ttl, err = r.client.SemaphoresOf(r.ctx, r.cfg.Job)
	} else {
		namespace = r.cfg.Queue.Namespace
		uses, ttl, err = r.client.QueueSemaphores(r.ctx, *r.cfg.Queue)
	}
	if err != nil {
		return false // the next claim says what is wrong
	}
	r.mu.Lock()
	if r.phase != Waiting || r.full == nil {
		r.log.Info("waiting for a semaphore slot", append(objArgs(full.Details), "revision", full.Revision)...)
	}
	r.full = full
	if r.slotWaitSince.IsZero() {
		r.slotWaitSince = time.Now()
	}
	r.setPhase(Waiting)
	r.mu.Unlock()
	ctx, cancel := r.stopCtx()
	defer cancel()
	if t := r.ticket; t != nil {
		go func() {
			select {
			case <-t.Lost(): // the place in line is gone: stop waiting for it
				cancel()
			case <-ctx.Done():
			}
		}()
	}
	if r.slotWatch == nil || !r.slotWatch.Serves(r.client.Root, namespace, uses) {
		r.endSlotWatch()
		w, err := r.client.WatchSlots(r.ctx, namespace, uses)
		if err != nil || w == nil {
			return false // the next claim says what is wrong
		}
		r.slotWatch = w
		if w.From() > full.Revision {
			// Written since the refusal (this sidecar's own ticket, at least):
			// a change in between is one the watch does not send, so claim
			// again, planned from a read the watch is not older than.
			return !r.stopping()
		}
	}
	// Each wait is capped at the TTL: a missed wake-up costs at most that.
	woke, err := r.slotWatch.Wait(ctx, full.Revision, time.Duration(max(ttl, 1))*time.Second)
	if err != nil {
		r.log.Debug("watch of the semaphores ended", "reason", err.Error())
		r.endSlotWatch() // the next wait opens another
	}
	return (woke || (r.ticket != nil && !r.ticket.Alive())) && !r.stopping()
}

// endSlotWatch closes the waiting phase's watch of the semaphores, if any.
func (r *Runner) endSlotWatch() {
	if r.slotWatch != nil {
		r.slotWatch.Close()
		r.slotWatch = nil
	}
}

// leaveLine gives up the place in line (its waiter keys go with its session)
// and ends the wait's watch.
func (r *Runner) leaveLine() {
	r.endSlotWatch()
	if r.ticket == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	r.ticket.Close(ctx)
	r.ticket = nil
}

// slotsJSON is the lease's slots as Lease.to_dict's "semaphores".
func slotsJSON(lease *protocol.Lease) []any {
	out := make([]any, 0, len(lease.Slots))
	for _, g := range lease.Slots {
		out = append(out, g.Dict())
	}
	return out
}

// detail is the value of a protocol error's detail key (nil: none).
func detail(e *errs.Error, key string) any {
	for _, kv := range e.Details {
		if kv.Key == key {
			return kv.Value
		}
	}
	return nil
}
