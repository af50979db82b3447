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

// values.json: what a result or checkpoint may be (docs/protocol.md, "Stored
// values"), the same verdicts as the Python side's test_vectors.py.
type valueVector struct {
	Name       string   `json:"name"`
	Verdict    string   `json:"verdict"`
	JSON       *string  `json:"json"`
	JSONBase64 *string  `json:"json_base64"`
	JSONParts  [][2]any `json:"json_parts"`
}

func (v valueVector) text(t *testing.T) []byte {
	t.Helper()
	switch {
	case v.JSONBase64 != nil:
		b, err := base64.StdEncoding.DecodeString(*v.JSONBase64)
		if err != nil {
			t.Fatalf("%s: bad json_base64: %v", v.Name, err)
		}
		return b
	case v.JSONParts != nil:
		var b strings.Builder
		for _, p := range v.JSONParts {
			n, err := p[1].(json.Number).Int64()
			if err != nil {
				t.Fatalf("%s: bad count: %v", v.Name, err)
			}
			b.WriteString(strings.Repeat(p[0].(string), int(n)))
		}
		return []byte(b.String())
	case v.JSON != nil:
		return []byte(*v.JSON)
	}
	t.Fatalf("%s: no json, json_base64 or json_parts", v.Name)
	return nil
}

// written is what the sidecar's writer does with a value sent as the result
// of POST /v1/complete (the checkpoint's is the same): the body is decoded
// by pyjson.Decode, as the API's parse does, and the value checked by
// JSONPayload, as Lease.Complete and Lease.Checkpoint do before any write.
func written(body []byte) error {
	v, err := pyjson.Decode(body)
	if err != nil {
		return err
	}
	_, err = JSONPayload(v.(map[string]any)["result"], "result", MaxResultBytes)
	return err
}

func recordAround(record string, text []byte) []byte {
	field, at := "result", "completedAt"
	if record == "checkpoint" {
		field, at = "data", "checkpointedAt"
	}
	return []byte(`{"claimId":"c1","` + at + `":1.5,"generation":2,"owner":"w","` + field + `":` + string(text) + `,"token":7}`)
}

func TestStoredValueRuleMatchesTheSharedVectors(t *testing.T) {
	var all struct {
		Limits struct{ MaxDepth, MaxBytes int }
		Values []valueVector
	}
	load(t, "values.json", &all)
	if all.Limits.MaxDepth != pyjson.MaxDepth || all.Limits.MaxBytes != MaxResultBytes || MaxCheckpointBytes != MaxResultBytes {
		t.Fatalf("values.json limits %+v, this package: depth %d, bytes %d", all.Limits, pyjson.MaxDepth, MaxResultBytes)
	}
	if len(all.Values) == 0 {
		t.Fatal("no value vectors")
	}
	for _, v := range all.Values {
		t.Run(v.Name, func(t *testing.T) {
			text := v.text(t)
			body := append(append([]byte(`{"token":7,"result":`), text...), '}')
			werr := written(body)
			for _, record := range []string{"result", "checkpoint"} {
				got, rerr := decoded(record, recordAround(record, text))
				switch v.Verdict {
				case "accept":
					if werr != nil {
						t.Fatalf("the writer refused an acceptable value: %v", werr)
					}
					if rerr != nil {
						t.Fatalf("the %s reader refused an acceptable value: %v", record, rerr)
					}
					field := map[string]string{"result": "result", "checkpoint": "data"}[record]
					want, err := pyjson.Decode(body)
					if err != nil {
						t.Fatal(err)
					}
					if canonical(t, got[field]) != canonical(t, want.(map[string]any)["result"]) {
						t.Fatalf("the %s reader changed the value", record)
					}
				case "refuse":
					if werr == nil {
						t.Fatalf("the writer accepted %.80q", text)
					}
					e, ok := rerr.(*errs.Error)
					if !ok || e.Kind != errs.KindCorrupt || !strings.Contains(e.Message, "stored "+record+" record") {
						t.Fatalf("a stored %s holding %.80q must be refused as corrupt, got %v", record, text, rerr)
					}
				default:
					t.Fatalf("unknown verdict %q", v.Verdict)
				}
			}
		})
	}
}
