package tracing

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// receiver is a stand-in OTLP/HTTP endpoint that keeps the decoded requests
// (the Python suite checks the same exporter against a receiver built on the
// official OTLP messages: tests/tracing/test_sidecar_spans.py).
type receiver struct {
	mu       sync.Mutex
	requests []otlpRequest
	release  chan struct{} // nil: answer at once; else wait until closed
}

func (rc *receiver) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if rc.release != nil {
		<-rc.release
	}
	body, _ := io.ReadAll(r.Body)
	var req otlpRequest
	if r.URL.Path != "/v1/traces" || r.Header.Get("Content-Type") != "application/json" || json.Unmarshal(body, &req) != nil {
		w.WriteHeader(http.StatusBadRequest)
		return
	}
	rc.mu.Lock()
	rc.requests = append(rc.requests, req)
	rc.mu.Unlock()
	_, _ = w.Write([]byte("{}"))
}

func (rc *receiver) spans() []otlpSpan {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	var out []otlpSpan
	for _, r := range rc.requests {
		out = append(out, r.ResourceSpans[0].ScopeSpans[0].Spans...)
	}
	return out
}

func TestChildSpansShareTheTraceAndNameTheirParent(t *testing.T) {
	rc := &receiver{}
	srv := httptest.NewServer(rc)
	defer srv.Close()
	tr := &Tracer{exp: NewExporter(srv.URL+"/v1/traces", "svc", ExporterOptions{})}
	parent := tr.Start(SpanTenure, Context{}, Attr{"joblease.token", int64(42)})
	child := tr.Start(SpanComplete, parent.Context())
	child.Fail("stale")
	child.End()
	parent.End()
	parent.End() // once only
	tr.Shutdown(5 * time.Second)

	spans := rc.spans()
	if len(spans) != 2 {
		t.Fatalf("got %d spans, want 2: %+v", len(spans), spans)
	}
	c, p := spans[0], spans[1]
	if c.TraceID != p.TraceID || c.ParentSpanID != p.SpanID || p.ParentSpanID != "" {
		t.Fatalf("child %+v is not a child of %+v", c, p)
	}
	if c.Status == nil || c.Status.Code != statusError {
		t.Fatalf("failed child has status %+v", c.Status)
	}
	if got := p.Attributes[0]; got.Key != "joblease.token" || got.Value["intValue"] != "42" {
		t.Fatalf("token attribute %+v", got)
	}
	if want := "00-" + p.TraceID + "-" + p.SpanID + "-01"; parent.Context().Traceparent() != want {
		t.Fatalf("traceparent %q, want %q", parent.Context().Traceparent(), want)
	}
}

func TestAFullQueueDropsAndCountsWithoutBlocking(t *testing.T) {
	rc := &receiver{release: make(chan struct{})} // the endpoint hangs: nothing drains
	srv := httptest.NewServer(rc)
	defer srv.Close()
	exp := NewExporter(srv.URL+"/v1/traces", "svc", ExporterOptions{QueueSize: 4, BatchSize: 1, Interval: time.Hour})
	var counted atomic.Int64
	exp.OnDrop(func(n int64) { counted.Add(n) })
	tr := &Tracer{exp: exp}
	start := time.Now()
	for range 100 {
		tr.Start("s", Context{}).End()
	}
	if elapsed := time.Since(start); elapsed > time.Second {
		t.Fatalf("ending 100 spans took %v with the endpoint hanging", elapsed)
	}
	// One span is in the hanging request, at most 4 queued: the rest dropped.
	if d := exp.Dropped(); d < 100-1-4 {
		t.Fatalf("dropped %d, want at least %d", d, 100-1-4)
	}
	close(rc.release)
	tr.Shutdown(5 * time.Second)
	if counted.Load() != exp.Dropped() {
		t.Fatalf("OnDrop counted %d, Dropped says %d", counted.Load(), exp.Dropped())
	}
	if got := exp.Exported() + exp.Dropped(); got != 100 {
		t.Fatalf("exported %d + dropped %d != 100", exp.Exported(), exp.Dropped())
	}
}

func TestSettingsFromTheStandardVariables(t *testing.T) {
	for _, tc := range []struct {
		env      map[string]string
		enabled  bool
		endpoint string
	}{
		{map[string]string{}, false, ""},
		{map[string]string{"OTEL_SERVICE_NAME": "x"}, false, ""},
		{map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318/"}, true, "http://c:4318/v1/traces"},
		{map[string]string{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://c/t"}, true, "http://c/t"},
		{map[string]string{"OTEL_TRACES_EXPORTER": "otlp"}, true, "http://localhost:4318/v1/traces"},
		{map[string]string{"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c"}, false, ""},
		{map[string]string{"OTEL_SDK_DISABLED": "true", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c"}, false, ""},
	} {
		s := FromEnv(func(k string) string { return tc.env[k] })
		if s.Enabled != tc.enabled || s.Endpoint != tc.endpoint {
			t.Errorf("%v: got %+v", tc.env, s)
		}
		tr := New(s)
		if (tr != nil) != tc.enabled {
			t.Errorf("%v: New gave a tracer: %v", tc.env, tr != nil)
		}
		tr.Shutdown(time.Second)
	}
}

func TestANilTracerAndSpanDoNothing(t *testing.T) {
	var tr *Tracer
	s := tr.Start("x", Context{})
	s.Set(Attr{"k", "v"})
	s.Fail("f")
	s.End()
	if s.Context().Valid() || s.Context().Traceparent() != "" {
		t.Fatal("a nil span has a context")
	}
	tr.Shutdown(time.Second)
}
