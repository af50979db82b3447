package pyjson

import "fmt"

// MaxDepth is the deepest nesting a stored value (a result, a checkpoint's
// data, a registration's parameters) may have: a scalar is depth 0, each
// array or object around it adds one. It is validation.MAX_JSON_DEPTH of the
// Python side (docs/protocol.md, "Stored values"): far under what Python's
// json.loads can read (about 1000) and Go's encoding/json (10000), so every
// reader decodes whatever a writer may store.
const MaxDepth = 64

// RuleError says why JSON text breaks the stored-value rule (too deep, or a
// lone UTF-16 surrogate) although it may be valid JSON syntax.
type RuleError struct{ Msg string }

func (e *RuleError) Error() string { return e.Msg }

// Check refuses JSON text that no joblease writer may store, before it is
// decoded: nesting deeper than maxDepth (brackets inside strings do not
// count), or a lone UTF-16 surrogate in a string, escaped (`\ud800` not
// followed by a low `\udc00`..`\udfff`, or a low one without a high one
// before it) or raw (the UTF-8 bytes ED A0..BF xx). encoding/json would read
// an escaped lone surrogate as U+FFFD without a word and Python keeps it as a
// code point that cannot be written as UTF-8, so the two sides could
// disagree on the value: it is refused on both. A valid pair
// (`\ud83d\ude80`) is one character and fine. Syntax errors are left to the
// decoder.
func Check(data []byte, maxDepth int) error { return check(data, maxDepth, false) }

// check is Check; with outer, the text is one object around the values the
// rule is about (a record, a request body), and a depth error says so in the
// values' terms (maxDepth-1 levels inside it).
func check(data []byte, maxDepth int, outer bool) error {
	depth := 0
	for i := 0; i < len(data); i++ {
		c := data[i]
		switch {
		case c == '[' || c == '{':
			depth++
			if depth > maxDepth {
				if outer {
					return &RuleError{fmt.Sprintf("a value in it is nested deeper than %d levels of arrays and objects", maxDepth-1)}
				}
				return &RuleError{fmt.Sprintf("nested deeper than %d levels of arrays and objects", maxDepth)}
			}
		case c == ']' || c == '}':
			depth--
		case c == '"':
			end, err := checkString(data, i+1)
			if err != nil {
				return err
			}
			i = end
		}
	}
	return nil
}

// checkString scans a string token from just after its opening quote and
// returns the index of its closing quote (or the end of data).
func checkString(data []byte, i int) (int, error) {
	for ; i < len(data); i++ {
		switch c := data[i]; {
		case c == '"':
			return i, nil
		case c == 0xed && i+1 < len(data) && data[i+1] >= 0xa0 && data[i+1] <= 0xbf:
			return 0, loneRaw(i)
		case c == '\\' && i+1 < len(data):
			if data[i+1] != 'u' {
				i++ // a one-character escape
				continue
			}
			u, ok := hex4(data, i+2)
			if !ok {
				i++ // malformed: the decoder says so
				continue
			}
			switch {
			case u >= 0xd800 && u <= 0xdbff:
				if lowAt(data, i+6) {
					i += 11 // the pair, both escapes
					continue
				}
				return 0, loneEscaped(u, i)
			case u >= 0xdc00 && u <= 0xdfff:
				return 0, loneEscaped(u, i)
			}
			i += 5
		}
	}
	return i, nil
}

// lowAt says whether a low-surrogate escape starts at data[i].
func lowAt(data []byte, i int) bool {
	if i+1 >= len(data) || data[i] != '\\' || data[i+1] != 'u' {
		return false
	}
	u, ok := hex4(data, i+2)
	return ok && u >= 0xdc00 && u <= 0xdfff
}

func hex4(data []byte, i int) (rune, bool) {
	if i+4 > len(data) {
		return 0, false
	}
	var u rune
	for _, c := range data[i : i+4] {
		switch {
		case c >= '0' && c <= '9':
			u = u<<4 | rune(c-'0')
		case c >= 'a' && c <= 'f':
			u = u<<4 | rune(c-'a'+10)
		case c >= 'A' && c <= 'F':
			u = u<<4 | rune(c-'A'+10)
		default:
			return 0, false
		}
	}
	return u, true
}

func loneEscaped(u rune, at int) error {
	return &RuleError{fmt.Sprintf("a string holds a lone UTF-16 surrogate (\\u%04x at byte %d)", u, at)}
}

func loneRaw(at int) error {
	return &RuleError{fmt.Sprintf("a string holds a lone UTF-16 surrogate (raw UTF-8 bytes at byte %d)", at)}
}
