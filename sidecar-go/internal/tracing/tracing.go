// Package tracing is the sidecar's opt-in OpenTelemetry traces
// (docs/tracing.md): spans of tenures, completions and checkpoints, exported
// by a small hand-written OTLP/HTTP exporter (JSON encoding, POST
// /v1/traces) rather than the OpenTelemetry Go SDK, whose size and memory
// this binary cannot afford.
//
// Tracing is telemetry, never part of safety. The exporter keeps a bounded
// queue: ending a span never blocks (the keep-alive loop and the API never
// wait on it), a full queue drops the span and counts it, and a failed export
// drops its batch. A nil *Tracer and a nil *Span do nothing, so a sidecar
// without the OTEL_* variables pays one nil check per span.
package tracing

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"strings"
	"sync"
	"time"
)

// Span names, as the Python library names them.
const (
	SpanTenure     = "joblease.tenure"
	SpanComplete   = "joblease.complete"
	SpanCheckpoint = "joblease.checkpoint"
)

// DefaultServiceName is the service name without OTEL_SERVICE_NAME.
const DefaultServiceName = "joblease-sidecar"

// Settings are what the standard OpenTelemetry variables ask for.
type Settings struct {
	Enabled     bool
	Endpoint    string // the full URL spans are POSTed to
	ServiceName string
}

// FromEnv reads the standard variables: on with OTEL_EXPORTER_OTLP_ENDPOINT
// (+ "/v1/traces") or OTEL_EXPORTER_OTLP_TRACES_ENDPOINT (as given), or with
// OTEL_TRACES_EXPORTER=otlp (default endpoint http://localhost:4318);
// off with OTEL_TRACES_EXPORTER=none or OTEL_SDK_DISABLED=true.
func FromEnv(getenv func(string) string) Settings {
	s := Settings{ServiceName: getenv("OTEL_SERVICE_NAME")}
	if s.ServiceName == "" {
		s.ServiceName = DefaultServiceName
	}
	if strings.EqualFold(strings.TrimSpace(getenv("OTEL_SDK_DISABLED")), "true") {
		return s
	}
	exporter := strings.ToLower(strings.TrimSpace(getenv("OTEL_TRACES_EXPORTER")))
	if exporter != "" && !strings.Contains(exporter, "otlp") {
		return s // none, console, ...: nothing this exporter sends
	}
	switch {
	case getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") != "":
		s.Endpoint = getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
	case getenv("OTEL_EXPORTER_OTLP_ENDPOINT") != "":
		s.Endpoint = strings.TrimRight(getenv("OTEL_EXPORTER_OTLP_ENDPOINT"), "/") + "/v1/traces"
	case exporter != "":
		s.Endpoint = "http://localhost:4318/v1/traces"
	default:
		return s
	}
	s.Enabled = true
	return s
}

// Attr is one span attribute: Value is a string, int64, bool or float64.
type Attr struct {
	Key   string
	Value any
}

// Context identifies a span: what a child names as its parent.
type Context struct {
	TraceID [16]byte
	SpanID  [8]byte
}

// Valid is false for the zero Context (no span).
func (c Context) Valid() bool { return c.TraceID != [16]byte{} }

// Traceparent is the W3C trace context header of the span ("" if invalid).
func (c Context) Traceparent() string {
	if !c.Valid() {
		return ""
	}
	return fmt.Sprintf("00-%s-%s-01", hex.EncodeToString(c.TraceID[:]), hex.EncodeToString(c.SpanID[:]))
}

// Tracer starts spans and hands the ended ones to its exporter.
type Tracer struct {
	exp *Exporter
}

// New tracer for settings (nil, which traces nothing, when not enabled).
// Its exporter runs until Shutdown.
func New(s Settings) *Tracer {
	if !s.Enabled {
		return nil
	}
	return &Tracer{exp: NewExporter(s.Endpoint, s.ServiceName, ExporterOptions{})}
}

// Exporter of the tracer (nil for a nil tracer).
func (t *Tracer) Exporter() *Exporter {
	if t == nil {
		return nil
	}
	return t.exp
}

// Start a span (a root span if parent is the zero Context).
func (t *Tracer) Start(name string, parent Context, attrs ...Attr) *Span {
	if t == nil {
		return nil
	}
	s := &Span{tracer: t, name: name, parent: parent.SpanID, start: time.Now(),
		attrs: append([]Attr(nil), attrs...)}
	s.ctx.TraceID = parent.TraceID
	if !parent.Valid() {
		_, _ = rand.Read(s.ctx.TraceID[:])
	}
	_, _ = rand.Read(s.ctx.SpanID[:])
	return s
}

// Shutdown exports what is queued (waiting at most timeout) and stops the exporter.
func (t *Tracer) Shutdown(timeout time.Duration) {
	if t != nil {
		t.exp.Shutdown(timeout)
	}
}

// Span is one span being recorded; its methods are safe on nil.
type Span struct {
	tracer *Tracer
	name   string
	ctx    Context
	parent [8]byte
	start  time.Time

	mu     sync.Mutex
	attrs  []Attr
	errMsg string
	failed bool
	ended  bool
}

// Context of the span (zero for nil).
func (s *Span) Context() Context {
	if s == nil {
		return Context{}
	}
	return s.ctx
}

// Set adds attributes.
func (s *Span) Set(attrs ...Attr) {
	if s == nil {
		return
	}
	s.mu.Lock()
	s.attrs = append(s.attrs, attrs...)
	s.mu.Unlock()
}

// Fail marks the span's status as an error.
func (s *Span) Fail(message string) {
	if s == nil {
		return
	}
	s.mu.Lock()
	s.failed, s.errMsg = true, message
	s.mu.Unlock()
}

// End the span (once) and queue it for export; never blocks.
func (s *Span) End() {
	if s == nil {
		return
	}
	s.mu.Lock()
	if s.ended {
		s.mu.Unlock()
		return
	}
	s.ended = true
	done := ended{name: s.name, ctx: s.ctx, parent: s.parent, start: s.start, end: time.Now(),
		attrs: s.attrs, failed: s.failed, errMsg: s.errMsg}
	s.mu.Unlock()
	s.tracer.exp.enqueue(done)
}

// ended is a span as the exporter sends it.
type ended struct {
	name       string
	ctx        Context
	parent     [8]byte
	start, end time.Time
	attrs      []Attr
	failed     bool
	errMsg     string
}
