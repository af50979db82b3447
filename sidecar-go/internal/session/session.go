// Package session keeps one etcd lease alive on one keep-alive stream, with
// the local safety deadline of docs/protocol.md#conservative-deadline: valid only
// until "time the last successful keep-alive was *sent* + TTL - margin" on
// the monotonic clock. Loss is final: once the deadline has passed, a
// keep-alive answered later does not revive the session, and a lost session
// revokes its etcd lease (best effort) so the job it held is claimable at once.
package session

import (
	"context"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/joblease/joblease/sidecar-go/internal/errs"
	"github.com/joblease/joblease/sidecar-go/internal/etcd"
)

// DefaultMargin is 20% of the TTL, at most 2 s.
func DefaultMargin(ttl int64) time.Duration {
	return min(2*time.Second, time.Duration(float64(ttl)*0.2*float64(time.Second)))
}

// Session is one etcd lease of TTL seconds and its keep-alive loop.
type Session struct {
	store    *etcd.Store
	TTL      int64
	margin   time.Duration
	LeaseID  int64
	interval time.Duration

	mu         sync.Mutex
	deadline   time.Time // carries Go's monotonic reading
	lostReason string
	closing    bool
	lost       chan struct{}
	listeners  []listener
	listenerID uint64
	check      func()
	checking   atomic.Bool
	done       chan struct{}
}

// SetCheck sets what re-verifies the holders bound to this lease after each
// keep-alive (renew-checks-holder: a live etcd lease alone is not proof, the
// key can be deleted meanwhile). The check runs beside the keep-alive loop,
// one at a time: a slow check (etcd answering reads late) never delays the
// next keep-alive, so it cannot turn into a spurious loss; a keep-alive that
// succeeds while a check is still running starts none (the running one reports).
func (s *Session) SetCheck(check func()) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.check = check
}

func (s *Session) startCheck() {
	s.mu.Lock()
	check := s.check
	s.mu.Unlock()
	if check == nil || !s.checking.CompareAndSwap(false, true) {
		return
	}
	go func() {
		defer s.checking.Store(false)
		check()
	}()
}

// Start grants the lease and starts renewing it every TTL/3.
func Start(ctx context.Context, store *etcd.Store, ttl int64) (*Session, error) {
	sent := time.Now()
	id, granted, err := store.Grant(ctx, ttl)
	if err != nil {
		return nil, err
	}
	s := &Session{store: store, TTL: ttl, margin: DefaultMargin(ttl), LeaseID: id,
		interval: time.Duration(float64(ttl) / 3 * float64(time.Second)),
		lost:     make(chan struct{}), done: make(chan struct{})}
	s.deadline = sent.Add(time.Duration(granted)*time.Second - s.margin)
	go s.run()
	return s, nil
}

// Alive is true until the safety deadline passes or the session is lost; never again after.
func (s *Session) Alive() bool {
	s.mu.Lock()
	expired := s.lostReason == "" && !time.Now().Before(s.deadline)
	s.mu.Unlock()
	if expired {
		s.Lose("no keep-alive succeeded before the safety deadline", false)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.lostReason == ""
}

// Remaining local safety time (0 once lost).
func (s *Session) Remaining() time.Duration {
	if !s.Alive() {
		return 0
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return max(0, time.Until(s.deadline))
}

// LostReason is why the session was lost ("" while alive).
func (s *Session) LostReason() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.lostReason
}

// Lost is closed once the session is lost.
func (s *Session) Lost() <-chan struct{} { return s.lost }

type listener struct {
	id uint64
	fn func(string)
}

// OnLoss registers a callback run (once) when the session is lost (at once
// if it already is). The function returned unregisters it: a lease that
// ended calls it, because one session outlives many leases (a draining
// sidecar's holds item after item on it), and a callback kept for each would
// keep every ended lease in memory for as long as the session lives.
func (s *Session) OnLoss(fn func(string)) (unregister func()) {
	s.mu.Lock()
	reason := s.lostReason
	var id uint64
	if reason == "" {
		s.listenerID++
		id = s.listenerID
		s.listeners = append(s.listeners, listener{id, fn})
	}
	s.mu.Unlock()
	if reason != "" {
		fn(reason)
	}
	return func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		for i, l := range s.listeners {
			if l.id == id {
				s.listeners = append(s.listeners[:i], s.listeners[i+1:]...)
				return
			}
		}
	}
}

// Listening is how many loss callbacks are registered (for tests).
func (s *Session) Listening() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.listeners)
}

// Lose marks the session lost (idempotent) and tells the listeners.
func (s *Session) Lose(reason string, expected bool) {
	s.mu.Lock()
	if s.lostReason != "" {
		s.mu.Unlock()
		return
	}
	s.lostReason = reason
	listeners := s.listeners
	s.listeners = nil
	close(s.lost)
	s.mu.Unlock()
	if !expected {
		slog.Warn("etcd lease lost", "leaseId", s.LeaseID, "reason", reason)
	}
	for _, l := range listeners {
		l.fn(reason)
	}
}

func (s *Session) run() {
	defer close(s.done)
	stream := s.store.NewKeepAlive(s.LeaseID)
	defer stream.Close()
	for s.Alive() {
		s.mu.Lock()
		wait := min(s.interval, max(0, time.Until(s.deadline)))
		s.mu.Unlock()
		timer := time.NewTimer(wait)
		select {
		case <-s.lost:
		case <-timer.C:
		}
		timer.Stop()
		if !s.Alive() {
			break // lost, or woke up late (paused, starved): nothing counts now
		}
		sent := time.Now()
		s.mu.Lock()
		timeout := min(s.interval, time.Until(s.deadline))
		s.mu.Unlock()
		ttl, err := stream.Renew(timeout)
		if err != nil {
			if errs.Is(err, errs.KindUnavailable, errs.KindLeaseNotFound) {
				slog.Info("keep-alive failed", "leaseId", s.LeaseID, "reason", err.Error())
				continue
			}
			s.Lose("keep-alive refused: "+err.Error(), false)
			break
		}
		if !s.Alive() {
			break // answered after the deadline: loss is final
		}
		if ttl <= 0 {
			s.Lose("etcd reports the lease expired (or it was revoked)", false)
			break
		}
		s.mu.Lock()
		if d := sent.Add(time.Duration(ttl)*time.Second - s.margin); d.After(s.deadline) {
			s.deadline = d
		}
		s.mu.Unlock()
		s.startCheck()
	}
	s.mu.Lock()
	closing := s.closing
	s.mu.Unlock()
	if !closing {
		s.revoke()
	}
}

func (s *Session) revoke() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := s.store.Revoke(ctx, s.LeaseID); err != nil {
		slog.Info("revoking lost etcd lease failed (it expires by itself)", "leaseId", s.LeaseID, "reason", err.Error())
	}
}

// Close stops renewing; with revoke, the held job is given back at once.
func (s *Session) Close(ctx context.Context, revoke bool) {
	s.mu.Lock()
	s.closing = true
	s.mu.Unlock()
	s.Lose("session closed", true)
	// The loop wakes at once (lost); a keep-alive in flight ends within its timeout.
	select {
	case <-s.done:
	case <-time.After(time.Second):
	}
	if revoke {
		_ = s.store.Revoke(ctx, s.LeaseID)
	}
}
