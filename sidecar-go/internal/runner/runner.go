// Package runner is the sidecar's life (joblease.sidecar.runner): claim with
// backoff, hold, notice loss, act, shut down; and the operations the HTTP
// API calls, answered in the protocol's terms (Answer; package api alone
// turns them into HTTP statuses). Every API call asks Current, which re-checks a held lease
// against the monotonic clock synchronously before answering, so a sidecar
// paused past its deadline answers "lost" on the first request after it
// resumes. Loss is one-way: token files removed, the worker signalled (or the
// sidecar exits), and no request is sent to etcd under the old token again.
//
// A completion ends the lease too (it deletes the holder key): when the lease
// ends while a completion of ours is in flight, the phase is "completing" and
// the job's result decides between completed and lost.
package runner

import (
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/joblease/joblease/sidecar-go/internal/config"
	"github.com/joblease/joblease/sidecar-go/internal/errs"
	"github.com/joblease/joblease/sidecar-go/internal/metrics"
	"github.com/joblease/joblease/sidecar-go/internal/protocol"
	"github.com/joblease/joblease/sidecar-go/internal/pyjson"
	"github.com/joblease/joblease/sidecar-go/internal/startup"
	"github.com/joblease/joblease/sidecar-go/internal/tracing"
)

// Phase of the sidecar.
type Phase string

const (
	Claiming   Phase = "claiming"
	HeldPhase  Phase = "held"
	Completing Phase = "completing"
	Lost       Phase = "lost"
	Completed  Phase = "completed"
	Failed     Phase = "failed"
	Released   Phase = "released"
	Stopping   Phase = "stopping"
	// Waiting: draining a queue, nothing claimable now; a watch wakes the claim.
	Waiting Phase = "waiting"
)

// Answer is what an operation's outcome means, in the protocol's terms; only
// package api turns it into an HTTP status.
type Answer int

const (
	// Done: what was asked is so (completed, checkpointed, released, held).
	Done Answer = iota
	// NotYet: nothing to answer with yet (still claiming, not ready); ask again.
	NotYet
	// Unsettled: etcd cannot say yet whether the operation took effect; retry it.
	Unsettled
	// Refused: the lease's state refuses it (stale token, lost, completed,
	// released, completing, failed); the body says which.
	Refused
	// BadInput: the request is malformed; nothing was sent to etcd.
	BadInput
	// TooLarge: the request's payload is over its limit; nothing was sent.
	TooLarge
)

// Outcome is what an API operation yields: its answer and JSON body, or a
// protocol error (which carries its own body, exit code and HTTP status).
type Outcome struct {
	Answer Answer
	Body   pyjson.Obj
	Err    *errs.Error
	// Next: a completion asked with next=S (CompleteNext) that was Done also
	// answers with the lease as it is once the next item is held or the wait
	// ended (LeaseWait's outcome); nil otherwise.
	Next *Outcome
}

// Runner owns the lease and the sidecar's phase.
type Runner struct {
	cfg     config.Config
	client  *protocol.Client
	Metrics *metrics.Metrics
	log     *slog.Logger

	mu                   sync.Mutex // phase and everything below
	phase                Phase
	lease                *protocol.Lease
	lostReason           string
	result               *protocol.Result
	completedBeforeClaim bool
	failure              pyjson.Obj
	gateOpened           bool
	lossFoundNoWorker    bool
	completionSent       bool
	releaseSent          bool
	endReason            string
	exitCode             *int
	settling             bool
	// Queue mode: item is the item claimed or being claimed (nil while a
	// draining sidecar has none); drained: the queue had nothing left to
	// claim (JOBLEASE_EXIT_WHEN_EMPTY), a final answer like an already
	// completed job; last: how the previous item of a draining sidecar
	// ended, so a retried request under its token gets the same answer.
	item    *protocol.ItemRef
	drained bool
	last    *endedItem
	// ahead: the next item, claimed by the completion of the one before in
	// the same transaction (protocol.CompleteAndClaimNext), not yet served
	ahead *protocol.Lease
	// Semaphores (slots.go): full is the refusal a claim waits on in phase
	// "waiting" (nil: waiting for an item); ticket is a job sidecar's place in
	// line; slotWatch the waiting phase's watch of the semaphores.
	full      *errs.Error
	ticket    *protocol.Ticket
	slotWatch *protocol.SlotWatch
	// slotWaitSince: when the claim now waiting for slots was first refused for
	// them (zero: not waiting); the wait is counted in the metrics at the grant.
	slotWaitSince time.Time
	// changed is closed (and replaced) at every change of phase: what a
	// GET /v1/lease?wait=... waits on (leasewait.go).
	changed chan struct{}
	trace   tenureTrace // opt-in spans of the tenure held (tracing.go)
	// timeline: the start's steps, logged at debug level once first held (SetTimeline).
	timeline *startup.Timeline

	opMu     sync.Mutex // one API operation at a time (the Python _op_lock)
	stop     chan struct{}
	stopOnce sync.Once
	ctx      context.Context
	cancel   context.CancelFunc
}

// New runner for cfg over client.
func New(cfg config.Config, client *protocol.Client, log *slog.Logger) *Runner {
	ctx, cancel := context.WithCancel(context.Background())
	r := &Runner{cfg: cfg, client: client, Metrics: metrics.New(), log: log, phase: Claiming,
		changed: make(chan struct{}), stop: make(chan struct{}), ctx: ctx, cancel: cancel}
	if cfg.Queue != nil && cfg.Item != "" {
		r.item = &protocol.ItemRef{Queue: *cfg.Queue, ID: cfg.Item}
	}
	return r
}

// Config of the runner.
func (r *Runner) Config() config.Config { return r.cfg }

// SetTimeline gives the runner the start's timeline (main's steps, the
// store's, the client's); the first lease held ends it with one debug line.
func (r *Runner) SetTimeline(t *startup.Timeline) {
	r.timeline = t
	r.client.Timeline = t
}

// setPhase (with mu held) also wakes the requests waiting for a change (LeaseWait).
func (r *Runner) setPhase(p Phase) {
	r.phase = p
	r.Metrics.SetState(string(p))
	r.tracePhaseLocked(p)
	close(r.changed)
	r.changed = make(chan struct{})
}

// Current is the phase after re-checking a held lease against the monotonic clock.
func (r *Runner) Current() Phase {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.currentLocked()
}

func (r *Runner) currentLocked() Phase {
	if r.phase == HeldPhase && r.lease != nil {
		if r.lease.State() != protocol.Held || !r.lease.Valid() {
			reason := r.lease.LostReason()
			if reason == "" {
				reason = "lease no longer valid"
			}
			r.leaseEndedLocked(reason)
		}
	}
	return r.phase
}

// PhaseNow without re-checking (what /readyz reports beside its verdict).
func (r *Runner) PhaseNow() Phase {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.phase
}

// EndMessage says why the lease is not held in the final states that have a
// reason (lost: etcd's reason, e.g. its refusal of a revoked credential;
// failed: the claim's refusal), "" otherwise: /readyz's "message", so a
// probe failure names a credential problem without a call to /v1/lease.
func (r *Runner) EndMessage() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	switch r.currentLocked() {
	case Lost:
		return "the lease was lost: " + r.lostReason
	case Failed:
		for _, kv := range r.failure {
			if m, ok := kv.Value.(string); ok && kv.Key == "message" {
				return m
			}
		}
	}
	return ""
}

// Remaining local safety seconds (0 unless held).
func (r *Runner) Remaining() float64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.currentLocked() == HeldPhase && r.lease != nil {
		return r.lease.Remaining().Seconds()
	}
	return 0
}

// Ready is /readyz: should the worker run now? While held, yes; in a final
// state reached before /readyz ever said yes, also yes when the worker must
// start to learn the outcome (already completed, refused for good, lost
// before there was a worker to signal): a startup probe that never passes
// would hang the pod.
func (r *Runner) Ready() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	phase := r.currentLocked()
	ok := phase == HeldPhase || (!r.gateOpened && (phase == Failed ||
		(phase == Completed && (r.completedBeforeClaim || r.drained)) || (phase == Lost && r.lossFoundNoWorker)))
	if ok {
		r.gateOpened = true
	}
	return ok
}

func (r *Runner) held(lease *protocol.Lease) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.lease = lease
	if lease.Item != nil {
		r.item = lease.Item
	}
	r.setPhase(HeldPhase)
	r.endSlotWatch()
	r.Metrics.Inc(r.Metrics.Claims)
	if !r.slotWaitSince.IsZero() {
		r.Metrics.Inc(r.Metrics.SlotWaits)
		r.Metrics.Add(r.Metrics.SlotWaitSeconds, time.Since(r.slotWaitSince).Seconds())
		r.slotWaitSince = time.Time{}
	}
	r.log.Info("lease held", "job", lease.Job.String(), "token", lease.Token, "generation", lease.Generation, "ttl", lease.TTL)
	// A claim that took longer than its TTL is already lost: check before
	// publishing anything, and again right before each file appears.
	if r.currentLocked() != HeldPhase {
		return
	}
	if r.cfg.TokenFile != "" {
		info, _ := pyjson.Spaced(r.withTraceparentLocked(tokenInfo(lease), lease.Token))
		stillHeld := func() bool { return r.currentLocked() == HeldPhase }
		// token.json first: whoever sees the token file finds its companion.
		ok, err := WriteAtomic(r.cfg.TokenJSONFile(), append(info, '\n'), stillHeld)
		if err == nil && ok {
			_, err = WriteAtomic(r.cfg.TokenFile, []byte(fmt.Sprintf("%d\n", lease.Token)), stillHeld)
		}
		if err != nil {
			r.log.Error("cannot write the token file", "path", r.cfg.TokenFile, "reason", err.Error())
		}
	}
	// The writes can be slow (a busy disk): if the deadline passed meanwhile, this removes what was published.
	r.currentLocked()
	r.timeline.Mark("token files")
	if steps, total := r.timeline.Close(); steps != nil {
		r.log.Debug("start timeline", "job", lease.Job.String(), "token", lease.Token, "totalMs", total, "steps", steps)
	}
}

// RemoveStaleFiles removes what an earlier incarnation of this sidecar may
// have left on the pod's volumes (a container restart keeps them): the token
// file, token.json, the port files and their half-written temporaries.
// Their token is a dead incarnation's, and another pod may hold the job by
// now, so main calls this before anything is served or claimed; an error
// (a file that stays) must stop the sidecar rather than leave the old token
// to a worker.
func (r *Runner) RemoveStaleFiles() error {
	return removeStale(r.cfg.TokenFile, r.cfg.TokenJSONFile(), r.cfg.PortFile, r.cfg.ProbePortFile)
}

// tokenInfo is token.json: for a queue item, "job" is "ns/queue/id" and
// "queue" and "item" replace "name".
func tokenInfo(lease *protocol.Lease) pyjson.Obj {
	head := pyjson.Obj{{Key: "job", Value: lease.Job.String()}, {Key: "namespace", Value: lease.Job.Namespace}}
	if lease.Item != nil {
		head = append(head, pyjson.KV{Key: "queue", Value: lease.Item.Queue.String()}, pyjson.KV{Key: "item", Value: lease.Item.ID})
	} else {
		head = append(head, pyjson.KV{Key: "name", Value: lease.Job.Name})
	}
	info := append(head, pyjson.KV{Key: "owner", Value: lease.Owner}, pyjson.KV{Key: "token", Value: lease.Token},
		pyjson.KV{Key: "generation", Value: lease.Generation}, pyjson.KV{Key: "ttl", Value: lease.TTL})
	if len(lease.Slots) > 0 {
		info = append(info, pyjson.KV{Key: "semaphores", Value: slotsJSON(lease)})
	}
	return info
}

// nameLocked is what the sidecar works on now, for logs: the job, or the
// item (the queue while a draining sidecar holds none).
func (r *Runner) nameLocked() string {
	if r.item != nil {
		return r.item.String()
	}
	return r.cfg.Name()
}

func (r *Runner) dropTokenFiles() {
	removeQuietly(r.cfg.TokenFile)
	removeQuietly(r.cfg.TokenJSONFile())
}

// leaseEndedLocked: the held lease is no longer valid. If a completion of
// ours may have committed, the job's result decides; otherwise this is loss.
func (r *Runner) leaseEndedLocked(reason string) {
	if r.phase != HeldPhase {
		return
	}
	if r.releaseSent {
		// The holder key our release deleted, or expiry while the release was
		// on its way: what the worker asked for is true either way.
		r.setPhase(Released)
		r.dropTokenFiles()
		r.log.Info("lease ended while its release was in flight", "job", r.nameLocked(), "reason", reason)
		return
	}
	if !r.completionSent {
		r.onLossLocked(reason, true)
		return
	}
	r.endReason = reason
	r.setPhase(Completing)
	r.dropTokenFiles()
	r.log.Info("lease ended while a completion may have committed; reading the result",
		"job", r.nameLocked(), "reason", reason, "token", r.lease.Token)
	if !r.settling {
		r.settling = true
		go r.settleUntilKnown()
	}
}

// onLossLocked flips to lost at once: files gone, worker signalled, maybe
// exit (not with act=false: the worker itself gave the job up).
func (r *Runner) onLossLocked(reason string, act bool) {
	if act && r.phase != HeldPhase && r.phase != Completing {
		return
	}
	if r.phase == Lost {
		return
	}
	r.lostReason = reason
	r.setPhase(Lost)
	r.dropTokenFiles()
	r.Metrics.Inc(r.Metrics.Losses)
	var token any
	if r.lease != nil {
		token = r.lease.Token
	}
	action := "none"
	if act {
		action = r.cfg.OnLoss
	}
	r.log.Warn("lease lost", "job", r.nameLocked(), "token", token, "reason", reason, "action", action)
	if !act {
		return
	}
	if r.cfg.OnLoss == "signal" || r.cfg.OnLoss == "exit" {
		pids := signalWorker(r.cfg.WorkerPidFile, r.cfg.WorkerProcessName)
		r.lossFoundNoWorker = len(pids) == 0
		if len(pids) > 0 {
			r.log.Warn("sent SIGTERM to the worker", "pids", pids)
		} else if r.cfg.OnLoss == "signal" {
			r.log.Warn("no worker process found to signal", "pidFile", r.cfg.WorkerPidFile,
				"workerProcessName", r.cfg.WorkerProcessName)
		}
	}
	if r.cfg.OnLoss == "exit" {
		code := r.cfg.LossExitCode
		r.exitCode = &code
		r.RequestStop("")
	}
}

func (r *Runner) completedLocked(lease *protocol.Lease, rec protocol.Result) Outcome {
	first := r.phase != Completed
	r.result = &rec
	r.completionSent = false
	r.setPhase(Completed)
	r.dropTokenFiles()
	if first {
		r.Metrics.Inc(r.Metrics.Completions)
		r.log.Info("job completed", "job", lease.Job.String(), "token", lease.Token, "generation", lease.Generation)
	}
	return answer(Done, rec.Dict())
}

// RequestStop asks the sidecar to shut down (SIGTERM, SIGINT, or exit on loss).
func (r *Runner) RequestStop(signame string) {
	r.stopOnce.Do(func() {
		if signame != "" {
			r.log.Info("stop requested", "signal", signame)
		}
		close(r.stop)
	})
}

func (r *Runner) stopping() bool {
	select {
	case <-r.stop:
		return true
	default:
		return false
	}
}

func (r *Runner) sleepOrStop(d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-r.stop:
	case <-t.C:
	}
}

// readState is the job's state per etcd (a read), or nil if unreadable.
func (r *Runner) readState() *protocol.JobState {
	ctx, cancel := context.WithTimeout(r.ctx, 3*time.Second)
	defer cancel()
	var st protocol.JobState
	var err error
	r.mu.Lock()
	item := r.item
	r.mu.Unlock()
	switch {
	case r.cfg.Queue == nil:
		st, err = r.client.ReadState(ctx, r.cfg.Job)
	case item != nil:
		st, err = r.client.ReadItemState(ctx, *item)
	default: // draining, between items: no item to read
		return nil
	}
	if err != nil {
		r.log.Info("could not read the job's state", "reason", err.Error())
		return nil
	}
	return &st
}

func ownResult(st *protocol.JobState, lease *protocol.Lease) *protocol.Result {
	if st.Result != nil && st.Result.ClaimID == lease.ClaimID && st.Result.Token == lease.Token {
		return st.Result
	}
	return nil
}

// settle decides a completing phase from etcd (call with opMu held, not mu):
// completed if the result carries our claim id, lost if the holder key is no
// longer ours without one; nil while etcd cannot say.
func (r *Runner) settle() *protocol.JobState {
	st := r.readState()
	if st == nil {
		return nil
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	lease := r.lease
	if r.phase != Completing || lease == nil {
		return st
	}
	if own := ownResult(st, lease); own != nil {
		r.completedLocked(lease, *own)
		return st
	}
	if st.HolderToken != 0 && st.HolderToken == lease.Token {
		return nil // still ours in etcd (its expiry is near): nothing decided yet
	}
	r.completionSent = false
	reason := r.endReason
	if reason == "" {
		reason = "lease ended"
	}
	r.onLossLocked(reason+"; the job has no result of ours", true)
	return st
}

func (r *Runner) settledAnswer(token int64, st *protocol.JobState) Outcome {
	r.mu.Lock()
	if r.phase == Completed && r.result != nil {
		o := answer(Done, r.result.Dict())
		r.mu.Unlock()
		return o
	}
	why := r.lostReason
	r.mu.Unlock()
	return r.stale(token, fmt.Sprintf("token %d is not current; the lease is lost: %s", token, why), st.Token(), true)
}

func (r *Runner) settleUntilKnown() {
	defer func() {
		r.mu.Lock()
		r.settling = false
		r.mu.Unlock()
	}()
	for attempt := 0; !r.stopping(); attempt++ {
		r.opMu.Lock()
		done := r.PhaseNow() != Completing || r.settle() != nil
		r.opMu.Unlock()
		if done {
			return
		}
		r.sleepOrStop(time.Duration(r.cfg.Backoff.Delay(attempt, rand.Float64()) * float64(time.Second)))
	}
}

// stale is 409 stale. current is the current token when known; otherwise it is read from etcd.
func (r *Runner) stale(token int64, message string, current int64, known bool) Outcome {
	r.Metrics.Inc(r.Metrics.StaleRejections)
	if !known {
		current = 0
		if st := r.readState(); st != nil {
			current = st.Token()
		}
	}
	var cur any
	if current != 0 {
		cur = current
	}
	r.log.Warn("refused a stale token", "token", token, "currentToken", cur, "why", message)
	return answer(Refused, pyjson.Obj{{Key: "error", Value: "stale"}, {Key: "message", Value: message},
		{Key: "token", Value: token}, {Key: "currentToken", Value: cur}, {Key: "state", Value: string(r.PhaseNow())}})
}

func (r *Runner) notCurrent(token int64, why string) Outcome {
	st := r.readState()
	r.mu.Lock()
	lease := r.lease
	if lease != nil && lease.Token == token && st != nil {
		if own := ownResult(st, lease); own != nil {
			o := r.completedLocked(lease, *own)
			r.mu.Unlock()
			return o
		}
	}
	r.mu.Unlock()
	var cur int64
	if st != nil {
		cur = st.Token()
	}
	if lease != nil && lease.Token == token && cur != token {
		// our own claim's completion, refused: count it against its tenure, as the
		// library's refused completer does (off the hot path: refused anyway)
		lease.RecordRefusedCompletion(r.ctx)
	}
	return r.stale(token, fmt.Sprintf("token %d is not current; %s", token, why), cur, true)
}

func answer(a Answer, body pyjson.Obj) Outcome { return Outcome{Answer: a, Body: body} }

func errOutcome(err error) Outcome {
	if e, ok := errs.As(err); ok {
		return Outcome{Err: e}
	}
	return Outcome{Err: errs.Generic(err.Error())}
}

func invalidOutcome(e *errs.Error) Outcome {
	if contains(e.Message, "too large") {
		return answer(TooLarge, e.Body())
	}
	return answer(BadInput, e.Body())
}

func contains(s, sub string) bool { return len(sub) <= len(s) && (s == sub || indexOf(s, sub) >= 0) }

func indexOf(s, sub string) int {
	for i := 0; i+len(sub) <= len(s); i++ {
		if s[i:i+len(sub)] == sub {
			return i
		}
	}
	return -1
}

func (r *Runner) whyNotHeld(phase Phase) string {
	why := "the lease is " + string(phase)
	if r.lostReason != "" {
		why += ": " + r.lostReason
	}
	return why
}

// Complete under token if and only if it is this sidecar's live token.
func (r *Runner) Complete(token int64, result any) (o Outcome) {
	defer r.traceOp(tracing.SpanComplete)(&o)
	r.opMu.Lock()
	defer r.opMu.Unlock()
	r.mu.Lock()
	phase := r.currentLocked()
	lease := r.lease
	if phase == Completed && lease != nil && lease.Token == token && r.result != nil {
		o := answer(Done, r.result.Dict()) // a retried completion
		r.mu.Unlock()
		return o
	}
	if r.last != nil && r.last.token == token && r.last.result != nil {
		o := answer(Done, r.last.result.Dict()) // a retried completion of the item before this one
		r.mu.Unlock()
		return o
	}
	if phase == Completing && lease != nil && lease.Token == token {
		r.mu.Unlock()
		if st := r.settle(); st != nil {
			return r.settledAnswer(token, st)
		}
		return answer(Unsettled, pyjson.Obj{{Key: "error", Value: "unknown"}, {Key: "state", Value: string(phase)},
			{Key: "message", Value: fmt.Sprintf("the lease ended while the completion under token %d was in flight "+
				"and etcd cannot say yet whether it committed; retry the same request", token)}})
	}
	if phase != HeldPhase || lease == nil {
		why := r.whyNotHeld(phase)
		r.mu.Unlock()
		return r.notCurrent(token, why)
	}
	if token != lease.Token {
		r.mu.Unlock()
		return r.stale(token, fmt.Sprintf("token %d is not the current token %d", token, lease.Token), lease.Token, true)
	}
	r.completionSent = true
	r.mu.Unlock()

	var rec protocol.Result
	var err error
	if r.Draining() {
		// the completion and, where it is safe, the claim of the next item in
		// one transaction (protocol.CompleteAndClaimNext); the drain loop takes
		// that item before it claims any (claimNext)
		var next *protocol.Lease
		rec, next, err = r.client.CompleteAndClaimNext(r.ctx, lease, result)
		if next != nil {
			r.mu.Lock()
			r.ahead = next
			r.mu.Unlock()
		}
	} else {
		rec, err = lease.Complete(r.ctx, result)
	}

	r.mu.Lock()
	if err == nil {
		o := r.completedLocked(lease, rec)
		r.mu.Unlock()
		return o
	}
	e, _ := errs.As(err)
	switch {
	case e != nil && e.Kind == errs.KindStale:
		r.completionSent = false
		r.onLossLocked("etcd refused the completion: "+e.Message, true)
		r.mu.Unlock()
		return r.stale(token, e.Message, e.CurrentToken(), true)
	case e != nil && e.Kind == errs.KindLost:
		r.completionSent = false
		r.onLossLocked(e.Message, true)
		r.mu.Unlock()
		return r.stale(token, e.Message, 0, false)
	case e != nil && e.Kind == errs.KindInvalid:
		r.completionSent = false
		r.mu.Unlock()
		return invalidOutcome(e)
	}
	// Unavailable, outcome unknown, permission denied...: the completion may
	// have committed. While the lease is held the same request may be retried
	// safely; if the lease ended meanwhile, the result decides.
	completing := r.currentLocked() == Completing
	r.mu.Unlock()
	if completing {
		if st := r.settle(); st != nil {
			return r.settledAnswer(token, st)
		}
	}
	return errOutcome(err)
}

// Checkpoint stores data under token if and only if it is this sidecar's live token.
func (r *Runner) Checkpoint(token int64, data any) (o Outcome) {
	defer r.traceOp(tracing.SpanCheckpoint)(&o)
	r.opMu.Lock()
	defer r.opMu.Unlock()
	r.mu.Lock()
	phase := r.currentLocked()
	lease := r.lease
	if phase != HeldPhase || lease == nil {
		why := r.whyNotHeld(phase)
		r.mu.Unlock()
		return r.stale(token, fmt.Sprintf("token %d is not current; %s", token, why), 0, false)
	}
	r.mu.Unlock()
	if token != lease.Token {
		return r.stale(token, fmt.Sprintf("token %d is not the current token %d", token, lease.Token), lease.Token, true)
	}
	rec, err := lease.Checkpoint(r.ctx, data)
	if err == nil {
		return answer(Done, rec.Dict())
	}
	e, _ := errs.As(err)
	switch {
	case e != nil && e.Kind == errs.KindStale:
		r.mu.Lock()
		r.onLossLocked("etcd refused the checkpoint: "+e.Message, true)
		r.mu.Unlock()
		return r.stale(token, e.Message, e.CurrentToken(), true)
	case e != nil && e.Kind == errs.KindInvalid:
		return invalidOutcome(e)
	}
	return errOutcome(err)
}

// Release gives the job back under token (same condition as completion).
func (r *Runner) Release(token int64) Outcome {
	r.opMu.Lock()
	defer r.opMu.Unlock()
	r.mu.Lock()
	phase := r.currentLocked()
	lease := r.lease
	if (phase == Released && lease != nil && lease.Token == token) || (r.last != nil && r.last.token == token && r.last.released) {
		r.mu.Unlock()
		return answer(Done, pyjson.Obj{{Key: "state", Value: "released"}, {Key: "token", Value: token}})
	}
	if phase == Completed && lease != nil && lease.Token == token && r.result != nil {
		o := answer(Refused, pyjson.Obj{{Key: "error", Value: "completed"}, {Key: "token", Value: token},
			{Key: "state", Value: string(phase)}, {Key: "result", Value: r.result.Dict()},
			{Key: "message", Value: fmt.Sprintf("the job was completed under token %d; there is nothing to release", token)}})
		r.mu.Unlock()
		return o
	}
	if phase != HeldPhase || lease == nil {
		r.mu.Unlock()
		return r.stale(token, fmt.Sprintf("token %d is not current; the lease is %s", token, phase), 0, false)
	}
	if token != lease.Token {
		r.mu.Unlock()
		return r.stale(token, fmt.Sprintf("token %d is not the current token %d", token, lease.Token), lease.Token, true)
	}
	r.releaseSent = true
	r.mu.Unlock()

	err := lease.Release(r.ctx)

	r.mu.Lock()
	defer r.mu.Unlock()
	r.releaseSent = false
	if err != nil {
		e, _ := errs.As(err)
		if e != nil && e.Kind == errs.KindStale {
			r.onLossLocked("etcd refused the release: "+e.Message, r.phase != Released)
			r.mu.Unlock()
			o := r.stale(token, e.Message, e.CurrentToken(), true)
			r.mu.Lock()
			return o
		}
		if r.currentLocked() == Released {
			return answer(Done, pyjson.Obj{{Key: "state", Value: "released"}, {Key: "token", Value: token}})
		}
		return errOutcome(err)
	}
	r.setPhase(Released)
	r.dropTokenFiles()
	r.log.Info("lease released by the worker", "token", token)
	return answer(Done, pyjson.Obj{{Key: "state", Value: "released"}, {Key: "token", Value: token}})
}

// LeaseView is GET /v1/lease: 200 only while the lease is held.
func (r *Runner) LeaseView() Outcome {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.leaseViewLocked()
}

func (r *Runner) leaseViewLocked() Outcome {
	phase := r.currentLocked()
	base := pyjson.Obj{{Key: "state", Value: string(phase)}, {Key: "job", Value: r.nameLocked()}, {Key: "owner", Value: r.cfg.Owner}}
	if r.cfg.Queue != nil {
		var id any
		if r.item != nil {
			id = r.item.ID
		}
		base = append(base, pyjson.KV{Key: "queue", Value: r.cfg.Queue.String()}, pyjson.KV{Key: "item", Value: id})
	}
	with := func(head pyjson.Obj, tail ...pyjson.KV) pyjson.Obj {
		return append(append(append(pyjson.Obj{}, head...), base...), tail...)
	}
	lease := r.lease
	switch {
	case phase == HeldPhase && lease != nil:
		rem := float64(int64(lease.Remaining().Seconds()*1000+0.5)) / 1000
		held := append(append(pyjson.Obj{}, base...), pyjson.KV{Key: "token", Value: lease.Token},
			pyjson.KV{Key: "generation", Value: lease.Generation}, pyjson.KV{Key: "ttl", Value: lease.TTL},
			pyjson.KV{Key: "remainingSeconds", Value: rem}, pyjson.KV{Key: "checkpoint", Value: lease.CheckpointDict()})
		if lease.Item != nil {
			held = append(held, pyjson.KV{Key: "payload", Value: lease.Payload})
		}
		if len(lease.Slots) > 0 {
			held = append(held, pyjson.KV{Key: "semaphores", Value: slotsJSON(lease)})
		}
		return answer(Done, r.withTraceparentLocked(held, lease.Token))
	case phase == Claiming:
		return answer(NotYet, base)
	case phase == Waiting && r.full != nil:
		return answer(NotYet, with(nil, pyjson.KV{Key: "message", Value: "waiting for a slot: " + r.full.Message},
			pyjson.KV{Key: "semaphore", Value: detail(r.full, "semaphore")}))
	case phase == Waiting:
		return answer(NotYet, with(nil, pyjson.KV{Key: "message", Value: "waiting for an item: none of queue " +
			r.cfg.Queue.String() + " is claimable now"}))
	case phase == Completed && r.drained:
		return answer(Refused, with(pyjson.Obj{{Key: "error", Value: "completed"}},
			pyjson.KV{Key: "message", Value: "queue " + r.cfg.Queue.String() + " has no item left to claim (none pending " +
				"or held); nothing to do"}, pyjson.KV{Key: "result", Value: nil}, pyjson.KV{Key: "exitCode", Value: 0}))
	case phase == Completing:
		return answer(Refused, with(pyjson.Obj{{Key: "error", Value: "completing"}}, pyjson.KV{Key: "message",
			Value: "the lease ended while a completion was in flight; the job's result decides whether it completed"}))
	case phase == Lost:
		return answer(Refused, with(pyjson.Obj{{Key: "error", Value: "lost"}},
			pyjson.KV{Key: "message", Value: "the lease was lost: " + r.lostReason}))
	case phase == Completed && r.completedBeforeClaim:
		by := ""
		var res any
		if r.result != nil {
			by = fmt.Sprintf(" by %s under token %d", r.result.Owner, r.result.Token)
			res = r.result.Dict()
		}
		return answer(Refused, with(pyjson.Obj{{Key: "error", Value: "completed"}},
			pyjson.KV{Key: "message", Value: "the job was already completed" + by + "; nothing to do"},
			pyjson.KV{Key: "result", Value: res}, pyjson.KV{Key: "exitCode", Value: 0}))
	case phase == Completed:
		var res any
		if r.result != nil {
			res = r.result.Dict()
		}
		return answer(Refused, with(pyjson.Obj{{Key: "error", Value: "completed"}},
			pyjson.KV{Key: "message", Value: "the job is completed"}, pyjson.KV{Key: "result", Value: res}))
	case phase == Failed && r.failure != nil:
		// {**failure, **base}: base's keys win and failure's keep their place.
		out := pyjson.Obj{}
		inBase := map[string]bool{}
		for _, kv := range base {
			inBase[kv.Key] = true
		}
		for _, kv := range r.failure {
			if !inBase[kv.Key] { // e.g. a not-found item's details name it "ns/queue/id": base's "item" is its id
				out = append(out, kv)
			}
		}
		return answer(Refused, append(out, base...))
	case phase == Released:
		return answer(Refused, with(pyjson.Obj{{Key: "error", Value: "released"}},
			pyjson.KV{Key: "message", Value: "the lease was released"}))
	}
	return answer(NotYet, base)
}

// endedItem is how an item of a draining sidecar ended (completed with
// result, or released) under token.
type endedItem struct {
	token    int64
	result   *protocol.Result
	released bool
}
