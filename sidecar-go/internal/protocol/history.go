package protocol

import (
	"context"
	"fmt"
	"log/slog"

	"github.com/joblease/joblease/sidecar-go/internal/etcd"
	"github.com/joblease/joblease/sidecar-go/internal/pyjson"
)

// A job's tenure history (docs/protocol.md, "Tenure history"; joblease.history):
// the claim transaction puts <history>/<generation> (its create revision is
// the token) and deletes the tenures older than the last HistoryLimit; a
// release puts <tenure>/end (a completion writes nothing more: its result
// carries the token, which is how a reader tells the completed tenure); a
// checkpoint puts <tenure>/checkpoints (its version counts them). A refused stale completion
// and a claim revoked while settling its unknown outcome are recorded after
// the fact, guarded by create(tenure) == token.

// Tenure ends a transaction writes (completed, expired and open are read,
// never written).
const (
	EndReleased = "released"
	EndRevoked  = "revoked"
)

// TenureStartValue is records.encode_tenure_start.
func TenureStartValue(owner, claimID string, claimedAt float64) ([]byte, error) {
	return pyjson.Sorted(pyjson.Obj{{Key: "claimId", Value: claimID}, {Key: "claimedAt", Value: claimedAt},
		{Key: "owner", Value: owner}})
}

// TenureEndValue is records.encode_tenure_end.
func TenureEndValue(how string, at float64) ([]byte, error) {
	return pyjson.Sorted(pyjson.Obj{{Key: "at", Value: at}, {Key: "how", Value: how}})
}

// TenureMarkValue is records.encode_tenure_mark (checkpoints, refused).
func TenureMarkValue(at float64) ([]byte, error) {
	return pyjson.Sorted(pyjson.Obj{{Key: "at", Value: at}})
}

// tenure is one claim's tenure: generation gen of keys' history.
type tenure struct {
	keys JobKeys
	gen  int64
}

func (t tenure) key() string         { return t.keys.Tenure(t.gen) }
func (t tenure) endKey() string      { return t.key() + "/end" }
func (t tenure) checkpoints() string { return t.key() + "/checkpoints" }
func (t tenure) refused() string     { return t.key() + "/refused" }

// claimWrites: the tenure and the delete of every tenure older than the last
// limit, from the start of the history (any backlog goes too).
func (t tenure) claimWrites(owner, claimID string, claimedAt float64, limit int64) ([]etcd.Op, error) {
	v, err := TenureStartValue(owner, claimID, claimedAt)
	if err != nil {
		return nil, err
	}
	ops := []etcd.Op{etcd.Put(t.key(), v, 0)}
	if oldestKept := t.gen - limit + 1; oldestKept > 1 {
		ops = append(ops, etcd.DeleteRange(t.keys.History(), t.keys.Tenure(oldestKept)))
	}
	return ops, nil
}

func (t *tenure) endPut(how string) []etcd.Op {
	if t == nil {
		return nil
	}
	v, _ := TenureEndValue(how, now())
	return []etcd.Op{etcd.Put(t.endKey(), v, 0)}
}

func (t *tenure) checkpointPut() []etcd.Op {
	if t == nil {
		return nil
	}
	v, _ := TenureMarkValue(now())
	return []etcd.Op{etcd.Put(t.checkpoints(), v, 0)}
}

// recordEnd puts how after the fact, only if this tenure (token) exists and has no end.
func (t *tenure) recordEnd(ctx context.Context, store *etcd.Store, token int64, how string) {
	if t == nil {
		return
	}
	v, _ := TenureEndValue(how, now())
	t.guarded(ctx, store, token, []etcd.Cmp{etcd.CreateEq(t.endKey(), 0)}, etcd.Put(t.endKey(), v, 0), "end ("+how+")")
}

// recordRefusal counts one stale completion refused under this tenure (token).
func (t *tenure) recordRefusal(ctx context.Context, store *etcd.Store, token int64) {
	if t == nil {
		return
	}
	v, _ := TenureMarkValue(now())
	t.guarded(ctx, store, token, nil, etcd.Put(t.refused(), v, 0), "refused completion")
}

// guarded is best effort and never re-sent after an unknown outcome: a second
// copy of a count would count twice, and a lost record is one missing line.
func (t *tenure) guarded(ctx context.Context, store *etcd.Store, token int64, more []etcd.Cmp, put etcd.Op, what string) {
	cmps := append([]etcd.Cmp{etcd.CreateEq(t.key(), token)}, more...)
	if _, err := store.Txn(ctx, cmps, []etcd.Op{put}, nil); err != nil {
		slog.Info(fmt.Sprintf("tenure %d's %s was not recorded: %v", t.gen, what, err))
	}
}
