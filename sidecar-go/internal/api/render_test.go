package api

import (
	"testing"

	"github.com/joblease/joblease/sidecar-go/internal/errs"
	"github.com/joblease/joblease/sidecar-go/internal/pyjson"
	"github.com/joblease/joblease/sidecar-go/internal/runner"
)

// Only api turns the runner's answers into HTTP: each answer has the status
// docs/sidecar.md documents, and a protocol error keeps its own status and
// body (stale 409 with the current token, unavailable 503, ...).
func TestRenderGivesEachAnswerItsDocumentedStatus(t *testing.T) {
	body := pyjson.Obj{{Key: "state", Value: "held"}}
	for _, tc := range []struct {
		out    runner.Outcome
		status int
		reason any
	}{
		{runner.Outcome{Answer: runner.Done, Body: body}, 200, nil},
		{runner.Outcome{Answer: runner.NotYet, Body: body}, 503, nil},
		{runner.Outcome{Answer: runner.Unsettled, Body: body}, 503, nil},
		{runner.Outcome{Answer: runner.Refused, Body: body}, 409, nil},
		{runner.Outcome{Answer: runner.BadInput, Body: body}, 400, nil},
		{runner.Outcome{Answer: runner.TooLarge, Body: body}, 413, nil},
		{runner.Outcome{Err: errs.Stale("default/j", 3, 5, "pod-b", "")}, 409, "stale"},
		{runner.Outcome{Err: errs.Unavailable("etcd unreachable")}, 503, "unavailable"},
		{runner.Outcome{Err: errs.Forbidden("no")}, 403, "forbidden"},
		{runner.Outcome{Err: errs.Generic("boom")}, 500, "error"},
		{runner.Outcome{Answer: runner.Answer(99)}, 500, "error"},
	} {
		status, got := Render(tc.out)
		var reason any
		for _, kv := range got {
			if kv.Key == "error" {
				reason = kv.Value
			}
		}
		if status != tc.status || reason != tc.reason {
			t.Errorf("%+v: %d %v, want %d %v", tc.out, status, reason, tc.status, tc.reason)
		}
	}
}

// A completion answered with the next lease keeps the completion's status
// and record under "completed"; "next" is GET /v1/lease's body and
// "nextStatus" the status GET /v1/lease would have had (503 while waiting).
func TestRenderPutsTheNextLeaseBesideTheCompletion(t *testing.T) {
	record := pyjson.Obj{{Key: "token", Value: int64(7)}}
	waiting := pyjson.Obj{{Key: "state", Value: "waiting"}}
	status, got := Render(runner.Outcome{Answer: runner.Done, Body: record,
		Next: &runner.Outcome{Answer: runner.NotYet, Body: waiting}})
	want := pyjson.Obj{{Key: "completed", Value: record}, {Key: "next", Value: waiting}, {Key: "nextStatus", Value: 503}}
	if status != 200 || string(pyjson.Response(got)) != string(pyjson.Response(want)) {
		t.Fatalf("%d %s, want 200 %s", status, pyjson.Response(got), pyjson.Response(want))
	}
}
