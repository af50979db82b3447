package protocol

import (
	"encoding/json"
	"strings"
	"testing"
)

// tests/vectors/history.json: the tenure history's records and keys, written
// byte for byte as the Python library writes them (which reads them:
// tests/vectors/test_history_vectors.py), and historyLimit in a job's spec.

type historyKeyVector struct {
	Root, Namespace, Name, Queue, Item         string
	History, Tenure, End, Checkpoints, Refused string
	Generation                                 int64
}

func TestHistoryVectors(t *testing.T) {
	var file struct {
		Spec, Tenure, TenureEnd, TenureMark []vector
		Keys, ItemKeys                      []historyKeyVector
	}
	load(t, "history.json", &file)
	if len(file.Spec) == 0 || len(file.Tenure) == 0 || len(file.TenureEnd) == 0 || len(file.TenureMark) == 0 ||
		len(file.Keys) == 0 || len(file.ItemKeys) == 0 {
		t.Fatal("history.json has an empty section")
	}
	meaning := func(v vector) map[string]any {
		var m map[string]any
		dec := json.NewDecoder(strings.NewReader(string(v.Meaning)))
		dec.UseNumber()
		if err := dec.Decode(&m); err != nil {
			t.Fatalf("%s: %v", v.Name, err)
		}
		return m
	}
	for _, v := range file.Spec {
		switch v.Direction {
		case "both", "decode":
			m := meaning(v)
			s, err := DecodeSpec(v.bytes(t))
			if err != nil || s.HistoryLimit != num(t, m, "historyLimit") || s.LeaseDurationSeconds != num(t, m, "leaseDurationSeconds") {
				t.Fatalf("spec %s: %+v %v", v.Name, s, err)
			}
			if v.Direction == "both" {
				b, err := EncodeSpec(Spec{LeaseDurationSeconds: num(t, m, "leaseDurationSeconds"), MaxAttempts: num(t, m, "maxAttempts"),
					Parameters: m["parameters"].(map[string]any), HistoryLimit: num(t, m, "historyLimit")})
				if err != nil || string(b) != string(v.bytes(t)) {
					t.Fatalf("spec %s: wrote %s (%v)", v.Name, b, err)
				}
			}
		case "refuse":
			if _, err := DecodeSpec(v.bytes(t)); err == nil {
				t.Fatalf("spec %s: accepted", v.Name)
			}
		}
	}
	check := func(record string, v vector, b []byte, err error) {
		if err != nil || string(b) != string(v.bytes(t)) {
			t.Fatalf("%s %s: wrote %s (%v), want %s", record, v.Name, b, err, v.bytes(t))
		}
	}
	for _, v := range file.Tenure {
		if v.Direction == "both" {
			m := meaning(v)
			b, err := TenureStartValue(m["owner"].(string), m["claimId"].(string), flt(t, m, "claimedAt"))
			check("tenure", v, b, err)
		}
	}
	for _, v := range file.TenureEnd {
		if v.Direction == "both" {
			m := meaning(v)
			b, err := TenureEndValue(m["how"].(string), flt(t, m, "at"))
			check("tenureEnd", v, b, err)
		}
	}
	for _, v := range file.TenureMark {
		m := meaning(v)
		b, err := TenureMarkValue(flt(t, m, "at"))
		check("tenureMark", v, b, err)
	}
	// a job's history keys, and a queue item's (the same layout under its queue's history/<id>/)
	for _, k := range append(file.Keys, file.ItemKeys...) {
		keys := Keys(k.Root, JobRef{k.Namespace, k.Name})
		if k.Item != "" {
			keys = QueueKeysOf(k.Root, QueueRef{k.Namespace, k.Queue}).Item(k.Item)
		}
		ten := tenure{keys: keys, gen: k.Generation}
		got := []string{keys.History(), ten.key(), ten.endKey(), ten.checkpoints(), ten.refused()}
		want := []string{k.History, k.Tenure, k.End, k.Checkpoints, k.Refused}
		for i := range got {
			if got[i] != want[i] {
				t.Fatalf("%s/%s: key %q, want %q", k.Namespace, k.Name, got[i], want[i])
			}
		}
	}
}
