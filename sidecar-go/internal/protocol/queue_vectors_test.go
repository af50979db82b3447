package protocol

import (
	"strings"
	"testing"

	"github.com/joblease/joblease/sidecar-go/internal/errs"
)

// The queue records and key layout against the shared vectors
// (tests/vectors/queue_records.json, queue_keys.json), which the Python side's
// tests/vectors/test_queue_vectors.py checks too.

func decodedQueueRecord(record string, data []byte) (map[string]any, error) {
	switch record {
	case "queue":
		q, err := DecodeQueueSpec(data)
		return map[string]any{"leaseDurationSeconds": q.LeaseDurationSeconds, "maxAttempts": q.MaxAttempts,
			"suspend": q.Suspend, "shards": q.Shards, "historyLimit": q.HistoryLimit}, err
	case "item":
		i, err := DecodeItem(data, 0)
		return map[string]any{"payload": i.Payload, "enqueuedAt": i.EnqueuedAt}, err
	case "pending":
		p, err := DecodePending(data)
		return map[string]any{"attemptsFrom": p.AttemptsFrom, "since": p.Since}, err
	case "failed":
		f, err := DecodeFailed(data)
		return map[string]any{"generation": f.Generation, "failedAt": f.FailedAt}, err
	}
	panic(record)
}

func encodedQueueRecord(t *testing.T, record string, m map[string]any) []byte {
	t.Helper()
	var b []byte
	var err error
	switch record {
	case "queue":
		b, err = QueueSpec{LeaseDurationSeconds: num(t, m, "leaseDurationSeconds"), MaxAttempts: num(t, m, "maxAttempts"),
			Suspend: m["suspend"].(bool), Shards: num(t, m, "shards"), HistoryLimit: num(t, m, "historyLimit")}.Encode()
	case "item":
		b, err = ItemRecord{Payload: m["payload"], EnqueuedAt: flt(t, m, "enqueuedAt")}.Encode()
	case "pending":
		b, err = PendingRecord{AttemptsFrom: num(t, m, "attemptsFrom"), Since: flt(t, m, "since")}.Encode()
	case "failed":
		b, err = FailedRecord{Generation: num(t, m, "generation"), FailedAt: flt(t, m, "failedAt")}.Encode()
	}
	if err != nil {
		t.Fatalf("encode: %v", err)
	}
	return b
}

func TestQueueRecordsMatchTheSharedVectors(t *testing.T) {
	var all map[string][]vector
	load(t, "queue_records.json", &all)
	records := []string{"queue", "item", "pending", "failed"}
	if len(all) != len(records) {
		t.Fatalf("queue_records.json has records %v, this test knows %v", keysOf(all), records)
	}
	for _, record := range records {
		seen := map[string]bool{}
		for _, v := range all[record] {
			seen[v.Direction] = true
			t.Run(record+"/"+v.Name, func(t *testing.T) {
				stored := v.bytes(t)
				got, err := decodedQueueRecord(record, stored)
				switch v.Direction {
				case "refuse":
					e, ok := err.(*errs.Error)
					if !ok || e.Kind != errs.KindCorrupt || !strings.Contains(e.Message, "stored "+record+" record") {
						t.Fatalf("%q must be refused as a corrupt %s record, got %v", stored, record, err)
					}
					return
				case "both", "decode":
				default:
					t.Fatalf("unknown direction %q", v.Direction)
				}
				if err != nil {
					t.Fatalf("%q: %v", stored, err)
				}
				want := meaning(t, v)
				if canonical(t, got) != canonical(t, want) {
					t.Fatalf("read %q as\n%s\nwant\n%s", stored, canonical(t, got), canonical(t, want))
				}
				if v.Direction == "both" {
					if b := encodedQueueRecord(t, record, want); string(b) != string(stored) {
						t.Fatalf("wrote\n%s\nwant\n%s", b, stored)
					}
				}
			})
		}
		if !seen["both"] || !seen["refuse"] {
			t.Errorf("%s: the vectors need both and refuse directions, have %v", record, seen)
		}
	}
}

func keysOf(m map[string][]vector) []string {
	out := []string{}
	for k := range m {
		out = append(out, k)
	}
	return out
}

func TestQueueKeyLayoutMatchesTheSharedVectors(t *testing.T) {
	var all struct {
		Layout []struct {
			Root, Namespace, Queue, Item, Prefix string
			Keys                                 map[string]string
		}
	}
	load(t, "queue_keys.json", &all)
	if len(all.Layout) == 0 {
		t.Fatal("no layout vectors")
	}
	for _, v := range all.Layout {
		q := QueueKeysOf(v.Root, QueueRef{v.Namespace, v.Queue})
		if q.Prefix != v.Prefix {
			t.Errorf("root %q: prefix %q, want %q", v.Root, q.Prefix, v.Prefix)
		}
		if err := ValidateItemID(v.Item); err != nil {
			t.Errorf("the vectors' item id %q is refused: %v", v.Item, err)
		}
		k := q.Item(v.Item)
		got := map[string]string{"spec": k.Spec(), "item": k.Item(), "pending": k.Pending(), "holder": k.Holder(),
			"claims": k.Claims(), "result": k.Result(), "checkpoint": k.Checkpoint(), "failed": k.Failed()}
		if len(got) != len(v.Keys) {
			t.Errorf("root %q: the vectors name %d keys, this package %d", v.Root, len(v.Keys), len(got))
		}
		for f, want := range v.Keys {
			if got[f] != want {
				t.Errorf("root %q: %s key %q, want %q", v.Root, f, got[f], want)
			}
		}
	}
}

func TestItemIDsAreTheDocumentedCharacters(t *testing.T) {
	for _, ok := range []string{"x", "7", "2026-12-01T23:00:00Z", "a.b_c:d-e", strings.Repeat("a", 253)} {
		if err := ValidateItemID(ok); err != nil {
			t.Errorf("%q refused: %v", ok, err)
		}
	}
	for _, bad := range []string{"", "a/b", "a b", "é", strings.Repeat("a", 254), "x\n"} {
		if err := ValidateItemID(bad); err == nil || !errs.Is(err, errs.KindInvalid) {
			t.Errorf("%q accepted (%v)", bad, err)
		}
	}
}
