package protocol

import (
	"context"
	"fmt"
	"github.com/joblease/joblease/sidecar-go/internal/errs"
	"log/slog"
	"strings"
	"time"

	"github.com/joblease/joblease/sidecar-go/internal/etcd"
	"github.com/joblease/joblease/sidecar-go/internal/session"
	"github.com/joblease/joblease/sidecar-go/internal/startup"
)

// minSessionLeft: a session with less local safety left takes no new claim.
const minSessionLeft = 500 * time.Millisecond

// Client claims jobs for one owner (the sidecar holds one job at a time, so
// one session per TTL is enough; a session that cannot take a claim any
// more is revoked and replaced).
type Client struct {
	Store   *etcd.Store
	Root    string
	session *session.Session
	specRev int64
	spec    *Spec
	// generation is the job's claims version as last seen: a claim of a job
	// with a history names its tenure key by it (a wrong guess fails the
	// claim's compare, whose failure branch reads the right one).
	generation int64
	// queueSpecs: the queues' specs as last read (queue.go).
	queueSpecs map[QueueRef]cachedQueueSpec
	// pools: each queue's candidates as the last claim-next read found them (queue.go).
	pools map[QueueRef]*candidatePool
	// Timeline gets the spec read, lease grant and claim steps of the
	// sidecar's start (nil: none; the runner closes it once held).
	Timeline *startup.Timeline
	// LeaseTTLHint: the TTL the job's spec is expected to have (the sidecar's
	// JOBLEASE_LEASE_TTL; 0: none). With no session yet, a claim grants a lease
	// of this TTL while it reads the spec, instead of after it; if the spec
	// says otherwise, sessionFor revokes that lease and grants one of the
	// spec's TTL before the claim, as it does when a job's TTL changes.
	LeaseTTLHint int64
	// ReadBackTimeout bounds how long an unknown outcome is read back, and a
	// read retried, while etcd is unreachable, for this client and its leases
	// (0: DefaultReadBackTimeout).
	ReadBackTimeout time.Duration
}

func (c *Client) readBackTimeout() time.Duration {
	if c.ReadBackTimeout > 0 {
		return c.ReadBackTimeout
	}
	return DefaultReadBackTimeout
}

// NewClient over store, keys under root.
func NewClient(store *etcd.Store, root string) *Client { return &Client{Store: store, Root: root} }

// Close stops renewing; with revoke, a held job is given back at once.
func (c *Client) Close(ctx context.Context, revoke bool) {
	if c.session != nil {
		c.session.Close(ctx, revoke)
	}
	c.Store.Close()
}

func (c *Client) readSpec(ctx context.Context, job JobRef, keys JobKeys, refresh bool) (int64, Spec, error) {
	if !refresh && c.spec != nil {
		return c.specRev, *c.spec, nil
	}
	// one read of the spec and the generation (what a history's tenure key needs)
	begin := time.Now()
	r, err := c.Store.Txn(ctx, nil, []etcd.Op{etcd.Get(keys.Spec()), etcd.Get(keys.Claims())}, nil)
	if err != nil {
		return 0, Spec{}, err
	}
	c.Timeline.Step("spec read", begin)
	kv := r.KV(0)
	c.generation = 0
	if claims := r.KV(1); claims != nil {
		c.generation = claims.Version
	}
	if kv == nil {
		c.spec = nil
		return 0, Spec{}, errs.NotRegistered(job.String())
	}
	spec, err := DecodeSpec(kv.Value)
	if err != nil {
		return 0, Spec{}, err
	}
	c.specRev, c.spec = kv.ModRevision, &spec
	return kv.ModRevision, spec, nil
}

// readSpecGranting is readSpec; with a TTL hint and no session yet, it also
// grants the session's lease of the hinted TTL at the same time (one round
// trip instead of two). The claim still reads the spec first and compares its
// revision; a lease of the wrong TTL is replaced by sessionFor before the
// claim, and a grant that failed is made again there.
func (c *Client) readSpecGranting(ctx context.Context, job JobRef, keys JobKeys, refresh bool) (int64, Spec, error) {
	if c.LeaseTTLHint <= 0 || c.session != nil || (!refresh && c.spec != nil) {
		return c.readSpec(ctx, job, keys, refresh)
	}
	type granted struct {
		s   *session.Session
		err error
	}
	done := make(chan granted, 1)
	go func() {
		begin := time.Now()
		s, err := session.Start(ctx, c.Store, c.LeaseTTLHint)
		if err == nil {
			c.Timeline.Step("lease grant", begin)
		}
		done <- granted{s, err}
	}()
	specRev, spec, err := c.readSpec(ctx, job, keys, refresh)
	if g := <-done; g.err == nil {
		c.session = g.s // sessionFor keeps it if the spec's TTL is the hinted one
		if err != nil {
			// no claim follows (not registered yet, etcd unavailable): revoke
			// it rather than keep it alive through the wait
			c.dropSession("the spec read beside its grant failed")
		}
	} else {
		slog.Debug("the lease grant beside the spec read failed; granting after it", "reason", g.err.Error())
	}
	return specRev, spec, err
}

func (c *Client) sessionFor(ctx context.Context, ttl int64) (*session.Session, error) {
	s := c.session
	if s != nil && s.TTL == ttl && s.Alive() && s.Remaining() >= minSessionLeft {
		return s, nil
	}
	if s != nil {
		c.dropSession("replaced")
	}
	begin := time.Now()
	s, err := session.Start(ctx, c.Store, ttl)
	if err != nil {
		return nil, err
	}
	c.Timeline.Step("lease grant", begin)
	c.session = s
	return s, nil
}

// dropSession stops using the session; its etcd lease is revoked in the
// background (nothing of ours is bound to it: claims on it failed).
func (c *Client) dropSession(reason string) {
	s := c.session
	c.session = nil
	if s == nil {
		return
	}
	s.Lose(reason, true)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		s.Close(ctx, true)
	}()
}

// Claim claims job for owner in one transaction (docs/protocol.md, "Claim").
// A job whose spec names semaphores takes their slots in the same
// transaction (docs/semaphores.md), or is refused with SemaphoreFull.
func (c *Client) Claim(ctx context.Context, job JobRef, owner string) (*Lease, error) {
	return c.ClaimInLine(ctx, job, owner, nil)
}

// ClaimInLine is Claim with ticket, the claimer's place in line for its
// semaphores' slots (TakeTicket; nil: not in line, so refused while anyone waits).
func (c *Client) ClaimInLine(ctx context.Context, job JobRef, owner string, ticket *Ticket) (*Lease, error) {
	if err := ValidateJob(job); err != nil {
		return nil, err
	}
	if err := ValidateOwner(owner); err != nil {
		return nil, err
	}
	keys := Keys(c.Root, job)
	refresh := false
	var revoked []string
	// Tries that did not settle: 4 at most, as without semaphores; slot races
	// (picks are random) are planned again, up to 16 tries in all.
	unsettled := 0
	for range 16 {
		specRev, spec, err := c.readSpecGranting(ctx, job, keys, refresh)
		if err != nil {
			return nil, err
		}
		plan, err := c.planFor(ctx, job.String(), job.Namespace, spec.Semaphores, ticket)
		if err != nil {
			if refresh || !errs.Is(err, errs.KindFull, errs.KindInvalid, errs.KindNotRegistered) {
				return nil, err
			}
			refresh = true // planned from a cached spec: make sure it is current
			continue
		}
		s, err := c.sessionFor(ctx, spec.LeaseDurationSeconds)
		if err != nil {
			return nil, err
		}
		lease, again, err := c.claimOn(ctx, job, keys, owner, specRev, spec, s, &revoked, 0, 0, plan)
		if err != nil || lease != nil {
			return lease, err
		}
		refresh = again
		if plan == nil || !again {
			if unsettled++; unsettled == 4 {
				break
			}
		}
	}
	if len(revoked) > 0 {
		return nil, errs.Unavailable(fmt.Sprintf("claim of %s did not settle after several attempts; claims with tokens %s "+
			"committed and were ended by the revoke that settled their unknown outcome (each used an attempt)",
			job, strings.Join(revoked, ", ")))
	}
	return nil, errs.Unavailable(fmt.Sprintf("claim of %s did not settle after several attempts", job))
}

// claimOn is one claim transaction bound to s: the lease, or whether to
// re-read the spec before trying again. For a queue item (keys.IsItem()),
// spec is its queue's with the round's attempts (QueueSpec.jobSpec) and the
// item's pending key must still have pendingRev (docs/queues.md, "Claim an item");
// itemGen is the item's generation as last seen, for its tenure key when the
// queue keeps a history (a job's is c.generation; a wrong guess fails the
// version(claims) compare and the caller reads the right one).
// plan: the semaphore slots to take in the same transaction (nil: none).
func (c *Client) claimOn(ctx context.Context, job JobRef, keys JobKeys, owner string, specRev int64, spec Spec,
	s *session.Session, revoked *[]string, pendingRev, itemGen int64, plan *SlotPlan) (*Lease, bool, error) {
	claimID := newClaimID()
	ttl := spec.LeaseDurationSeconds
	claimedAt := now()
	holderValue, err := HolderValue(owner, claimID, ttl, claimedAt)
	if err != nil {
		return nil, false, err
	}
	claimValue, err := ClaimsValue(owner, claimID)
	if err != nil {
		return nil, false, err
	}
	cmps := []etcd.Cmp{etcd.ModEq(keys.Spec(), specRev), etcd.CreateEq(keys.Holder(), 0), etcd.VersionEq(keys.Result(), 0)}
	if spec.MaxAttempts > 0 {
		cmps = append(cmps, etcd.VersionLess(keys.Claims(), spec.MaxAttempts))
	}
	// A job with a history needs no read-back of its generation: the
	// version(claims) == gen compare below fixes it at gen+1, so the success
	// branch has one Get fewer.
	keepsHistory := spec.HistoryLimit > 0
	success := []etcd.Op{etcd.Put(keys.Holder(), holderValue, s.LeaseID), etcd.Put(keys.Claims(), claimValue, 0)}
	if !keepsHistory {
		success = append(success, etcd.Get(keys.Claims()))
	}
	success = append(success, etcd.Get(keys.Checkpoint()))
	failure := []etcd.Op{etcd.Get(keys.Spec()), etcd.Get(keys.Holder()), etcd.Get(keys.Result()), etcd.Get(keys.Claims())}
	if keys.IsItem() {
		cmps = append(cmps, etcd.ModEq(keys.Pending(), pendingRev), etcd.VersionGreater(keys.Item(), 0))
		success = append(success, etcd.Get(keys.Item()))
		failure = append(failure, etcd.Get(keys.Pending()), etcd.Get(keys.Item()))
	}
	if plan != nil {
		cmps = append(cmps, plan.compares()...)
		// after every Get the success branch is read by index; writes go last
		writes, err := plan.writes(s.LeaseID, SlotRecord{Holder: job.String(), Owner: owner, ClaimID: claimID})
		if err != nil {
			return nil, false, err
		}
		success = append(success, writes...)
	}
	var ten *tenure
	if keepsHistory {
		gen := c.generation
		if keys.IsItem() {
			gen = itemGen
		}
		ten = &tenure{keys: keys, gen: gen + 1}
		cmps = append(cmps, etcd.VersionEq(keys.Claims(), gen))
		writes, err := ten.claimWrites(owner, claimID, claimedAt, spec.HistoryLimit)
		if err != nil {
			return nil, false, err
		}
		success = append(success, writes...)
	}
	begin := time.Now()
	r, err := c.Store.Txn(ctx, cmps, success, failure)
	if err == nil {
		c.Timeline.Step("claim", begin)
	}
	switch {
	case errs.Is(err, errs.KindLeaseNotFound):
		c.dropSession("etcd no longer knows the lease")
		return nil, false, nil
	case errs.Is(err, errs.KindOutcomeUnknown):
		lease, err := c.resolveAmbiguous(ctx, job, keys, owner, claimID, holderValue, s, spec, revoked, plan, ten)
		return lease, false, err
	case err != nil:
		return nil, false, err
	}
	if r.Succeeded {
		// indices of the success branch's Gets: checkpoint (and item after it)
		var gen int64
		at := 2
		if ten != nil {
			gen = ten.gen
		} else {
			if claims := r.KV(2); claims != nil {
				gen = claims.Version
			}
			at = 3
		}
		if !keys.IsItem() {
			c.generation = gen
		}
		l := c.newLease(s, job, keys, owner, claimID, r.Revision, gen, ttl, holderValue, r.KV(at), plan.grants(r.Revision))
		l.tenure = ten
		if keys.IsItem() {
			if err := l.setItem(ctx, r.KV(at+1)); err != nil {
				return nil, false, err
			}
		}
		return l, false, nil
	}
	if keys.IsItem() {
		again, err := itemRefused(job, keys, r, specRev, spec, pendingRev)
		return nil, again, err
	}
	again, err := c.refused(job, r, specRev)
	return nil, again, err
}

// refused explains a failed claim; (true, nil) when the spec merely changed.
func (c *Client) refused(job JobRef, r etcd.TxnResult, specRev int64) (bool, error) {
	specKV, holderKV, resultKV, claimsKV := r.KV(0), r.KV(1), r.KV(2), r.KV(3)
	if specKV == nil {
		c.spec = nil
		return false, errs.NotRegistered(job.String())
	}
	var gen int64
	if claimsKV != nil {
		gen = claimsKV.Version
	}
	c.generation = gen // the next try names the right tenure
	if resultKV != nil {
		rec, err := DecodeResult(resultKV.Value, 0)
		if err != nil {
			return false, err
		}
		return false, errs.AlreadyCompleted(job.String(), rec.Owner, rec.Token, rec.Generation)
	}
	if holderKV != nil {
		h, err := DecodeHolder(holderKV.Value)
		if err != nil {
			return false, err
		}
		return false, errs.Held(job.String(), h.Owner, holderKV.CreateRevision, gen, r.Revision)
	}
	if specKV.ModRevision != specRev {
		return true, nil
	}
	spec, err := DecodeSpec(specKV.Value)
	if err != nil {
		return false, err
	}
	if spec.MaxAttempts > 0 && gen >= spec.MaxAttempts {
		return false, errs.AttemptsExhausted(job.String(), gen, spec.MaxAttempts)
	}
	// raced with a change that is gone again, or (a job with a history) another
	// claim came and went since we last saw the generation; just retry
	return true, nil
}

// WaitForHolderChange waits until job's holder key changes after revision
// (the holder released, its lease expired, or someone else claimed), at most
// timeout (and no longer than ctx); true if it changed (JobLeaseClient.
// wait_for_holder_change). A waiter that only retried with backoff would
// claim up to a backoff late after the holder is gone; a watch wakes it when
// etcd deletes the key. While etcd is unreachable the watch keeps
// reconnecting until timeout; an error it cannot retry (revision compacted,
// permission denied) ends the wait early with false and that error: the
// caller claims again, and the claim reports what is wrong.
func (c *Client) WaitForHolderChange(ctx context.Context, job JobRef, revision int64, timeout time.Duration) (bool, error) {
	wctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	return c.Store.WatchChange(wctx, Keys(c.Root, job).Holder(), revision+1)
}

// retryRead runs fn while etcd is unavailable, for up to timeout.
func retryRead[T any](ctx context.Context, timeout time.Duration, fn func() (T, error)) (T, error) {
	deadline := time.Now().Add(timeout)
	delay := 50 * time.Millisecond
	for {
		v, err := fn()
		if err == nil || !errs.Is(err, errs.KindUnavailable) || time.Now().After(deadline) {
			return v, err
		}
		select {
		case <-ctx.Done():
			return v, err
		case <-time.After(delay):
		}
		delay = min(time.Second, delay*2)
	}
}

// resolveAmbiguous settles a claim whose answer was lost (docs/protocol.md#read-back): our
// holder there means committed; otherwise the session's lease is revoked so a
// copy in flight cannot commit later, and claims is read again.
func (c *Client) resolveAmbiguous(ctx context.Context, job JobRef, keys JobKeys, owner, claimID string,
	holderValue []byte, s *session.Session, spec Spec, revoked *[]string, plan *SlotPlan, ten *tenure) (*Lease, error) {
	fields, err := retryRead(ctx, c.readBackTimeout(), func() (map[string]*etcd.KV, error) {
		// The fields the lease needs, at one revision (an item's keys are
		// spread over its queue's sub-prefixes, so no one prefix read).
		names := []string{"holder", "claims", "checkpoint", "item"}
		ops := []etcd.Op{etcd.Get(keys.Holder()), etcd.Get(keys.Claims()), etcd.Get(keys.Checkpoint())}
		if keys.IsItem() {
			ops = append(ops, etcd.Get(keys.Item()))
		}
		r, err := c.Store.Txn(ctx, nil, ops, nil)
		out := map[string]*etcd.KV{}
		for i := range ops {
			if kv := r.KV(i); kv != nil {
				out[names[i]] = kv
			}
		}
		return out, err
	})
	if err != nil {
		revokedOK := c.endSession(ctx, s)
		return nil, errs.ClaimOutcomeUnknown(job.String(), claimID, s.LeaseID, revokedOK, s.TTL, "reading it back failed: "+err.Error())
	}
	if h := fields["holder"]; h != nil && string(h.Value) == string(holderValue) {
		slog.Info(fmt.Sprintf("ambiguous claim of %s resolved by read-back: committed", job))
		var gen int64
		if cl := fields["claims"]; cl != nil {
			gen = cl.Version
		}
		// the holder committed, so did its slots (one transaction)
		l := c.newLease(s, job, keys, owner, claimID, h.CreateRevision, gen, s.TTL, holderValue, fields["checkpoint"],
			plan.grants(h.CreateRevision))
		l.tenure = ten
		if keys.IsItem() {
			if err := l.setItem(ctx, fields["item"]); err != nil {
				return nil, err
			}
		}
		return l, nil
	}
	slog.Info(fmt.Sprintf("ambiguous claim of %s not visible; revoking lease %x so it cannot commit late", job, s.LeaseID))
	if !c.endSession(ctx, s) {
		return nil, errs.ClaimOutcomeUnknown(job.String(), claimID, s.LeaseID, false, s.TTL,
			"not visible on read-back, and the revoke that settles it failed")
	}
	kv, err := retryRead(ctx, c.readBackTimeout(), func() (*etcd.KV, error) {
		_, kv, err := c.Store.Get(ctx, keys.Claims())
		return kv, err
	})
	if err != nil {
		return nil, errs.ClaimOutcomeUnknown(job.String(), claimID, s.LeaseID, true, s.TTL,
			"re-reading it after the revoke failed: "+err.Error())
	}
	if !keys.IsItem() && kv != nil {
		c.generation = kv.Version
	}
	if kv == nil || ClaimIDOf(kv.Value) != claimID {
		return nil, nil // not claimed, and with the lease gone it never will be
	}
	token, gen := kv.ModRevision, kv.Version
	// its tenure committed with it; say how it ended (the holder went with the
	// revoked lease), so the history does not read "expired"
	ten.recordEnd(ctx, c.Store, token, EndRevoked)
	if spec.MaxAttempts > 0 && gen >= spec.MaxAttempts {
		return nil, errs.ClaimRevoked(job.String(), token, gen, spec.MaxAttempts)
	}
	*revoked = append(*revoked, fmt.Sprint(token))
	slog.Warn(fmt.Sprintf("claim of %s committed while its outcome was being settled (token %d, generation %d) and "+
		"was ended by the revoke; that attempt is used; claiming again", job, token, gen))
	return nil, nil
}

// endSession stops renewing s and revokes its lease; true once etcd confirmed it is gone.
func (c *Client) endSession(ctx context.Context, s *session.Session) bool {
	if c.session == s {
		c.session = nil
	}
	s.Lose("revoked to settle an ambiguous claim", false)
	s.Close(ctx, false)
	_, err := retryRead(ctx, min(c.readBackTimeout(), time.Duration(s.TTL)*time.Second), func() (struct{}, error) {
		return struct{}{}, c.Store.Revoke(ctx, s.LeaseID)
	})
	if err != nil {
		slog.Warn(fmt.Sprintf("could not revoke etcd lease %x: %v; it expires within %ds", s.LeaseID, err, s.TTL))
		return false
	}
	return true
}

// JobState is what the sidecar reads of a job to decide what etcd decided.
type JobState struct {
	Registered  bool
	HolderToken int64
	HolderOwner string
	Result      *Result
}

// Token is the current fencing token: the live holder's, else the completer's (0: none).
func (s JobState) Token() int64 {
	if s.HolderToken != 0 {
		return s.HolderToken
	}
	if s.Result != nil {
		return s.Result.Token
	}
	return 0
}

// ReadState reads every key of job in one linearizable read. Records that
// cannot be decoded are left empty (as assemble does).
func (c *Client) ReadState(ctx context.Context, job JobRef) (JobState, error) {
	keys := Keys(c.Root, job)
	_, kvs, err := c.Store.GetPrefix(ctx, keys.Prefix)
	if err != nil {
		return JobState{}, err
	}
	var st JobState
	for _, kv := range kvs {
		switch strings.TrimPrefix(string(kv.Key), keys.Prefix) {
		case "spec":
			st.Registered = true
		case "holder":
			if h, err := DecodeHolder(kv.Value); err == nil {
				st.HolderToken, st.HolderOwner = kv.CreateRevision, h.Owner
			}
		case "result":
			if r, err := DecodeResult(kv.Value, kv.ModRevision); err == nil {
				st.Result = &r
			}
		}
	}
	return st, nil
}
