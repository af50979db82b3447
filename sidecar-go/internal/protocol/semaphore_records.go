package protocol

import (
	"github.com/joblease/joblease/sidecar-go/internal/errs"
	"github.com/joblease/joblease/sidecar-go/internal/pyjson"
)

// The semaphore records (docs/semaphores.md, "Key layout"; joblease.records
// SemaphoreUse, SemaphoreSpec, SlotRecord, WaiterRecord), byte for byte as
// Python writes them and read with Python's type checks:
// tests/vectors/semaphore_records.json pins both directions.

// SemaphoreUse is a claim's need: Weight slots of the semaphore Name (same namespace).
type SemaphoreUse struct {
	Name   string
	Weight int64
}

func usesJSON(uses []SemaphoreUse) []any {
	out := make([]any, 0, len(uses))
	for _, u := range uses {
		out = append(out, pyjson.Obj{{Key: "name", Value: u.Name}, {Key: "weight", Value: u.Weight}})
	}
	return out
}

// decodeUses is records._uses: absent, null or empty names none; a weight
// defaults to 1; a use that is not an object, a name that is not a string or
// a weight that is not an int (a bool is not) makes the record corrupt.
func decodeUses(record string, obj map[string]any) ([]SemaphoreUse, error) {
	u, ok := obj["semaphores"]
	if !ok || !truthy(u) {
		return nil, nil
	}
	list, ok := u.([]any)
	if !ok {
		return nil, errs.Corrupt(record, "TypeError: 'semaphores' must be a list")
	}
	out := make([]SemaphoreUse, 0, len(list))
	for _, item := range list {
		m, ok := item.(map[string]any)
		if !ok {
			return nil, errs.Corrupt(record, "TypeError: a semaphore use must be an object")
		}
		use := SemaphoreUse{Weight: 1}
		var err error
		if use.Name, err = strField(record, m, "name"); err != nil {
			return nil, err
		}
		if _, ok := m["weight"]; ok {
			if use.Weight, err = intField(record, m, "weight"); err != nil {
				return nil, err
			}
		}
		out = append(out, use)
	}
	return out, nil
}

// SemaphoreSpec is S/spec: how many slots may be live at once.
type SemaphoreSpec struct{ Limit int64 }

// Encode is SemaphoreSpec.encode.
func (s SemaphoreSpec) Encode() ([]byte, error) {
	return pyjson.Sorted(pyjson.Obj{{Key: "limit", Value: s.Limit}})
}

// DecodeSemaphoreSpec is SemaphoreSpec.decode.
func DecodeSemaphoreSpec(data []byte) (SemaphoreSpec, error) {
	obj, err := object("semaphore", data)
	if err != nil {
		return SemaphoreSpec{}, err
	}
	limit, err := intField("semaphore", obj, "limit")
	return SemaphoreSpec{Limit: limit}, err
}

// SlotRecord is S/slots/<index>: one slot, granted in a claim's transaction
// and bound to its etcd lease; its create revision is the slot's token.
type SlotRecord struct{ Holder, Owner, ClaimID string }

// Encode is SlotRecord.encode.
func (s SlotRecord) Encode() ([]byte, error) {
	return pyjson.Sorted(pyjson.Obj{{Key: "claimId", Value: s.ClaimID}, {Key: "holder", Value: s.Holder},
		{Key: "owner", Value: s.Owner}})
}

// DecodeSlot is SlotRecord.decode.
func DecodeSlot(data []byte) (SlotRecord, error) {
	obj, err := object("slot", data)
	if err != nil {
		return SlotRecord{}, err
	}
	var s SlotRecord
	if s.Holder, err = strField("slot", obj, "holder"); err != nil {
		return s, err
	}
	if s.Owner, err = strField("slot", obj, "owner"); err != nil {
		return s, err
	}
	s.ClaimID, err = strField("slot", obj, "claimId")
	return s, err
}

// WaiterRecord is S/waiters/<ticket>: a claim waiting for slots, bound to the
// waiter's etcd lease; its create revision is its place in line.
type WaiterRecord struct {
	Holder, Owner string
	Weight        int64
}

// Encode is WaiterRecord.encode.
func (w WaiterRecord) Encode() ([]byte, error) {
	return pyjson.Sorted(pyjson.Obj{{Key: "holder", Value: w.Holder}, {Key: "owner", Value: w.Owner},
		{Key: "weight", Value: w.Weight}})
}

// DecodeWaiter is WaiterRecord.decode.
func DecodeWaiter(data []byte) (WaiterRecord, error) {
	obj, err := object("waiter", data)
	if err != nil {
		return WaiterRecord{}, err
	}
	var w WaiterRecord
	if w.Holder, err = strField("waiter", obj, "holder"); err != nil {
		return w, err
	}
	if w.Owner, err = strField("waiter", obj, "owner"); err != nil {
		return w, err
	}
	w.Weight, err = intField("waiter", obj, "weight")
	return w, err
}
