// Package metrics renders the sidecar's Prometheus metrics exactly as the
// Python sidecar's prometheus_client registry does: the same names, help
// texts, types, order, the _created series and value formatting, so
// dashboards and alerts work unchanged whichever sidecar runs.
package metrics

import (
	"fmt"
	"math"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/joblease/joblease/sidecar-go/internal/pyjson"
)

// ContentType is prometheus_client's CONTENT_TYPE_LATEST.
const ContentType = "text/plain; version=1.0.0; charset=utf-8"

// States, in the order the state gauge lists them.
// "waiting": a sidecar waits on a watch for a semaphore slot, or (draining a
// queue) for an item to claim.
var States = []string{"claiming", "held", "completing", "lost", "completed", "failed", "released", "stopping", "waiting"}

type counter struct {
	name, help string
	value      float64
	created    float64
}

// Metrics are the counters and gauges of one sidecar.
type Metrics struct {
	mu                                                          sync.Mutex
	Claims, ClaimAttempts, Losses, Completions, StaleRejections *counter
	// Waits in line for semaphore slots that ended in a grant, and the seconds
	// they lasted (their ratio over a window is the mean wait for a slot).
	SlotWaits, SlotWaitSeconds *counter
	// AuthFailures: requests etcd refused for the sidecar's credentials or
	// permissions (a revoked or mistyped credential, a foreign namespace): the
	// alert that tells a credential problem from an outage.
	AuthFailures *counter
	counters     []*counter
	state        string
}

func nowSeconds() float64 { return float64(time.Now().UnixNano()) / 1e9 }

// New metrics in state "claiming".
func New() *Metrics {
	m := &Metrics{state: "claiming"}
	mk := func(name, help string) *counter {
		c := &counter{name: name, help: help, created: nowSeconds()}
		m.counters = append(m.counters, c)
		return c
	}
	m.Claims = mk("joblease_sidecar_claims", "Successful claims of the job.")
	m.ClaimAttempts = mk("joblease_sidecar_claim_attempts", "Claim attempts, refused ones included.")
	m.Losses = mk("joblease_sidecar_losses", "Leases lost while held.")
	m.Completions = mk("joblease_sidecar_completions", "Completions the store accepted.")
	m.StaleRejections = mk("joblease_sidecar_stale_rejections",
		"Completions or releases refused because the token was not current.")
	m.SlotWaits = mk("joblease_sidecar_slot_waits",
		"Claims that waited for semaphore slots, counted when the slots were granted.")
	m.SlotWaitSeconds = mk("joblease_sidecar_slot_wait_seconds",
		"Seconds claims waited for semaphore slots, added when the slots were granted.")
	m.AuthFailures = mk("joblease_sidecar_auth_failures",
		"Requests etcd refused for the credentials (authentication failed) or a permission (permission denied).")
	return m
}

// Counter adds a counter after New, for one that exists only in some
// configurations (joblease_sidecar_spans_dropped, with tracing on), so the
// default exposition stays as it is.
func (m *Metrics) Counter(name, help string) *counter {
	m.mu.Lock()
	defer m.mu.Unlock()
	c := &counter{name: name, help: help, created: nowSeconds()}
	m.counters = append(m.counters, c)
	return c
}

// Inc adds one to c.
func (m *Metrics) Inc(c *counter) {
	m.mu.Lock()
	c.value++
	m.mu.Unlock()
}

// Add v to c.
func (m *Metrics) Add(c *counter, v float64) {
	m.mu.Lock()
	c.value += v
	m.mu.Unlock()
}

// Value of c (for tests).
func (m *Metrics) Value(c *counter) float64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	return c.value
}

// SetState makes state the one with value 1.
func (m *Metrics) SetState(state string) {
	m.mu.Lock()
	m.state = state
	m.mu.Unlock()
}

// Render the exposition text; remaining is the lease's local safety time left.
func (m *Metrics) Render(remaining float64) []byte {
	m.mu.Lock()
	defer m.mu.Unlock()
	var b strings.Builder
	for _, c := range m.counters {
		fmt.Fprintf(&b, "# HELP %s_total %s\n# TYPE %s_total counter\n%s_total %s\n", c.name, c.help, c.name, c.name, goFloat(c.value))
		fmt.Fprintf(&b, "# HELP %s_created %s\n# TYPE %s_created gauge\n%s_created %s\n", c.name, c.help, c.name, c.name, goFloat(c.created))
	}
	r := "joblease_sidecar_lease_remaining_seconds"
	fmt.Fprintf(&b, "# HELP %s Local safety time left on the lease (0 unless held).\n# TYPE %s gauge\n%s %s\n", r, r, r, goFloat(remaining))
	s := "joblease_sidecar_state"
	fmt.Fprintf(&b, "# HELP %s 1 for the sidecar's current state.\n# TYPE %s gauge\n", s, s)
	for _, st := range States {
		v := 0.0
		if st == m.state {
			v = 1
		}
		fmt.Fprintf(&b, "%s{state=%q} %s\n", s, st, goFloat(v))
	}
	return []byte(b.String())
}

// goFloat is prometheus_client's floatToGoString.
func goFloat(d float64) string {
	switch {
	case math.IsInf(d, 1):
		return "+Inf"
	case math.IsInf(d, -1):
		return "-Inf"
	case math.IsNaN(d):
		return "NaN"
	}
	s, _ := pyjson.Float(d)
	dot := strings.IndexByte(s, '.')
	if d > 0 && dot > 6 {
		mantissa := strings.TrimRight(s[:1]+"."+s[1:dot]+s[dot+1:], "0.")
		return mantissa + "e+0" + strconv.Itoa(dot-1)
	}
	return s
}
