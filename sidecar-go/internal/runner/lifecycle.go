package runner

import (
	"context"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/joblease/joblease/sidecar-go/internal/errs"
	"github.com/joblease/joblease/sidecar-go/internal/protocol"
	"github.com/joblease/joblease/sidecar-go/internal/pyjson"
)

// name is what the sidecar works on, for logs (nameLocked without the lock held).
func (r *Runner) name() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.nameLocked()
}

// claimOnce is one claim of this sidecar's job, or of its one queue item
// (created first for a CronJob slot).
func (r *Runner) claimOnce() (*protocol.Lease, error) {
	switch {
	case r.cfg.Queue == nil:
		if r.ticket != nil && !r.ticket.Alive() {
			// Its waiter keys expire with its session: a claim with it could
			// pass for first in line, or never pass its compares at all.
			r.log.Warn("lost its place in line for a semaphore slot", "job", r.name())
			r.leaveLine()
		}
		return r.client.ClaimInLine(r.ctx, r.cfg.Job, r.cfg.Owner, r.ticket)
	case r.cfg.ItemCreate:
		return r.client.ClaimOrCreateItem(r.ctx, *r.item, r.cfg.Owner)
	}
	return r.client.ClaimItem(r.ctx, *r.item, r.cfg.Owner)
}

// holderKey is the holder key of the job or item being claimed.
func (r *Runner) holderKey() string {
	if r.cfg.Queue != nil {
		return protocol.QueueKeysOf(r.client.Root, *r.cfg.Queue).Item(r.cfg.Item).Holder()
	}
	return protocol.Keys(r.client.Root, r.cfg.Job).Holder()
}

// suspendedWait: how long one wait for a suspended queue's spec to change
// lasts before the claim looks again (the watch wakes it at once on a change).
const suspendedWait = time.Minute

// claim with backoff: a lease, or the exit code of a final answer (0 if the
// job or item is already completed; the phase is then completed or failed),
// or 0 when stopped while claiming.
func (r *Runner) claim() (*protocol.Lease, int) {
	defer r.leaveLine()
	cfg := r.cfg
	registrationDeadline := time.Now().Add(time.Duration(cfg.RegistrationWait * float64(time.Second)))
	for attempt := 0; !r.stopping(); attempt++ {
		r.Metrics.Inc(r.Metrics.ClaimAttempts)
		lease, err := r.claimOnce()
		if err == nil {
			return lease, 0
		}
		if r.stopping() {
			return nil, 0 // stopped while claiming: the failure is the shutdown's, not etcd's
		}
		e, ok := errs.As(err)
		if !ok {
			e = errs.Generic(err.Error())
		}
		details := func() []any { return objArgs(e.Details) }
		switch e.Kind {
		case errs.KindCompleted:
			var owner, token any
			for _, kv := range e.Details {
				switch kv.Key {
				case "owner":
					owner = kv.Value
				case "token":
					token = kv.Value
				}
			}
			r.log.Info("job already completed; nothing to do", "job", r.name(), "completedBy", owner, "token", token)
			st := r.readState()
			r.mu.Lock()
			if st != nil {
				r.result = st.Result
			}
			r.completedBeforeClaim = true
			r.setPhase(Completed)
			r.mu.Unlock()
			return nil, 0
		case errs.KindExhausted:
			r.log.Error("job has no attempts left", append(details(), "exitCode", e.ExitCode)...)
			return nil, r.failed(e, e.Message)
		case errs.KindNotRegistered:
			if !time.Now().Before(registrationDeadline) {
				r.log.Error("job is not registered", "job", r.name(), "waited", cfg.RegistrationWait, "exitCode", e.ExitCode)
				return nil, r.failed(e, r.notRegisteredMessage(e))
			}
			r.log.Info("job not registered yet; waiting", "job", r.name())
		case errs.KindSuspended:
			r.log.Info("queue suspended; waiting for it to be resumed", "queue", cfg.Queue.String())
			ctx, cancel := r.stopCtx()
			woke, _ := r.client.WaitForResume(ctx, *cfg.Queue, e.Revision, suspendedWait)
			cancel()
			if woke && !r.stopping() {
				attempt = -1
				continue
			}
		case errs.KindHeld:
			var holder, token, gen any
			for _, kv := range e.Details {
				switch kv.Key {
				case "owner":
					holder = kv.Value
				case "token":
					token = kv.Value
				case "generation":
					gen = kv.Value
				}
			}
			r.log.Info("job held by another owner; backing off", "holder", holder, "token", token, "generation", gen)
			// Wake when the holder key changes (released, expired), not a backoff
			// later; the backoff stays the longest wait, and a little jitter keeps
			// the waiters of one job from claiming in lock step.
			if r.waitForKeyChange(r.holderKey(), e.Revision, time.Duration(cfg.Backoff.Delay(attempt, rand.Float64())*float64(time.Second))) {
				r.sleepOrStop(time.Duration(cfg.Backoff.Initial / 2 * rand.Float64() * float64(time.Second)))
			}
			continue
		case errs.KindFull:
			if r.waitForSlot(e) {
				attempt = -1
				continue
			}
		case errs.KindUnavailable, errs.KindOutcomeUnknown, errs.KindClaimOutcomeUnknown:
			r.log.Warn("etcd unavailable; retrying", "reason", e.Message)
		case errs.KindLost:
			r.log.Warn("the claim committed but its lease was already gone; claiming again", "reason", e.Message)
		default:
			r.log.Error("cannot claim", "reason", e.Message, "exitCode", e.ExitCode)
			return nil, r.failed(e, fmt.Sprintf("cannot claim %s: %s", r.what(), e.Message))
		}
		r.sleepOrStop(time.Duration(cfg.Backoff.Delay(attempt, rand.Float64()) * float64(time.Second)))
	}
	return nil, 0
}

// what the claim is of, in a failure message: "job ns/name", "item ns/queue/id", "queue ns/queue".
func (r *Runner) what() string {
	switch {
	case r.cfg.Queue == nil:
		return "job " + r.cfg.Job.String()
	case r.cfg.Item != "":
		return "item " + r.cfg.Name()
	}
	return "queue " + r.cfg.Queue.String()
}

func (r *Runner) notRegisteredMessage(e *errs.Error) string {
	wait := pyG(r.cfg.RegistrationWait)
	switch {
	case hasDetail(e, "semaphore"):
		return fmt.Sprintf("%s (waited %s s): is there a JobSemaphore of that name in this namespace?", e.Message, wait)
	case r.cfg.Queue == nil:
		return fmt.Sprintf("job %s is not registered (waited %s s): is there a JobLease of that name in this namespace?",
			r.cfg.Job, wait)
	case hasDetail(e, "item"):
		return fmt.Sprintf("%s (waited %s s): was it enqueued?", e.Message, wait)
	}
	return fmt.Sprintf("%s (waited %s s): is there a queue of that name in this namespace?", e.Message, wait)
}

func hasDetail(e *errs.Error, key string) bool {
	for _, kv := range e.Details {
		if kv.Key == key {
			return true
		}
	}
	return false
}

// waitForKeyChange: did key (a holder, a queue's spec) change after revision
// within timeout? A stop request ends the wait at once (false); so does a
// watch error (false, logged at debug: the next claim reports what is wrong).
func (r *Runner) waitForKeyChange(key string, revision int64, timeout time.Duration) bool {
	ctx, cancel := context.WithCancel(r.ctx)
	defer cancel() // also ends the watch stream
	go func() {
		select {
		case <-r.stop:
			cancel()
		case <-ctx.Done():
		}
	}()
	changed, err := r.client.WaitForKeyChange(ctx, key, revision, timeout)
	if err != nil {
		r.log.Debug("watch ended", "key", key, "reason", err.Error())
	}
	return changed && !r.stopping()
}

// stopCtx is r.ctx, also ended by a stop request (the waits of a draining
// sidecar end at once on SIGTERM).
func (r *Runner) stopCtx() (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(r.ctx)
	go func() {
		select {
		case <-r.stop:
			cancel()
		case <-ctx.Done():
		}
	}()
	return ctx, cancel
}

func pyG(f float64) string { return fmt.Sprintf("%g", f) }

func objArgs(o pyjson.Obj) []any {
	out := make([]any, 0, 2*len(o))
	for _, kv := range o {
		out = append(out, kv.Key, kv.Value)
	}
	return out
}

// failed: the claim was refused for good; returns the exit code.
func (r *Runner) failed(e *errs.Error, message string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.failure = append(pyjson.Obj{{Key: "error", Value: "failed"}, {Key: "reason", Value: e.Reason},
		{Key: "message", Value: message}, {Key: "exitCode", Value: e.ExitCode}}, e.Details...)
	r.setPhase(Failed)
	return e.ExitCode
}

// lifecycle claims, then holds until the lease ends (a draining sidecar:
// item after item, drain.go). It returns an exit code and true when the
// sidecar must exit now.
func (r *Runner) lifecycle() (int, bool) {
	if r.cfg.Queue != nil && r.cfg.Item == "" {
		return r.drain()
	}
	lease, code := r.claim()
	if lease == nil {
		return r.final(code)
	}
	r.held(lease)
	r.hold(lease)
	return 0, false
}

// final: the claim ended without a lease (a final answer, or a stop).
func (r *Runner) final(code int) (int, bool) {
	if r.stopping() || r.cfg.OnFinal == "exit" {
		return code, true
	}
	r.log.Info("serving the final answer until stopped", "job", r.name(), "state", string(r.PhaseNow()), "exitCode", code)
	return 0, false
}

// hold waits until the lease ends (completed, released, lost, expired) or a
// stop is requested (true).
func (r *Runner) hold(lease *protocol.Lease) bool {
	for {
		remaining := lease.Remaining()
		if lease.State() != protocol.Held || remaining <= 0 {
			break
		}
		t := time.NewTimer(remaining)
		select {
		case <-lease.Done():
		case <-lease.Session().Lost():
		case <-t.C:
		case <-r.stop:
			t.Stop()
			return true
		}
		t.Stop()
	}
	r.mu.Lock()
	if lease.State() == protocol.LostState {
		reason := lease.LostReason()
		if reason == "" {
			reason = "lease lost"
		}
		r.leaseEndedLocked(reason)
	}
	r.mu.Unlock()
	return false
}

// End is how the claim and hold ended: ExitNow says the sidecar must exit at
// once with Code (a final answer with --on-final exit, or a stop while
// claiming); otherwise it keeps serving its final answer until stopped.
type End struct {
	Code    int
	ExitNow bool
}

// Lifecycle runs the claim and hold; done receives how it ended.
func (r *Runner) Lifecycle(done chan<- End) {
	code, exitNow := r.lifecycle()
	done <- End{Code: code, ExitNow: exitNow}
}

// Stopped is closed once a stop was requested.
func (r *Runner) Stopped() <-chan struct{} { return r.stop }

// ExitCode set by an on-loss exit, if any.
func (r *Runner) ExitCode() (int, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.exitCode == nil {
		return 0, false
	}
	return *r.exitCode, true
}

// Shutdown gives back an item claimed ahead (dropAhead), releases a held
// lease (with release-on-term), removes the token files and closes the client.
func (r *Runner) Shutdown() {
	r.opMu.Lock()
	r.dropAhead() // never served: given back whatever release-on-term says
	r.mu.Lock()
	phase := r.currentLocked()
	lease := r.lease
	r.mu.Unlock()
	if phase == Completing {
		var token any
		if lease != nil {
			token = lease.Token
		}
		r.log.Warn("stopping before etcd could say whether the completion committed", "job", r.name(),
			"reason", r.endReason, "token", token)
	}
	if phase == HeldPhase && lease != nil && r.cfg.ReleaseOnTerm {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		err := lease.Release(ctx)
		cancel()
		r.mu.Lock()
		if err == nil {
			r.log.Info("lease released on shutdown", "token", lease.Token)
			r.setPhase(Released)
		} else {
			r.log.Warn("release on shutdown failed", "reason", err.Error())
		}
		r.mu.Unlock()
	}
	r.mu.Lock()
	r.dropTokenFiles()
	if r.phase == HeldPhase || r.phase == Completing {
		r.setPhase(Stopping)
	}
	r.mu.Unlock()
	r.opMu.Unlock()
	r.cancel()
}

// CloseClient stops renewing (revoking with release-on-term) and closes etcd connections.
func (r *Runner) CloseClient() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	r.client.Close(ctx, r.cfg.ReleaseOnTerm)
}
