package protocol

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"github.com/joblease/joblease/sidecar-go/internal/errs"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/joblease/joblease/sidecar-go/internal/etcd"
	"github.com/joblease/joblease/sidecar-go/internal/session"
)

// DefaultReadBackTimeout bounds how long an unknown outcome is read back (and
// a read retried) while etcd is unreachable before the operation says
// OutcomeUnknown, unless the Client's ReadBackTimeout says otherwise (Python:
// lease.READ_BACK_SECONDS, JobLeaseClient's read_back_timeout).
const DefaultReadBackTimeout = 30 * time.Second

// State of a lease handle.
type State int

const (
	Held State = iota
	LostState
	Completed
	Released
)

// Lease is temporary ownership of one job, proven by Token (the holder key's
// create revision). Valid while its session is alive within the local safety
// deadline and the holder key still carries this claim; once invalid, never
// valid again.
type Lease struct {
	store       *etcd.Store
	session     *session.Session
	Job         JobRef
	keys        JobKeys
	Owner       string
	ClaimID     string
	Token       int64
	Generation  int64
	TTL         int64
	holderValue []byte
	// Item is the queue item this lease holds (nil: a job); Job then names
	// it as "<queue>/<id>" in its namespace, so messages say "ns/queue/id"
	// as Python's do. Payload is the item's, as enqueued.
	Item    *ItemRef
	Payload any
	// Slots are the semaphore slots this claim took (docs/semaphores.md);
	// completion and release delete them in their own transactions.
	Slots    []SlotGrant
	slotKeys []string

	mu           sync.Mutex
	state        State
	reason       string
	done         chan struct{}
	result       *Result
	checkpointKV *etcd.KV
	// tenure is this claim's tenure in the job's history (nil: the job keeps
	// none); release and checkpoint record themselves in it (a completion by its result).
	tenure *tenure
	// unlisten unregisters the session's loss callback once the lease ended
	// (the session lives on for the next claims; nil until registered).
	unlisten func()
	// readBackTimeout bounds this lease's read-backs: its client's ReadBackTimeout.
	readBackTimeout time.Duration
}

func (c *Client) newLease(s *session.Session, job JobRef, keys JobKeys, owner, claimID string,
	token, generation, ttl int64, holderValue []byte, checkpoint *etcd.KV, slots []SlotGrant) *Lease {
	l := &Lease{store: c.Store, session: s, Job: job, keys: keys, Owner: owner, ClaimID: claimID, Token: token,
		Generation: generation, TTL: ttl, holderValue: holderValue, done: make(chan struct{}), checkpointKV: checkpoint,
		Slots: slots, readBackTimeout: c.readBackTimeout()}
	for _, g := range slots {
		l.slotKeys = append(l.slotKeys, g.keys...)
	}
	s.SetCheck(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		l.Check(ctx)
	})
	unlisten := s.OnLoss(func(why string) { l.lose("etcd lease lost: " + why) })
	l.mu.Lock()
	if l.state == Held {
		l.unlisten = unlisten
	} else {
		l.mu.Unlock()
		unlisten() // lost already (the session was): nothing to keep
		return l
	}
	l.mu.Unlock()
	return l
}

// setItem reads the claimed item's record into the lease. A record that
// cannot be decoded gives the item back (the worker could not be told its
// payload) and says why.
func (l *Lease) setItem(ctx context.Context, kv *etcd.KV) error {
	// Job is itemJob(ref): "<queue>/<id>" in the queue's namespace.
	ref := ItemRef{Queue: QueueRef{l.Job.Namespace, strings.TrimSuffix(l.Job.Name, "/"+l.keys.ItemID)}, ID: l.keys.ItemID}
	l.Item = &ref
	if kv == nil { // compared: version(item) > 0; kept should a claim without it come here
		_ = l.Release(ctx)
		return errs.ItemNotFound(ref.String())
	}
	rec, err := DecodeItem(kv.Value, kv.CreateRevision)
	if err != nil {
		_ = l.Release(ctx)
		return err
	}
	l.Payload = rec.Payload
	return nil
}

// Session the lease is bound to.
func (l *Lease) Session() *session.Session { return l.session }

// Valid: effects under Token are allowed now.
func (l *Lease) Valid() bool {
	l.mu.Lock()
	held := l.state == Held
	l.mu.Unlock()
	return held && l.session.Alive()
}

// Current state (Held turns into LostState once the deadline has passed).
func (l *Lease) State() State {
	l.mu.Lock()
	st := l.state
	l.mu.Unlock()
	if st == Held && !l.session.Alive() {
		return LostState
	}
	return st
}

// LostReason says why the lease is no longer held.
func (l *Lease) LostReason() string {
	l.mu.Lock()
	reason, st := l.reason, l.state
	l.mu.Unlock()
	if reason == "" && st == Held && !l.Valid() {
		// The session is lost but its callback has not reached this lease yet
		// (Session.Lose closes Lost() before it runs the callbacks): say what
		// the callback is about to record, not a guess.
		if why := l.session.LostReason(); why != "" {
			return "etcd lease lost: " + why
		}
		return "no keep-alive succeeded before the safety deadline"
	}
	return reason
}

// Remaining local safety time.
func (l *Lease) Remaining() time.Duration {
	if !l.Valid() {
		return 0
	}
	return l.session.Remaining()
}

// Done is closed when the lease is lost, completed or released; the lease's
// own deadline passing is seen through the session (Lost channel).
func (l *Lease) Done() <-chan struct{} { return l.done }

func (l *Lease) lose(reason string) {
	l.mu.Lock()
	if l.state != Held {
		l.mu.Unlock()
		return
	}
	l.state, l.reason = LostState, reason
	close(l.done)
	unlisten := l.unlisten
	l.unlisten = nil
	l.mu.Unlock()
	if unlisten != nil {
		unlisten()
	}
	slog.Warn(fmt.Sprintf("lease on %s (token %d) lost: %s", l.Job, l.Token, reason))
}

func (l *Lease) finish(st State) {
	l.mu.Lock()
	var unlisten func()
	if l.state == Held {
		l.state = st
		close(l.done)
		unlisten, l.unlisten = l.unlisten, nil
	}
	l.mu.Unlock()
	if unlisten != nil {
		unlisten()
	}
}

func (l *Lease) ours() []etcd.Cmp {
	return []etcd.Cmp{etcd.CreateEq(l.keys.Holder(), l.Token), etcd.ValueEq(l.keys.Holder(), l.holderValue)}
}

func (l *Lease) isOurs(kv *etcd.KV) bool {
	return kv != nil && kv.CreateRevision == l.Token && string(kv.Value) == string(l.holderValue)
}

// Check re-verifies that the holder key is still ours; the lease is lost if not.
func (l *Lease) Check(ctx context.Context) {
	if l.State() != Held {
		return
	}
	r, err := l.store.Txn(ctx, l.ours(), nil, []etcd.Op{etcd.Get(l.keys.Holder()), etcd.Get(l.keys.Result())})
	if err != nil {
		slog.Info(fmt.Sprintf("holder check for %s failed: %v", l.Job, err))
		return
	}
	if !r.Succeeded {
		l.lose(l.describeChange(r))
	}
}

func (l *Lease) describeChange(r etcd.TxnResult) string {
	holder, result := r.KV(0), r.KV(1)
	if holder != nil {
		h, err := DecodeHolder(holder.Value)
		if err != nil {
			return fmt.Sprintf("job now held with token %d (%s)", holder.CreateRevision, err)
		}
		return fmt.Sprintf("job now held by %s with token %d", errs.PyRepr(h.Owner), holder.CreateRevision)
	}
	if result != nil {
		rec, err := DecodeResult(result.Value, result.ModRevision)
		if err != nil {
			return fmt.Sprintf("job has a result (%s)", err)
		}
		return fmt.Sprintf("job completed with token %d", rec.Token)
	}
	return "holder key deleted (expired, released or job unregistered)"
}

func (l *Lease) stale(r etcd.TxnResult, detail string) *errs.Error {
	holder, result := r.KV(0), r.KV(1)
	if holder != nil {
		h, err := DecodeHolder(holder.Value)
		if err != nil && detail == "" {
			detail = err.Error()
		}
		return errs.Stale(l.Job.String(), l.Token, holder.CreateRevision, h.Owner, detail)
	}
	if result != nil {
		rec, err := DecodeResult(result.Value, result.ModRevision)
		if err != nil {
			if detail == "" {
				detail = "the job has a result: " + err.Error()
			}
			return errs.Stale(l.Job.String(), l.Token, 0, "", detail)
		}
		if detail == "" {
			detail = "the job was completed under that token"
		}
		return errs.Stale(l.Job.String(), l.Token, rec.Token, rec.Owner, detail)
	}
	return errs.Stale(l.Job.String(), l.Token, 0, "", detail)
}

// CheckpointDict is the checkpoint as this handle knows it, as JSON (nil: none).
func (l *Lease) CheckpointDict() any {
	l.mu.Lock()
	kv := l.checkpointKV
	l.mu.Unlock()
	if kv == nil {
		return nil
	}
	c, err := DecodeCheckpoint(kv.Value, kv.ModRevision)
	if err != nil {
		return map[string]any{"corrupt": err.Error()}
	}
	return c.Dict()
}

func now() float64 { return float64(time.Now().UnixNano()) / 1e9 }

// readUntilAnswered runs one read-only transaction, retried while etcd is
// unreachable, for at most its client's ReadBackTimeout; then OutcomeUnknown for what.
func (l *Lease) readUntilAnswered(ctx context.Context, what string, cmps []etcd.Cmp, success, failure []etcd.Op) (etcd.TxnResult, error) {
	deadline := time.Now().Add(l.readBackTimeout)
	for {
		r, err := l.store.Txn(ctx, cmps, success, failure)
		if err == nil || !errs.Is(err, errs.KindUnavailable, errs.KindOutcomeUnknown) {
			return r, err
		}
		if time.Now().After(deadline) {
			return r, errs.OutcomeUnknown(fmt.Sprintf("%s of %s has an unknown outcome and etcd could not be read back: %v", what, l.Job, err))
		}
		select {
		case <-ctx.Done():
			return r, errs.OutcomeUnknown(fmt.Sprintf("%s of %s has an unknown outcome: %v", what, l.Job, ctx.Err()))
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// readBack after an unknown outcome: nil when the holder is still ours (the
// write has not committed); else the holder and result as they are now.
func (l *Lease) readBack(ctx context.Context, what string) (*etcd.TxnResult, error) {
	r, err := l.readUntilAnswered(ctx, what, l.ours(), nil, []etcd.Op{etcd.Get(l.keys.Holder()), etcd.Get(l.keys.Result())})
	if err != nil {
		return nil, err
	}
	if r.Succeeded {
		return nil, nil
	}
	return &r, nil
}

// Complete records result if, and only if, this claim still holds the job;
// Stale (naming the current token) when it does not.
func (l *Lease) Complete(ctx context.Context, result any) (Result, error) {
	l.mu.Lock()
	if l.state == Completed && l.result != nil {
		r := *l.result
		l.mu.Unlock()
		return r, nil
	}
	l.mu.Unlock()
	if _, err := JSONPayload(result, "result", MaxResultBytes); err != nil {
		return Result{}, err
	}
	rec := Result{Owner: l.Owner, ClaimID: l.ClaimID, Token: l.Token, Generation: l.Generation, Result: result, CompletedAt: now()}
	value, err := rec.Encode()
	if err != nil {
		return Result{}, errs.Invalid("invalid result: " + err.Error())
	}
	for range 3 {
		ops := []etcd.Op{etcd.Put(l.keys.Result(), value, 0)}
		for _, k := range append(l.keys.completionDeletes(), l.slotKeys...) {
			ops = append(ops, etcd.Delete(k))
		}
		r, err := l.store.Txn(ctx, l.ours(), ops,
			[]etcd.Op{etcd.Get(l.keys.Holder()), etcd.Get(l.keys.Result())})
		if errs.Is(err, errs.KindOutcomeUnknown) {
			slog.Info(fmt.Sprintf("completion of %s has an unknown outcome; reading back", l.Job))
			back, err := l.readBack(ctx, "completion")
			if err != nil {
				return Result{}, err
			}
			if back == nil {
				continue
			}
			r = *back
		} else if err != nil {
			return Result{}, err
		}
		if r.Succeeded {
			stored, _ := DecodeResult(value, r.Revision)
			return l.completed(stored), nil
		}
		if kv := r.KV(1); kv != nil {
			if stored, err := DecodeResult(kv.Value, kv.ModRevision); err == nil && stored.ClaimID == l.ClaimID {
				return l.completed(stored), nil
			}
		}
		l.lose(l.describeChange(r))
		l.tenure.recordRefusal(ctx, l.store, l.Token) // off the hot path: refused anyway
		return Result{}, l.stale(r, "")
	}
	return Result{}, errs.OutcomeUnknown(fmt.Sprintf("completion of %s could not be confirmed: three copies had unknown "+
		"outcomes and the holder was still ours after each; the job is not completed yet and this handle "+
		"still holds it (a copy still in flight may commit)", l.Job))
}

// RecordRefusedCompletion counts one stale completion refused under this
// claim's token against its tenure (docs/protocol.md, "Tenure history"), for
// a completion refused without sending it (the lease already lost); a no-op
// when the job keeps no history. Best effort.
func (l *Lease) RecordRefusedCompletion(ctx context.Context) {
	l.tenure.recordRefusal(ctx, l.store, l.Token)
}

func (l *Lease) completed(r Result) Result {
	l.mu.Lock()
	l.result = &r
	l.mu.Unlock()
	l.finish(Completed)
	return r
}

// Release gives the job back; returns only once etcd confirmed the holder is gone.
func (l *Lease) Release(ctx context.Context) error {
	if st := l.State(); st == Released || st == Completed {
		return nil
	}
	for range 3 {
		ops := []etcd.Op{etcd.Delete(l.keys.Holder())}
		for _, k := range l.slotKeys {
			ops = append(ops, etcd.Delete(k))
		}
		ops = append(ops, l.tenure.endPut(EndReleased)...)
		r, err := l.store.Txn(ctx, l.ours(), ops, []etcd.Op{etcd.Get(l.keys.Holder()), etcd.Get(l.keys.Result())})
		if errs.Is(err, errs.KindOutcomeUnknown) {
			slog.Info(fmt.Sprintf("release of %s has an unknown outcome; reading back", l.Job))
			back, err := l.readBack(ctx, "release")
			if err != nil {
				return err
			}
			if back == nil {
				continue // still ours: not applied; the conditional delete is safe to resend
			}
			if back.KV(0) == nil && back.KV(1) == nil {
				l.finish(Released) // our delete committed (or the key expired): released either way
				return nil
			}
			r = *back
		} else if err != nil {
			return err
		}
		if !r.Succeeded {
			l.lose(l.describeChange(r))
			return l.stale(r, "")
		}
		l.finish(Released)
		return nil
	}
	return errs.OutcomeUnknown(fmt.Sprintf("release of %s could not be confirmed: three copies had unknown outcomes "+
		"and the holder was still ours after each; the job is still held by this handle (release again, or "+
		"close the client to revoke its lease)", l.Job))
}

// Checkpoint stores data as the job's checkpoint if, and only if, this claim
// still holds the job and the checkpoint key is as this handle last saw it.
func (l *Lease) Checkpoint(ctx context.Context, data any) (Checkpoint, error) {
	if _, err := JSONPayload(data, "checkpoint", MaxCheckpointBytes); err != nil {
		return Checkpoint{}, err
	}
	rec := Checkpoint{Owner: l.Owner, ClaimID: l.ClaimID, Token: l.Token, Generation: l.Generation, Data: data, CheckpointedAt: now()}
	value, err := rec.Encode()
	if err != nil {
		return Checkpoint{}, errs.Invalid("invalid checkpoint: " + err.Error())
	}
	key := l.keys.Checkpoint()
	reads := []etcd.Op{etcd.Get(l.keys.Holder()), etcd.Get(l.keys.Result()), etcd.Get(key)}
	for range 5 {
		l.mu.Lock()
		var seen int64
		if l.checkpointKV != nil {
			seen = l.checkpointKV.ModRevision
		}
		l.mu.Unlock()
		r, err := l.store.Txn(ctx, append(l.ours(), etcd.ModEq(key, seen)),
			append([]etcd.Op{etcd.Put(key, value, 0)}, l.tenure.checkpointPut()...), reads)
		if errs.Is(err, errs.KindOutcomeUnknown) {
			slog.Info(fmt.Sprintf("checkpoint of %s has an unknown outcome; reading back", l.Job))
			r, err = l.readUntilAnswered(ctx, "checkpoint", nil, reads, nil)
			if err != nil {
				return Checkpoint{}, err
			}
			r.Succeeded = false
		} else if err != nil {
			return Checkpoint{}, err
		}
		if r.Succeeded {
			return l.checkpointed(&etcd.KV{Key: []byte(key), Value: value, ModRevision: r.Revision})
		}
		stored := r.KV(2)
		if stored != nil && string(stored.Value) == string(value) {
			return l.checkpointed(stored) // an earlier copy committed
		}
		if l.isOurs(r.KV(0)) {
			// Still ours: not written, or another writer of this claim
			// checkpointed meanwhile: last writer wins.
			l.mu.Lock()
			l.checkpointKV = stored
			l.mu.Unlock()
			continue
		}
		l.lose(l.describeChange(r))
		return Checkpoint{}, l.stale(r, "")
	}
	return Checkpoint{}, errs.OutcomeUnknown(fmt.Sprintf("checkpoint of %s could not be confirmed after several attempts; "+
		"the holder was still ours and a copy still in flight may commit", l.Job))
}

func (l *Lease) checkpointed(kv *etcd.KV) (Checkpoint, error) {
	l.mu.Lock()
	l.checkpointKV = kv
	l.mu.Unlock()
	return DecodeCheckpoint(kv.Value, kv.ModRevision)
}

func newClaimID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	b[6] = (b[6] & 0x0f) | 0x40 // a version-4 UUID, as uuid.uuid4().hex
	b[8] = (b[8] & 0x3f) | 0x80
	return hex.EncodeToString(b[:])
}
