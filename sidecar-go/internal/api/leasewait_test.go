package api

import (
	"net/http/httptest"
	"testing"
	"time"
)

// GET /v1/lease?wait=S takes one finite number of seconds from 0 to
// runner.MaxLeaseWait; anything else is a 400 before the runner is asked.
func TestTheLeaseWaitParameterIsOneBoundedNumberOfSeconds(t *testing.T) {
	for _, c := range []struct {
		query string
		want  time.Duration
		bad   bool
	}{
		{"", 0, false},
		{"?wait=0", 0, false},
		{"?wait=2.5", 2500 * time.Millisecond, false},
		{"?wait=60", time.Minute, false},
		{"?wait=60.001", 0, true},
		{"?wait=-1", 0, true},
		{"?wait=", 0, true},
		{"?wait=soon", 0, true},
		{"?wait=NaN", 0, true},
		{"?wait=inf", 0, true},
		{"?wait=1&wait=2", 0, true},
	} {
		got, bad := leaseWait(httptest.NewRequest("GET", "/v1/lease"+c.query, nil))
		if (bad != nil) != c.bad || got != c.want || (bad != nil && (bad.status != 400 || bad.error != "invalid")) {
			t.Errorf("%q: wait %v, refusal %+v; want %v, refused %v", c.query, got, bad, c.want, c.bad)
		}
	}
}

// POST /v1/complete?next=S takes one finite number of seconds above 0 up to
// runner.MaxLeaseWait (0 would answer before the next claim could run);
// anything else is a 400 before the runner is asked.
func TestTheCompleteNextParameterIsOnePositiveBoundedNumberOfSeconds(t *testing.T) {
	for _, c := range []struct {
		query string
		want  time.Duration
		bad   bool
	}{
		{"", 0, false},
		{"?next=0.5", 500 * time.Millisecond, false},
		{"?next=60", time.Minute, false},
		{"?next=0", 0, true},
		{"?next=60.001", 0, true},
		{"?next=-1", 0, true},
		{"?next=", 0, true},
		{"?next=soon", 0, true},
		{"?next=NaN", 0, true},
		{"?next=inf", 0, true},
		{"?next=1&next=2", 0, true},
	} {
		got, bad := completeNext(httptest.NewRequest("POST", "/v1/complete"+c.query, nil))
		if (bad != nil) != c.bad || got != c.want || (bad != nil && (bad.status != 400 || bad.error != "invalid")) {
			t.Errorf("%q: next %v, refusal %+v; want %v, refused %v", c.query, got, bad, c.want, c.bad)
		}
	}
}
