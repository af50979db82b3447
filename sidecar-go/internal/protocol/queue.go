package protocol

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"time"

	"github.com/joblease/joblease/sidecar-go/internal/errs"
	"github.com/joblease/joblease/sidecar-go/internal/etcd"
	"github.com/joblease/joblease/sidecar-go/internal/pyjson"
)

// Queue items (docs/queues.md): an item is a job of its queue, so claiming
// one is claimOn on the item's keys with the queue's spec in place of the
// job's and the item's pending key compared too; the lease, its renewal,
// completion (which also deletes the pending key), release and checkpoints
// are the job's. This file adds picking the next item, waiting for one on a
// watch, enqueueing a CronJob slot, and marking exhausted items failed, as
// joblease.queue does.

const (
	// PickFrom: a claimer picks at random among this many of the oldest
	// claimable items, so many claimers do not all race for the head.
	PickFrom = 16
	// ReadAhead: pending keys read beyond the held ones when looking for the next item (at least).
	ReadAhead = 32
	// ReadAheadShare and ReadAheadMax: a candidate read reads ahead one in
	// ReadAheadShare of the pending keys the previous read counted, at most
	// ReadAheadMax (joblease.queue's READ_AHEAD_SHARE and READ_AHEAD_MAX).
	ReadAheadShare = 64
	ReadAheadMax   = 2048
)

// itemJob is the name an item goes by in a lease and in errors: "<queue>/<id>"
// in the queue's namespace, so JobRef.String() is Python's str(ItemRef).
func itemJob(item ItemRef) JobRef {
	return JobRef{Namespace: item.Queue.Namespace, Name: item.Queue.Name + "/" + item.ID}
}

// queueSpec is the queue's spec and its mod revision, cached per queue (a
// changed spec fails the claim's first compare and is read again), and the
// revision the read was answered at.
func (c *Client) queueSpec(ctx context.Context, queue QueueRef, refresh bool) (int64, QueueSpec, int64, error) {
	if c.queueSpecs == nil {
		c.queueSpecs = map[QueueRef]cachedQueueSpec{}
	}
	if cached, ok := c.queueSpecs[queue]; ok && !refresh {
		return cached.modRev, cached.spec, cached.readRev, nil
	}
	rev, kv, err := c.Store.Get(ctx, QueueKeysOf(c.Root, queue).Spec())
	if err != nil {
		return 0, QueueSpec{}, 0, err
	}
	if kv == nil {
		delete(c.queueSpecs, queue)
		return 0, QueueSpec{}, rev, errs.QueueNotFound(queue.String())
	}
	spec, err := DecodeQueueSpec(kv.Value)
	if err != nil {
		return 0, QueueSpec{}, rev, err
	}
	c.queueSpecs[queue] = cachedQueueSpec{kv.ModRevision, spec, rev}
	return kv.ModRevision, spec, rev, nil
}

type cachedQueueSpec struct {
	modRev  int64
	spec    QueueSpec
	readRev int64
}

// ClaimItem claims this item (an Indexed Job's index). It refuses like
// Claim, with Suspended (before anything is sent), ItemNotFound and
// QueueNotFound; an item found exhausted is marked failed before
// AttemptsExhausted is returned.
func (c *Client) ClaimItem(ctx context.Context, item ItemRef, owner string) (*Lease, error) {
	if err := ValidateQueue(item.Queue); err != nil {
		return nil, err
	}
	if err := ValidateItemID(item.ID); err != nil {
		return nil, err
	}
	if err := ValidateOwner(owner); err != nil {
		return nil, err
	}
	return c.claimItem(ctx, item, owner, nil)
}

// ClaimOrCreateItem claims this item, enqueueing it first (payload null) if
// it is absent: a CronJob slot. A slot already completed answers
// AlreadyCompleted; one enqueued with another payload, Conflict.
func (c *Client) ClaimOrCreateItem(ctx context.Context, item ItemRef, owner string) (*Lease, error) {
	if err := ValidateOwner(owner); err != nil {
		return nil, err
	}
	if _, err := c.Enqueue(ctx, item, nil); err != nil {
		return nil, err
	}
	return c.ClaimItem(ctx, item, owner)
}

// claimItem: pending is the item's pending key as a claim-next read it (nil: read it here).
func (c *Client) claimItem(ctx context.Context, item ItemRef, owner string, pending *etcd.KV) (*Lease, error) {
	keys := QueueKeysOf(c.Root, item.Queue).Item(item.ID)
	job := itemJob(item)
	refresh := false
	var revoked []string
	// the item's generation (claims version), once read; -1: not yet
	gen := int64(-1)
	for range 16 { // slot races are planned again here (picks are random)
		specRev, spec, readRev, err := c.queueSpec(ctx, item.Queue, refresh)
		if err != nil {
			return nil, err
		}
		if spec.Suspend {
			return nil, errs.Suspended(item.Queue.String(), readRev)
		}
		if pending == nil || refresh {
			if pending, gen, err = c.pendingOf(ctx, item, keys); err != nil {
				return nil, err
			}
		}
		rec, err := DecodePending(pending.Value)
		if err != nil {
			return nil, err
		}
		jobSpec := spec.jobSpec(rec.AttemptsFrom)
		// A queue's claimers take no place in line (joblease.queue): a full
		// semaphore is waited on with a watch (WaitForSlots) by the caller.
		plan, err := c.planFor(ctx, job.String(), item.Queue.Namespace, spec.Semaphores, nil)
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
		// A history's tenure key needs the generation: a claim-next candidate's
		// is guessed from its round (exact for a first claim, the usual case);
		// a wrong guess is refused by the claim's compare and the refresh reads it.
		guess := gen
		if guess < 0 {
			guess = rec.AttemptsFrom
		}
		lease, _, err := c.claimOn(ctx, job, keys, owner, specRev, jobSpec, s, &revoked, pending.ModRevision, guess, plan)
		if errs.Is(err, errs.KindExhausted) {
			c.markFailed(ctx, keys, pending)
			return nil, err
		}
		if err != nil || lease != nil {
			return lease, err
		}
		refresh = true // the spec or the pending key changed (or a claim was revoked): read both again
	}
	if len(revoked) > 0 {
		return nil, errs.Unavailable(fmt.Sprintf("claim of item %s did not settle after several attempts; claims with "+
			"tokens %s committed and were ended by the revoke that settled their unknown outcome (each used an attempt)",
			item, strings.Join(revoked, ", ")))
	}
	return nil, errs.Unavailable(fmt.Sprintf("claim of item %s did not settle after several attempts", item))
}

// pendingOf is the item's pending key and generation (its claims version, read
// with it), or the error that says why it has none (no queue, never
// enqueued, completed, failed).
func (c *Client) pendingOf(ctx context.Context, item ItemRef, keys JobKeys) (*etcd.KV, int64, error) {
	r, err := retryRead(ctx, c.readBackTimeout(), func() (etcd.TxnResult, error) {
		return c.Store.Txn(ctx, nil, []etcd.Op{etcd.Get(keys.Pending()), etcd.Get(keys.Item()), etcd.Get(keys.Result()),
			etcd.Get(keys.Claims()), etcd.Get(keys.Spec())}, nil)
	})
	if err != nil {
		return nil, 0, err
	}
	pending, record, result, claims, spec := r.KV(0), r.KV(1), r.KV(2), r.KV(3), r.KV(4)
	var gen int64
	if claims != nil {
		gen = claims.Version
	}
	switch {
	case pending != nil:
		return pending, gen, nil
	case spec == nil:
		return nil, 0, errs.QueueNotFound(item.Queue.String())
	case record == nil:
		return nil, 0, errs.ItemNotFound(item.String())
	case result != nil:
		rec, err := DecodeResult(result.Value, result.ModRevision)
		if err != nil {
			return nil, 0, err
		}
		return nil, 0, errs.AlreadyCompleted(item.String(), rec.Owner, rec.Token, rec.Generation)
	}
	return nil, 0, errs.AttemptsExhausted(item.String(), gen, gen) // failed: out of the queue until retried
}

// itemRefused explains a failed claim of an item; (true, nil) when the
// queue's spec or the item's pending key merely changed (read them again).
func itemRefused(job JobRef, keys JobKeys, r etcd.TxnResult, specRev int64, spec Spec, pendingRev int64) (bool, error) {
	specKV, holderKV, resultKV, claimsKV, pendingKV, itemKV := r.KV(0), r.KV(1), r.KV(2), r.KV(3), r.KV(4), r.KV(5)
	name := job.String()
	if specKV == nil {
		queue, _, _ := strings.Cut(job.Name, "/")
		return false, errs.QueueNotFound(QueueRef{job.Namespace, queue}.String())
	}
	var gen int64
	if claimsKV != nil {
		gen = claimsKV.Version
	}
	if resultKV != nil {
		rec, err := DecodeResult(resultKV.Value, 0)
		if err != nil {
			return false, err
		}
		return false, errs.AlreadyCompleted(name, rec.Owner, rec.Token, rec.Generation)
	}
	if holderKV != nil {
		h, err := DecodeHolder(holderKV.Value)
		if err != nil {
			return false, err
		}
		return false, errs.Held(name, h.Owner, holderKV.CreateRevision, gen, r.Revision)
	}
	if specKV.ModRevision != specRev {
		return true, nil
	}
	if pendingKV == nil { // neither completed nor pending: failed (or the queue was re-created)
		return false, errs.AttemptsExhausted(name, gen, spec.MaxAttempts)
	}
	if pendingKV.ModRevision != pendingRev {
		return true, nil
	}
	if itemKV == nil {
		return false, itemRecordMissing(name, keys.Item())
	}
	if spec.MaxAttempts > 0 && gen >= spec.MaxAttempts {
		return false, errs.AttemptsExhausted(name, gen, spec.MaxAttempts)
	}
	return true, nil
}

// itemRecordMissing: the item is pending but its record is gone, a state
// joblease never writes (enqueue writes both keys in one transaction,
// deletion removes both); its claim is refused before anything is written
// (joblease.errors.ItemRecordMissingError).
func itemRecordMissing(item, recordKey string) error {
	return errs.Corrupt("item "+item, fmt.Sprintf("it is pending but its record '%s' is missing, a state joblease "+
		"never writes: not claimed; enqueue the item again, or delete its pending key", recordKey))
}

// isItemRecordMissing: err is itemRecordMissing's for item.
func isItemRecordMissing(err error, item ItemRef) bool {
	record, ok := detail(err, "record")
	return ok && errs.Is(err, errs.KindCorrupt) && record == "item "+itemJob(item).String()
}

// markFailed moves an exhausted item out of the pending set (docs/queues.md,
// "Mark failed"); a compare that fails means someone else settled it first.
// Best effort: if etcd cannot be reached, the next claimer that meets the
// item marks it (until then it is counted pending).
func (c *Client) markFailed(ctx context.Context, keys JobKeys, pending *etcd.KV) {
	r, err := c.Store.Txn(ctx, nil, []etcd.Op{etcd.Get(keys.Claims())}, nil)
	if err != nil {
		return
	}
	var version int64
	if kv := r.KV(0); kv != nil {
		version = kv.Version
	}
	value, err := FailedRecord{Generation: version, FailedAt: now()}.Encode()
	if err != nil {
		return
	}
	_, _ = c.Store.Txn(ctx, []etcd.Cmp{etcd.ModEq(keys.Pending(), pending.ModRevision), etcd.CreateEq(keys.Holder(), 0),
		etcd.VersionEq(keys.Result(), 0), etcd.VersionEq(keys.Claims(), version)},
		[]etcd.Op{etcd.Delete(keys.Pending()), etcd.Put(keys.Failed(), value, 0)}, nil)
}

// NoItem is why ClaimNext claimed nothing: Revision is the one to watch from
// (WaitForClaimable), Empty that the queue had no pending item at all (none
// waiting and none held: nothing can become claimable without an enqueue or
// a retry).
type NoItem struct {
	Revision int64
	Empty    bool
}

// candidatePool is what one candidate read found of a queue, kept across
// ClaimNext calls as joblease.queue's _Pool is: the pending keys without a
// holder not yet tried, and the hints for the next read's size.
type candidatePool struct {
	candidates []etcd.KV
	// heldHint and pendingHint: holders and pending keys the last read counted.
	heldHint, pendingHint int
	// readCost is how long the last candidate read took; refusedCost how
	// long the claims refused since then (or since the last success) took.
	readCost, refusedCost time.Duration
	// stuck: pending keys (at their mod revision) whose claim was refused as
	// completed or for a missing item record. A pending key that outlives its
	// item's completion or record, which joblease never writes (the
	// completion and deletion remove it too), would otherwise be read,
	// claimed and refused again without end; reads skip them.
	// stuckSeen: the item ids of such keys the last read skipped.
	stuck     map[string]int64
	stuckSeen []string
}

// stuckKept bounds candidatePool.stuck (as joblease.queue's _STUCK_KEPT).
const stuckKept = 1024

// refusedForGood records that a claim of pending's item was refused as
// completed (or for a missing item record). Usually another claimer
// completed (or deleted) it meanwhile, deleting the key (so it is never read
// at this revision again); if the key is still there, it is stuck, and
// reads skip it.
func (p *candidatePool) refusedForGood(pending etcd.KV) {
	if p.stuck == nil || len(p.stuck) >= stuckKept {
		p.stuck = map[string]int64{} // mostly races' keys, long gone: a stuck one is refused once more
	}
	p.stuck[string(pending.Key)] = pending.ModRevision
}

// stuckError is what ClaimNext answers when only stuck pending keys are left
// to claim (joblease.queue's _stuck_error).
func stuckError(queue QueueRef, keys QueueKeys, ids []string) error {
	shown := strings.Join(ids[:min(5, len(ids))], ", ")
	if len(ids) > 5 {
		shown += fmt.Sprintf(" and %d more", len(ids)-5)
	}
	return errs.Corrupt("queue "+queue.String()+" pending", fmt.Sprintf("item(s) %s are pending but already completed, "+
		"without their item record or with a pending record that does not decode, states joblease never writes (the "+
		"completion deletes the pending key, enqueue "+
		"writes both): nothing else is claimable; delete their keys under '%s' (or enqueue one without a record again)",
		shown, keys.FieldPrefix("pending")))
}

// refused records a claim of a candidate that was refused after d (another
// claimer took it, or it was completed or exhausted meanwhile), and drops
// what is left (the next claim reads again) once refusals cost a read.
//
// A sidecar's pool is one pod's, and a queue usually has several pods
// draining it: they take most of each other's candidates, and every one
// tried costs a transaction. So once refusals cost as long as a read (which
// returns only free items) took, the pool is read again: never much more
// than a read's worth of refusals per claim (shallow queues, whose reads are
// cheap, are read again soon), and on a deep queue, whose read sorts it all
// and costs far more than a refusal, the pool is kept as joblease.queue keeps it.
func (p *candidatePool) refused(d time.Duration) {
	if p.refusedCost += d; p.refusedCost >= p.readCost {
		p.candidates, p.refusedCost = nil, 0
	}
}

// take one of the PickFrom oldest left, at random (claimers in other
// processes read the same head: a random pick spreads them out).
func (p *candidatePool) take() (etcd.KV, bool) {
	if len(p.candidates) == 0 {
		return etcd.KV{}, false
	}
	pick := rand.IntN(min(PickFrom, len(p.candidates)))
	kv := p.candidates[pick]
	p.candidates = append(p.candidates[:pick], p.candidates[pick+1:]...)
	return kv, true
}

func (c *Client) poolOf(queue QueueRef) *candidatePool {
	if c.pools == nil {
		c.pools = map[QueueRef]*candidatePool{}
	}
	p := c.pools[queue]
	if p == nil {
		p = &candidatePool{}
		c.pools[queue] = p
	}
	return p
}

// ClaimNext claims one of the oldest claimable items of queue (docs/queues.md,
// "Claim the next item"), as joblease.queue's claim_next does for one
// claimer: candidates come from a pool filled by one read-only transaction
// (the held keys, keys only; the oldest held+A pending keys by create
// revision, A the adaptive read-ahead of candidateRead; the count of pending
// keys) and kept across calls, so a claim usually costs its one transaction
// and a sidecar draining a queue reads it about once in A items. One of the
// PickFrom oldest candidates is claimed at random. A refused candidate (taken
// by another claimer, completed, or found exhausted and marked failed
// meanwhile) is dropped and another tried, until refusals have cost as long
// as the last read took (candidatePool.refused: then the rest is dropped);
// an empty pool is read again. A candidate refused as completed, or for a
// missing item record, whose pending key is still there (states joblease
// never writes) is skipped by
// later reads; when only such keys are left, ClaimNext answers Corrupt naming
// them rather than reading and being refused without end. It returns a
// lease, or nil and what to wait from when a read found nothing claimable
// (it never waits itself).
// Suspended is returned as ClaimItem would, before anything is sent.
//
// Not safe for concurrent use on one Client (nor is the rest of Client): a
// sidecar claims one item at a time.
func (c *Client) ClaimNext(ctx context.Context, queue QueueRef, owner string) (*Lease, NoItem, error) {
	if err := ValidateQueue(queue); err != nil {
		return nil, NoItem{}, err
	}
	if err := ValidateOwner(owner); err != nil {
		return nil, NoItem{}, err
	}
	keys := QueueKeysOf(c.Root, queue)
	pendingPrefix := keys.FieldPrefix("pending")
	pool := c.poolOf(queue)
	for {
		_, spec, readRev, err := c.queueSpec(ctx, queue, false)
		if err != nil {
			pool.candidates = nil
			return nil, NoItem{}, err
		}
		if spec.Suspend {
			return nil, NoItem{}, errs.Suspended(queue.String(), readRev)
		}
		for {
			pending, ok := pool.take()
			if !ok {
				break
			}
			id := strings.TrimPrefix(string(pending.Key), pendingPrefix)
			if _, err := DecodePending(pending.Value); err != nil {
				// written by hand (joblease writes none): skipped like a stuck key,
				// so one bad key cannot stop the queue for every claimer
				pool.refusedForGood(pending)
				continue
			}
			sent := time.Now()
			lease, err := c.claimItem(ctx, ItemRef{queue, id}, owner, &pending)
			if err == nil {
				pool.refusedCost = 0
				return lease, NoItem{}, nil
			}
			switch {
			case errs.Is(err, errs.KindCompleted), isItemRecordMissing(err, ItemRef{queue, id}):
				pool.refusedForGood(pending) // completed meanwhile, or stuck
				pool.refused(time.Since(sent))
				continue
			case errs.Is(err, errs.KindHeld, errs.KindExhausted),
				errs.Is(err, errs.KindNotRegistered) && hasDetail(err, "item"):
				// Taken, exhausted (now marked failed), completed meanwhile, or
				// gone with a re-created queue: try another, or read again.
				pool.refused(time.Since(sent))
				continue
			case errs.Is(err, errs.KindFull):
				pool.candidates = append(pool.candidates, pending) // still claimable once a slot frees
			default:
				// The queue is gone, etcd unreachable...: what the pool read
				// may be stale by the time a claim can pass; read it again then.
				pool.candidates = nil
			}
			return nil, NoItem{}, err
		}
		read := time.Now()
		revision, free, err := c.candidateRead(ctx, keys, pool)
		if err != nil {
			return nil, NoItem{}, err
		}
		pool.readCost, pool.refusedCost = time.Since(read), 0
		if len(free) == 0 {
			if len(pool.stuckSeen) > 0 {
				return nil, NoItem{}, stuckError(queue, keys, pool.stuckSeen)
			}
			return nil, NoItem{Revision: revision, Empty: pool.pendingHint == 0}, nil
		}
		pool.candidates = free
	}
}

// candidateRead reads, in one read-only transaction, the held ids (keys
// only), the oldest pending keys and the number of pending keys, records the
// counts in pool (the next read's hints) and returns the revision read at (a
// waiter watches from just after it) and the pending keys without a holder.
// It asks for held+A pending keys, held as the last read counted and A =
// ReadAhead, or one in ReadAheadShare of the pending keys it counted, at
// most ReadAheadMax (docs/queues.md: etcd sorts the whole range before it
// limits, so reading ahead in proportion keeps the cost per claim flat on a
// deep queue); when holders filled a read cut at that limit, it reads again
// past them.
func (c *Client) candidateRead(ctx context.Context, keys QueueKeys, pool *candidatePool) (int64, []etcd.KV, error) {
	heldPrefix, pendingPrefix := keys.FieldPrefix("held"), keys.FieldPrefix("pending")
	ahead := min(max(ReadAhead, pool.pendingHint/ReadAheadShare), ReadAheadMax)
	limit := int64(pool.heldHint + ahead)
	for {
		r, err := retryRead(ctx, c.readBackTimeout(), func() (etcd.TxnResult, error) {
			return c.Store.Txn(ctx, nil, []etcd.Op{etcd.GetPrefixOp(heldPrefix, etcd.RangeOpts{KeysOnly: true}),
				etcd.GetPrefixOp(pendingPrefix, etcd.RangeOpts{Limit: limit, OldestFirst: true}),
				etcd.GetPrefixOp(pendingPrefix, etcd.RangeOpts{CountOnly: true})}, nil)
		})
		if err != nil {
			return 0, nil, err
		}
		held := map[string]bool{}
		var pending []etcd.KV
		var count int64
		if len(r.Gets) == 3 {
			for _, kv := range r.Gets[0] {
				held[strings.TrimPrefix(string(kv.Key), heldPrefix)] = true
			}
			pending, count = r.Gets[1], r.Counts[2]
		}
		var free []etcd.KV
		var skipped []string
		for _, kv := range pending {
			id := strings.TrimPrefix(string(kv.Key), pendingPrefix)
			if rev, ok := pool.stuck[string(kv.Key)]; ok && rev == kv.ModRevision {
				skipped = append(skipped, id)
			} else if !held[id] {
				free = append(free, kv)
			}
		}
		pool.heldHint, pool.pendingHint, pool.stuckSeen = len(held), int(count), skipped
		if len(free) >= ReadAhead || int64(len(pending)) < limit {
			if len(pool.stuck) > 0 && int64(len(pending)) < limit { // read whole: forget keys gone since
				seen := map[string]int64{}
				for _, kv := range pending {
					seen[string(kv.Key)] = kv.ModRevision
				}
				for key, rev := range pool.stuck {
					if at, ok := seen[key]; !ok || at != rev {
						delete(pool.stuck, key)
					}
				}
			}
			return r.Revision, free, nil
		}
		// the holders (and stuck keys) filled a read cut at the limit: read past them
		limit = int64(len(held) + len(skipped) + ahead)
	}
}

// WaitForClaimable waits until, after revision, a pending key of queue is
// written (an enqueue, a retry), a holder deleted (a completion, a release,
// an expiry) or the queue's spec changed (resumed, deleted), at most timeout
// and no longer than ctx: true if one came. A watch, never a poll. Like
// WaitForHolderChange, a watch error it cannot retry ends the wait early
// with false and the error; the caller claims again and learns what is wrong.
func (c *Client) WaitForClaimable(ctx context.Context, queue QueueRef, revision int64, timeout time.Duration) (bool, error) {
	keys := QueueKeysOf(c.Root, queue)
	pending, held, spec := keys.FieldPrefix("pending"), keys.FieldPrefix("held"), keys.Spec()
	wctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	// The spec may have changed: the next claim reads it again (a cached
	// "suspended" would refuse it without sending anything, forever).
	defer delete(c.queueSpecs, queue)
	return c.Store.WatchUntil(wctx, keys.Prefix, etcd.PrefixEnd(keys.Prefix), revision+1, func(ev etcd.Event) bool {
		key := string(ev.Key)
		return (!ev.Deleted && strings.HasPrefix(key, pending)) || (ev.Deleted && strings.HasPrefix(key, held)) || key == spec
	})
}

// WaitForResume waits for a change of a suspended queue's spec after
// revision (resumed, changed, deleted), at most timeout: true if one came.
// The cached spec is dropped, so the next claim reads it again.
func (c *Client) WaitForResume(ctx context.Context, queue QueueRef, revision int64, timeout time.Duration) (bool, error) {
	defer delete(c.queueSpecs, queue)
	return c.WaitForKeyChange(ctx, QueueKeysOf(c.Root, queue).Spec(), revision, timeout)
}

// WaitForKeyChange waits for a put or delete of key after revision (an item's holder, or its queue's spec).
func (c *Client) WaitForKeyChange(ctx context.Context, key string, revision int64, timeout time.Duration) (bool, error) {
	wctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	return c.Store.WatchChange(wctx, key, revision+1)
}

// Enqueue adds one item (docs/queues.md, "Enqueue", for a batch of one): an
// id already stored with the same payload is left as it is (re-enqueueing is
// a no-op, even for a completed or failed item; false), one stored with
// another payload is refused with Conflict; otherwise the item and its
// pending key are written in one transaction conditional on the queue
// existing and the item not (true). An unknown outcome is settled by
// sending it again: a copy that committed makes the next fail its compares
// and read back as the same payload.
func (c *Client) Enqueue(ctx context.Context, item ItemRef, payload any) (bool, error) {
	if err := ValidateQueue(item.Queue); err != nil {
		return false, err
	}
	if err := ValidateItemID(item.ID); err != nil {
		return false, err
	}
	want, err := payloadBytes(payload, item.ID)
	if err != nil {
		return false, err
	}
	keys := QueueKeysOf(c.Root, item.Queue).Item(item.ID)
	for attempt := 0; attempt < 5; attempt++ {
		stamp := now()
		itemValue, err := ItemRecord{Payload: payload, EnqueuedAt: stamp}.Encode()
		if err != nil {
			return false, errs.Invalid("invalid payload: " + err.Error())
		}
		pendingValue, err := PendingRecord{Since: stamp}.Encode()
		if err != nil {
			return false, err
		}
		r, err := c.Store.Txn(ctx, []etcd.Cmp{etcd.CreateNe(keys.Spec(), 0), etcd.CreateEq(keys.Item(), 0)},
			[]etcd.Op{etcd.Put(keys.Item(), itemValue, 0), etcd.Put(keys.Pending(), pendingValue, 0)},
			[]etcd.Op{etcd.Get(keys.Spec()), etcd.Get(keys.Item())})
		if errs.Is(err, errs.KindOutcomeUnknown, errs.KindUnavailable) {
			select {
			case <-ctx.Done():
				return false, err
			case <-time.After(time.Duration(100<<attempt) * time.Millisecond):
			}
			continue
		}
		if err != nil {
			return false, err
		}
		if r.Succeeded {
			return true, nil
		}
		if r.KV(0) == nil {
			return false, errs.QueueNotFound(item.Queue.String())
		}
		stored := r.KV(1)
		if stored == nil { // refused although both keys read back as they should be: try again
			continue
		}
		rec, err := DecodeItem(stored.Value, stored.CreateRevision)
		if err != nil {
			return false, err
		}
		have, err := pyjson.Sorted(rec.Payload)
		if err != nil {
			return false, err
		}
		if string(have) != string(want) {
			return false, errs.Conflict(item.Queue.String(), item.ID)
		}
		return false, nil // already there (a concurrent enqueue, or an earlier copy of this one)
	}
	return false, errs.OutcomeUnknown(fmt.Sprintf("enqueueing item %s did not settle", item))
}

// ReadItemState reads what the sidecar needs of an item at one revision:
// whether its queue exists, its live holder and its result (undecodable
// records left empty, as ReadState does).
func (c *Client) ReadItemState(ctx context.Context, item ItemRef) (JobState, error) {
	keys := QueueKeysOf(c.Root, item.Queue).Item(item.ID)
	r, err := c.Store.Txn(ctx, nil, []etcd.Op{etcd.Get(keys.Spec()), etcd.Get(keys.Holder()), etcd.Get(keys.Result())}, nil)
	if err != nil {
		return JobState{}, err
	}
	var st JobState
	st.Registered = r.KV(0) != nil
	if kv := r.KV(1); kv != nil {
		if h, err := DecodeHolder(kv.Value); err == nil {
			st.HolderToken, st.HolderOwner = kv.CreateRevision, h.Owner
		}
	}
	if kv := r.KV(2); kv != nil {
		if res, err := DecodeResult(kv.Value, kv.ModRevision); err == nil {
			st.Result = &res
		}
	}
	return st, nil
}

// hasDetail: err is a protocol error whose details name key (an
// ItemNotFound names the item, a QueueNotFound the queue).
func hasDetail(err error, key string) bool {
	_, ok := detail(err, key)
	return ok
}

// detail is the value err's details give key, and whether they give one.
func detail(err error, key string) (any, bool) {
	e, ok := errs.As(err)
	if !ok {
		return nil, false
	}
	for _, kv := range e.Details {
		if kv.Key == key {
			return kv.Value, true
		}
	}
	return nil, false
}
