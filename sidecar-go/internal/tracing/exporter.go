package tracing

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// ExporterOptions bound the exporter; zero fields take the defaults.
type ExporterOptions struct {
	QueueSize int           // spans waiting for export (default 2048); beyond it spans are dropped
	BatchSize int           // spans per request at most (default 256)
	Interval  time.Duration // longest a span waits for its batch (default 1 s)
	Timeout   time.Duration // one request's limit (default 5 s)
}

// Exporter sends ended spans to an OTLP/HTTP endpoint in batches, as OTLP
// JSON, from one goroutine of its own.
type Exporter struct {
	endpoint, service string
	opts              ExporterOptions
	queue             chan ended
	flushReq          chan chan struct{}
	stop              chan struct{}
	stopped           chan struct{}
	stopOnce          sync.Once
	dropped, exported atomic.Int64
	failures          atomic.Int64
	onDrop            atomic.Pointer[func(int64)]
}

// OnDrop calls f with the number of spans each time some are dropped (the
// sidecar counts them in /metrics); f must not block.
func (e *Exporter) OnDrop(f func(n int64)) { e.onDrop.Store(&f) }

func (e *Exporter) drop(n int64) {
	e.dropped.Add(n)
	if f := e.onDrop.Load(); f != nil {
		(*f)(n)
	}
}

// NewExporter starts an exporter to endpoint (a full URL, ".../v1/traces").
func NewExporter(endpoint, service string, opts ExporterOptions) *Exporter {
	if opts.QueueSize <= 0 {
		opts.QueueSize = 2048
	}
	if opts.BatchSize <= 0 {
		opts.BatchSize = 256
	}
	if opts.Interval <= 0 {
		opts.Interval = time.Second
	}
	if opts.Timeout <= 0 {
		opts.Timeout = 5 * time.Second
	}
	e := &Exporter{endpoint: endpoint, service: service, opts: opts,
		queue:    make(chan ended, opts.QueueSize),
		flushReq: make(chan chan struct{}), stop: make(chan struct{}), stopped: make(chan struct{})}
	go e.loop()
	return e
}

// Dropped counts spans dropped because the queue was full or the exporter stopped.
func (e *Exporter) Dropped() int64 { return e.dropped.Load() }

// Exported counts spans the endpoint accepted.
func (e *Exporter) Exported() int64 { return e.exported.Load() }

// Failures counts requests that failed (their spans are dropped, not retried).
func (e *Exporter) Failures() int64 { return e.failures.Load() }

func (e *Exporter) enqueue(s ended) {
	select {
	case <-e.stopped:
		e.drop(1)
		return
	default:
	}
	select {
	case e.queue <- s:
	default: // full: never wait, whoever ended the span has real work to do
		e.drop(1)
	}
}

// Flush exports what is queued now, waiting at most timeout.
func (e *Exporter) Flush(timeout time.Duration) {
	done := make(chan struct{})
	select {
	case e.flushReq <- done:
		select {
		case <-done:
		case <-time.After(timeout):
		}
	case <-e.stopped:
	case <-time.After(timeout):
	}
}

// Shutdown flushes and stops the exporter, waiting at most timeout in all
// (a request still in flight then is abandoned with its spans).
func (e *Exporter) Shutdown(timeout time.Duration) {
	deadline := time.Now().Add(timeout)
	e.Flush(timeout)
	e.stopOnce.Do(func() { close(e.stop) })
	select {
	case <-e.stopped:
	case <-time.After(time.Until(deadline)):
	}
}

func (e *Exporter) loop() {
	defer close(e.stopped)
	tick := time.NewTicker(e.opts.Interval)
	defer tick.Stop()
	batch := make([]ended, 0, e.opts.BatchSize)
	send := func() {
		if len(batch) > 0 {
			e.send(batch)
			batch = batch[:0]
		}
	}
	// add is the one way a span joins a batch: a full batch goes at once,
	// whether the span came in the main loop or in a drain.
	add := func(s ended) {
		batch = append(batch, s)
		if len(batch) == e.opts.BatchSize {
			send()
		}
	}
	drain := func() {
		for {
			select {
			case s := <-e.queue:
				add(s)
			default:
				send()
				return
			}
		}
	}
	for {
		select {
		case s := <-e.queue:
			add(s)
		case <-tick.C:
			send()
		case done := <-e.flushReq:
			drain()
			close(done)
		case <-e.stop:
			drain()
			return
		}
	}
}

func (e *Exporter) send(batch []ended) {
	body, err := json.Marshal(e.request(batch))
	if err == nil {
		err = post(context.Background(), e.endpoint, body, e.opts.Timeout)
	}
	if err != nil {
		e.failures.Add(1)
		e.drop(int64(len(batch)))
		return
	}
	e.exported.Add(int64(len(batch)))
}

// The OTLP/JSON shapes (opentelemetry-proto's JSON mapping: lowerCamelCase
// names, ids in hex, 64-bit integers as strings).
type (
	otlpRequest struct {
		ResourceSpans []otlpResourceSpans `json:"resourceSpans"`
	}
	otlpResourceSpans struct {
		Resource   otlpResource     `json:"resource"`
		ScopeSpans []otlpScopeSpans `json:"scopeSpans"`
	}
	otlpResource struct {
		Attributes []otlpKeyValue `json:"attributes"`
	}
	otlpScopeSpans struct {
		Scope otlpScope  `json:"scope"`
		Spans []otlpSpan `json:"spans"`
	}
	otlpScope struct {
		Name string `json:"name"`
	}
	otlpSpan struct {
		TraceID      string         `json:"traceId"`
		SpanID       string         `json:"spanId"`
		ParentSpanID string         `json:"parentSpanId,omitempty"`
		Name         string         `json:"name"`
		Kind         int            `json:"kind"`
		Start        string         `json:"startTimeUnixNano"`
		End          string         `json:"endTimeUnixNano"`
		Attributes   []otlpKeyValue `json:"attributes,omitempty"`
		Status       *otlpStatus    `json:"status,omitempty"`
	}
	otlpStatus struct {
		Code    int    `json:"code"`
		Message string `json:"message,omitempty"`
	}
	otlpKeyValue struct {
		Key   string         `json:"key"`
		Value map[string]any `json:"value"`
	}
)

const (
	spanKindInternal = 1
	statusError      = 2
)

func (e *Exporter) request(batch []ended) otlpRequest {
	spans := make([]otlpSpan, 0, len(batch))
	for _, s := range batch {
		o := otlpSpan{TraceID: hex.EncodeToString(s.ctx.TraceID[:]), SpanID: hex.EncodeToString(s.ctx.SpanID[:]),
			Name: s.name, Kind: spanKindInternal, Attributes: keyValues(s.attrs),
			Start: strconv.FormatInt(s.start.UnixNano(), 10), End: strconv.FormatInt(s.end.UnixNano(), 10)}
		if s.parent != [8]byte{} {
			o.ParentSpanID = hex.EncodeToString(s.parent[:])
		}
		if s.failed {
			o.Status = &otlpStatus{Code: statusError, Message: s.errMsg}
		}
		spans = append(spans, o)
	}
	return otlpRequest{ResourceSpans: []otlpResourceSpans{{
		Resource:   otlpResource{Attributes: keyValues([]Attr{{"service.name", e.service}})},
		ScopeSpans: []otlpScopeSpans{{Scope: otlpScope{Name: "joblease-sidecar"}, Spans: spans}},
	}}}
}

func keyValues(attrs []Attr) []otlpKeyValue {
	out := make([]otlpKeyValue, 0, len(attrs))
	for _, a := range attrs {
		var v map[string]any
		switch x := a.Value.(type) {
		case string:
			v = map[string]any{"stringValue": x}
		case bool:
			v = map[string]any{"boolValue": x}
		case int:
			v = map[string]any{"intValue": strconv.FormatInt(int64(x), 10)}
		case int64:
			v = map[string]any{"intValue": strconv.FormatInt(x, 10)}
		case float64:
			v = map[string]any{"doubleValue": x}
		default:
			v = map[string]any{"stringValue": fmt.Sprint(x)}
		}
		out = append(out, otlpKeyValue{Key: a.Key, Value: v})
	}
	return out
}
