// Package pyjson writes JSON byte for byte as the Python side of joblease does.
//
// Stored records are compared as bytes by etcd (the renew condition compares
// the holder key's value), and both implementations read each other's
// records, so the Go sidecar must produce exactly what Python's
// json.dumps(obj, separators=(",", ":"), sort_keys=True) produces: keys in
// code point order, no spaces, non-ASCII escaped as lowercase \uXXXX (UTF-16
// surrogate pairs above the BMP), integers as written, floats as Python's
// repr (shortest round trip; exponent form below 1e-4 and from 1e16 on).
//
// Values come from Decode, which keeps numbers as json.Number so that an
// integer of any size survives unchanged, as in Python.
package pyjson

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"sort"
	"strconv"
	"strings"
	"unicode/utf8"
)

// Obj is a JSON object whose keys are written in the order given (Python
// dicts keep insertion order; json.dumps without sort_keys writes them so).
type Obj []KV

// KV is one member of an Obj.
type KV struct {
	Key   string
	Value any
}

// Decode parses one JSON value, keeping numbers as json.Number. Trailing
// data after the value is an error, as for Python's json.loads. What it reads
// is always one object around a stored value (a record, a request body), so
// it refuses, as a *RuleError, text nested deeper than MaxDepth+1 or holding
// a lone surrogate (Check): no joblease writer stores such a value.
func Decode(data []byte) (any, error) {
	if err := check(data, MaxDepth+1, true); err != nil {
		return nil, err
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, err
	}
	if rest := bytes.TrimLeft(data[dec.InputOffset():], " \t\r\n"); len(rest) > 0 {
		return nil, errors.New("extra data after the JSON value")
	}
	if !utf8.Valid(data) {
		return nil, errors.New("invalid UTF-8")
	}
	return v, nil
}

// DecodeObject parses a JSON object (anything else is an error).
func DecodeObject(data []byte) (map[string]any, error) {
	v, err := Decode(data)
	if err != nil {
		return nil, err
	}
	m, ok := v.(map[string]any)
	if !ok {
		return nil, fmt.Errorf("expected a JSON object, got %s", TypeName(v))
	}
	return m, nil
}

// TypeName is Python's name for the type a decoded JSON value has there.
func TypeName(v any) string {
	switch x := v.(type) {
	case nil:
		return "NoneType"
	case bool:
		return "bool"
	case string:
		return "str"
	case json.Number:
		if IsInt(x) {
			return "int"
		}
		return "float"
	case []any:
		return "list"
	case map[string]any, Obj:
		return "dict"
	}
	return fmt.Sprintf("%T", v)
}

// IsInt says whether a number literal is an integer in Python (no fraction, no exponent).
func IsInt(n json.Number) bool {
	return !strings.ContainsAny(string(n), ".eE")
}

// ErrNotJSON is returned for values Python refuses with allow_nan=False (NaN,
// infinities, including number literals too large for a float).
var ErrNotJSON = errors.New("out of range float values are not JSON compliant")

// Sorted encodes like json.dumps(v, separators=(",", ":"), sort_keys=True) with
// allow_nan=False. Obj members are sorted too.
func Sorted(v any) ([]byte, error) {
	var b bytes.Buffer
	if err := encode(&b, v, true, true); err != nil {
		return nil, err
	}
	return b.Bytes(), nil
}

// Compact encodes like json.dumps(v, separators=(",", ":")): Obj members in
// their order, map keys sorted (Go maps have no order of their own).
func Compact(v any) ([]byte, error) {
	var b bytes.Buffer
	if err := encode(&b, v, false, true); err != nil {
		return nil, err
	}
	return b.Bytes(), nil
}

// Response encodes an HTTP response body as Starlette's JSONResponse does:
// compact, members in order, non-ASCII left as UTF-8.
func Response(v any) []byte {
	var b bytes.Buffer
	if err := encode(&b, v, false, false); err != nil {
		return []byte(`{"error":"internal","message":"response not encodable"}`)
	}
	return b.Bytes()
}

// Spaced encodes like json.dumps(v) (", " and ": " separators, members in order).
func Spaced(o Obj) ([]byte, error) {
	var b bytes.Buffer
	b.WriteByte('{')
	for i, kv := range o {
		if i > 0 {
			b.WriteString(", ")
		}
		writeString(&b, kv.Key, true)
		b.WriteString(": ")
		if err := encode(&b, kv.Value, false, true); err != nil {
			return nil, err
		}
	}
	b.WriteByte('}')
	return b.Bytes(), nil
}

func encode(b *bytes.Buffer, v any, sortObj, ascii bool) error {
	switch x := v.(type) {
	case nil:
		b.WriteString("null")
	case bool:
		if x {
			b.WriteString("true")
		} else {
			b.WriteString("false")
		}
	case string:
		writeString(b, x, ascii)
	case json.Number:
		s, err := Number(x)
		if err != nil {
			return err
		}
		b.WriteString(s)
	case int:
		b.WriteString(strconv.Itoa(x))
	case int64:
		b.WriteString(strconv.FormatInt(x, 10))
	case float64:
		s, err := Float(x)
		if err != nil {
			return err
		}
		b.WriteString(s)
	case []any:
		b.WriteByte('[')
		for i, e := range x {
			if i > 0 {
				b.WriteByte(',')
			}
			if err := encode(b, e, sortObj, ascii); err != nil {
				return err
			}
		}
		b.WriteByte(']')
	case map[string]any:
		keys := make([]string, 0, len(x))
		for k := range x {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		o := make(Obj, 0, len(keys))
		for _, k := range keys {
			o = append(o, KV{k, x[k]})
		}
		return encodeObj(b, o, false, ascii, sortObj)
	case Obj:
		return encodeObj(b, x, sortObj, ascii, sortObj)
	default:
		return fmt.Errorf("pyjson: cannot encode %T", v)
	}
	return nil
}

func encodeObj(b *bytes.Buffer, o Obj, sortHere, ascii, sortNested bool) error {
	if sortHere {
		o = append(Obj(nil), o...)
		sort.SliceStable(o, func(i, j int) bool { return o[i].Key < o[j].Key })
	}
	b.WriteByte('{')
	for i, kv := range o {
		if i > 0 {
			b.WriteByte(',')
		}
		writeString(b, kv.Key, ascii)
		b.WriteByte(':')
		if err := encode(b, kv.Value, sortNested, ascii); err != nil {
			return err
		}
	}
	b.WriteByte('}')
	return nil
}

const hexDigits = "0123456789abcdef"

func writeString(b *bytes.Buffer, s string, ascii bool) {
	b.WriteByte('"')
	for _, r := range s {
		switch {
		case r == '"':
			b.WriteString(`\"`)
		case r == '\\':
			b.WriteString(`\\`)
		case r == '\n':
			b.WriteString(`\n`)
		case r == '\r':
			b.WriteString(`\r`)
		case r == '\t':
			b.WriteString(`\t`)
		case r == '\b':
			b.WriteString(`\b`)
		case r == '\f':
			b.WriteString(`\f`)
		case r < 0x20 || (ascii && r >= 0x7f):
			if r >= 0x10000 {
				r -= 0x10000
				writeU(b, 0xd800+(r>>10))
				writeU(b, 0xdc00+(r&0x3ff))
			} else {
				writeU(b, r)
			}
		default:
			b.WriteRune(r)
		}
	}
	b.WriteByte('"')
}

func writeU(b *bytes.Buffer, r rune) {
	b.WriteString(`\u`)
	b.WriteByte(hexDigits[(r>>12)&0xf])
	b.WriteByte(hexDigits[(r>>8)&0xf])
	b.WriteByte(hexDigits[(r>>4)&0xf])
	b.WriteByte(hexDigits[r&0xf])
}

// Number renders a number literal as Python re-serialises it: an integer
// as its value (so "-0" is "0"), anything else as the repr of its float.
func Number(n json.Number) (string, error) {
	s := string(n)
	if IsInt(n) {
		neg := strings.HasPrefix(s, "-")
		digits := strings.TrimLeft(strings.TrimPrefix(s, "-"), "0")
		if digits == "" {
			return "0", nil
		}
		if neg {
			return "-" + digits, nil
		}
		return digits, nil
	}
	f, err := strconv.ParseFloat(s, 64)
	if err != nil && !errors.Is(err, strconv.ErrRange) {
		return "", err
	}
	return Float(f)
}

// Float is Python's repr of a float (json.dumps uses it), refusing NaN and infinities.
func Float(f float64) (string, error) {
	if math.IsNaN(f) || math.IsInf(f, 0) {
		return "", ErrNotJSON
	}
	if f == 0 {
		if math.Signbit(f) {
			return "-0.0", nil
		}
		return "0.0", nil
	}
	// Shortest digits that round-trip, then Python's layout rules (float_repr_style
	// 'short': exponent form when the decimal exponent is < -4 or >= 16).
	e := strconv.FormatFloat(f, 'e', -1, 64) // d.ddde±XX
	mant, expPart, _ := strings.Cut(e, "e")
	exp, _ := strconv.Atoi(expPart)
	neg := strings.HasPrefix(mant, "-")
	mant = strings.TrimPrefix(mant, "-")
	digits := strings.Replace(mant, ".", "", 1)
	sign := ""
	if neg {
		sign = "-"
	}
	if exp < -4 || exp >= 16 {
		m := digits[:1]
		if len(digits) > 1 {
			m += "." + digits[1:]
		}
		es := "+"
		if exp < 0 {
			es = "-"
			exp = -exp
		}
		return fmt.Sprintf("%s%se%s%02d", sign, m, es, exp), nil
	}
	if exp < 0 {
		return sign + "0." + strings.Repeat("0", -exp-1) + digits, nil
	}
	if len(digits) <= exp+1 {
		return sign + digits + strings.Repeat("0", exp+1-len(digits)) + ".0", nil
	}
	return sign + digits[:exp+1] + "." + digits[exp+1:], nil
}
