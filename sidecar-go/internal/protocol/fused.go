package protocol

import (
	"context"
	"fmt"
	"log/slog"

	"github.com/joblease/joblease/sidecar-go/internal/errs"
	"github.com/joblease/joblease/sidecar-go/internal/etcd"
)

// The completion of a held item fused with the claim of the next
// (docs/queues.md, "Complete and claim the next"): one transaction whose
// compares are the completion's (the holder is ours) and whose success
// branch is the completion's writes with the claim of a candidate nested
// under it (etcd's request_txn). The next item's token is that commit's
// revision, as every claim's. If the nested claim's compares fail (another
// claimer took it, the spec or its pending key changed), the completion
// commits alone and the next item is claimed the usual way. Only for what
// the fused shape carries safely: an item claim without semaphore slots and
// without a tenure history, on the session the held item is bound to (a
// claim that needs another TTL, slots or a history is two transactions, as
// before). joblease.queue's Queues.complete_next sends the same request
// (tests/vectors/fused.json).

// FusedClaim is the claim of the next item as the fused transaction sends it.
type FusedClaim struct {
	Keys        JobKeys
	SpecRev     int64
	PendingRev  int64
	MaxAttempts int64 // the round's limit (attemptsFrom + maxAttempts; 0: unlimited)
	LeaseID     int64
	HolderValue []byte
	ClaimsValue []byte
}

// FusedRequest is the fused transaction: the completion of held (holder
// compares ours, result value) with next's claim nested under its success
// branch. Its success branch answers, at index 3, the nested claim: put
// holder, put claims, get claims, get checkpoint, get item (as a claim's).
func FusedRequest(held JobKeys, ours []etcd.Cmp, resultValue []byte, next FusedClaim) ([]etcd.Cmp, []etcd.Op, []etcd.Op) {
	k := next.Keys
	cmps := []etcd.Cmp{etcd.ModEq(k.Spec(), next.SpecRev), etcd.CreateEq(k.Holder(), 0), etcd.VersionEq(k.Result(), 0)}
	if next.MaxAttempts > 0 {
		cmps = append(cmps, etcd.VersionLess(k.Claims(), next.MaxAttempts))
	}
	cmps = append(cmps, etcd.ModEq(k.Pending(), next.PendingRev), etcd.VersionGreater(k.Item(), 0))
	claim := etcd.TxnOp(cmps, []etcd.Op{etcd.Put(k.Holder(), next.HolderValue, next.LeaseID),
		etcd.Put(k.Claims(), next.ClaimsValue, 0), etcd.Get(k.Claims()), etcd.Get(k.Checkpoint()), etcd.Get(k.Item())}, nil)
	success := []etcd.Op{etcd.Put(held.Result(), resultValue, 0)}
	for _, key := range held.completionDeletes() {
		success = append(success, etcd.Delete(key))
	}
	success = append(success, claim)
	return ours, success, []etcd.Op{etcd.Get(held.Holder()), etcd.Get(held.Result())}
}

// fusedIndex is where the nested claim answers in the success branch.
const fusedIndex = 3

// fusable is the candidate the completion of l can claim in the same
// transaction, and what that claim sends, or ok false: l is no plain item
// lease (slots, a history), the queue's spec is not cached, is suspended,
// takes slots or keeps a history, the session is not one the claim may use,
// or the pool has no candidate (no read is sent for one here).
func (c *Client) fusable(l *Lease, owner string) (ItemRef, FusedClaim, etcd.KV, bool) {
	if l.Item == nil || len(l.slotKeys) > 0 || l.tenure != nil {
		return ItemRef{}, FusedClaim{}, etcd.KV{}, false
	}
	queue := l.Item.Queue
	cached, ok := c.queueSpecs[queue]
	spec := cached.spec
	if !ok || spec.Suspend || spec.HistoryLimit > 0 || len(spec.Semaphores) > 0 {
		return ItemRef{}, FusedClaim{}, etcd.KV{}, false
	}
	s := c.session
	if s == nil || s != l.session || s.TTL != spec.LeaseDurationSeconds || !s.Alive() || s.Remaining() < minSessionLeft {
		return ItemRef{}, FusedClaim{}, etcd.KV{}, false
	}
	pool := c.poolOf(queue)
	for {
		pending, ok := pool.take()
		if !ok {
			return ItemRef{}, FusedClaim{}, etcd.KV{}, false
		}
		id := string(pending.Key[len(QueueKeysOf(c.Root, queue).FieldPrefix("pending")):])
		if id == l.Item.ID {
			continue // never the item being completed
		}
		rec, err := DecodePending(pending.Value)
		if err != nil {
			pool.refusedForGood(pending) // skipped as ClaimNext skips it
			continue
		}
		claimID := newClaimID()
		holderValue, err := HolderValue(owner, claimID, spec.LeaseDurationSeconds, now())
		if err != nil {
			return ItemRef{}, FusedClaim{}, etcd.KV{}, false
		}
		claimsValue, err := ClaimsValue(owner, claimID)
		if err != nil {
			return ItemRef{}, FusedClaim{}, etcd.KV{}, false
		}
		item := ItemRef{Queue: queue, ID: id}
		return item, FusedClaim{Keys: QueueKeysOf(c.Root, queue).Item(id), SpecRev: cached.modRev,
			PendingRev: pending.ModRevision, MaxAttempts: spec.jobSpec(rec.AttemptsFrom).MaxAttempts,
			LeaseID: s.LeaseID, HolderValue: holderValue, ClaimsValue: claimsValue}, pending, true
	}
}

// CompleteAndClaimNext completes l, an item of a queue this client drains,
// and, where the fused shape is safe (fusable), claims the next candidate of
// its pool in the same transaction: the result, and the next item's lease
// (nil: none claimed; the caller claims the next item the usual way). The
// completion is decided and refused exactly as Lease.Complete decides it.
//
// An unknown outcome is read back in one read: the held item's holder and
// result, the next item's holder and claims. The completion and the claim
// are one commit, so the answer is the truth for both: the held item still
// ours means neither committed (sent again, as a completion is); our result
// there means the completion committed, and then the next item is ours if
// its holder is our claim's (a claim whose holder is gone with its lease is
// no lease); someone else's holder or result means the completion was
// refused. When etcd cannot be read back at all, the session's lease is
// revoked, as for a claim whose outcome is unknown, so a claim that may have
// committed cannot outlive it unknown to anyone (and so when three copies
// found the held item still ours: one may still be in flight); the
// completion's outcome is then OutcomeUnknown, settled by reading the held
// item's result (the revoke ended the held item's lease too).
func (c *Client) CompleteAndClaimNext(ctx context.Context, l *Lease, result any) (Result, *Lease, error) {
	l.mu.Lock()
	if l.state == Completed && l.result != nil {
		r := *l.result
		l.mu.Unlock()
		return r, nil, nil
	}
	l.mu.Unlock()
	item, next, pending, ok := c.fusable(l, l.Owner)
	if !ok {
		r, err := l.Complete(ctx, result)
		return r, nil, err
	}
	if _, err := JSONPayload(result, "result", MaxResultBytes); err != nil {
		c.poolOf(item.Queue).candidates = append(c.poolOf(item.Queue).candidates, pending) // not sent: still a candidate
		return Result{}, nil, err
	}
	rec := Result{Owner: l.Owner, ClaimID: l.ClaimID, Token: l.Token, Generation: l.Generation, Result: result, CompletedAt: now()}
	value, err := rec.Encode()
	if err != nil {
		c.poolOf(item.Queue).candidates = append(c.poolOf(item.Queue).candidates, pending)
		return Result{}, nil, errs.Invalid("invalid result: " + err.Error())
	}
	cmps, success, failure := FusedRequest(l.keys, l.ours(), value, next)
	for range 3 {
		r, err := c.Store.Txn(ctx, cmps, success, failure)
		if errs.Is(err, errs.KindOutcomeUnknown) {
			slog.Info(fmt.Sprintf("completion of %s (with the claim of %s) has an unknown outcome; reading back", l.Job, item))
			back, err := c.readBackFused(ctx, l, next)
			if err != nil {
				revoked := c.endSession(ctx, l.session)
				return Result{}, nil, errs.OutcomeUnknown(fmt.Sprintf("%s; the claim of %s sent with it may have committed, "+
					"so the session's lease %x was revoked (confirmed: %t)", err.Error(), item, l.session.LeaseID, revoked))
			}
			if l.isOurs(back.KV(0)) {
				continue // neither committed: the same conditional transaction is safe to send again
			}
			stored := ourResult(back.KV(1), l.ClaimID)
			if stored == nil {
				l.lose(l.describeChange(back))
				return Result{}, nil, l.stale(back, "")
			}
			done := l.completed(*stored)
			return done, c.nextFromReadBack(ctx, l, item, next, back), nil
		} else if err != nil {
			c.poolOf(item.Queue).candidates = append(c.poolOf(item.Queue).candidates, pending)
			return Result{}, nil, err
		}
		if r.Succeeded {
			stored, _ := DecodeResult(value, r.Revision)
			done := l.completed(stored)
			return done, c.nextFromCommit(ctx, l, item, next, r), nil
		}
		if stored := ourResult(r.KV(1), l.ClaimID); stored != nil {
			// an earlier copy committed (its answer was lost): so may its claim
			done := l.completed(*stored)
			back, err := c.readBackFused(ctx, l, next)
			if err != nil {
				c.endSession(ctx, l.session)
				return done, nil, nil
			}
			return done, c.nextFromReadBack(ctx, l, item, next, back), nil
		}
		l.lose(l.describeChange(r))
		return Result{}, nil, l.stale(r, "")
	}
	// a copy still in flight may commit, and the claim with it: end the
	// session, so that claim cannot outlive it unknown to anyone
	revoked := c.endSession(ctx, l.session)
	return Result{}, nil, errs.OutcomeUnknown(fmt.Sprintf("completion of %s could not be confirmed: three copies had unknown "+
		"outcomes and the holder was still ours after each (a copy still in flight may commit); the claim of %s sent "+
		"with it may commit too, so the session's lease %x was revoked (confirmed: %t)", l.Job, item, l.session.LeaseID, revoked))
}

func ourResult(kv *etcd.KV, claimID string) *Result {
	if kv == nil {
		return nil
	}
	if stored, err := DecodeResult(kv.Value, kv.ModRevision); err == nil && stored.ClaimID == claimID {
		return &stored
	}
	return nil
}

// readBackFused reads, at one revision, the held item's holder and result
// (indices 0, 1) and the next item's holder, claims, checkpoint and item (2-5).
func (c *Client) readBackFused(ctx context.Context, l *Lease, next FusedClaim) (etcd.TxnResult, error) {
	k := next.Keys
	return l.readUntilAnswered(ctx, "completion", nil, []etcd.Op{etcd.Get(l.keys.Holder()), etcd.Get(l.keys.Result()),
		etcd.Get(k.Holder()), etcd.Get(k.Claims()), etcd.Get(k.Checkpoint()), etcd.Get(k.Item())}, nil)
}

// nextFromCommit is the next item's lease from the fused transaction's
// answer, or nil (its claim's compares failed: the candidate is dropped,
// as a refused claim's is).
func (c *Client) nextFromCommit(ctx context.Context, l *Lease, item ItemRef, next FusedClaim, r etcd.TxnResult) *Lease {
	claim := r.Txn(fusedIndex)
	if claim == nil || !claim.Succeeded {
		return nil
	}
	var gen int64
	if kv := claim.KV(2); kv != nil {
		gen = kv.Version
	}
	return c.fusedLease(ctx, l, item, next, r.Revision, gen, claim.KV(3), claim.KV(4))
}

// nextFromReadBack is the next item's lease when the read-back shows the
// fused claim committed and its holder is still there, else nil.
func (c *Client) nextFromReadBack(ctx context.Context, l *Lease, item ItemRef, next FusedClaim, back etcd.TxnResult) *Lease {
	holder := back.KV(2)
	if holder == nil || string(holder.Value) != string(next.HolderValue) {
		if claims := back.KV(3); claims != nil && ClaimIDOf(claims.Value) == ClaimIDOf(next.ClaimsValue) {
			slog.Warn(fmt.Sprintf("the claim of %s sent with a completion committed, but its holder is gone (its lease "+
				"expired); that attempt is used", item))
		}
		return nil
	}
	slog.Info(fmt.Sprintf("the claim of %s sent with a completion resolved by read-back: committed", item))
	var gen int64
	if kv := back.KV(3); kv != nil {
		gen = kv.Version
	}
	return c.fusedLease(ctx, l, item, next, holder.CreateRevision, gen, back.KV(4), back.KV(5))
}

func (c *Client) fusedLease(ctx context.Context, l *Lease, item ItemRef, next FusedClaim, token, gen int64,
	checkpoint, itemKV *etcd.KV) *Lease {
	nl := c.newLease(l.session, itemJob(item), next.Keys, l.Owner, ClaimIDOf(next.ClaimsValue), token, gen, l.session.TTL,
		next.HolderValue, checkpoint, nil)
	c.poolOf(item.Queue).refusedCost = 0
	if err := nl.setItem(ctx, itemKV); err != nil {
		slog.Warn(fmt.Sprintf("the item %s claimed with a completion was given back: %v", item, err))
		return nil
	}
	return nl
}
