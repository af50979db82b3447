package api

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/joblease/joblease/sidecar-go/internal/config"
	"github.com/joblease/joblease/sidecar-go/internal/etcd"
	"github.com/joblease/joblease/sidecar-go/internal/etcdtest"
	"github.com/joblease/joblease/sidecar-go/internal/protocol"
	"github.com/joblease/joblease/sidecar-go/internal/runner"
)

// Where an item's time goes in a sidecar draining a queue (issue 26, "items/s
// through one sidecar"; docs/benchmarks.md, "The Go sidecar draining a
// queue"): the sidecar's runner and HTTP API in this process, as main wires
// them, against a real etcd, with a trivial worker written in Go (so the
// worker's own cost is small next to the sidecar's), and beside it, in the
// same run, the parts an item is made of measured alone: the claim and the
// completion transactions through the same protocol client (no HTTP), the
// two token files, and one HTTP exchange that touches no etcd. The etcd
// requests per item are counted by etcd itself (its /metrics). Figures, not
// assertions:
//
//	cd sidecar-go && go test ./internal/api -run '^$' -bench Drain -benchtime 2000x
//
// b.N is the number of items per mode.

// etcdCounts is what etcd says it served, by gRPC method (unary calls
// handled; stream messages received for the streaming ones).
func etcdCounts(b *testing.B, ep string) map[string]float64 {
	b.Helper()
	resp, err := http.Get("http://" + ep + "/metrics")
	if err != nil {
		b.Fatal(err)
	}
	defer resp.Body.Close()
	out := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		var metric string
		switch {
		case strings.HasPrefix(line, "grpc_server_handled_total{"):
			metric = "handled"
		case strings.HasPrefix(line, "grpc_server_msg_received_total{"):
			metric = "received"
		default:
			continue
		}
		method := between(line, `grpc_method="`, `"`)
		kind := between(line, `grpc_type="`, `"`)
		if (metric == "handled") != (kind == "unary") {
			continue
		}
		v, err := strconv.ParseFloat(line[strings.LastIndexByte(line, ' ')+1:], 64)
		if err == nil {
			out[method] += v
		}
	}
	return out
}

func between(s, open, end string) string {
	_, rest, ok := strings.Cut(s, open)
	if !ok {
		return ""
	}
	v, _, _ := strings.Cut(rest, end)
	return v
}

func benchQueue(b *testing.B, ep string, n int) protocol.QueueRef {
	b.Helper()
	store := etcdtest.NewStore(b, ep)
	q := protocol.QueueRef{Namespace: "default", Name: fmt.Sprintf("bench-%d", time.Now().UnixNano())}
	spec, _ := protocol.QueueSpec{LeaseDurationSeconds: 30, MaxAttempts: 3}.Encode()
	if _, err := store.Txn(context.Background(), nil, []etcd.Op{etcd.Put(protocol.QueueKeysOf(protocol.DefaultRoot, q).Spec(), spec, 0)}, nil); err != nil {
		b.Fatal(err)
	}
	producer := protocol.NewClient(store, protocol.DefaultRoot)
	var wg sync.WaitGroup
	errc := make(chan error, 8)
	for w := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; i < n; i += 8 {
				if _, err := producer.Enqueue(context.Background(), protocol.ItemRef{Queue: q, ID: fmt.Sprintf("i%06d", i)}, nil); err != nil {
					errc <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	select {
	case err := <-errc:
		b.Fatal(err)
	default:
	}
	return q
}

func tokenDir(b *testing.B) string {
	if fi, err := os.Stat("/dev/shm"); err == nil && fi.IsDir() {
		dir, err := os.MkdirTemp("/dev/shm", "drainbench")
		if err == nil {
			b.Cleanup(func() { os.RemoveAll(dir) })
			return dir
		}
	}
	return b.TempDir()
}

// sidecar runs a draining runner and its API as main does; returns its base URL.
func sidecar(b *testing.B, ep string, q protocol.QueueRef) (string, *runner.Runner) {
	b.Helper()
	dir := tokenDir(b)
	cfg, err := config.Parse(nil, map[string]string{"JOBLEASE_ETCD_ENDPOINTS": ep, "JOBLEASE_QUEUE": q.String(),
		"POD_NAME": "bench", "JOBLEASE_TOKEN_FILE": filepath.Join(dir, "token"), "JOBLEASE_SIDECAR_ON_LOSS": "none",
		"JOBLEASE_SIDECAR_RATE_LIMIT": "off", "JOBLEASE_SIDECAR_PORT": "0", "JOBLEASE_SIDECAR_PROBE_PORT": "-1"})
	if err != nil {
		b.Fatal(err)
	}
	cfg.Etcd.RequestTimeout = 5 * time.Second
	store, err := etcd.New(cfg.Etcd)
	if err != nil {
		b.Fatal(err)
	}
	rn := runner.New(cfg, protocol.NewClient(store, cfg.Etcd.Root), slog.New(slog.NewJSONHandler(io.Discard, nil)))
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	srv := &http.Server{Handler: Handler(rn), ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(LingeringListener(ln)) }()
	done := make(chan runner.End, 1)
	go rn.Lifecycle(done)
	b.Cleanup(func() {
		rn.RequestStop("")
		rn.Shutdown()
		_ = srv.Close()
		rn.CloseClient()
	})
	return "http://" + ln.Addr().String(), rn
}

type held struct {
	Item  string `json:"item"`
	Token int64  `json:"token"`
}

type worker struct {
	b    *testing.B
	http *http.Client
	base string
}

func (w worker) do(req *http.Request) []byte {
	resp, err := w.http.Do(req)
	if err != nil {
		w.b.Fatal(err)
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		w.b.Fatal(err)
	}
	if resp.StatusCode != 200 {
		w.b.Fatalf("%s %s: %d %s", req.Method, req.URL, resp.StatusCode, body)
	}
	return body
}

// next long-polls until an item not seen yet is held.
func (w worker) next(seen string) held {
	for {
		req, _ := http.NewRequest("GET", w.base+"/v1/lease?wait=10", nil)
		var h held
		if err := json.Unmarshal(w.do(req), &h); err != nil {
			w.b.Fatal(err)
		}
		if h.Item != seen {
			return h
		}
	}
}

func (w worker) complete(h held, next bool) *held {
	body := fmt.Appendf(nil, `{"token":%d,"result":{"ok":true}}`, h.Token)
	url := w.base + "/v1/complete"
	if next {
		url += "?next=10"
	}
	req, _ := http.NewRequest("POST", url, bytes.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	out := w.do(req)
	if !next {
		return nil
	}
	var answer struct {
		Next       held `json:"next"`
		NextStatus int  `json:"nextStatus"`
	}
	if err := json.Unmarshal(out, &answer); err != nil {
		w.b.Fatal(err)
	}
	if answer.NextStatus != 200 {
		return nil
	}
	return &answer.Next
}

func pctl(d []time.Duration, p float64) time.Duration {
	if len(d) == 0 {
		return 0
	}
	s := append([]time.Duration(nil), d...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	return s[min(len(s)-1, int(p*float64(len(s))))]
}

func mean(d []time.Duration) time.Duration {
	var sum time.Duration
	for _, x := range d {
		sum += x
	}
	if len(d) == 0 {
		return 0
	}
	return sum / time.Duration(len(d))
}

// liveHeap is the live heap after a collection.
func liveHeap() int64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return int64(m.HeapAlloc)
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

func reportPerItem(b *testing.B, ep string, before map[string]float64, n int) {
	after := etcdCounts(b, ep)
	for _, m := range []string{"Txn", "Range", "LeaseGrant", "LeaseKeepAlive", "Watch"} {
		b.ReportMetric((after[m]-before[m])/float64(n), m+"/item")
	}
}

func BenchmarkDrain(b *testing.B) {
	ep, _ := etcdtest.Start(b)
	for _, mode := range []string{"wait", "next"} {
		b.Run(mode, func(b *testing.B) {
			q := benchQueue(b, ep, b.N+1)
			base, _ := sidecar(b, ep, q)
			w := worker{b: b, http: &http.Client{Timeout: 20 * time.Second}, base: base}
			h := w.next("") // the first claim (and its session) untimed
			ahead := w.complete(h, mode == "next" && b.N > 0)
			var claim, complete []time.Duration
			heap0 := liveHeap()
			before := etcdCounts(b, ep)
			b.ResetTimer()
			t := time.Now()
			for i := range b.N {
				if ahead != nil && ahead.Item != h.Item {
					h = *ahead
				} else {
					h = w.next(h.Item)
				}
				t1 := time.Now()
				// the last item asks for no next: the queue stays open, so it would wait out next=10
				ahead = w.complete(h, mode == "next" && i < b.N-1)
				t2 := time.Now()
				claim, complete = append(claim, t1.Sub(t)), append(complete, t2.Sub(t1))
				t = t2
			}
			b.StopTimer()
			reportPerItem(b, ep, before, b.N)
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "items/s")
			// what each item left behind in the sidecar's heap (the timings above kept 48 bytes an item)
			b.ReportMetric(float64(liveHeap()-heap0)/float64(b.N), "heapB/item")
			b.Logf("%s: claim (answer → next held seen) p50 %.2f p99 %.2f mean %.2f ms; completion POST p50 %.2f p99 %.2f mean %.2f ms",
				mode, ms(pctl(claim, .5)), ms(pctl(claim, .99)), ms(mean(claim)), ms(pctl(complete, .5)), ms(pctl(complete, .99)), ms(mean(complete)))
		})
	}
	// The parts, alone, on the same etcd.
	b.Run("parts", func(b *testing.B) {
		q := benchQueue(b, ep, b.N+1+min(b.N, 1000)+1)
		client := protocol.NewClient(etcdtest.NewStore(b, ep), protocol.DefaultRoot)
		l, _, err := client.ClaimNext(context.Background(), q, "bench")
		if err != nil || l == nil {
			b.Fatal(err)
		}
		if _, err := l.Complete(context.Background(), map[string]any{"ok": true}); err != nil {
			b.Fatal(err)
		}
		dir := tokenDir(b)
		var claimT, completeT, filesT, exchangeT []time.Duration
		before := etcdCounts(b, ep)
		b.ResetTimer()
		for range b.N {
			t0 := time.Now()
			l, _, err := client.ClaimNext(context.Background(), q, "bench")
			if err != nil || l == nil {
				b.Fatal(err)
			}
			t1 := time.Now()
			if _, err := runner.WriteAtomic(filepath.Join(dir, "token.json"), []byte(`{"job":"x","token":1}`+"\n"), nil); err != nil {
				b.Fatal(err)
			}
			if _, err := runner.WriteAtomic(filepath.Join(dir, "token"), []byte("1\n"), nil); err != nil {
				b.Fatal(err)
			}
			t2 := time.Now()
			if _, err := l.Complete(context.Background(), map[string]any{"ok": true}); err != nil {
				b.Fatal(err)
			}
			t3 := time.Now()
			claimT, filesT, completeT = append(claimT, t1.Sub(t0)), append(filesT, t2.Sub(t1)), append(completeT, t3.Sub(t2))
		}
		b.StopTimer()
		reportPerItem(b, ep, before, b.N)
		// The next claim sent while the completion is in flight (both
		// transactions at once on the one connection): what pipelining them would cost.
		var pairT []time.Duration
		if l, _, err = client.ClaimNext(context.Background(), q, "bench"); err != nil || l == nil {
			b.Fatal(err)
		}
		for range min(b.N, 1000) {
			t0 := time.Now()
			var next *protocol.Lease
			done := make(chan error, 1)
			go func() {
				var err error
				next, _, err = client.ClaimNext(context.Background(), q, "bench")
				done <- err
			}()
			if _, err := l.Complete(context.Background(), map[string]any{"ok": true}); err != nil {
				b.Fatal(err)
			}
			if err := <-done; err != nil || next == nil {
				b.Fatal(err)
			}
			pairT = append(pairT, time.Since(t0))
			l = next
		}
		b.Logf("parts: completion and next claim sent at once: both answered p50 %.2f mean %.2f ms", ms(pctl(pairT, .5)), ms(mean(pairT)))
		// One HTTP exchange with no etcd behind it (GET /v1/lease of a sidecar
		// waiting on an empty queue answers 503 at once), as the worker above makes them.
		empty := benchQueue(b, ep, 0)
		base, _ := sidecar(b, ep, empty)
		hc := &http.Client{Timeout: 5 * time.Second}
		for i := range 1000 + min(b.N, 2000) {
			t0 := time.Now()
			resp, err := hc.Get(base + "/v1/lease")
			if err != nil {
				b.Fatal(err)
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if i >= 1000 {
				exchangeT = append(exchangeT, time.Since(t0))
			}
		}
		b.Logf("parts: claim-next txn p50 %.2f mean %.2f; two token files p50 %.3f mean %.3f; completion txn p50 %.2f mean %.2f; "+
			"one HTTP exchange p50 %.3f mean %.3f ms", ms(pctl(claimT, .5)), ms(mean(claimT)), ms(pctl(filesT, .5)), ms(mean(filesT)),
			ms(pctl(completeT, .5)), ms(mean(completeT)), ms(pctl(exchangeT, .5)), ms(mean(exchangeT)))
		b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "items/s")
	})
}
