// Package startup records where the sidecar's start spends its time, on the
// monotonic clock: each step (reading the configuration, connecting to etcd
// and its TLS handshake, authenticating, the spec read, the lease grant, the
// claim transaction, the token files) with its offset from the start of main
// and its duration. The runner logs them once, at debug level, when the
// first lease is held ("start timeline"): what a slow start was waiting for
// (a slow DNS answer, a TLS handshake on a busy node, etcd's password check
// or its fsyncs) without a tracer. Steps may overlap (the connection is made
// while the listeners start); the time before main (exec, the Go runtime and
// package initialisation) is not in it.
package startup

import (
	"math"
	"sort"
	"sync"
	"time"

	"github.com/joblease/joblease/sidecar-go/internal/pyjson"
)

// Timeline of one start. A nil *Timeline records nothing, so code that runs
// without one (tests, later claims) needs no checks.
type Timeline struct {
	mu     sync.Mutex
	start  time.Time
	last   time.Time
	steps  []step
	closed bool
}

type step struct {
	name       string
	begin, end time.Time
}

// New timeline counted from start (time.Now() at the top of main).
func New(start time.Time) *Timeline { return &Timeline{start: start, last: start} }

// Step records name as running from begin until now.
func (t *Timeline) Step(name string, begin time.Time) {
	if t == nil {
		return
	}
	end := time.Now()
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return
	}
	t.steps = append(t.steps, step{name, begin, end})
	if end.After(t.last) {
		t.last = end
	}
}

// Mark records name as running from the end of the latest step (or the
// timeline's start) until now: for steps that follow one another.
func (t *Timeline) Mark(name string) {
	if t == nil {
		return
	}
	t.mu.Lock()
	begin := t.last
	t.mu.Unlock()
	t.Step(name, begin)
}

// Close ends the timeline (later steps are not recorded) and returns its
// steps in the order they began, each {"step", "atMs", "ms"}, and the time
// from the start to the end of the last step, in milliseconds.
func (t *Timeline) Close() ([]any, float64) {
	if t == nil {
		return nil, 0
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return nil, 0
	}
	t.closed = true
	steps := append([]step(nil), t.steps...)
	sort.SliceStable(steps, func(i, j int) bool { return steps[i].begin.Before(steps[j].begin) })
	out := make([]any, 0, len(steps))
	for _, s := range steps {
		out = append(out, pyjson.Obj{{Key: "step", Value: s.name}, {Key: "atMs", Value: ms(s.begin.Sub(t.start))},
			{Key: "ms", Value: ms(s.end.Sub(s.begin))}})
	}
	return out, ms(t.last.Sub(t.start))
}

// ms rounds d to 0.01 ms.
func ms(d time.Duration) float64 { return math.Round(float64(d)/1e4) / 100 }
