package etcdtest

import (
	"context"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/joblease/joblease/sidecar-go/internal/etcd"
)

// gRPC method names the faults are keyed by.
const (
	Txn        = "/etcdserverpb.KV/Txn"
	LeaseGrant = "/etcdserverpb.Lease/LeaseGrant"
	KeepAlive  = "/etcdserverpb.Lease/LeaseKeepAlive"
)

// Faults sits at a store's gRPC client boundary, in front of a real etcd, and
// changes what the store sees of etcd's answers: an answer delayed on its way
// back (etcd latency), an answer lost after etcd applied the request (a
// connection dropped at the worst moment), a stream open that never finishes
// (a half-open connection). The requests themselves always reach the real
// etcd unchanged, so what etcd decides is real; only the news of it is late
// or missing. Safe for concurrent use; faults can change while the store runs.
type Faults struct {
	mu         sync.Mutex
	delay      map[string]time.Duration
	loseNext   map[string]int
	hangOpen   map[string]bool
	lostAnswer map[string]int
	drop       map[string]func(req any) bool
}

// NewFaultyStore is a client of ep whose answers f can delay or lose, closed
// when the test ends.
func NewFaultyStore(t testing.TB, ep string) (*etcd.Store, *Faults) {
	f := &Faults{delay: map[string]time.Duration{}, loseNext: map[string]int{}, hangOpen: map[string]bool{},
		lostAnswer: map[string]int{}, drop: map[string]func(any) bool{}}
	s, err := etcd.New(etcd.Config{Endpoints: []string{ep}, RequestTimeout: 2 * time.Second,
		UnaryInterceptor: f.unary, StreamInterceptor: f.stream})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return s, f
}

// Delay holds every answer of method (each message, for a stream) for d
// after etcd sent it; 0 ends the delay.
func (f *Faults) Delay(method string, d time.Duration) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.delay[method] = d
}

// LoseNextAnswers: the next n calls of method reach etcd and are applied, but
// their answers are lost (the store sees a reset connection).
func (f *Faults) LoseNextAnswers(method string, n int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.loseNext[method] = n
}

// LostAnswers is how many answers of method were lost so far.
func (f *Faults) LostAnswers(method string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.lostAnswer[method]
}

// DropRequests: every later call of method whose request drop says true
// never reaches etcd, and the caller sees a reset connection (a request lost
// on its way: nothing applied); nil ends it.
func (f *Faults) DropRequests(method string, drop func(req any) bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.drop[method] = drop
}

// HangOpen makes opening a stream of method wait until the caller gives up
// (its context ends), as on a connection that accepts and never answers.
func (f *Faults) HangOpen(method string, hang bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.hangOpen[method] = hang
}

func (f *Faults) delayOf(method string) time.Duration {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.delay[method]
}

func (f *Faults) unary(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn,
	invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	f.mu.Lock()
	drop := f.drop[method]
	f.mu.Unlock()
	if drop != nil && drop(req) {
		return status.Error(codes.Unavailable, "connection reset by peer (request dropped by etcdtest.Faults)")
	}
	err := invoker(ctx, method, req, reply, cc, opts...)
	f.mu.Lock()
	lose := f.loseNext[method] > 0
	if lose {
		f.loseNext[method]--
		f.lostAnswer[method]++
	}
	f.mu.Unlock()
	if lose {
		return status.Error(codes.Unavailable, "connection reset by peer (answer lost by etcdtest.Faults)")
	}
	if err := wait(ctx, f.delayOf(method)); err != nil {
		return err
	}
	return err
}

func (f *Faults) stream(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string,
	streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
	f.mu.Lock()
	hang := f.hangOpen[method]
	f.mu.Unlock()
	if hang {
		<-ctx.Done()
		return nil, status.FromContextError(ctx.Err()).Err()
	}
	cs, err := streamer(ctx, desc, cc, method, opts...)
	if err != nil {
		return nil, err
	}
	return &delayedStream{ClientStream: cs, f: f, method: method, ctx: ctx}, nil
}

type delayedStream struct {
	grpc.ClientStream
	f      *Faults
	method string
	ctx    context.Context
}

func (d *delayedStream) RecvMsg(m any) error {
	if err := d.ClientStream.RecvMsg(m); err != nil {
		return err
	}
	return wait(d.ctx, d.f.delayOf(d.method))
}

// wait for d unless ctx ends first (then the error a real late answer gives).
func wait(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return status.FromContextError(ctx.Err()).Err()
	}
}
