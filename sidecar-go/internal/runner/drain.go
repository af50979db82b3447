package runner

import (
	"context"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/joblease/joblease/sidecar-go/internal/errs"
	"github.com/joblease/joblease/sidecar-go/internal/protocol"
)

// A draining sidecar (JOBLEASE_QUEUE without JOBLEASE_ITEM; docs/sidecar.md,
// "Queue mode") holds one item at a time, as a job sidecar holds its job:
// the same token files, API answers and loss handling per item. When the
// worker completes or releases the item (or its lease is lost, unless
// on-loss is "exit"), the sidecar claims the next one; while none is claimable it waits
// on a watch of the queue (phase "waiting"), never a poll. With
// JOBLEASE_EXIT_WHEN_EMPTY the wait ends once no item is pending or held:
// the final answer "completed" with exit code 0, as for a job completed
// before its claim.

// emptyWait bounds one wait on the queue's watch; after it the claim reads again.
const emptyWait = 10 * time.Minute

func (r *Runner) drain() (int, bool) {
	for {
		lease, code := r.claimNext()
		if lease == nil {
			r.dropAhead() // a stop found an item claimed ahead: never served, given back
			return r.final(code)
		}
		r.held(lease)
		if r.hold(lease) || !r.nextItem() {
			r.dropAhead()
			return 0, false
		}
	}
}

// claimNext claims the queue's next item, waiting while there is none: a
// lease, or (nil, exit code) for a final answer (0: drained, or stopped).
func (r *Runner) claimNext() (*protocol.Lease, int) {
	cfg := r.cfg
	queue := *cfg.Queue
	registrationDeadline := time.Now().Add(time.Duration(cfg.RegistrationWait * float64(time.Second)))
	r.mu.Lock()
	ahead := r.ahead
	r.ahead = nil
	r.mu.Unlock()
	if ahead != nil {
		r.Metrics.Inc(r.Metrics.ClaimAttempts)
		if r.stopping() {
			// never served (no token file, no answer named it): given back
			// by the caller (dropAhead), whatever release-on-term says
			r.mu.Lock()
			r.ahead = ahead
			r.mu.Unlock()
			return nil, 0
		}
		return ahead, 0
	}
	for attempt := 0; !r.stopping(); attempt++ {
		r.Metrics.Inc(r.Metrics.ClaimAttempts)
		lease, miss, err := r.client.ClaimNext(r.ctx, queue, cfg.Owner)
		if r.stopping() {
			if lease != nil {
				r.held(lease) // Shutdown releases it (release-on-term) and removes its files
			}
			return nil, 0
		}
		if err == nil && lease != nil {
			return lease, 0
		}
		if err == nil {
			if miss.Empty && cfg.ExitWhenEmpty {
				r.mu.Lock()
				r.drained = true
				r.setPhase(Completed)
				r.mu.Unlock()
				r.log.Info("queue drained: no item pending or held; nothing left to do", "queue", queue.String())
				return nil, 0
			}
			r.waitingFor(miss.Revision, func(ctx context.Context) (bool, error) {
				return r.client.WaitForClaimable(ctx, queue, miss.Revision, emptyWait)
			})
			attempt = -1
			continue
		}
		e, ok := errs.As(err)
		if !ok {
			e = errs.Generic(err.Error())
		}
		switch e.Kind {
		case errs.KindFull:
			if r.waitForSlot(e) {
				attempt = -1
				continue
			}
		case errs.KindSuspended:
			r.log.Info("queue suspended; waiting for it to be resumed", "queue", queue.String())
			if r.waitingFor(e.Revision, func(ctx context.Context) (bool, error) {
				return r.client.WaitForResume(ctx, queue, e.Revision, suspendedWait)
			}) {
				attempt = -1
				continue
			}
		case errs.KindNotRegistered:
			if !time.Now().Before(registrationDeadline) {
				r.log.Error("queue does not exist", "queue", queue.String(), "waited", cfg.RegistrationWait, "exitCode", e.ExitCode)
				return nil, r.failed(e, r.notRegisteredMessage(e))
			}
			r.log.Info("queue does not exist yet; waiting", "queue", queue.String())
		case errs.KindUnavailable, errs.KindOutcomeUnknown, errs.KindClaimOutcomeUnknown:
			r.log.Warn("etcd unavailable; retrying", "reason", e.Message)
		case errs.KindLost:
			r.log.Warn("the claim committed but its lease was already gone; claiming again", "reason", e.Message)
		default:
			r.log.Error("cannot claim", "reason", e.Message, "exitCode", e.ExitCode)
			return nil, r.failed(e, fmt.Sprintf("cannot claim an item of queue %s: %s", queue, e.Message))
		}
		r.sleepOrStop(time.Duration(cfg.Backoff.Delay(attempt, rand.Float64()) * float64(time.Second)))
	}
	return nil, 0
}

// dropAhead gives back an item claimed ahead that the drain will not serve
// (the sidecar is stopping, or stays lost): its holder must not live on
// with the session. The drain calls it when it stops, and Shutdown again
// once no operation is in flight: a completion answered after the drain
// had stopped (a worker completing as the stop came) may have claimed one.
func (r *Runner) dropAhead() {
	r.mu.Lock()
	ahead := r.ahead
	r.ahead = nil
	r.mu.Unlock()
	if ahead != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := ahead.Release(ctx); err != nil {
			r.log.Warn("could not give back the item claimed with the last completion", "job", ahead.Job.String(),
				"reason", err.Error())
		}
	}
}

// waitingFor runs wait in phase "waiting" (readiness 503, GET /v1/lease 503
// "waiting for an item"), ended at once by a stop; true if it woke for a change.
func (r *Runner) waitingFor(revision int64, wait func(context.Context) (bool, error)) bool {
	r.mu.Lock()
	if r.phase != Waiting || r.full != nil {
		r.log.Info("waiting for an item", "queue", r.cfg.Queue.String(), "revision", revision)
	}
	r.full = nil
	r.setPhase(Waiting)
	r.mu.Unlock()
	ctx, cancel := r.stopCtx()
	defer cancel()
	woke, err := wait(ctx)
	if err != nil {
		r.log.Debug("watch of the queue ended", "queue", r.cfg.Queue.String(), "reason", err.Error())
	}
	return woke && !r.stopping()
}

// nextItem: the held item ended; settle it and get ready to claim the next.
// False when the sidecar must stay in its state (stopping; lost with on-loss
// "exit", which ends the sidecar). A lost item with on-loss "signal" ends that
// item, not the draining: its worker was signalled (its late effects and its
// completion are refused under the item's token), and the next item is
// claimed. Staying lost instead left a Deployment's pod useless for good: the
// restarted worker found 409 "lost", exited, and was restarted again, while
// nothing restarts a sidecar that is alive (tests/cluster/test_pod_chaos.py).
func (r *Runner) nextItem() bool {
	// A completion whose outcome the lease's end left open is settled first:
	// its answer is the worker's, and the next item must not hide it.
	for attempt := 0; r.PhaseNow() == Completing && !r.stopping(); attempt++ {
		r.opMu.Lock()
		r.settle()
		r.opMu.Unlock()
		if r.PhaseNow() == Completing {
			r.sleepOrStop(time.Duration(r.cfg.Backoff.Delay(attempt, rand.Float64()) * float64(time.Second)))
		}
	}
	// The operation that ended the lease (a completion, a release) finishes
	// before the phase is read: it holds opMu until its answer is recorded.
	r.opMu.Lock()
	defer r.opMu.Unlock()
	r.mu.Lock()
	defer r.mu.Unlock()
	phase := r.currentLocked()
	if r.stopping() || (phase == Lost && r.cfg.OnLoss == "exit") || phase == Completing {
		return false
	}
	if r.lease != nil {
		ended := &endedItem{token: r.lease.Token, released: phase == Released}
		if phase == Completed && r.result != nil {
			res := *r.result
			ended.result = &res
		}
		r.last = ended
	}
	r.log.Info("item ended; claiming the next", "job", r.nameLocked(), "state", string(phase))
	r.lease, r.item, r.result = nil, nil, nil
	r.lostReason, r.endReason, r.failure = "", "", nil
	r.completionSent, r.releaseSent = false, false
	r.setPhase(Claiming)
	return true
}
