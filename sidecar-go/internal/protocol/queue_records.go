package protocol

import (
	"fmt"

	"github.com/joblease/joblease/sidecar-go/internal/errs"
	"github.com/joblease/joblease/sidecar-go/internal/pyjson"
)

// The queue records (docs/queues.md, "Key layout"; joblease.records
// QueueSpec, ItemRecord, PendingRecord, FailedRecord), byte for byte as
// Python writes them and read with Python's type checks, as records.go does
// for a job's: tests/vectors/queue_records.json pins both directions.

// QueueSpec is Q/spec: what every claim of the queue's items uses.
type QueueSpec struct {
	LeaseDurationSeconds int64
	MaxAttempts          int64 // 0: unlimited
	Suspend              bool
	Shards               int64 // items "0".."Shards-1" exist from creation
	// Semaphores every item's claim takes slots of (as Spec.Semaphores).
	Semaphores []SemaphoreUse
	// HistoryLimit: tenures kept per item (docs/history.md, "Queue items"); 0:
	// none. Written only when > 0, so a spec without it keeps its bytes.
	HistoryLimit int64
}

// Encode is QueueSpec.encode.
func (q QueueSpec) Encode() ([]byte, error) {
	obj := pyjson.Obj{{Key: "leaseDurationSeconds", Value: q.LeaseDurationSeconds},
		{Key: "maxAttempts", Value: q.MaxAttempts}, {Key: "shards", Value: q.Shards}, {Key: "suspend", Value: q.Suspend}}
	if len(q.Semaphores) > 0 {
		obj = append(obj, pyjson.KV{Key: "semaphores", Value: usesJSON(q.Semaphores)})
	}
	if q.HistoryLimit > 0 {
		obj = append(obj, pyjson.KV{Key: "historyLimit", Value: q.HistoryLimit})
	}
	return pyjson.Sorted(obj)
}

// DecodeQueueSpec is QueueSpec.decode: absent maxAttempts, suspend, shards and historyLimit are 0, false, 0, 0.
func DecodeQueueSpec(data []byte) (QueueSpec, error) {
	obj, err := object("queue", data)
	if err != nil {
		return QueueSpec{}, err
	}
	var q QueueSpec
	if q.LeaseDurationSeconds, err = intField("queue", obj, "leaseDurationSeconds"); err != nil {
		return q, err
	}
	if _, ok := obj["maxAttempts"]; ok {
		if q.MaxAttempts, err = intField("queue", obj, "maxAttempts"); err != nil {
			return q, err
		}
	}
	if v, ok := obj["suspend"]; ok {
		b, isBool := v.(bool)
		if !isBool {
			return q, errs.Corrupt("queue", "TypeError: 'suspend' must be bool")
		}
		q.Suspend = b
	}
	if _, ok := obj["shards"]; ok {
		if q.Shards, err = intField("queue", obj, "shards"); err != nil {
			return q, err
		}
	}
	if _, ok := obj["historyLimit"]; ok {
		if q.HistoryLimit, err = intField("queue", obj, "historyLimit"); err != nil {
			return q, err
		}
	}
	q.Semaphores, err = decodeUses("queue", obj)
	return q, err
}

// jobSpec is the spec a claim of an item uses, as a job's: the attempts of
// the item's current round are counted from attemptsFrom (a retried item
// gets maxAttempts new claims; its generation keeps increasing).
func (q QueueSpec) jobSpec(attemptsFrom int64) Spec {
	s := Spec{LeaseDurationSeconds: q.LeaseDurationSeconds, Semaphores: q.Semaphores, HistoryLimit: q.HistoryLimit}
	if q.MaxAttempts > 0 {
		s.MaxAttempts = attemptsFrom + q.MaxAttempts
	}
	return s
}

// ItemRecord is Q/items/<id>, written once by the enqueue.
type ItemRecord struct {
	Payload    any
	EnqueuedAt float64 // informational wall clock of the enqueuer
	Revision   int64   // create revision: the enqueue's commit
}

// Encode is ItemRecord.encode.
func (i ItemRecord) Encode() ([]byte, error) {
	return pyjson.Sorted(pyjson.Obj{{Key: "enqueuedAt", Value: i.EnqueuedAt}, {Key: "payload", Value: i.Payload}})
}

// DecodeItem is ItemRecord.decode (an absent payload is null).
func DecodeItem(data []byte, revision int64) (ItemRecord, error) {
	obj, err := object("item", data)
	if err != nil {
		return ItemRecord{}, err
	}
	it := ItemRecord{Payload: obj["payload"], Revision: revision}
	if err := withinLimit("item", it.Payload, data, MaxPayloadBytes); err != nil {
		return it, err
	}
	if _, ok := obj["enqueuedAt"]; ok {
		if it.EnqueuedAt, err = floatField("item", obj, "enqueuedAt"); err != nil {
			return it, err
		}
	}
	return it, nil
}

// PendingRecord is Q/pending/<id>: the item is neither completed nor failed.
type PendingRecord struct {
	AttemptsFrom int64   // claims made before this round (0, or the generation at a retry)
	Since        float64 // informational wall clock of the enqueue or retry
}

// Encode is PendingRecord.encode.
func (p PendingRecord) Encode() ([]byte, error) {
	return pyjson.Sorted(pyjson.Obj{{Key: "attemptsFrom", Value: p.AttemptsFrom}, {Key: "since", Value: p.Since}})
}

// DecodePending is PendingRecord.decode (both fields optional).
func DecodePending(data []byte) (PendingRecord, error) {
	obj, err := object("pending", data)
	if err != nil {
		return PendingRecord{}, err
	}
	var p PendingRecord
	if _, ok := obj["attemptsFrom"]; ok {
		if p.AttemptsFrom, err = intField("pending", obj, "attemptsFrom"); err != nil {
			return p, err
		}
	}
	if _, ok := obj["since"]; ok {
		if p.Since, err = floatField("pending", obj, "since"); err != nil {
			return p, err
		}
	}
	return p, nil
}

// FailedRecord is Q/failed/<id>: the item used its round's attempts without a result.
type FailedRecord struct {
	Generation int64
	FailedAt   float64 // informational wall clock of the claimer that marked it
}

// Encode is FailedRecord.encode.
func (f FailedRecord) Encode() ([]byte, error) {
	return pyjson.Sorted(pyjson.Obj{{Key: "failedAt", Value: f.FailedAt}, {Key: "generation", Value: f.Generation}})
}

// DecodeFailed is FailedRecord.decode.
func DecodeFailed(data []byte) (FailedRecord, error) {
	obj, err := object("failed", data)
	if err != nil {
		return FailedRecord{}, err
	}
	var f FailedRecord
	if f.Generation, err = intField("failed", obj, "generation"); err != nil {
		return f, err
	}
	if _, ok := obj["failedAt"]; ok {
		if f.FailedAt, err = floatField("failed", obj, "failedAt"); err != nil {
			return f, err
		}
	}
	return f, nil
}

// payloadBytes is an item payload's canonical encoding, refused as bad input
// when it is not one a queue may hold (docs/queues.md: a stored value of at most 64 KiB).
func payloadBytes(payload any, id string) ([]byte, error) {
	return JSONPayload(payload, fmt.Sprintf("payload of item %s", errs.PyRepr(id)), MaxPayloadBytes)
}
