package runner

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/joblease/joblease/sidecar-go/internal/config"
	"github.com/joblease/joblease/sidecar-go/internal/etcdtest"
	"github.com/joblease/joblease/sidecar-go/internal/logs"
	"github.com/joblease/joblease/sidecar-go/internal/protocol"
	"github.com/joblease/joblease/sidecar-go/internal/startup"
)

// The first lease held logs the start's steps at debug level, once: what the
// store (connect), the client (spec read, lease grant, claim) and the runner
// (token files) recorded, against a real etcd.
func TestStartTimelineLoggedOnceHeld(t *testing.T) {
	ep, _ := etcdtest.Start(t)
	job := protocol.JobRef{Namespace: "ns", Name: "timeline"}
	registerJob(t, etcdtest.NewStore(t, ep), job, 10)
	tl := startup.New(time.Now())
	tl.Mark("config")
	store := etcdtest.NewStore(t, ep)
	store.SetTimeline(tl)
	var out bytes.Buffer
	cfg := config.Config{Job: job, Owner: "worker-a", TokenFile: filepath.Join(t.TempDir(), "token"),
		Backoff: config.Backoff{Initial: 0.2, Maximum: 1, Multiplier: 2}}
	r := New(cfg, protocol.NewClient(store, protocol.DefaultRoot), slog.New(logs.New(&out, "DEBUG", "joblease.sidecar")))
	r.SetTimeline(tl)
	t.Cleanup(func() { r.RequestStop(""); r.cancel() })
	lease, code := r.claim()
	if lease == nil {
		t.Fatalf("no lease (code %d)", code)
	}
	defer func() { _ = lease.Release(context.Background()) }()
	r.held(lease)
	r.held(lease) // a second held (a draining sidecar's next item) logs nothing more
	var lines []map[string]any
	for _, line := range strings.Split(strings.TrimSpace(out.String()), "\n") {
		var rec map[string]any
		if err := json.Unmarshal([]byte(line), &rec); err != nil {
			t.Fatalf("%q: %v", line, err)
		}
		if rec["msg"] == "start timeline" {
			lines = append(lines, rec)
		}
	}
	if len(lines) != 1 {
		t.Fatalf("%d start timeline lines, want 1:\n%s", len(lines), out.String())
	}
	rec := lines[0]
	if rec["level"] != "debug" || rec["token"] != float64(lease.Token) {
		t.Fatalf("line %v", rec)
	}
	seen := map[string]bool{}
	for _, s := range rec["steps"].([]any) {
		step := s.(map[string]any)
		if step["ms"].(float64) < 0 || step["atMs"].(float64) < 0 {
			t.Fatalf("step %v", step)
		}
		seen[step["step"].(string)] = true
	}
	for _, want := range []string{"config", "connect", "spec read", "lease grant", "claim", "token files"} {
		if !seen[want] {
			t.Fatalf("no %q step in %v", want, rec["steps"])
		}
	}
	if rec["totalMs"].(float64) <= 0 {
		t.Fatalf("totalMs %v", rec["totalMs"])
	}
}
