package protocol

import (
	"strings"
	"testing"

	"github.com/joblease/joblease/sidecar-go/internal/errs"
)

// The semaphore records, the specs' semaphores field and the semaphore key
// layout against the shared vectors (tests/vectors/semaphore_records.json,
// semaphore_keys.json), which tests/vectors/test_semaphore_vectors.py checks too.

func usesMeaning(uses []SemaphoreUse) []any {
	out := []any{}
	for _, u := range uses {
		out = append(out, map[string]any{"name": u.Name, "weight": u.Weight})
	}
	return out
}

func usesOf(t *testing.T, m map[string]any) []SemaphoreUse {
	var out []SemaphoreUse
	for _, u := range m["semaphores"].([]any) {
		um := u.(map[string]any)
		out = append(out, SemaphoreUse{Name: um["name"].(string), Weight: num(t, um, "weight")})
	}
	return out
}

func decodedSemaphoreRecord(record string, data []byte) (map[string]any, error) {
	switch record {
	case "semaphore":
		s, err := DecodeSemaphoreSpec(data)
		return map[string]any{"limit": s.Limit}, err
	case "slot":
		s, err := DecodeSlot(data)
		return map[string]any{"holder": s.Holder, "owner": s.Owner, "claimId": s.ClaimID}, err
	case "waiter":
		w, err := DecodeWaiter(data)
		return map[string]any{"holder": w.Holder, "owner": w.Owner, "weight": w.Weight}, err
	case "spec":
		s, err := DecodeSpec(data)
		return map[string]any{"leaseDurationSeconds": s.LeaseDurationSeconds, "maxAttempts": s.MaxAttempts,
			"parameters": s.Parameters, "semaphores": usesMeaning(s.Semaphores)}, err
	case "queue":
		q, err := DecodeQueueSpec(data)
		return map[string]any{"leaseDurationSeconds": q.LeaseDurationSeconds, "maxAttempts": q.MaxAttempts,
			"suspend": q.Suspend, "shards": q.Shards, "semaphores": usesMeaning(q.Semaphores)}, err
	}
	panic(record)
}

func encodedSemaphoreRecord(t *testing.T, record string, m map[string]any) []byte {
	t.Helper()
	var b []byte
	var err error
	switch record {
	case "semaphore":
		b, err = SemaphoreSpec{Limit: num(t, m, "limit")}.Encode()
	case "slot":
		b, err = SlotRecord{Holder: m["holder"].(string), Owner: m["owner"].(string), ClaimID: m["claimId"].(string)}.Encode()
	case "waiter":
		b, err = WaiterRecord{Holder: m["holder"].(string), Owner: m["owner"].(string), Weight: num(t, m, "weight")}.Encode()
	case "spec":
		b, err = EncodeSpec(Spec{LeaseDurationSeconds: num(t, m, "leaseDurationSeconds"), MaxAttempts: num(t, m, "maxAttempts"),
			Parameters: m["parameters"].(map[string]any), Semaphores: usesOf(t, m)})
	case "queue":
		b, err = QueueSpec{LeaseDurationSeconds: num(t, m, "leaseDurationSeconds"), MaxAttempts: num(t, m, "maxAttempts"),
			Suspend: m["suspend"].(bool), Shards: num(t, m, "shards"), Semaphores: usesOf(t, m)}.Encode()
	}
	if err != nil {
		t.Fatalf("encode: %v", err)
	}
	return b
}

func TestSemaphoreRecordsMatchTheSharedVectors(t *testing.T) {
	var all map[string][]vector
	load(t, "semaphore_records.json", &all)
	records := []string{"semaphore", "slot", "waiter", "spec", "queue"}
	if len(all) != len(records) {
		t.Fatalf("semaphore_records.json has records %v, this test knows %v", keysOf(all), records)
	}
	for _, record := range records {
		seen := map[string]bool{}
		for _, v := range all[record] {
			seen[v.Direction] = true
			t.Run(record+"/"+v.Name, func(t *testing.T) {
				stored := v.bytes(t)
				got, err := decodedSemaphoreRecord(record, stored)
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
					if b := encodedSemaphoreRecord(t, record, want); string(b) != string(stored) {
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

func TestSemaphoreKeyLayoutMatchesTheSharedVectors(t *testing.T) {
	var all struct {
		Layout []struct {
			Root, Namespace, Semaphore, Prefix, Spec, Slots, Waiters, Ticket, Waiter string
			Slot                                                                     map[string]string
		}
	}
	load(t, "semaphore_keys.json", &all)
	if len(all.Layout) == 0 {
		t.Fatal("no layout vectors")
	}
	for _, v := range all.Layout {
		k := SemaphoreKeysOf(v.Root, SemaphoreRef{v.Namespace, v.Semaphore})
		got := []string{k.Prefix, k.Spec(), k.Slots(), k.Waiters(), k.Waiter(v.Ticket)}
		want := []string{v.Prefix, v.Spec, v.Slots, v.Waiters, v.Waiter}
		for i := range got {
			if got[i] != want[i] {
				t.Errorf("root %q: key %q, want %q", v.Root, got[i], want[i])
			}
		}
		if len(v.Slot) == 0 {
			t.Errorf("root %q: no slot vectors", v.Root)
		}
		for index, key := range v.Slot {
			var i int64
			for _, ch := range index {
				i = 10*i + int64(ch-'0')
			}
			if k.Slot(i) != key || k.SlotIndex(key) != i {
				t.Errorf("slot %d: key %q (index back %d), want %q", i, k.Slot(i), k.SlotIndex(key), key)
			}
		}
	}
}
