package startup

import (
	"testing"
	"time"

	"github.com/joblease/joblease/sidecar-go/internal/pyjson"
)

func field(t *testing.T, s any, key string) any {
	t.Helper()
	for _, kv := range s.(pyjson.Obj) {
		if kv.Key == key {
			return kv.Value
		}
	}
	t.Fatalf("no %q in %v", key, s)
	return nil
}

func TestStepsInTheOrderTheyBeganWithOffsetsAndDurations(t *testing.T) {
	start := time.Now().Add(-100 * time.Millisecond)
	tl := New(start)
	tl.Mark("config") // start .. now
	connectBegan := time.Now()
	tl.Step("late", time.Now().Add(-150*time.Millisecond)) // began before the start: listed first
	tl.Step("connect", connectBegan)
	tl.Mark("claim")
	steps, total := tl.Close()
	if len(steps) != 4 {
		t.Fatalf("steps %v", steps)
	}
	names := []string{}
	for _, s := range steps {
		names = append(names, field(t, s, "step").(string))
	}
	if want := []string{"late", "config", "connect", "claim"}; names[0] != want[0] || names[1] != want[1] ||
		names[2] != want[2] || names[3] != want[3] {
		t.Fatalf("order %v, want %v", names, want)
	}
	if at := field(t, steps[1], "atMs").(float64); at != 0 {
		t.Fatalf("config began at %v ms, want 0 (the start)", at)
	}
	if d := field(t, steps[1], "ms").(float64); d < 100 {
		t.Fatalf("config took %v ms, want >= 100", d)
	}
	if total < 100 {
		t.Fatalf("total %v ms, want >= 100", total)
	}
	// closed: nothing more is recorded, and a second Close says nothing
	tl.Mark("after")
	if steps, _ := tl.Close(); steps != nil {
		t.Fatalf("a closed timeline returned %v", steps)
	}
}

func TestNilTimelineRecordsNothing(t *testing.T) {
	var tl *Timeline
	tl.Mark("config")
	tl.Step("connect", time.Now())
	if steps, total := tl.Close(); steps != nil || total != 0 {
		t.Fatalf("nil timeline returned %v, %v", steps, total)
	}
}
