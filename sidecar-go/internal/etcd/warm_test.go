package etcd_test

import (
	"context"
	"sync"
	"testing"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/joblease/joblease/sidecar-go/internal/etcd"
	"github.com/joblease/joblease/sidecar-go/internal/etcdtest"
)

// enableAuth turns etcd's auth on with user root (as joblease.tenancy.enable_auth).
func enableAuth(t *testing.T, ep, password string) {
	conn, err := grpc.NewClient("passthrough:///"+ep, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	a := pb.NewAuthClient(conn)
	steps := []func() error{
		func() error { _, err := a.RoleAdd(ctx, &pb.AuthRoleAddRequest{Name: "root"}); return err },
		func() error {
			_, err := a.UserAdd(ctx, &pb.AuthUserAddRequest{Name: "root", Password: password})
			return err
		},
		func() error {
			_, err := a.UserGrantRole(ctx, &pb.AuthUserGrantRoleRequest{User: "root", Role: "root"})
			return err
		},
		func() error { _, err := a.AuthEnable(ctx, &pb.AuthEnableRequest{}); return err },
	}
	for _, step := range steps {
		if err := step(); err != nil {
			t.Fatal(err)
		}
	}
}

// countingCalls is a unary interceptor that records every method called
// through it, and how many times one was called so far.
func countingCalls() (grpc.UnaryClientInterceptor, func(method string) int) {
	var mu sync.Mutex
	calls := map[string]int{}
	record := func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn,
		invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		err := invoker(ctx, method, req, reply, cc, opts...)
		mu.Lock()
		calls[method]++
		mu.Unlock()
		return err
	}
	return record, func(method string) int {
		mu.Lock()
		defer mu.Unlock()
		return calls[method]
	}
}

// Warm connects and authenticates before any request, and the first request
// uses that token: one Authenticate in all.
func TestWarmAuthenticatesBeforeTheFirstRequest(t *testing.T) {
	ep, _ := etcdtest.Start(t)
	enableAuth(t, ep, "pw")
	record, count := countingCalls()
	s, err := etcd.New(etcd.Config{Endpoints: []string{ep}, Username: "root", Password: "pw",
		RequestTimeout: 5 * time.Second, UnaryInterceptor: record})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	s.Warm()
	const authenticate = "/etcdserverpb.Auth/Authenticate"
	deadline := time.Now().Add(10 * time.Second)
	for count(authenticate) == 0 {
		if time.Now().After(deadline) {
			t.Fatal("Warm did not authenticate within 10 s")
		}
		time.Sleep(5 * time.Millisecond)
	}
	if _, _, err := s.Get(context.Background(), "/probe"); err != nil {
		t.Fatal(err)
	}
	if n := count(authenticate); n != 1 {
		t.Fatalf("%d Authenticate calls, want 1 (the first request uses Warm's token)", n)
	}
}

// A wrong password is one refusal, Warm or not: Warm's early Authenticate is
// refused too, but only the first request's refusal reaches the refusal hook
// (the sidecar's joblease_sidecar_auth_failures counter).
func TestWarmsRefusedAuthenticationIsCountedOnce(t *testing.T) {
	ep, _ := etcdtest.Start(t)
	enableAuth(t, ep, "pw")
	record, count := countingCalls()
	var mu sync.Mutex
	s, err := etcd.New(etcd.Config{Endpoints: []string{ep}, Username: "root", Password: "wrong",
		RequestTimeout: 5 * time.Second, UnaryInterceptor: record})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	counted := 0
	s.SetRefusalHook(func() { mu.Lock(); counted++; mu.Unlock() })
	s.Warm()
	if _, _, err := s.Get(context.Background(), "/probe"); err == nil {
		t.Fatal("a wrong password was accepted")
	}
	// Warm's Authenticate may run before or after the request's: wait for both.
	deadline := time.Now().Add(10 * time.Second)
	for {
		n := count("/etcdserverpb.Auth/Authenticate")
		if n >= 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d Authenticate calls within 10 s, want 2 (Warm's and the request's)", n)
		}
		time.Sleep(5 * time.Millisecond)
	}
	mu.Lock()
	defer mu.Unlock()
	if counted != 1 {
		t.Fatalf("refusal hook ran %d times for one refused request, want 1", counted)
	}
}
