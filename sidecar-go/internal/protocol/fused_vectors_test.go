package protocol

import (
	"encoding/json"
	"fmt"
	"testing"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"

	"github.com/joblease/joblease/sidecar-go/internal/etcd"
)

// The fused completion's request (FusedRequest, sent by CompleteAndClaimNext)
// against the shared vector tests/vectors/fused.json, which the Python side's
// tests/vectors/test_fused_vectors.py checks joblease.queue's request against.

type fusedCase struct {
	Name  string `json:"name"`
	Given struct {
		Root, Namespace, Queue, Held, Next                             string
		HeldHolderValue, ResultValue, NextHolderValue, NextClaimsValue string
		Token, SpecRevision, PendingRevision, MaxAttempts, LeaseID     json.Number
	} `json:"given"`
	Request any `json:"request"`
}

func describeCmp(c *pb.Compare) string {
	target := map[pb.Compare_CompareTarget]string{pb.Compare_CREATE: "create", pb.Compare_MOD: "mod",
		pb.Compare_VERSION: "version", pb.Compare_VALUE: "value"}[c.Target]
	op := map[pb.Compare_CompareResult]string{pb.Compare_EQUAL: "==", pb.Compare_LESS: "<", pb.Compare_GREATER: ">",
		pb.Compare_NOT_EQUAL: "!="}[c.Result]
	var value any
	switch u := c.TargetUnion.(type) {
	case *pb.Compare_CreateRevision:
		value = u.CreateRevision
	case *pb.Compare_ModRevision:
		value = u.ModRevision
	case *pb.Compare_Version:
		value = u.Version
	case *pb.Compare_Value:
		value = string(u.Value)
	}
	if len(c.RangeEnd) > 0 {
		return "range compares are not in the vectors"
	}
	return fmt.Sprintf("%s(%s) %s %v", target, c.Key, op, value)
}

func describeOps(ops []*pb.RequestOp) []any {
	out := []any{}
	for _, op := range ops {
		switch r := op.Request.(type) {
		case *pb.RequestOp_RequestPut:
			out = append(out, fmt.Sprintf("put %s %s lease=%d", r.RequestPut.Key, r.RequestPut.Value, r.RequestPut.Lease))
		case *pb.RequestOp_RequestRange:
			rr := r.RequestRange
			if len(rr.RangeEnd) > 0 || rr.Limit != 0 || rr.KeysOnly || rr.CountOnly {
				out = append(out, "range reads are not in the vectors")
				continue
			}
			out = append(out, fmt.Sprintf("get %s", rr.Key))
		case *pb.RequestOp_RequestDeleteRange:
			if len(r.RequestDeleteRange.RangeEnd) > 0 {
				out = append(out, "range deletes are not in the vectors")
				continue
			}
			out = append(out, fmt.Sprintf("delete %s", r.RequestDeleteRange.Key))
		case *pb.RequestOp_RequestTxn:
			out = append(out, describeTxn(r.RequestTxn.Compare, r.RequestTxn.Success, r.RequestTxn.Failure))
		}
	}
	return out
}

func describeTxn(cmps []*pb.Compare, success, failure []*pb.RequestOp) map[string]any {
	described := []any{}
	for _, c := range cmps {
		described = append(described, describeCmp(c))
	}
	return map[string]any{"compare": described, "success": describeOps(success), "failure": describeOps(failure)}
}

func TestTheFusedRequestIsTheVectors(t *testing.T) {
	var file struct {
		Cases []fusedCase `json:"cases"`
	}
	load(t, "fused.json", &file)
	if len(file.Cases) == 0 {
		t.Fatal("no cases")
	}
	n := func(v json.Number) int64 {
		i, err := v.Int64()
		if err != nil {
			t.Fatal(err)
		}
		return i
	}
	for _, c := range file.Cases {
		g := c.Given
		q := QueueKeysOf(g.Root, QueueRef{g.Namespace, g.Queue})
		held := &Lease{keys: q.Item(g.Held), Token: n(g.Token), holderValue: []byte(g.HeldHolderValue)}
		cmps, success, failure := FusedRequest(held.keys, held.ours(), []byte(g.ResultValue), FusedClaim{
			Keys: q.Item(g.Next), SpecRev: n(g.SpecRevision), PendingRev: n(g.PendingRevision),
			MaxAttempts: n(g.MaxAttempts), LeaseID: n(g.LeaseID), HolderValue: []byte(g.NextHolderValue),
			ClaimsValue: []byte(g.NextClaimsValue)})
		got, _ := json.Marshal(describeTxn(cmps, etcd.RequestOps(success), etcd.RequestOps(failure)))
		want, _ := json.Marshal(c.Request)
		if string(got) != string(want) {
			t.Errorf("%s:\n got %s\nwant %s", c.Name, got, want)
		}
	}
}
