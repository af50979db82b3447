// Package api is the sidecar's HTTP API (joblease.sidecar.api) on net/http:
// the same routes, JSON bodies, status codes and checks in the same order.
// Every handler asks the runner for the phase at the moment of the request.
// Input is checked completely (rate limit, bearer token, method, size, JSON,
// token type, result size) before the runner, and so etcd, is touched: a bad
// request changes nothing.
//
// Two handlers: the full API for the loopback listener, and a probe-only one
// (/healthz, /readyz, /metrics) for the pod-IP listener kubelet's probes reach.
package api

import (
	"crypto/subtle"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"math/big"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/joblease/joblease/sidecar-go/internal/metrics"
	"github.com/joblease/joblease/sidecar-go/internal/pyjson"
	"github.com/joblease/joblease/sidecar-go/internal/runner"
)

// envelopeBytes is the JSON allowance on top of the result limit (the token, the keys).
const envelopeBytes = 4096

// RateLimiter is a token bucket: rate units per second, bursts of up to burst units
// (requests for the API's rate limit, bytes for the checkpoint volume bound).
type RateLimiter struct {
	mu     sync.Mutex
	rate   float64
	burst  float64
	tokens float64
	last   time.Time
}

// NewRateLimiter for rate requests per second, bursts of one second's worth.
func NewRateLimiter(rate float64) *RateLimiter {
	return newBucket(rate, math.Max(1, rate))
}

// checkpointBurstSeconds: the checkpoint volume bound lets this many seconds' worth
// of bytes through at once (and always one checkpoint of the largest size).
const checkpointBurstSeconds = 16

// NewVolumeLimiter for rate bytes of checkpoints per second; a burst admits
// checkpointBurstSeconds of them, and at least one of maxItem bytes.
func NewVolumeLimiter(rate float64, maxItem int) *RateLimiter {
	return newBucket(rate, math.Max(float64(maxItem), rate*checkpointBurstSeconds))
}

func newBucket(rate, burst float64) *RateLimiter {
	return &RateLimiter{rate: rate, burst: burst, tokens: burst, last: time.Now()}
}

// Take one unit: 0 if the request may go ahead, else the seconds until it could.
func (l *RateLimiter) Take() float64 { return l.TakeN(1) }

// TakeN units: 0 if they were taken, else the seconds until they could be (a
// refused take takes nothing).
func (l *RateLimiter) TakeN(n float64) float64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := time.Now()
	l.tokens = math.Min(l.burst, l.tokens+now.Sub(l.last).Seconds()*l.rate)
	l.last = now
	if l.tokens >= n {
		l.tokens -= n
		return 0
	}
	return (n - l.tokens) / l.rate
}

// retryAfter is a Retry-After header value for a wait of seconds (at least 1).
func retryAfter(seconds float64) string {
	return strconv.Itoa(max(1, int(math.Ceil(seconds))))
}

type badRequest struct {
	status         int
	error, message string
	headers        []string // name, value, ...
}

func writeJSON(w http.ResponseWriter, status int, body pyjson.Obj, headers ...string) {
	for i := 0; i+1 < len(headers); i += 2 {
		w.Header().Set(headers[i], headers[i+1])
	}
	data := pyjson.Response(body)
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(len(data)))
	w.WriteHeader(status)
	_, _ = w.Write(data)
}

func errBody(e, msg string) pyjson.Obj {
	return pyjson.Obj{{Key: "error", Value: e}, {Key: "message", Value: msg}}
}

type handler func(r *http.Request) (runner.Outcome, *badRequest)

// guard applies the rate limit, the bearer check (constant time), then the
// method check, in that order, each answered as JSON.
func guard(rn *runner.Runner, methods []string, h handler, auth bool, limiter *RateLimiter) http.HandlerFunc {
	expected := rn.Config().APIToken
	return func(w http.ResponseWriter, req *http.Request) {
		if limiter != nil {
			if wait := limiter.Take(); wait > 0 {
				writeJSON(w, 429, errBody("rate_limited", fmt.Sprintf("more than %s requests per second; retry in %.2f s",
					strconv.FormatFloat(limiter.rate, 'g', -1, 64), wait)), "Retry-After", retryAfter(wait))
				return
			}
		}
		if auth && expected != "" {
			scheme, given, _ := strings.Cut(req.Header.Get("Authorization"), " ")
			if !strings.EqualFold(scheme, "bearer") ||
				subtle.ConstantTimeCompare([]byte(strings.TrimSpace(given)), []byte(expected)) != 1 {
				writeJSON(w, 401, errBody("unauthorized", "missing or wrong bearer token"), "WWW-Authenticate", "Bearer")
				return
			}
		}
		allowed := false
		for _, m := range methods {
			allowed = allowed || req.Method == m
		}
		if !allowed {
			writeJSON(w, 405, errBody("method_not_allowed", fmt.Sprintf("%s not allowed; use %s", req.Method,
				strings.Join(methods, ", "))), "Allow", strings.Join(methods, ", "))
			return
		}
		out, bad := h(req)
		if bad != nil {
			writeJSON(w, bad.status, errBody(bad.error, bad.message), bad.headers...)
			return
		}
		status, body := Render(out)
		writeJSON(w, status, body)
	}
}

// decode is the one way a POST body is read, in the order the checks are
// promised: size (declared, then read) 413, JSON object 400, then "token" a
// positive 64-bit integer 400. The operation's own fields are checked after.
func decode(req *http.Request, limit int) (map[string]any, int64, *badRequest) {
	body, bad := readBody(req, limit)
	if bad != nil {
		return nil, 0, bad
	}
	obj, bad := parse(body)
	if bad != nil {
		return nil, 0, bad
	}
	tok, bad := token(obj)
	if bad != nil {
		return nil, 0, bad
	}
	return obj, tok, nil
}

// statuses: each answer of the runner as HTTP (docs/sidecar.md's API section).
var statuses = map[runner.Answer]int{runner.Done: 200, runner.NotYet: 503, runner.Unsettled: 503,
	runner.Refused: 409, runner.BadInput: 400, runner.TooLarge: 413}

// Render is the one place an operation's outcome becomes an HTTP status and
// body: a protocol error answers with its own status (errs: stale 409,
// unavailable 503, ...) and body; every other answer by statuses. A
// completion that also answers with the next lease (runner.CompleteNext) is
// {"completed": <its body>, "next": <GET /v1/lease's body>, "nextStatus":
// <the status GET /v1/lease would have answered with>} under its own status.
func Render(o runner.Outcome) (int, pyjson.Obj) {
	if o.Err != nil {
		return o.Err.Status, o.Err.Body()
	}
	status, ok := statuses[o.Answer]
	if !ok {
		return 500, errBody("error", fmt.Sprintf("no HTTP status for answer %d", o.Answer))
	}
	if o.Next != nil {
		nextStatus, next := Render(*o.Next)
		return status, pyjson.Obj{{Key: "completed", Value: o.Body}, {Key: "next", Value: next},
			{Key: "nextStatus", Value: nextStatus}}
	}
	return status, o.Body
}

func readBody(req *http.Request, limit int) ([]byte, *badRequest) {
	if declared := req.Header.Get("Content-Length"); declared != "" {
		if n, err := strconv.ParseInt(declared, 10, 64); err == nil && n > int64(limit) {
			return nil, &badRequest{status: 413, error: "too_large", message: fmt.Sprintf("request body of %s bytes exceeds the limit of %d bytes", declared, limit)}
		}
	}
	data, err := io.ReadAll(io.LimitReader(req.Body, int64(limit)+1))
	if err != nil {
		return nil, &badRequest{status: 400, error: "invalid", message: "cannot read the request body: " + err.Error()}
	}
	if len(data) > limit {
		return nil, &badRequest{status: 413, error: "too_large", message: fmt.Sprintf("request body exceeds the limit of %d bytes", limit)}
	}
	return data, nil
}

func parse(body []byte) (map[string]any, *badRequest) {
	v, err := pyjson.Decode(body)
	if err != nil {
		return nil, &badRequest{status: 400, error: "invalid", message: "request body is not valid JSON: " + err.Error()}
	}
	obj, ok := v.(map[string]any)
	if !ok {
		return nil, &badRequest{status: 400, error: "invalid", message: "request body must be a JSON object"}
	}
	return obj, nil
}

var maxToken = new(big.Int).Lsh(big.NewInt(1), 63)

func token(obj map[string]any) (int64, *badRequest) {
	v, ok := obj["token"]
	if !ok {
		return 0, &badRequest{status: 400, error: "invalid", message: `missing "token": send the token from GET /v1/lease`}
	}
	n, isNum := v.(json.Number)
	if !isNum || !pyjson.IsInt(n) {
		return 0, &badRequest{status: 400, error: "invalid", message: fmt.Sprintf(`"token" must be an integer, got %s`, pyjson.TypeName(v))}
	}
	b, ok := new(big.Int).SetString(string(n), 10)
	if !ok || b.Sign() <= 0 || b.Cmp(maxToken) >= 0 {
		return 0, &badRequest{status: 400, error: "invalid", message: `"token" must be a positive 64-bit integer`}
	}
	return b.Int64(), nil
}

func payload(obj map[string]any, limit int, key, what string) (any, int, *badRequest) {
	v := obj[key]
	data, err := pyjson.Sorted(v)
	if err != nil {
		return nil, 0, &badRequest{status: 400, error: "invalid", message: fmt.Sprintf("invalid %s: not JSON-serializable (%s)", what, err)}
	}
	if len(data) > limit {
		return nil, 0, &badRequest{status: 413, error: "too_large", message: fmt.Sprintf("%s too large: %d bytes of JSON, the limit is %d bytes", what, len(data), limit)}
	}
	return v, len(data), nil
}

// leaseWait is GET /v1/lease's optional "wait" query parameter: seconds,
// a finite number from 0 to runner.MaxLeaseWait (0 or absent: answer at once).
func leaseWait(req *http.Request) (time.Duration, *badRequest) {
	return seconds(req, "wait", false)
}

// completeNext is POST /v1/complete's optional "next" query parameter
// (absent: 0, a plain completion): seconds to wait for the next item, a
// finite number above 0 (0 would answer before the next claim could run,
// with the item just completed) up to runner.MaxLeaseWait.
func completeNext(req *http.Request) (time.Duration, *badRequest) {
	return seconds(req, "next", true)
}

// seconds is the query parameter name as one number of seconds up to
// runner.MaxLeaseWait, from 0 or (positive) above it; absent is 0.
func seconds(req *http.Request, name string, positive bool) (time.Duration, *badRequest) {
	values, ok := req.URL.Query()[name]
	if !ok {
		return 0, nil
	}
	limit := runner.MaxLeaseWait.Seconds()
	text := ""
	if len(values) == 1 {
		text = values[0]
	}
	f, err := strconv.ParseFloat(text, 64)
	if len(values) != 1 || err != nil || math.IsNaN(f) || f < 0 || f > limit || (positive && f == 0) {
		from := "from 0"
		if positive {
			from = "above 0"
		}
		return 0, &badRequest{status: 400, error: "invalid", message: fmt.Sprintf(`%q must be one number of seconds %s to %g, got %q`,
			name, from, limit, strings.Join(values, ","))}
	}
	return time.Duration(f * float64(time.Second)), nil
}

func probeRoutes(mux routes, rn *runner.Runner) {
	get := []string{"GET", "HEAD"}
	mux["/healthz"] = guard(rn, get, func(*http.Request) (runner.Outcome, *badRequest) {
		return runner.Outcome{Answer: runner.Done, Body: pyjson.Obj{{Key: "status", Value: "ok"}, {Key: "state", Value: string(rn.Current())}}}, nil
	}, false, nil)
	mux["/readyz"] = guard(rn, get, func(*http.Request) (runner.Outcome, *badRequest) {
		ready := rn.Ready()
		answer := runner.NotYet
		if ready {
			answer = runner.Done
		}
		body := pyjson.Obj{{Key: "ready", Value: ready}, {Key: "state", Value: string(rn.PhaseNow())}}
		if why := rn.EndMessage(); why != "" {
			body = append(body, pyjson.KV{Key: "message", Value: why})
		}
		return runner.Outcome{Answer: answer, Body: body}, nil
	}, false, nil)
	mux["/metrics"] = http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if req.Method != "GET" && req.Method != "HEAD" {
			guard(rn, get, nil, false, nil)(w, req)
			return
		}
		body := rn.Metrics.Render(rn.Remaining())
		w.Header().Set("Content-Type", metrics.ContentType)
		w.Header().Set("Content-Length", strconv.Itoa(len(body)))
		w.WriteHeader(200)
		_, _ = w.Write(body)
	})
}

// routes is Starlette's router as the Python sidecar uses it (not
// http.ServeMux, which cleans paths and redirects "/v1//lease" or
// "/v1/./lease" to "/v1/lease"): a decoded path matches a route exactly or not
// at all, and a miss is redirected (307) when the path with its trailing
// slashes removed, or with one added, is a route (redirect_slashes); anything
// else is Starlette's plain-text 404.
type routes map[string]http.Handler

func (rt routes) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	path := req.URL.Path
	if h, ok := rt[path]; ok {
		h.ServeHTTP(w, req)
		return
	}
	if path != "/" {
		other := path + "/"
		if strings.HasSuffix(path, "/") {
			other = strings.TrimRight(path, "/")
		}
		if _, ok := rt[other]; ok {
			w.Header().Set("Location", redirectURL(req, other))
			w.Header().Set("Content-Length", "0")
			w.WriteHeader(307)
			return
		}
	}
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("Content-Length", "9")
	w.WriteHeader(404)
	_, _ = io.WriteString(w, "Not Found")
}

// redirectURL is Starlette's str(URL(scope=...)) for path, quoted as
// RedirectResponse quotes it: http://, the Host header (else the address the
// request came in on), the path, the query as sent.
func redirectURL(req *http.Request, path string) string {
	host := req.Host
	if host == "" {
		if addr, ok := req.Context().Value(http.LocalAddrContextKey).(net.Addr); ok {
			host = addr.String()
		}
	}
	url := "http://" + host + path
	if req.URL.RawQuery != "" {
		url += "?" + req.URL.RawQuery
	}
	return quote(url)
}

// quote is urllib.parse.quote(s, safe=":/%#?=@[]!$&'()*+,;") for ASCII s.
func quote(s string) string {
	const safe = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_.-~:/%#?=@[]!$&'()*+,;"
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if strings.IndexByte(safe, s[i]) >= 0 {
			b.WriteByte(s[i])
		} else {
			fmt.Fprintf(&b, "%%%02X", s[i])
		}
	}
	return b.String()
}

// Handler is the loopback API: lease, complete, checkpoint, release, and the probe endpoints.
func Handler(rn *runner.Runner) http.Handler {
	cfg := rn.Config()
	bodyLimit := cfg.MaxResultBytes + envelopeBytes
	var limiter, volume *RateLimiter
	if cfg.RateLimit > 0 {
		limiter = NewRateLimiter(cfg.RateLimit)
	}
	if cfg.CheckpointRate > 0 {
		volume = NewVolumeLimiter(cfg.CheckpointRate, cfg.MaxResultBytes)
	}
	mux := routes{}
	mux["/v1/lease"] = guard(rn, []string{"GET", "HEAD"}, func(req *http.Request) (runner.Outcome, *badRequest) {
		wait, bad := leaseWait(req)
		if bad != nil {
			return runner.Outcome{}, bad
		}
		if wait > 0 {
			return rn.LeaseWait(req.Context(), wait), nil
		}
		return rn.LeaseView(), nil
	}, true, limiter)
	mux["/v1/complete"] = guard(rn, []string{"POST"}, func(req *http.Request) (runner.Outcome, *badRequest) {
		next, bad := completeNext(req)
		if bad != nil {
			return runner.Outcome{}, bad
		}
		if next > 0 && !rn.Draining() {
			return runner.Outcome{}, &badRequest{status: 400, error: "invalid", message: `"next" is only for a sidecar ` +
				`draining a queue (JOBLEASE_QUEUE without JOBLEASE_ITEM): this one claims no next item`}
		}
		obj, tok, bad := decode(req, bodyLimit)
		if bad != nil {
			return runner.Outcome{}, bad
		}
		result, _, bad := payload(obj, cfg.MaxResultBytes, "result", "result")
		if bad != nil {
			return runner.Outcome{}, bad
		}
		if next > 0 {
			return rn.CompleteNext(req.Context(), tok, result, next), nil
		}
		return rn.Complete(tok, result), nil
	}, true, limiter)
	mux["/v1/checkpoint"] = guard(rn, []string{"POST"}, func(req *http.Request) (runner.Outcome, *badRequest) {
		obj, tok, bad := decode(req, bodyLimit)
		if bad != nil {
			return runner.Outcome{}, bad
		}
		if _, ok := obj["data"]; !ok {
			return runner.Outcome{}, &badRequest{status: 400, error: "invalid", message: `missing "data": the checkpoint as JSON`}
		}
		data, size, bad := payload(obj, cfg.MaxResultBytes, "data", "checkpoint")
		if bad != nil {
			return runner.Outcome{}, bad
		}
		// The volume bound (docs/sidecar.md, "Rate limiting"): every checkpoint is a
		// new etcd revision kept until compaction, so one worker checkpointing at
		// the request rate could fill etcd's quota for every tenant.
		if volume != nil {
			if wait := volume.TakeN(float64(size)); wait > 0 {
				return runner.Outcome{}, &badRequest{status: 429, error: "checkpoint_volume",
					message: fmt.Sprintf("checkpoints over %s bytes per second; retry in %.2f s",
						strconv.FormatFloat(volume.rate, 'g', -1, 64), wait),
					headers: []string{"Retry-After", retryAfter(wait)}}
			}
		}
		return rn.Checkpoint(tok, data), nil
	}, true, limiter)
	mux["/v1/release"] = guard(rn, []string{"POST"}, func(req *http.Request) (runner.Outcome, *badRequest) {
		_, tok, bad := decode(req, envelopeBytes)
		if bad != nil {
			return runner.Outcome{}, bad
		}
		return rn.Release(tok), nil
	}, true, limiter)
	probeRoutes(mux, rn)
	return mux
}

// ProbeHandler serves only what kubelet and Prometheus need; never the token.
func ProbeHandler(rn *runner.Runner) http.Handler {
	mux := routes{}
	probeRoutes(mux, rn)
	return mux
}
