package protocol

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/joblease/joblease/sidecar-go/internal/errs"
	"github.com/joblease/joblease/sidecar-go/internal/etcd"
	"github.com/joblease/joblease/sidecar-go/internal/pyjson"
	"github.com/joblease/joblease/sidecar-go/internal/session"
)

// Semaphore slots taken in a claim's own transaction (docs/semaphores.md;
// joblease.slots). A claim that needs w slots of semaphore S (limit K) reads
// its semaphores in one read-only transaction, picks w free indexes below K
// at random, and adds to its claim transaction, per semaphore:
//
//	mod(S/spec) == the revision read          (the limit it planned with)
//	create(S/slots/<i>) == 0  for each pick   (still free)
//	no key in [S/slots/<K>, end of S/slots/)  (nobody above a lowered limit)
//	no key in S/waiters/                      (nobody waits: do not jump the line)
//	  or: every waiter's create revision >= the ticket's  (we are first in line)
//
// and puts the picked slot keys bound to the claim's etcd lease. A job's
// waiting claim gets in line with a Ticket first; a queue's claimers wait on a
// watch of the semaphores without a place in line, as joblease.queue does.

// SemaphoresSegment is the path segment under a namespace that holds its semaphores.
const SemaphoresSegment = "_semaphores"

// SlotDigits: slot indexes are zero-padded so that key order is index order.
const SlotDigits = 6

// SemaphoreRef is a semaphore's identity: the namespace and name of its JobSemaphore.
type SemaphoreRef struct{ Namespace, Name string }

func (s SemaphoreRef) String() string { return s.Namespace + "/" + s.Name }

// SemaphoreKeys are a semaphore's keys: Prefix is <root>/<ns>/_semaphores/<name>/.
type SemaphoreKeys struct{ Prefix string }

// SemaphoreKeysOf maps a semaphore to its keys under root (normalised as Keys does).
func SemaphoreKeysOf(root string, s SemaphoreRef) SemaphoreKeys {
	root = "/" + strings.Trim(root, "/")
	return SemaphoreKeys{Prefix: root + "/" + s.Namespace + "/" + SemaphoresSegment + "/" + s.Name + "/"}
}

func (k SemaphoreKeys) Spec() string    { return k.Prefix + "spec" }
func (k SemaphoreKeys) Slots() string   { return k.Prefix + "slots/" }
func (k SemaphoreKeys) Waiters() string { return k.Prefix + "waiters/" }
func (k SemaphoreKeys) Slot(index int64) string {
	return fmt.Sprintf("%s%0*d", k.Slots(), SlotDigits, index)
}
func (k SemaphoreKeys) Waiter(ticket string) string { return k.Waiters() + ticket }

// SlotIndex is the index of a slot key (-1 if it is not one of this semaphore's).
func (k SemaphoreKeys) SlotIndex(key string) int64 {
	i, err := strconv.ParseInt(strings.TrimPrefix(key, k.Slots()), 10, 64)
	if err != nil || !strings.HasPrefix(key, k.Slots()) {
		return -1
	}
	return i
}

// semNeed is one semaphore a claim needs and how many of its slots.
type semNeed struct {
	ref    SemaphoreRef
	keys   SemaphoreKeys
	weight int64
}

// needsOf is (ref, keys, weight) per use, in name order (slots.semaphore_refs:
// a stable order for reads, the same in every claimer).
func needsOf(root, namespace string, uses []SemaphoreUse) []semNeed {
	sorted := slices.Clone(uses)
	sort.Slice(sorted, func(i, j int) bool {
		if sorted[i].Name != sorted[j].Name {
			return sorted[i].Name < sorted[j].Name
		}
		return sorted[i].Weight < sorted[j].Weight
	})
	out := make([]semNeed, 0, len(sorted))
	for _, u := range sorted {
		ref := SemaphoreRef{namespace, u.Name}
		out = append(out, semNeed{ref, SemaphoreKeysOf(root, ref), u.Weight})
	}
	return out
}

// semState is one semaphore as read at one revision.
type semState struct {
	need    semNeed
	specRev int64
	limit   int64
	slots   map[int64]etcd.KV // live slots by index
	waiters []etcd.KV         // oldest first
}

// readSemaphores reads every semaphore of needs in one read-only transaction
// (spec, live slots, waiters oldest first): the states and the revision.
func (c *Client) readSemaphores(ctx context.Context, needs []semNeed) ([]semState, int64, error) {
	var ops []etcd.Op
	for _, n := range needs {
		ops = append(ops, etcd.Get(n.keys.Spec()), etcd.GetPrefixOp(n.keys.Slots(), etcd.RangeOpts{}),
			etcd.GetPrefixOp(n.keys.Waiters(), etcd.RangeOpts{OldestFirst: true}))
	}
	r, err := retryRead(ctx, c.readBackTimeout(), func() (etcd.TxnResult, error) { return c.Store.Txn(ctx, nil, ops, nil) })
	if err != nil {
		return nil, 0, err
	}
	states := make([]semState, 0, len(needs))
	for i, n := range needs {
		specKV := r.KV(3 * i)
		if specKV == nil {
			return nil, r.Revision, errs.SemaphoreNotFound(n.ref.String())
		}
		spec, err := DecodeSemaphoreSpec(specKV.Value)
		if err != nil {
			return nil, r.Revision, err
		}
		st := semState{need: n, specRev: specKV.ModRevision, limit: spec.Limit, slots: map[int64]etcd.KV{}}
		if len(r.Gets) > 3*i+2 {
			for _, kv := range r.Gets[3*i+1] {
				st.slots[n.keys.SlotIndex(string(kv.Key))] = kv
			}
			st.waiters = r.Gets[3*i+2]
		}
		states = append(states, st)
	}
	return states, r.Revision, nil
}

// Ticket is a place in line: waiter keys put in one transaction (so at one
// create revision in every semaphore the claim waits for: no two waiters can
// be ahead of each other in different semaphores, hence no deadlock), bound
// to a session of the waiter's own. Close revokes it (the keys go with it).
type Ticket struct {
	Revision int64
	Keys     []string
	guard    *session.Session
}

// Lost is closed once the ticket's session is lost (its keys expire with it:
// the place in line is gone, and a new ticket goes to the back).
func (t *Ticket) Lost() <-chan struct{} { return t.guard.Lost() }

// Alive: the ticket's session is alive, so its place in line holds.
func (t *Ticket) Alive() bool { return t.guard.Alive() }

// Close revokes the ticket's session: its waiter keys are deleted with it.
func (t *Ticket) Close(ctx context.Context) { t.guard.Close(ctx, true) }

// slotPick is the slots a claim takes of one semaphore.
type slotPick struct {
	state   semState
	indexes []int64
}

// SlotPlan is the slots a claim will take and the compares that make taking them safe.
type SlotPlan struct {
	picks  []slotPick
	ticket *Ticket
}

func (p *SlotPlan) compares() []etcd.Cmp {
	var out []etcd.Cmp
	for _, pk := range p.picks {
		k := pk.state.need.keys
		out = append(out, etcd.ModEq(k.Spec(), pk.state.specRev))
		for _, i := range pk.indexes {
			out = append(out, etcd.CreateEq(k.Slot(i), 0))
		}
		out = append(out, etcd.CreateEqRange(k.Slot(pk.state.limit), etcd.PrefixEnd(k.Slots()), 0))
		if p.ticket == nil {
			out = append(out, etcd.CreateEqRange(k.Waiters(), etcd.PrefixEnd(k.Waiters()), 0))
		} else {
			out = append(out, etcd.CreateGreaterRange(k.Waiters(), etcd.PrefixEnd(k.Waiters()), p.ticket.Revision-1))
		}
	}
	return out
}

func (p *SlotPlan) writes(leaseID int64, rec SlotRecord) ([]etcd.Op, error) {
	value, err := rec.Encode()
	if err != nil {
		return nil, err
	}
	var ops []etcd.Op
	for _, pk := range p.picks {
		for _, i := range pk.indexes {
			ops = append(ops, etcd.Put(pk.state.need.keys.Slot(i), value, leaseID))
		}
	}
	if p.ticket != nil {
		for _, k := range p.ticket.Keys {
			ops = append(ops, etcd.Delete(k))
		}
	}
	return ops, nil
}

// grants are the slots the plan took, under token (the claim's commit revision).
func (p *SlotPlan) grants(token int64) []SlotGrant {
	if p == nil {
		return nil
	}
	out := make([]SlotGrant, 0, len(p.picks))
	for _, pk := range p.picks {
		g := SlotGrant{Semaphore: pk.state.need.ref, Indexes: pk.indexes, Token: token}
		for _, i := range pk.indexes {
			g.keys = append(g.keys, pk.state.need.keys.Slot(i))
		}
		out = append(out, g)
	}
	return out
}

// SlotGrant is the slots of one semaphore a claim holds; Token is their create
// revision (the claim's commit revision), which fenced destinations gate on.
type SlotGrant struct {
	Semaphore SemaphoreRef
	Indexes   []int64
	Token     int64
	keys      []string
}

// Dict is SlotGrant.to_dict: {"semaphore", "slots", "token"}.
func (g SlotGrant) Dict() pyjson.Obj {
	slots := make([]any, 0, len(g.Indexes))
	for _, i := range g.Indexes {
		slots = append(slots, i)
	}
	return pyjson.Obj{{Key: "semaphore", Value: g.Semaphore.String()}, {Key: "slots", Value: slots},
		{Key: "token", Value: g.Token}}
}

// planSlots is slots.plan: the slots to take for job, or SemaphoreFull naming
// the first semaphore without room (or with someone ahead in line); a weight
// above a limit is refused as bad input. Free indexes are picked at random:
// many claimers reading the same free slots would all pick the lowest and collide.
func planSlots(job string, states []semState, ticket *Ticket, revision int64) (*SlotPlan, error) {
	plan := &SlotPlan{ticket: ticket}
	for _, st := range states {
		w := st.need.weight
		if w > st.limit {
			return nil, errs.Invalid(fmt.Sprintf("%s needs %d slots of semaphore %s, whose limit is %d: it could never "+
				"be granted", job, w, st.need.ref, st.limit))
		}
		ahead := 0
		for _, kv := range st.waiters {
			if ticket == nil || kv.CreateRevision < ticket.Revision {
				ahead++
			}
		}
		over := false
		for i := range st.slots {
			if i >= st.limit {
				over = true
			}
		}
		var free []int64
		for i := int64(0); i < st.limit; i++ {
			if _, taken := st.slots[i]; !taken {
				free = append(free, i)
			}
		}
		if ahead > 0 || over || int64(len(free)) < w {
			return nil, errs.SemaphoreFull(st.need.ref.String(), job, st.limit, int64(len(st.slots)),
				int64(len(st.waiters)), w, revision)
		}
		rand.Shuffle(len(free), func(i, j int) { free[i], free[j] = free[j], free[i] })
		chosen := slices.Clone(free[:w])
		slices.Sort(chosen)
		plan.picks = append(plan.picks, slotPick{st, chosen})
	}
	return plan, nil
}

// planFor reads the semaphores a claim of uses needs and plans its slots (nil: it names none).
func (c *Client) planFor(ctx context.Context, what, namespace string, uses []SemaphoreUse, ticket *Ticket) (*SlotPlan, error) {
	if len(uses) == 0 {
		return nil, nil
	}
	states, revision, err := c.readSemaphores(ctx, needsOf(c.Root, namespace, uses))
	if err != nil {
		return nil, err
	}
	return planSlots(what, states, ticket, revision)
}

// TakeTicket gets job in line for the slots its spec names: waiter keys in
// every semaphore, put in one transaction (one create revision: the same
// place in every line) bound to a new session of the job's TTL, so giving up
// or dying leaves nothing behind beyond that TTL.
func (c *Client) TakeTicket(ctx context.Context, job JobRef, owner string) (*Ticket, error) {
	_, spec, err := c.readSpec(ctx, job, Keys(c.Root, job), false)
	if err != nil {
		return nil, err
	}
	needs := needsOf(c.Root, job.Namespace, spec.Semaphores)
	if len(needs) == 0 {
		return nil, errs.Invalid(fmt.Sprintf("job %s names no semaphore: there is no line to wait in", job))
	}
	guard, err := session.Start(ctx, c.Store, spec.LeaseDurationSeconds)
	if err != nil {
		return nil, err
	}
	id := newClaimID()
	t := &Ticket{guard: guard}
	var cmps []etcd.Cmp
	var puts, gets []etcd.Op
	for _, n := range needs {
		value, err := WaiterRecord{Holder: job.String(), Owner: owner, Weight: n.weight}.Encode()
		if err != nil {
			guard.Close(ctx, true)
			return nil, err
		}
		key := n.keys.Waiter(id)
		t.Keys = append(t.Keys, key)
		cmps = append(cmps, etcd.CreateEq(key, 0))
		puts = append(puts, etcd.Put(key, value, guard.LeaseID))
		gets = append(gets, etcd.Get(key))
	}
	// Only if absent: a copy re-sent after an unknown outcome then finds the
	// first copy's keys and their create revision, our place in line.
	for attempt := 0; ; attempt++ {
		r, err := c.Store.Txn(ctx, cmps, puts, gets)
		if err == nil {
			if r.Succeeded {
				t.Revision = r.Revision
				return t, nil
			}
			if kv := r.KV(0); kv != nil {
				t.Revision = kv.CreateRevision
				return t, nil
			}
			err = errs.Generic("waiter keys bound to a live session vanished")
		}
		if attempt == 4 || !errs.Is(err, errs.KindOutcomeUnknown, errs.KindUnavailable) {
			guard.Close(ctx, true)
			return nil, err
		}
		select {
		case <-ctx.Done():
			guard.Close(context.Background(), true)
			return nil, ctx.Err()
		case <-time.After(time.Duration(100<<attempt) * time.Millisecond):
		}
	}
}

// SlotWatch is a waiting phase's watch of the semaphores a claim needs (a slot
// or a waiter deleted, the spec written): one etcd watch per semaphore, opened
// once and kept across the phase's retries, never a poll. It is opened from
// the revision of a fresh read + 1, so etcd registers it as synced and sends
// each change as it commits; a watch opened at every wait from the revision
// of the refusal was, whenever anything had been written since, an unsynced
// watcher that etcd catches up every 100 ms, and a hand-over waited for that
// (docs/benchmarks.md, "Semaphores"). Wait tells whether a change came after
// a given revision: the refusal a claim planned from, never older than From,
// so no change it has not seen is missed.
type SlotWatch struct {
	keys   []string // the semaphores' prefixes, in needs order
	from   int64    // the fresh read's revision: every change after it is seen
	cancel context.CancelFunc
	mu     sync.Mutex
	latest int64         // the highest revision of a change seen
	change chan struct{} // closed at each change seen (then replaced)
	err    error         // set once a watch ended for good (revision compacted, refused)
}

// WatchSlots opens the watch of the semaphores uses names (nil: it names none).
// Close ends it; so does ctx.
func (c *Client) WatchSlots(ctx context.Context, namespace string, uses []SemaphoreUse) (*SlotWatch, error) {
	needs := needsOf(c.Root, namespace, uses)
	if len(needs) == 0 {
		return nil, nil
	}
	revision, _, err := c.Store.Get(ctx, needs[0].keys.Spec())
	if err != nil {
		return nil, err
	}
	wctx, cancel := context.WithCancel(ctx)
	w := &SlotWatch{from: revision, cancel: cancel, change: make(chan struct{})}
	for _, n := range needs {
		w.keys = append(w.keys, n.keys.Prefix)
		spec := n.keys.Spec()
		go func() {
			_, err := c.Store.WatchUntil(wctx, n.keys.Prefix, etcd.PrefixEnd(n.keys.Prefix), revision+1,
				func(ev etcd.Event) bool {
					if ev.Deleted || string(ev.Key) == spec {
						w.saw(ev.Revision)
					}
					return false // keep watching: the phase's next wait needs it too
				})
			if wctx.Err() == nil {
				w.failed(err)
			}
		}()
	}
	return w, nil
}

func (w *SlotWatch) saw(revision int64) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if revision > w.latest {
		w.latest = revision
		close(w.change)
		w.change = make(chan struct{})
	}
}

func (w *SlotWatch) failed(err error) {
	if err == nil {
		err = errs.Generic("the watch of the semaphores ended")
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.err == nil {
		w.err = err
		close(w.change)
		w.change = make(chan struct{})
	}
}

// From is the revision the watch sees every change after.
func (w *SlotWatch) From() int64 { return w.from }

// Serves tells whether the watch is of exactly the semaphores uses names and
// still running: else the waiter opens another.
func (w *SlotWatch) Serves(root, namespace string, uses []SemaphoreUse) bool {
	needs := needsOf(root, namespace, uses)
	if len(needs) != len(w.keys) {
		return false
	}
	for i, n := range needs {
		if n.keys.Prefix != w.keys[i] {
			return false
		}
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.err == nil
}

// Wait waits until a change after revision has been seen (true), at most
// timeout and no longer than ctx (false, nil), or the watch ended for good
// (its error). revision must not be older than From.
func (w *SlotWatch) Wait(ctx context.Context, revision int64, timeout time.Duration) (bool, error) {
	t := time.NewTimer(timeout)
	defer t.Stop()
	for {
		w.mu.Lock()
		latest, err, change := w.latest, w.err, w.change
		w.mu.Unlock()
		if latest > revision {
			return true, nil
		}
		if err != nil {
			return false, err
		}
		select {
		case <-change:
		case <-ctx.Done():
			return false, nil
		case <-t.C:
			return false, nil
		}
	}
}

// Close ends the watch.
func (w *SlotWatch) Close() { w.cancel() }

// SemaphoresOf is what a job's spec names and its TTL, for a waiter (the
// spec as this client last read it: the claim that was refused read it).
func (c *Client) SemaphoresOf(ctx context.Context, job JobRef) ([]SemaphoreUse, int64, error) {
	_, spec, err := c.readSpec(ctx, job, Keys(c.Root, job), false)
	return spec.Semaphores, spec.LeaseDurationSeconds, err
}

// QueueSemaphores is what a queue's spec names and its TTL (as last read).
func (c *Client) QueueSemaphores(ctx context.Context, queue QueueRef) ([]SemaphoreUse, int64, error) {
	_, spec, _, err := c.queueSpec(ctx, queue, false)
	return spec.Semaphores, spec.LeaseDurationSeconds, err
}
