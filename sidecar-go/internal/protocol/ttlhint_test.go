package protocol

import (
	"context"
	"sync"
	"testing"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/joblease/joblease/sidecar-go/internal/errs"
	"github.com/joblease/joblease/sidecar-go/internal/etcd"
	"github.com/joblease/joblease/sidecar-go/internal/etcdtest"
)

// With a TTL hint, the first claim grants its lease while it reads the spec;
// a hint that is not the spec's TTL is corrected before the claim. Real etcd;
// the store's calls are recorded at its gRPC boundary, and every Txn answer is
// held back 200 ms on its way (so the spec read is still unanswered while
// anything sent beside it goes out).

type call struct {
	method     string
	start, end time.Time
	grantTTL   int64
	leaseID    int64
}

type recorder struct {
	mu    sync.Mutex
	calls []call
}

func (r *recorder) unary(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn,
	invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	c := call{method: method, start: time.Now()}
	err := invoker(ctx, method, req, reply, cc, opts...)
	if method == etcdtest.Txn {
		time.Sleep(200 * time.Millisecond)
	}
	c.end = time.Now()
	if g, ok := req.(*pb.LeaseGrantRequest); ok {
		c.grantTTL = g.TTL
		c.leaseID = reply.(*pb.LeaseGrantResponse).ID
	}
	r.mu.Lock()
	r.calls = append(r.calls, c)
	r.mu.Unlock()
	return err
}

func (r *recorder) of(method string) []call {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []call
	for _, c := range r.calls {
		if c.method == method {
			out = append(out, c)
		}
	}
	return out
}

func hintedClient(t *testing.T, ep string, hint int64) (*Client, *recorder) {
	rec := &recorder{}
	s, err := etcd.New(etcd.Config{Endpoints: []string{ep}, RequestTimeout: 5 * time.Second, UnaryInterceptor: rec.unary})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	c := NewClient(s, DefaultRoot)
	c.LeaseTTLHint = hint
	return c, rec
}

// leaseTTL is etcd's word on lease id: its granted TTL, and its remaining TTL (-1: gone).
func leaseTTL(t *testing.T, ep string, id int64) (granted, remaining int64) {
	conn, err := grpc.NewClient("passthrough:///"+ep, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	r, err := pb.NewLeaseClient(conn).LeaseTimeToLive(ctx, &pb.LeaseTimeToLiveRequest{ID: id})
	if err != nil {
		t.Fatal(err)
	}
	return r.GrantedTTL, r.TTL
}

func holderLease(t *testing.T, s *etcd.Store, job JobRef) int64 {
	_, kv, err := s.Get(context.Background(), Keys(DefaultRoot, job).Holder())
	if err != nil || kv == nil {
		t.Fatalf("holder: %v %v", kv, err)
	}
	return kv.Lease
}

// waitRevoked waits (10 s at most) until etcd no longer knows lease id.
func waitRevoked(t *testing.T, ep string, id int64) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		if _, remaining := leaseTTL(t, ep, id); remaining == -1 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("the hinted lease was not revoked within 10 s")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestTTLHintGrantsTheLeaseWhileTheSpecIsRead(t *testing.T) {
	ep, _ := startEtcd(t)
	admin := newStore(t, ep)
	job := JobRef{"default", "hinted"}
	register(t, admin, job, 10, 3)
	c, rec := hintedClient(t, ep, 10)
	lease, err := c.Claim(context.Background(), job, "worker-a")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = lease.Release(context.Background()) }()
	grants, txns := rec.of(etcdtest.LeaseGrant), rec.of(etcdtest.Txn)
	if len(grants) != 1 || len(txns) != 2 {
		t.Fatalf("%d grants and %d transactions, want 1 and 2 (spec read, claim)", len(grants), len(txns))
	}
	// the spec read is the first transaction; the grant went out before its answer came
	if !grants[0].start.Before(txns[0].end) {
		t.Fatalf("the grant was sent %v after the spec read was answered", grants[0].start.Sub(txns[0].end))
	}
	if lease.Session().TTL != 10 || holderLease(t, admin, job) != lease.Session().LeaseID {
		t.Fatalf("session TTL %d, lease %x; holder bound to %x", lease.Session().TTL, lease.Session().LeaseID,
			holderLease(t, admin, job))
	}
}

func TestAWrongTTLHintIsCorrectedBeforeTheClaim(t *testing.T) {
	ep, _ := startEtcd(t)
	admin := newStore(t, ep)
	job := JobRef{"default", "mis-hinted"}
	register(t, admin, job, 10, 3)
	c, rec := hintedClient(t, ep, 20)
	lease, err := c.Claim(context.Background(), job, "worker-a")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = lease.Release(context.Background()) }()
	grants := rec.of(etcdtest.LeaseGrant)
	if len(grants) != 2 || grants[0].grantTTL != 20 || grants[1].grantTTL != 10 {
		t.Fatalf("grants %+v, want the hinted 20 s, then the spec's 10 s", grants)
	}
	bound := holderLease(t, admin, job)
	if bound != grants[1].leaseID || bound != lease.Session().LeaseID {
		t.Fatalf("holder bound to lease %x, want the spec's TTL's %x", bound, grants[1].leaseID)
	}
	if granted, _ := leaseTTL(t, ep, bound); granted != 10 {
		t.Fatalf("the holder's lease has TTL %d in etcd, want the spec's 10", granted)
	}
	// the hinted lease is revoked (in the background), not left to expire
	waitRevoked(t, ep, grants[0].leaseID)
}

// A hinted lease granted beside a spec read that found no job is revoked, not
// kept alive while the sidecar waits for the registration.
func TestAHintedLeaseIsRevokedWhenTheJobIsNotRegistered(t *testing.T) {
	ep, _ := startEtcd(t)
	c, rec := hintedClient(t, ep, 10)
	_, err := c.Claim(context.Background(), JobRef{"default", "unregistered"}, "worker-a")
	if !errs.Is(err, errs.KindNotRegistered) {
		t.Fatalf("claim: %v, want not registered", err)
	}
	grants := rec.of(etcdtest.LeaseGrant)
	if len(grants) != 1 {
		t.Fatalf("%d grants, want the hinted one", len(grants))
	}
	waitRevoked(t, ep, grants[0].leaseID)
}
