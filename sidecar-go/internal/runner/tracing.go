package runner

import (
	"strings"

	"github.com/joblease/joblease/sidecar-go/internal/pyjson"
	"github.com/joblease/joblease/sidecar-go/internal/tracing"
)

// tenureTrace is the runner's side of docs/tracing.md: the span of the
// tenure held now, opened when the phase becomes held and ended by the phase
// that ends the tenure. r.mu guards it. Spans are telemetry: nothing here
// decides or delays anything the protocol does.
type tenureTrace struct {
	tracer *tracing.Tracer
	span   *tracing.Span // the open tenure span (nil: none)
	token  int64         // the open span's token
	// last is the latest tenure's context and attributes, open or ended:
	// an operation after the end (a retried completion) still joins its trace.
	last  tracing.Context
	attrs []tracing.Attr
	// children open under the span; a tenure that ends inside one (the
	// completion that ended it) is ended after it, as pending.
	children int
	pending  *tracing.Span
}

// SetTracer sends this runner's spans to t (nil, the default: no spans).
func (r *Runner) SetTracer(t *tracing.Tracer) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.trace.tracer = t
	if t != nil {
		dropped := r.Metrics.Counter("joblease_sidecar_spans_dropped",
			"Trace spans dropped: the export queue was full or an export failed.")
		t.Exporter().OnDrop(func(n int64) { r.Metrics.Add(dropped, float64(n)) })
	}
}

// tracePhaseLocked follows a change of phase (setPhase calls it).
func (r *Runner) tracePhaseLocked(p Phase) {
	t := &r.trace
	if t.tracer == nil {
		return
	}
	switch p {
	case HeldPhase:
		l := r.lease
		if l == nil || (t.span != nil && t.token == l.Token) {
			return
		}
		if t.span != nil {
			r.endTenureLocked("lost", "another claim began")
		}
		t.attrs = []tracing.Attr{{Key: "joblease.job", Value: l.Job.String()},
			{Key: "joblease.namespace", Value: l.Job.Namespace}, {Key: "joblease.holder", Value: l.Owner},
			{Key: "joblease.claim_id", Value: l.ClaimID}, {Key: "joblease.token", Value: l.Token},
			{Key: "joblease.generation", Value: l.Generation}}
		t.span = t.tracer.Start(tracing.SpanTenure, tracing.Context{}, t.attrs...)
		t.token, t.last = l.Token, t.span.Context()
	case Completing: // the result decides how it ended
	case Completed:
		r.endTenureLocked("completed", "")
	case Released:
		r.endTenureLocked("released", "")
	case Lost:
		r.endTenureLocked(lossCause(r.lostReason), r.lostReason)
	case Stopping:
		// Stopped while holding, the release on shutdown not confirmed: closing
		// the client revokes the etcd lease (release-on-term), or etcd expires it.
		if r.cfg.ReleaseOnTerm {
			r.endTenureLocked("revoked", "sidecar stopped")
		} else {
			r.endTenureLocked("expired", "sidecar stopped without releasing")
		}
	default:
		r.endTenureLocked("lost", string(p))
	}
}

// lossCause: a lease that ran out (no keep-alive in time, etcd says expired)
// is "expired"; one whose holder key changed (another claim, an unregister)
// is "lost": a sidecar cannot tell an unregister from another loss.
func lossCause(reason string) string {
	// "lease expired", not the "(expired, released or job unregistered)" of a deleted holder key
	if strings.Contains(reason, "deadline") || strings.Contains(reason, "lease expired") {
		return "expired"
	}
	return "lost"
}

func (r *Runner) endTenureLocked(cause, reason string) {
	t := &r.trace
	if t.span == nil {
		return
	}
	t.span.Set(tracing.Attr{Key: "joblease.end_cause", Value: cause})
	if reason != "" {
		t.span.Set(tracing.Attr{Key: "joblease.end_reason", Value: reason})
	}
	if t.children > 0 {
		t.pending = t.span
	} else {
		t.span.End()
	}
	t.span = nil
}

// traceOp starts the span of an API operation (a child of the latest
// tenure); the function it returns ends it with the operation's outcome.
func (r *Runner) traceOp(name string) func(*Outcome) {
	r.mu.Lock()
	t := &r.trace
	if t.tracer == nil || !t.last.Valid() {
		r.mu.Unlock()
		return func(*Outcome) {}
	}
	span := t.tracer.Start(name, t.last, t.attrs...)
	t.children++
	r.mu.Unlock()
	return func(o *Outcome) {
		outcome := outcomeOf(o)
		span.Set(tracing.Attr{Key: "joblease.outcome", Value: outcome})
		if outcome != "ok" {
			span.Fail(outcome)
		}
		span.End()
		r.mu.Lock()
		defer r.mu.Unlock()
		if t.children--; t.children == 0 && t.pending != nil {
			t.pending.End()
			t.pending = nil
		}
	}
}

// outcomeOf an operation: "ok", or the word its refusal or error names (stale, lost, invalid...).
func outcomeOf(o *Outcome) string {
	if o.Err != nil {
		return o.Err.Reason
	}
	if o.Answer == Done {
		return "ok"
	}
	for _, kv := range o.Body {
		if kv.Key == "error" {
			if s, ok := kv.Value.(string); ok {
				return s
			}
		}
	}
	return "unsettled"
}

// withTraceparentLocked adds the open tenure's W3C trace context to a body
// about that tenure's lease (GET /v1/lease, token.json); unchanged without one.
func (r *Runner) withTraceparentLocked(body pyjson.Obj, token int64) pyjson.Obj {
	t := &r.trace
	if t.span == nil || t.token != token {
		return body
	}
	return append(body, pyjson.KV{Key: "traceparent", Value: t.span.Context().Traceparent()})
}
