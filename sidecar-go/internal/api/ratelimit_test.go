package api

import (
	"testing"
	"time"
)

// The checkpoint volume bound's bucket: a burst of 16 s worth (at least one
// largest checkpoint), a refused take takes nothing, and bytes come back at the rate.
func TestTheVolumeBucketAdmitsItsBurstRefusesWithoutTakingAndRefills(t *testing.T) {
	l := NewVolumeLimiter(1024, 65536) // burst: max(64 KiB, 16 KiB)
	if l.burst != 65536 {
		t.Fatalf("burst %v, want 65536 (one largest checkpoint)", l.burst)
	}
	if wait := l.TakeN(60000); wait != 0 {
		t.Fatalf("first 60000 bytes refused (wait %v)", wait)
	}
	wait := l.TakeN(10000)
	if wait <= 0 {
		t.Fatal("10000 more bytes admitted beyond the burst")
	}
	// what was left (about 5536) is still there: the refusal took nothing
	if w := l.TakeN(5000); w != 0 {
		t.Fatalf("5000 bytes of the remainder refused after a refusal (wait %v)", w)
	}
	l.mu.Lock()
	l.last = l.last.Add(-2 * time.Second) // two seconds pass: 2048 bytes come back
	l.mu.Unlock()
	if w := l.TakeN(2000); w != 0 {
		t.Fatalf("2000 bytes refused after 2 s at 1024 B/s (wait %v)", w)
	}
	if big := NewVolumeLimiter(16384, 65536); big.burst != 16384*checkpointBurstSeconds {
		t.Fatalf("burst %v, want 16 s worth", big.burst)
	}
}
