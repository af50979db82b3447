package runner

import "testing"

func TestLossCauseTellsExpiryFromOtherLosses(t *testing.T) {
	for _, tc := range []struct{ reason, cause string }{
		{"etcd lease lost: no keep-alive succeeded before the safety deadline", "expired"},
		{"etcd lease lost: etcd reports the lease expired (or it was revoked)", "expired"},
		{"lease no longer valid", "lost"},
		{"holder key deleted (expired, released or job unregistered)", "lost"},
		{"etcd refused the completion: job now held by \"b\" with token 19", "lost"},
	} {
		if got := lossCause(tc.reason); got != tc.cause {
			t.Errorf("lossCause(%q) = %q, want %q", tc.reason, got, tc.cause)
		}
	}
}
