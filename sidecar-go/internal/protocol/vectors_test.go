package protocol

import (
	"encoding/base64"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/joblease/joblease/sidecar-go/internal/errs"
	"github.com/joblease/joblease/sidecar-go/internal/pyjson"
)

// The shared test vectors (tests/vectors/, README there): the bytes both
// implementations write and read. Nothing is faked: the real encoders and
// decoders of this package run against the files the Python side checks too.

func vectorsDir(t *testing.T) string {
	t.Helper()
	dir := os.Getenv("JOBLEASE_VECTORS_DIR")
	if dir == "" {
		dir = filepath.Join("..", "..", "..", "tests", "vectors")
	}
	if _, err := os.Stat(filepath.Join(dir, "records.json")); err != nil {
		t.Fatalf("the shared test vectors are missing (%v): they live in tests/vectors/ of the repository "+
			"(set JOBLEASE_VECTORS_DIR to read them elsewhere)", err)
	}
	return dir
}

type vector struct {
	Name         string          `json:"name"`
	Direction    string          `json:"direction"`
	Stored       *string         `json:"stored"`
	StoredBase64 *string         `json:"stored_base64"`
	Meaning      json.RawMessage `json:"meaning"`
}

func (v vector) bytes(t *testing.T) []byte {
	if v.Stored != nil {
		return []byte(*v.Stored)
	}
	b, err := base64.StdEncoding.DecodeString(*v.StoredBase64)
	if err != nil {
		t.Fatalf("%s: bad stored_base64: %v", v.Name, err)
	}
	return b
}

func load(t *testing.T, name string, into any) {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(vectorsDir(t), name))
	if err != nil {
		t.Fatal(err)
	}
	dec := json.NewDecoder(strings.NewReader(string(data)))
	dec.UseNumber()
	if err := dec.Decode(into); err != nil {
		t.Fatalf("%s: %v", name, err)
	}
}

// canonical is a value's canonical encoding, so that meanings compare
// exactly (numbers as Python writes them: 5 and 5.0 differ, 1.50 and 1.5 do not).
func canonical(t *testing.T, v any) string {
	t.Helper()
	b, err := pyjson.Sorted(v)
	if err != nil {
		t.Fatalf("cannot encode %v: %v", v, err)
	}
	return string(b)
}

func meaning(t *testing.T, v vector) map[string]any {
	t.Helper()
	m, err := pyjson.DecodeObject(v.Meaning)
	if err != nil {
		t.Fatalf("%s: meaning: %v", v.Name, err)
	}
	return m
}

// decoded is the record as a reader of this package gets it, shaped like `meaning`.
func decoded(record string, data []byte) (map[string]any, error) {
	switch record {
	case "spec":
		s, err := DecodeSpec(data)
		return map[string]any{"leaseDurationSeconds": s.LeaseDurationSeconds, "maxAttempts": s.MaxAttempts,
			"parameters": s.Parameters}, err
	case "holder":
		h, err := DecodeHolder(data)
		return map[string]any{"owner": h.Owner, "claimId": h.ClaimID, "ttl": h.TTL, "claimedAt": h.ClaimedAt}, err
	case "claims":
		c, err := DecodeClaims(data)
		return map[string]any{"owner": c.Owner, "claimId": c.ClaimID}, err
	case "result":
		r, err := DecodeResult(data, 0)
		return map[string]any{"owner": r.Owner, "claimId": r.ClaimID, "token": r.Token, "generation": r.Generation,
			"result": r.Result, "completedAt": r.CompletedAt}, err
	case "checkpoint":
		c, err := DecodeCheckpoint(data, 0)
		return map[string]any{"owner": c.Owner, "claimId": c.ClaimID, "token": c.Token, "generation": c.Generation,
			"data": c.Data, "checkpointedAt": c.CheckpointedAt}, err
	}
	panic(record)
}

func num(t *testing.T, m map[string]any, k string) int64 {
	n, err := m[k].(json.Number).Int64()
	if err != nil {
		t.Fatalf("%s: %v", k, err)
	}
	return n
}

func flt(t *testing.T, m map[string]any, k string) float64 {
	f, err := m[k].(json.Number).Float64()
	if err != nil {
		t.Fatalf("%s: %v", k, err)
	}
	return f
}

// encoded is what a writer of this package produces for `meaning`.
func encoded(t *testing.T, record string, m map[string]any) []byte {
	t.Helper()
	var b []byte
	var err error
	switch record {
	case "spec":
		b, err = EncodeSpec(Spec{LeaseDurationSeconds: num(t, m, "leaseDurationSeconds"), MaxAttempts: num(t, m, "maxAttempts"),
			Parameters: m["parameters"].(map[string]any)})
	case "holder":
		b, err = HolderValue(m["owner"].(string), m["claimId"].(string), num(t, m, "ttl"), flt(t, m, "claimedAt"))
	case "claims":
		b, err = ClaimsValue(m["owner"].(string), m["claimId"].(string))
	case "result":
		b, err = Result{Owner: m["owner"].(string), ClaimID: m["claimId"].(string), Token: num(t, m, "token"),
			Generation: num(t, m, "generation"), Result: m["result"], CompletedAt: flt(t, m, "completedAt")}.Encode()
	case "checkpoint":
		b, err = Checkpoint{Owner: m["owner"].(string), ClaimID: m["claimId"].(string), Token: num(t, m, "token"),
			Generation: num(t, m, "generation"), Data: m["data"], CheckpointedAt: flt(t, m, "checkpointedAt")}.Encode()
	}
	if err != nil {
		t.Fatalf("encode: %v", err)
	}
	return b
}

func TestRecordsMatchTheSharedVectors(t *testing.T) {
	var all map[string][]vector
	load(t, "records.json", &all)
	for _, record := range []string{"spec", "holder", "claims", "result", "checkpoint"} {
		if len(all[record]) == 0 {
			t.Fatalf("no vectors for %s", record)
		}
		for _, v := range all[record] {
			t.Run(record+"/"+v.Name, func(t *testing.T) {
				stored := v.bytes(t)
				got, err := decoded(record, stored)
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
					if b := encoded(t, record, want); string(b) != string(stored) {
						t.Fatalf("wrote\n%s\nwant\n%s", b, stored)
					}
				}
			})
		}
	}
}

func TestKeyLayoutMatchesTheSharedVectors(t *testing.T) {
	var all struct {
		Layout []struct {
			Root, Namespace, Name, Prefix string
			Keys                          map[string]string
		}
	}
	load(t, "keys.json", &all)
	if len(all.Layout) == 0 {
		t.Fatal("no layout vectors")
	}
	for _, v := range all.Layout {
		k := Keys(v.Root, JobRef{v.Namespace, v.Name})
		got := map[string]string{"spec": k.Spec(), "holder": k.Holder(), "claims": k.Claims(), "result": k.Result(),
			"checkpoint": k.Checkpoint()}
		if k.Prefix != v.Prefix {
			t.Errorf("root %q: prefix %q, want %q", v.Root, k.Prefix, v.Prefix)
		}
		for f, want := range v.Keys {
			if got[f] != want {
				t.Errorf("root %q: %s key %q, want %q", v.Root, f, got[f], want)
			}
		}
	}
}
