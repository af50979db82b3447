package metrics

import (
	"os"
	"regexp"
	"testing"
)

// testdata/prometheus_client.txt is what the Python sidecar's registry
// renders (joblease.sidecar.metrics with prometheus_client) after one claim,
// two claim attempts, in state "held", with 1.234 s left; its _created
// timestamps are replaced by CREATED. The Go rendering must be the same text.
// (The state "waiting" of queue mode came after the Python sidecar was
// retired: its line was added to the file as prometheus_client renders a
// ninth state, in order; so were the slot-wait counters, as prometheus_client
// renders two more counters after the others, and the auth-failures counter after them.)
func TestRenderingMatchesPrometheusClient(t *testing.T) {
	want, err := os.ReadFile("testdata/prometheus_client.txt")
	if err != nil {
		t.Fatal(err)
	}
	m := New()
	m.Inc(m.Claims)
	m.Inc(m.ClaimAttempts)
	m.Inc(m.ClaimAttempts)
	m.SetState("held")
	got := regexp.MustCompile(`(_created) \S+`).ReplaceAll(m.Render(1.234), []byte("$1 CREATED"))
	if string(got) != string(want) {
		t.Fatalf("got\n%s\nwant\n%s", got, want)
	}
}

func TestFloatsAreFormattedLikePrometheusClient(t *testing.T) {
	for in, want := range map[float64]string{0: "0.0", 1: "1.0", 1.796129008210721e9: "1.796129008210721e+09",
		123456.5: "123456.5", 1234567.0: "1.234567e+06"} {
		if got := goFloat(in); got != want {
			t.Errorf("%v: %s, want %s", in, got, want)
		}
	}
}
