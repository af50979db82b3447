package pyjson

import (
	"bufio"
	"encoding/hex"
	"encoding/json"
	"errors"
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

// Check is the text-level half of the stored-value rule (docs/protocol.md,
// "Stored values"); the shared vectors judge it through the protocol package,
// these pin the scanner's corners and its messages.
func TestCheckFindsDepthAndLoneSurrogatesOutsideTheDecoder(t *testing.T) {
	for _, c := range []struct {
		name, text string
		depth      int
		want       string // "" accepts; else a substring of the error
	}{
		{"at-limit", "[[1]]", 2, ""},
		{"over", "[[[1]]]", 2, "nested deeper than 2 levels"},
		{"brackets-in-strings", `["[[[[", "\"[[["]`, 1, ""},
		{"escaped-backslash-then-u", `"\\ud800"`, 0, ""},
		{"pair", `"\ud83d\ude80"`, 0, ""},
		{"pair-upper-hex", `"\uD83D\uDE80"`, 0, ""},
		{"lone-high", `"a\ud800"`, 0, `\ud800 at byte 2`},
		{"lone-high-at-end", `"\ud800`, 0, `\ud800`},
		{"high-then-high", `"\ud800\ud800"`, 0, `\ud800 at byte 1`},
		{"lone-low", `["\udfff"]`, 1, `\udfff at byte 2`},
		{"raw", "\"\xed\xa0\x80\"", 0, "raw UTF-8 bytes at byte 1"},
		{"raw-3-byte-non-surrogate", "\"\xed\x9f\xbf\"", 0, ""}, // U+D7FF
	} {
		t.Run(c.name, func(t *testing.T) {
			err := Check([]byte(c.text), c.depth)
			if c.want == "" {
				if err != nil {
					t.Fatalf("refused %q: %v", c.text, err)
				}
				return
			}
			var rule *RuleError
			if !errors.As(err, &rule) || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("%q: got %v, want a RuleError containing %q", c.text, err, c.want)
			}
		})
	}
}

// Go's decoder reads an escaped lone surrogate as U+FFFD without an error:
// Decode must refuse it before that can happen.
func TestDecodeRefusesWhatEncodingJSONWouldSilentlyReplace(t *testing.T) {
	if _, err := Decode([]byte(`{"result":"\ud800"}`)); err == nil {
		t.Fatal(`Decode accepted a lone surrogate (encoding/json reads it as "\ufffd")`)
	}
	deep := strings.Repeat("[", MaxDepth+1) + strings.Repeat("]", MaxDepth+1)
	if _, err := Decode([]byte(`{"result":` + deep + `}`)); err == nil ||
		!strings.Contains(err.Error(), "a value in it is nested deeper than 64") {
		t.Fatalf("Decode of a %d-deep value inside an object: %v", MaxDepth+1, err)
	}
	ok := strings.Repeat("[", MaxDepth) + strings.Repeat("]", MaxDepth)
	if _, err := Decode([]byte(`{"result":` + ok + `}`)); err != nil {
		t.Fatalf("Decode of a %d-deep value inside an object: %v", MaxDepth, err)
	}
}
