package protocol

import (
	"encoding/json"
	"errors"
	"fmt"
	"strconv"

	"github.com/joblease/joblease/sidecar-go/internal/errs"
	"github.com/joblease/joblease/sidecar-go/internal/pyjson"
)

// The stored records (joblease.records), encoded byte for byte as Python
// encodes them and decoded with Python's type checks: a bool is never an
// int, a timestamp may be an int or a float, a record that is not a JSON
// object (or lacks a required field) is corrupt.

// Spec is the registration the operator writes.
type Spec struct {
	LeaseDurationSeconds int64
	MaxAttempts          int64 // 0: unlimited
	Parameters           map[string]any
	// Semaphores every claim takes slots of, in the claim's transaction
	// (docs/semaphores.md); written only when there are some, so a spec
	// without them has the bytes it always had.
	Semaphores []SemaphoreUse
	// HistoryLimit: tenures kept in the job's history (docs/protocol.md,
	// "Tenure history"); 0: none is written. Written only when > 0.
	HistoryLimit int64
}

// EncodeSpec is JobSpec.encode.
func EncodeSpec(s Spec) ([]byte, error) {
	params := s.Parameters
	if params == nil {
		params = map[string]any{}
	}
	obj := pyjson.Obj{{Key: "leaseDurationSeconds", Value: s.LeaseDurationSeconds},
		{Key: "maxAttempts", Value: s.MaxAttempts}, {Key: "parameters", Value: params}}
	if len(s.Semaphores) > 0 {
		obj = append(obj, pyjson.KV{Key: "semaphores", Value: usesJSON(s.Semaphores)})
	}
	if s.HistoryLimit > 0 {
		obj = append(obj, pyjson.KV{Key: "historyLimit", Value: s.HistoryLimit})
	}
	return pyjson.Sorted(obj)
}

// DecodeSpec is JobSpec.decode (a missing maxAttempts means unlimited).
func DecodeSpec(data []byte) (Spec, error) {
	obj, err := object("spec", data)
	if err != nil {
		return Spec{}, err
	}
	ttl, err := intField("spec", obj, "leaseDurationSeconds")
	if err != nil {
		return Spec{}, err
	}
	var max int64
	if _, ok := obj["maxAttempts"]; ok {
		if max, err = intField("spec", obj, "maxAttempts"); err != nil {
			return Spec{}, err
		}
	}
	params := map[string]any{}
	if p, ok := obj["parameters"]; ok && truthy(p) {
		m, ok := p.(map[string]any)
		if !ok {
			return Spec{}, errs.Corrupt("spec", "TypeError: 'parameters' must be an object")
		}
		params = m
	}
	semaphores, err := decodeUses("spec", obj)
	if err != nil {
		return Spec{}, err
	}
	var historyLimit int64
	if _, ok := obj["historyLimit"]; ok {
		if historyLimit, err = intField("spec", obj, "historyLimit"); err != nil {
			return Spec{}, err
		}
	}
	return Spec{LeaseDurationSeconds: ttl, MaxAttempts: max, Parameters: params,
		Semaphores: semaphores, HistoryLimit: historyLimit}, nil
}

// HolderValue is Holder.encode_value: the holder key's value.
func HolderValue(owner, claimID string, ttl int64, claimedAt float64) ([]byte, error) {
	return pyjson.Sorted(pyjson.Obj{{Key: "owner", Value: owner}, {Key: "claimId", Value: claimID},
		{Key: "ttl", Value: ttl}, {Key: "claimedAt", Value: claimedAt}})
}

// HolderInfo is what a stored holder value names.
type HolderInfo struct {
	Owner, ClaimID string
	TTL            int64
	ClaimedAt      float64
}

// DecodeHolder is Holder.decode_value: owner and claimId must be strings.
func DecodeHolder(data []byte) (HolderInfo, error) {
	obj, err := object("holder", data)
	if err != nil {
		return HolderInfo{}, err
	}
	var h HolderInfo
	if h.Owner, err = strField("holder", obj, "owner"); err != nil {
		return h, err
	}
	if h.ClaimID, err = strField("holder", obj, "claimId"); err != nil {
		return h, err
	}
	if _, ok := obj["claimedAt"]; ok {
		if h.ClaimedAt, err = floatField("holder", obj, "claimedAt"); err != nil {
			return h, err
		}
	}
	if n, ok := obj["ttl"].(json.Number); ok && pyjson.IsInt(n) {
		h.TTL, _ = strconv.ParseInt(string(n), 10, 64)
	}
	return h, nil
}

// ClaimsValue is the claims key's value: {"owner","claimId"} in that order
// (the claim writes it with json.dumps without sort_keys).
func ClaimsValue(owner, claimID string) ([]byte, error) {
	return pyjson.Compact(pyjson.Obj{{Key: "owner", Value: owner}, {Key: "claimId", Value: claimID}})
}

// ClaimIDOf is the claim id in a claims value, or "" if it is not one we wrote.
func ClaimIDOf(data []byte) string {
	obj, err := pyjson.DecodeObject(data)
	if err != nil {
		return ""
	}
	id, _ := obj["claimId"].(string)
	return id
}

// Result is the accepted completion (ResultRecord).
type Result struct {
	Owner, ClaimID    string
	Token, Generation int64
	Result            any
	CompletedAt       float64
	Revision          int64
}

// Encode is ResultRecord.encode.
func (r Result) Encode() ([]byte, error) {
	return pyjson.Sorted(pyjson.Obj{{Key: "owner", Value: r.Owner}, {Key: "claimId", Value: r.ClaimID},
		{Key: "token", Value: r.Token}, {Key: "generation", Value: r.Generation}, {Key: "result", Value: r.Result},
		{Key: "completedAt", Value: r.CompletedAt}})
}

// Dict is ResultRecord.to_dict.
func (r Result) Dict() pyjson.Obj {
	return pyjson.Obj{{Key: "owner", Value: r.Owner}, {Key: "claimId", Value: r.ClaimID}, {Key: "token", Value: r.Token},
		{Key: "generation", Value: r.Generation}, {Key: "result", Value: r.Result},
		{Key: "completedAt", Value: r.CompletedAt}, {Key: "revision", Value: r.Revision}}
}

// DecodeResult is ResultRecord.decode.
func DecodeResult(data []byte, revision int64) (Result, error) {
	obj, err := object("result", data)
	if err != nil {
		return Result{}, err
	}
	r := Result{Revision: revision, Result: obj["result"]}
	if err := withinLimit("result", r.Result, data, MaxResultBytes); err != nil {
		return r, err
	}
	if r.Owner, err = strField("result", obj, "owner"); err != nil {
		return r, err
	}
	if r.ClaimID, err = strField("result", obj, "claimId"); err != nil {
		return r, err
	}
	if r.Token, err = intField("result", obj, "token"); err != nil {
		return r, err
	}
	if r.Generation, err = intField("result", obj, "generation"); err != nil {
		return r, err
	}
	if _, ok := obj["completedAt"]; ok {
		if r.CompletedAt, err = floatField("result", obj, "completedAt"); err != nil {
			return r, err
		}
	}
	return r, nil
}

// Checkpoint is the last progress checkpoint (CheckpointRecord).
type Checkpoint struct {
	Owner, ClaimID    string
	Token, Generation int64
	Data              any
	CheckpointedAt    float64
	Revision          int64
}

// Encode is CheckpointRecord.encode.
func (c Checkpoint) Encode() ([]byte, error) {
	return pyjson.Sorted(pyjson.Obj{{Key: "owner", Value: c.Owner}, {Key: "claimId", Value: c.ClaimID},
		{Key: "token", Value: c.Token}, {Key: "generation", Value: c.Generation}, {Key: "data", Value: c.Data},
		{Key: "checkpointedAt", Value: c.CheckpointedAt}})
}

// Dict is CheckpointRecord.to_dict.
func (c Checkpoint) Dict() pyjson.Obj {
	return pyjson.Obj{{Key: "owner", Value: c.Owner}, {Key: "claimId", Value: c.ClaimID}, {Key: "token", Value: c.Token},
		{Key: "generation", Value: c.Generation}, {Key: "data", Value: c.Data},
		{Key: "checkpointedAt", Value: c.CheckpointedAt}, {Key: "revision", Value: c.Revision}}
}

// DecodeCheckpoint is CheckpointRecord.decode.
func DecodeCheckpoint(data []byte, revision int64) (Checkpoint, error) {
	obj, err := object("checkpoint", data)
	if err != nil {
		return Checkpoint{}, err
	}
	c := Checkpoint{Revision: revision, Data: obj["data"]}
	if err := withinLimit("checkpoint", c.Data, data, MaxCheckpointBytes); err != nil {
		return c, err
	}
	if c.Owner, err = strField("checkpoint", obj, "owner"); err != nil {
		return c, err
	}
	if c.ClaimID, err = strField("checkpoint", obj, "claimId"); err != nil {
		return c, err
	}
	if c.Token, err = intField("checkpoint", obj, "token"); err != nil {
		return c, err
	}
	if c.Generation, err = intField("checkpoint", obj, "generation"); err != nil {
		return c, err
	}
	if _, ok := obj["checkpointedAt"]; ok {
		if c.CheckpointedAt, err = floatField("checkpoint", obj, "checkpointedAt"); err != nil {
			return c, err
		}
	}
	return c, nil
}

// JSONPayload is validation.json_payload: compact sorted JSON within limit,
// nested at most pyjson.MaxDepth deep, without lone surrogates
// (docs/protocol.md, "Stored values").
func JSONPayload(v any, what string, limit int) ([]byte, error) {
	data, err := pyjson.Sorted(v)
	if err != nil {
		return nil, errs.Invalid(fmt.Sprintf("invalid %s: not JSON-serializable (%s)", what, err))
	}
	if err := pyjson.Check(data, pyjson.MaxDepth); err != nil {
		return nil, errs.Invalid(fmt.Sprintf("invalid %s: %s", what, err))
	}
	if len(data) > limit {
		return nil, errs.Invalid(fmt.Sprintf("%s too large: %d bytes of JSON, the limit is %d bytes", what, len(data), limit))
	}
	return data, nil
}

func object(record string, data []byte) (map[string]any, error) {
	obj, err := pyjson.DecodeObject(data)
	if err != nil {
		if _, ok := err.(*json.SyntaxError); ok {
			return nil, errs.Corrupt(record, "JSONDecodeError: "+err.Error())
		}
		var rule *pyjson.RuleError
		if errors.As(err, &rule) {
			return nil, errs.Corrupt(record, "ValueError: "+rule.Msg)
		}
		return nil, errs.Corrupt(record, "TypeError: "+err.Error())
	}
	return obj, nil
}

// withinLimit refuses a stored result or checkpoint whose value's canonical
// encoding is over limit: no writer may have stored it. Escaping at most
// sextuples a byte (a raw control character becomes \u0001), so only a
// record over a sixth of the limit is re-encoded.
func withinLimit(record string, v any, data []byte, limit int) error {
	if 6*len(data) <= limit {
		return nil
	}
	b, err := pyjson.Sorted(v)
	if err != nil {
		return errs.Corrupt(record, "ValueError: "+err.Error())
	}
	if len(b) > limit {
		return errs.Corrupt(record, fmt.Sprintf("ValueError: %s is %d bytes of JSON, the limit is %d bytes", record, len(b), limit))
	}
	return nil
}

func missing(record, key string) error { return errs.Corrupt(record, "KeyError: '"+key+"'") }

func strField(record string, obj map[string]any, key string) (string, error) {
	v, ok := obj[key]
	if !ok {
		return "", missing(record, key)
	}
	s, ok := v.(string)
	if !ok {
		return "", errs.Corrupt(record, fmt.Sprintf("TypeError: '%s' must be str", key))
	}
	return s, nil
}

func intField(record string, obj map[string]any, key string) (int64, error) {
	v, ok := obj[key]
	if !ok {
		return 0, missing(record, key)
	}
	n, ok := v.(json.Number)
	if !ok || !pyjson.IsInt(n) {
		return 0, errs.Corrupt(record, fmt.Sprintf("TypeError: '%s' must be int", key))
	}
	i, err := strconv.ParseInt(string(n), 10, 64)
	if err != nil {
		return 0, errs.Corrupt(record, fmt.Sprintf("ValueError: '%s' out of range", key))
	}
	return i, nil
}

func floatField(record string, obj map[string]any, key string) (float64, error) {
	v, ok := obj[key]
	if !ok {
		return 0, missing(record, key)
	}
	n, ok := v.(json.Number)
	if !ok {
		return 0, errs.Corrupt(record, fmt.Sprintf("TypeError: '%s' must be int or float", key))
	}
	f, err := strconv.ParseFloat(string(n), 64)
	if err != nil {
		return 0, errs.Corrupt(record, fmt.Sprintf("ValueError: '%s' out of range", key))
	}
	return f, nil
}

// truthy is Python's truth of a decoded JSON value (for `obj.get(k) or {}`).
func truthy(v any) bool {
	switch x := v.(type) {
	case nil:
		return false
	case bool:
		return x
	case string:
		return x != ""
	case json.Number:
		f, _ := strconv.ParseFloat(string(x), 64)
		return f != 0
	case []any:
		return len(x) > 0
	case map[string]any:
		return len(x) > 0
	}
	return true
}

// Claims is what a claims value names: the last claimer. A field of the
// wrong type reads as nil (unknown owner; not a claim of ours), never as
// corruption; a value that is not a JSON object is corrupt.
type Claims struct{ Owner, ClaimID any }

// DecodeClaims reads a claims value.
func DecodeClaims(data []byte) (Claims, error) {
	obj, err := object("claims", data)
	if err != nil {
		return Claims{}, err
	}
	var c Claims
	if s, ok := obj["owner"].(string); ok {
		c.Owner = s
	}
	if s, ok := obj["claimId"].(string); ok {
		c.ClaimID = s
	}
	return c, nil
}
