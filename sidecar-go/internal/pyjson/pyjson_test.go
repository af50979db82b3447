package pyjson

import (
	"bufio"
	"encoding/hex"
	"encoding/json"
	"os"
	"strconv"
	"strings"
	"testing"
)

// testdata/python.txt holds what CPython's json.dumps writes for floats
// (given as exact hex), strings (given as UTF-8 hex) and number literals
// re-serialised after json.loads. It was produced by CPython 3 itself:
//
//	F <float.hex()> <json.dumps(f)>
//	S <json.dumps(utf8 hex)> <json.dumps(s)>
//	N <literal> <json.dumps(json.loads(literal))>
//
// so these tests compare against Python's real output, not a re-derivation.
func TestEncodingMatchesPython(t *testing.T) {
	f, err := os.Open("testdata/python.txt")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	n := 0
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		kind, rest, _ := strings.Cut(sc.Text(), " ")
		in, want, _ := strings.Cut(rest, " ")
		var got string
		switch kind {
		case "F":
			x, err := strconv.ParseFloat(strings.Trim(in, "'"), 64)
			if err != nil {
				t.Fatal(err)
			}
			b, err := Sorted(x)
			if err != nil {
				t.Fatal(err)
			}
			got = string(b)
		case "S":
			raw, _ := hex.DecodeString(strings.Trim(in, `"`))
			b, _ := Sorted(string(raw))
			got = string(b)
		case "N":
			b, err := Sorted(json.Number(in))
			if err != nil {
				t.Fatal(err)
			}
			got = string(b)
		}
		if got != want {
			t.Errorf("%s %s: wrote %s, Python writes %s", kind, in, got, want)
		}
		n++
	}
	if n < 20 {
		t.Fatalf("only %d cases read", n)
	}
}

func TestSortedSortsEveryDepthAndObjKeepsOrderWhenCompact(t *testing.T) {
	v, err := Decode([]byte(`{"b":{"z":1,"a":[{"y":2,"x":1}]},"a":null}`))
	if err != nil {
		t.Fatal(err)
	}
	b, _ := Sorted(v)
	if string(b) != `{"a":null,"b":{"a":[{"x":1,"y":2}],"z":1}}` {
		t.Fatalf("got %s", b)
	}
	c, _ := Compact(Obj{{"owner", "o"}, {"claimId", "c"}})
	if string(c) != `{"owner":"o","claimId":"c"}` {
		t.Fatalf("got %s", c)
	}
}

func TestRefusesWhatPythonRefuses(t *testing.T) {
	for _, bad := range []string{`NaN`, `{"a":Infinity}`, `{"a":1} x`, "\"\xff\"", ``} {
		if _, err := Decode([]byte(bad)); err == nil {
			t.Errorf("%q decoded", bad)
		}
	}
	// A literal too large for a double is infinity in Python: not JSON-compliant on output.
	if _, err := Sorted(json.Number("1e400")); err == nil {
		t.Error("1e400 encoded")
	}
}
