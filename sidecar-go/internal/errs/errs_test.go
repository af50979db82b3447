package errs

import (
	"fmt"
	"testing"
)

// A protocol error keeps its kind through wrapping: callers that add context
// with %w do not turn a stale token into a generic failure.
func TestIsAndAsSeeThroughWrapping(t *testing.T) {
	stale := Stale("default/job", 3, 5, "pod-b", "")
	wrapped := fmt.Errorf("completing: %w", fmt.Errorf("txn: %w", stale))
	for _, tc := range []struct {
		name string
		err  error
		want bool
	}{
		{"bare", stale, true},
		{"wrapped twice", wrapped, true},
		{"other kind", fmt.Errorf("x: %w", Held("default/job", "pod-b", 5, 2, 9)), false},
		{"plain error", fmt.Errorf("x"), false},
		{"nil", nil, false},
	} {
		if got := Is(tc.err, KindStale); got != tc.want {
			t.Errorf("%s: Is(stale) = %v", tc.name, got)
		}
	}
	e, ok := As(wrapped)
	if !ok || e != stale || e.ExitCode != 7 || e.Status != 409 {
		t.Fatalf("As(wrapped) = %v, %v", e, ok)
	}
}
