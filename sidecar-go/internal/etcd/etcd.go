// Package etcd is the sidecar's etcd client: etcd's own gRPC API (the
// generated etcdserverpb stubs) on one connection per endpoint, with
// failover, auth tokens, TLS and mutual TLS, and errors mapped to the
// protocol's (a write whose answer was lost is OutcomeUnknown, never a plain
// "unavailable"). It mirrors joblease.etcd_store and is deliberately not
// etcd's clientv3: see docs/sidecar-go.md (footprint, and retries that must
// stay outcome-aware).
package etcd

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/joblease/joblease/sidecar-go/internal/errs"
	"github.com/joblease/joblease/sidecar-go/internal/startup"
)

// Config is how to reach etcd (EtcdConfig).
type Config struct {
	Endpoints                 []string
	CAFile, CertFile, KeyFile string
	ServerName                string
	Username, Password        string
	// UsernameFile, PasswordFile: mounted Secret files that Username and Password were
	// read from. They are read again before every authentication, so a rotated
	// credential (the operator moves the Secret to the namespace's other etcd user,
	// then revokes the old one) is picked up when etcd refuses the old token.
	UsernameFile, PasswordFile string
	RequestTimeout             time.Duration
	Root                       string
	// Interceptors are extra gRPC client interceptors. Only tests set them
	// (etcdtest.Faults: an answer of the real etcd delayed or lost, a stream
	// open that hangs); the sidecar never does.
	UnaryInterceptor  grpc.UnaryClientInterceptor
	StreamInterceptor grpc.StreamClientInterceptor
}

// TLS: an https endpoint or any TLS file switches TLS on.
func (c Config) TLS() bool {
	if c.CAFile != "" || c.CertFile != "" {
		return true
	}
	for _, e := range c.Endpoints {
		if strings.HasPrefix(e, "https://") {
			return true
		}
	}
	return false
}

var notSentHints = []string{"failed to connect", "connection refused", "no address", "dns resolution",
	"error while dialing", "produced zero addresses"}
var staleTokenHints = []string{"invalid auth token", "revision of auth store is old"}

func hasAny(s string, hints []string) bool {
	for _, h := range hints {
		if strings.Contains(s, h) {
			return true
		}
	}
	return false
}

// Store is a connection to etcd.
type Store struct {
	cfg       Config
	endpoints []string
	creds     credentials.TransportCredentials

	mu      sync.Mutex
	conns   map[int]*grpc.ClientConn
	current int
	token   string
	authMu  sync.Mutex
	// onRefused is told of each refusal of the credentials or of a permission
	// (SetRefusalHook: the sidecar's joblease_sidecar_auth_failures counter).
	onRefused func()
	// timeline gets the first connection's "connect" (TCP, TLS handshake, HTTP/2
	// preface: until gRPC calls it ready) and each "authenticate" (SetTimeline).
	timeline *startup.Timeline
}

// SetTimeline makes the store record its connect and authenticate steps in t
// (the sidecar's start timeline). Set it before the first request.
func (s *Store) SetTimeline(t *startup.Timeline) { s.timeline = t }

// SetRefusalHook makes f run each time etcd refuses this store's credentials
// ("authentication failed", a deleted user) or a permission ("permission
// denied"). A stale token that a fresh one cures is not a refusal. Set it
// before the first request; f must not block.
func (s *Store) SetRefusalHook(f func()) { s.onRefused = f }

// refused maps a gRPC error (MapError) and reports a credential or permission
// refusal to the hook.
func (s *Store) refused(ctx context.Context, err error) error {
	mapped := MapError(err)
	if ctx.Value(quietKey{}) == nil {
		s.reportRefusal(mapped)
	}
	return mapped
}

func (s *Store) reportRefusal(err error) {
	if s.onRefused != nil && errs.Is(err, errs.KindForbidden) {
		s.onRefused()
	}
}

// New prepares the connections (nothing is dialled until the first call).
func New(cfg Config) (*Store, error) {
	if cfg.RequestTimeout == 0 {
		cfg.RequestTimeout = 5 * time.Second
	}
	s := &Store{cfg: cfg, conns: map[int]*grpc.ClientConn{}}
	for _, e := range cfg.Endpoints {
		for _, scheme := range []string{"http://", "https://", "unix://"} {
			e = strings.TrimPrefix(e, scheme)
		}
		s.endpoints = append(s.endpoints, e)
	}
	if len(s.endpoints) == 0 {
		return nil, errs.Invalid("no etcd endpoints")
	}
	if cfg.TLS() {
		tc := &tls.Config{ServerName: cfg.ServerName, MinVersion: tls.VersionTLS12}
		if cfg.CAFile != "" {
			pem, err := os.ReadFile(cfg.CAFile)
			if err != nil {
				return nil, errs.Invalid(fmt.Sprintf("cannot read %s: %v", cfg.CAFile, err))
			}
			pool := x509.NewCertPool()
			if !pool.AppendCertsFromPEM(pem) {
				return nil, errs.Invalid("no certificates in " + cfg.CAFile)
			}
			tc.RootCAs = pool
		}
		if cfg.CertFile != "" || cfg.KeyFile != "" {
			cert, err := tls.LoadX509KeyPair(cfg.CertFile, cfg.KeyFile)
			if err != nil {
				return nil, errs.Invalid(fmt.Sprintf("cannot load the client certificate: %v", err))
			}
			tc.Certificates = []tls.Certificate{cert}
		}
		s.creds = credentials.NewTLS(tc)
	}
	return s, nil
}

// Warm starts, in the background, what the first request would otherwise do
// first and wait for: the connection to the current endpoint (DNS, TCP, the
// TLS handshake, HTTP/2's preface) and, with credentials, the authentication
// (etcd's password check and its raft write). Main calls it as soon as the
// configuration is read, so they run while the listeners start. It changes
// no outcome: the first request waits for an authentication in flight
// (authMu) and uses its token, or authenticates itself if it failed (and
// that request's refusal is the one counted); a failed connection is dialled
// again by gRPC as before.
func (s *Store) Warm() {
	c, err := s.conn(s.currentIndex())
	if err != nil {
		return // the first request reports it
	}
	c.Connect()
	if s.cfg.Username == "" {
		return
	}
	// Quietly: a refusal here is etcd refusing the credentials before any
	// request of the sidecar's needed them; the first request that does meets
	// the same refusal and counts it, so one bad password counts once.
	go func() { _, _, _ = s.authContext(withoutRefusalReports(context.Background())) }()
}

type quietKey struct{}

// withoutRefusalReports marks ctx's requests as not to be counted by the
// refusal hook (Warm's early authentication).
func withoutRefusalReports(ctx context.Context) context.Context {
	return context.WithValue(ctx, quietKey{}, true)
}

// Endpoints as dialled (schemes stripped).
func (s *Store) Endpoints() []string { return s.endpoints }

func (s *Store) conn(i int) (*grpc.ClientConn, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if c, ok := s.conns[i]; ok {
		return c, nil
	}
	creds := s.creds
	if creds == nil {
		creds = insecure.NewCredentials()
	}
	opts := []grpc.DialOption{
		grpc.WithTransportCredentials(creds),
		grpc.WithDisableRetry(), // retries are ours, and outcome-aware
		grpc.WithKeepaliveParams(keepalive.ClientParameters{Time: 10 * time.Second, Timeout: 5 * time.Second,
			PermitWithoutStream: true}),
		grpc.WithConnectParams(grpc.ConnectParams{Backoff: backoff.Config{BaseDelay: 100 * time.Millisecond,
			Multiplier: 1.6, Jitter: 0.2, MaxDelay: time.Second}, MinConnectTimeout: 5 * time.Second}),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(64 << 20)),
	}
	if s.cfg.UnaryInterceptor != nil {
		opts = append(opts, grpc.WithUnaryInterceptor(s.cfg.UnaryInterceptor))
	}
	if s.cfg.StreamInterceptor != nil {
		opts = append(opts, grpc.WithStreamInterceptor(s.cfg.StreamInterceptor))
	}
	c, err := grpc.NewClient("passthrough:///"+s.endpoints[i], opts...)
	if err != nil {
		return nil, errs.Invalid(fmt.Sprintf("bad etcd endpoint %q: %v", s.endpoints[i], err))
	}
	s.conns[i] = c
	if s.timeline != nil && len(s.conns) == 1 {
		go watchReady(c, s.timeline, time.Now())
	}
	return c, nil
}

// watchReady records the "connect" step of c, created at begin: until gRPC
// first calls it ready (connected, TLS done), or nothing if it is closed first.
func watchReady(c *grpc.ClientConn, t *startup.Timeline, begin time.Time) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for st := c.GetState(); st != connectivity.Ready; st = c.GetState() {
		if st == connectivity.Shutdown || !c.WaitForStateChange(ctx, st) {
			return
		}
	}
	t.Step("connect", begin)
}

func (s *Store) currentIndex() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.current
}

func (s *Store) failOver() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.endpoints) > 1 {
		s.current = (s.current + 1) % len(s.endpoints)
	}
}

// Close closes every connection.
func (s *Store) Close() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, c := range s.conns {
		_ = c.Close()
	}
	s.conns = map[int]*grpc.ClientConn{}
}

// authContext adds the auth token (fetched on first use) to ctx.
func (s *Store) authContext(ctx context.Context) (context.Context, string, error) {
	if s.cfg.Username == "" {
		return ctx, "", nil
	}
	s.authMu.Lock()
	defer s.authMu.Unlock()
	if s.token == "" {
		s.rereadCredentials()
		name, password := s.cfg.Username, s.cfg.Password
		begin := time.Now()
		resp, err := call(s, ctx, false, false, func(ctx context.Context, c *grpc.ClientConn) (*pb.AuthenticateResponse, error) {
			return pb.NewAuthClient(c).Authenticate(ctx, &pb.AuthenticateRequest{Name: name, Password: password})
		})
		if err != nil {
			return ctx, "", err
		}
		s.timeline.Step("authenticate", begin)
		s.token = resp.Token
	}
	return metadata.AppendToOutgoingContext(ctx, "token", s.token), s.token, nil
}

// rereadCredentials loads UsernameFile and PasswordFile again (called with authMu
// held). A file that cannot be read (the kubelet swapping the Secret's files)
// leaves the value read before.
func (s *Store) rereadCredentials() {
	for _, f := range []struct {
		path string
		into *string
	}{{s.cfg.UsernameFile, &s.cfg.Username}, {s.cfg.PasswordFile, &s.cfg.Password}} {
		if f.path == "" {
			continue
		}
		if data, err := os.ReadFile(f.path); err == nil {
			if v := strings.TrimSpace(string(data)); v != "" {
				*f.into = v
			}
		}
	}
}

// AuthUser is the etcd user the store authenticates as now (empty: no auth).
func (s *Store) AuthUser() string {
	s.authMu.Lock()
	defer s.authMu.Unlock()
	return s.cfg.Username
}

func (s *Store) tokenRejected(used string) {
	s.authMu.Lock()
	defer s.authMu.Unlock()
	if used != "" && used == s.token {
		s.token = ""
	}
}

// call runs fn with failover and maps errors: reads are retried on another
// endpoint; writes only when the request provably never reached a server,
// otherwise OutcomeUnknown.
func call[T any](s *Store, ctx context.Context, write, authenticate bool,
	fn func(context.Context, *grpc.ClientConn) (T, error)) (T, error) {
	var zero T
	attempts := max(2, 2*len(s.endpoints))
	var last error
	for range attempts {
		cctx, used := ctx, ""
		if authenticate {
			var err error
			if cctx, used, err = s.authContext(ctx); err != nil {
				return zero, err
			}
		}
		c, err := s.conn(s.currentIndex())
		if err != nil {
			return zero, err
		}
		tctx, cancel := context.WithTimeout(cctx, s.cfg.RequestTimeout)
		resp, err := fn(tctx, c)
		cancel()
		if err == nil {
			return resp, nil
		}
		last = err
		st, _ := status.FromError(err)
		code, details := st.Code(), st.Message()
		if authenticate && used != "" && hasAny(details, staleTokenHints) {
			s.tokenRejected(used) // refused before any apply
			continue
		}
		if ctx.Err() != nil {
			if write {
				return zero, errs.OutcomeUnknown(fmt.Sprintf("etcd write outcome unknown (cancelled: %v)", ctx.Err()))
			}
			return zero, errs.Unavailable(fmt.Sprintf("etcd request cancelled: %v", ctx.Err()))
		}
		switch code {
		case codes.Unavailable, codes.DeadlineExceeded, codes.Canceled, codes.Unknown:
			notSent := code == codes.Unavailable && hasAny(strings.ToLower(details), notSentHints)
			s.failOver()
			if write && !notSent {
				return zero, errs.OutcomeUnknown(fmt.Sprintf("etcd write outcome unknown (%s: %s)", codeName(code), details))
			}
			continue
		}
		return zero, s.refused(ctx, err)
	}
	st, _ := status.FromError(last)
	return zero, errs.Unavailable(fmt.Sprintf("etcd unreachable at %s: %s: %s",
		strings.Join(s.endpoints, ", "), codeName(st.Code()), st.Message()))
}

func codeName(c codes.Code) string {
	return strings.ToUpper(map[codes.Code]string{codes.Unavailable: "UNAVAILABLE", codes.DeadlineExceeded: "DEADLINE_EXCEEDED",
		codes.Canceled: "CANCELLED", codes.Unknown: "UNKNOWN", codes.PermissionDenied: "PERMISSION_DENIED",
		codes.Unauthenticated: "UNAUTHENTICATED", codes.InvalidArgument: "INVALID_ARGUMENT",
		codes.NotFound: "NOT_FOUND", codes.FailedPrecondition: "FAILED_PRECONDITION"}[c])
}

// MapError turns a gRPC error into the protocol's.
func MapError(err error) error {
	st, _ := status.FromError(err)
	code, details := st.Code(), st.Message()
	switch {
	case code == codes.PermissionDenied || code == codes.Unauthenticated:
		return errs.Forbidden("etcd refused the request: " + details)
	case strings.Contains(details, "authentication failed") || strings.Contains(details, "user name is empty") ||
		// a client certificate whose CN is no etcd user (mutual TLS, no token)
		strings.Contains(details, "user name not found"):
		return errs.Forbidden("etcd refused the credentials: " + details)
	case strings.Contains(details, "lease not found"):
		return errs.LeaseNotFound(details)
	case code == codes.InvalidArgument:
		return errs.Invalid("etcd refused the request: " + details)
	}
	return errs.Generic(fmt.Sprintf("etcd error %s: %s", codeName(code), details))
}

// KV is one stored key.
type KV struct {
	Key, Value                           []byte
	CreateRevision, ModRevision, Version int64
	Lease                                int64
}

// TxnResult: which branch ran, the revision, and one slice of KVs per Get
// of that branch (in order; nil entries for puts and deletes).
type TxnResult struct {
	Succeeded bool
	Revision  int64
	Gets      [][]KV
	// Counts[i] is how many keys get i matched (before any limit), 0 for a put or delete.
	Counts []int64
	// Txns[i] is what nested transaction i answered (nil for any other op;
	// its Revision is the outer one's): see TxnOp.
	Txns []*TxnResult
}

// Txn of the nested transaction at index i of the branch that ran, or nil.
func (r TxnResult) Txn(i int) *TxnResult {
	if i >= len(r.Txns) {
		return nil
	}
	return r.Txns[i]
}

// First KV of get i of the branch that ran, or nil.
func (r TxnResult) KV(i int) *KV {
	if i >= len(r.Gets) || len(r.Gets[i]) == 0 {
		return nil
	}
	return &r.Gets[i][0]
}

// Op is one operation of a transaction branch.
type Op struct {
	kind  int // 0 get, 1 put, 2 delete, 3 get of a prefix, 4 delete of a range, 5 nested txn
	key   string
	end   string // kind 4: the range's end (exclusive)
	value []byte
	lease int64
	rng   RangeOpts
	// kind 5: the nested transaction's compares and branches
	cmps             []Cmp
	success, failure []Op
}

// TxnOp is a transaction nested in a branch of another (etcd's
// RequestOp.request_txn): its compares are evaluated, in the same atomic
// transaction, only if that branch runs; its answer is TxnResult.Txn(i).
// etcd refuses a transaction that puts or deletes one key twice across its
// branches ("duplicate key given in txn request").
func TxnOp(cmps []Cmp, success, failure []Op) Op {
	return Op{kind: 5, cmps: cmps, success: success, failure: failure}
}

// RangeOpts shape a GetPrefix op (a queue's "oldest pending keys" read).
type RangeOpts struct {
	KeysOnly bool
	// Limit: at most this many keys (0: all).
	Limit int64
	// OldestFirst sorts by create revision, ascending (etcd sorts before it limits).
	OldestFirst bool
	// CountOnly returns no keys, only how many there are (TxnResult.Counts).
	CountOnly bool
}

// GetPrefixOp reads every key under prefix inside a transaction.
func GetPrefixOp(prefix string, o RangeOpts) Op { return Op{kind: 3, key: prefix, rng: o} }

// PrefixEnd is the range end of prefix (prefixes end in '/', never 0xff).
func PrefixEnd(prefix string) []byte {
	end := []byte(prefix)
	end[len(end)-1]++
	return end
}

func Get(key string) Op { return Op{kind: 0, key: key} }
func Put(key string, value []byte, lease int64) Op {
	return Op{kind: 1, key: key, value: value, lease: lease}
}
func Delete(key string) Op { return Op{kind: 2, key: key} }

// DeleteRange deletes every key in [key, end).
func DeleteRange(key, end string) Op { return Op{kind: 4, key: key, end: end} }

// Cmp is one compare of a transaction.
type Cmp = *pb.Compare

func CreateEq(key string, rev int64) Cmp {
	return &pb.Compare{Key: []byte(key), Target: pb.Compare_CREATE, Result: pb.Compare_EQUAL,
		TargetUnion: &pb.Compare_CreateRevision{CreateRevision: rev}}
}
func ModEq(key string, rev int64) Cmp {
	return &pb.Compare{Key: []byte(key), Target: pb.Compare_MOD, Result: pb.Compare_EQUAL,
		TargetUnion: &pb.Compare_ModRevision{ModRevision: rev}}
}
func CreateNe(key string, rev int64) Cmp {
	return &pb.Compare{Key: []byte(key), Target: pb.Compare_CREATE, Result: pb.Compare_NOT_EQUAL,
		TargetUnion: &pb.Compare_CreateRevision{CreateRevision: rev}}
}
func VersionEq(key string, v int64) Cmp {
	return &pb.Compare{Key: []byte(key), Target: pb.Compare_VERSION, Result: pb.Compare_EQUAL,
		TargetUnion: &pb.Compare_Version{Version: v}}
}
func VersionGreater(key string, v int64) Cmp {
	return &pb.Compare{Key: []byte(key), Target: pb.Compare_VERSION, Result: pb.Compare_GREATER,
		TargetUnion: &pb.Compare_Version{Version: v}}
}
func VersionLess(key string, v int64) Cmp {
	return &pb.Compare{Key: []byte(key), Target: pb.Compare_VERSION, Result: pb.Compare_LESS,
		TargetUnion: &pb.Compare_Version{Version: v}}
}

// CreateEqRange: every key in [key, end) has create revision rev (rev 0: no key
// there at all; etcd compares an empty range as one absent key).
func CreateEqRange(key string, end []byte, rev int64) Cmp {
	c := CreateEq(key, rev)
	c.RangeEnd = end
	return c
}

// CreateGreaterRange: every key in [key, end) was created after rev (an empty
// range fails: it compares as one absent key, created at 0).
func CreateGreaterRange(key string, end []byte, rev int64) Cmp {
	return &pb.Compare{Key: []byte(key), RangeEnd: end, Target: pb.Compare_CREATE, Result: pb.Compare_GREATER,
		TargetUnion: &pb.Compare_CreateRevision{CreateRevision: rev}}
}

func ValueEq(key string, value []byte) Cmp {
	return &pb.Compare{Key: []byte(key), Target: pb.Compare_VALUE, Result: pb.Compare_EQUAL,
		TargetUnion: &pb.Compare_Value{Value: value}}
}

// RequestOps is what a branch of ops is sent as (the shared vectors compare it).
func RequestOps(ops []Op) []*pb.RequestOp { return requestOps(ops) }

func requestOps(ops []Op) []*pb.RequestOp {
	out := make([]*pb.RequestOp, 0, len(ops))
	for _, op := range ops {
		switch op.kind {
		case 0:
			out = append(out, &pb.RequestOp{Request: &pb.RequestOp_RequestRange{RequestRange: &pb.RangeRequest{Key: []byte(op.key)}}})
		case 1:
			out = append(out, &pb.RequestOp{Request: &pb.RequestOp_RequestPut{RequestPut: &pb.PutRequest{
				Key: []byte(op.key), Value: op.value, Lease: op.lease}}})
		case 2:
			out = append(out, &pb.RequestOp{Request: &pb.RequestOp_RequestDeleteRange{RequestDeleteRange: &pb.DeleteRangeRequest{Key: []byte(op.key)}}})
		case 4:
			out = append(out, &pb.RequestOp{Request: &pb.RequestOp_RequestDeleteRange{RequestDeleteRange: &pb.DeleteRangeRequest{
				Key: []byte(op.key), RangeEnd: []byte(op.end)}}})
		case 5:
			out = append(out, &pb.RequestOp{Request: &pb.RequestOp_RequestTxn{RequestTxn: &pb.TxnRequest{
				Compare: op.cmps, Success: requestOps(op.success), Failure: requestOps(op.failure)}}})
		case 3:
			rr := &pb.RangeRequest{Key: []byte(op.key), RangeEnd: PrefixEnd(op.key), KeysOnly: op.rng.KeysOnly, Limit: op.rng.Limit,
				CountOnly: op.rng.CountOnly}
			if op.rng.OldestFirst {
				rr.SortOrder, rr.SortTarget = pb.RangeRequest_ASCEND, pb.RangeRequest_CREATE
			}
			out = append(out, &pb.RequestOp{Request: &pb.RequestOp_RequestRange{RequestRange: rr}})
		}
	}
	return out
}

func hasWrite(ops ...[]Op) bool {
	for _, branch := range ops {
		for _, op := range branch {
			if op.kind == 1 || op.kind == 2 || op.kind == 4 || (op.kind == 5 && hasWrite(op.success, op.failure)) {
				return true
			}
		}
	}
	return false
}

// Txn runs one transaction.
func (s *Store) Txn(ctx context.Context, cmps []Cmp, success, failure []Op) (TxnResult, error) {
	req := &pb.TxnRequest{Compare: cmps, Success: requestOps(success), Failure: requestOps(failure)}
	resp, err := call(s, ctx, hasWrite(success, failure), true, func(ctx context.Context, c *grpc.ClientConn) (*pb.TxnResponse, error) {
		return pb.NewKVClient(c).Txn(ctx, req)
	})
	if err != nil {
		return TxnResult{}, err
	}
	return txnResult(resp, resp.Header.GetRevision()), nil
}

func txnResult(resp *pb.TxnResponse, revision int64) TxnResult {
	r := TxnResult{Succeeded: resp.Succeeded, Revision: revision}
	for i, op := range resp.Responses {
		if nested := op.GetResponseTxn(); nested != nil {
			if r.Txns == nil {
				r.Txns = make([]*TxnResult, len(resp.Responses))
			}
			n := txnResult(nested, revision)
			r.Txns[i] = &n
		}
		if rr := op.GetResponseRange(); rr != nil {
			kvs := make([]KV, 0, len(rr.Kvs))
			for _, kv := range rr.Kvs {
				kvs = append(kvs, KV{kv.Key, kv.Value, kv.CreateRevision, kv.ModRevision, kv.Version, kv.Lease})
			}
			r.Gets = append(r.Gets, kvs)
			r.Counts = append(r.Counts, rr.Count)
		} else {
			r.Gets = append(r.Gets, nil)
			r.Counts = append(r.Counts, 0)
		}
	}
	return r
}

// GetPrefix reads every key under prefix: the revision and the KVs.
func (s *Store) GetPrefix(ctx context.Context, prefix string) (int64, []KV, error) {
	end := []byte(prefix)
	end[len(end)-1]++ // prefixes end in '/', never 0xff
	resp, err := call(s, ctx, false, true, func(ctx context.Context, c *grpc.ClientConn) (*pb.RangeResponse, error) {
		return pb.NewKVClient(c).Range(ctx, &pb.RangeRequest{Key: []byte(prefix), RangeEnd: end})
	})
	if err != nil {
		return 0, nil, err
	}
	kvs := make([]KV, 0, len(resp.Kvs))
	for _, kv := range resp.Kvs {
		kvs = append(kvs, KV{kv.Key, kv.Value, kv.CreateRevision, kv.ModRevision, kv.Version, kv.Lease})
	}
	return resp.Header.GetRevision(), kvs, nil
}

// Get reads one key.
func (s *Store) Get(ctx context.Context, key string) (int64, *KV, error) {
	resp, err := call(s, ctx, false, true, func(ctx context.Context, c *grpc.ClientConn) (*pb.RangeResponse, error) {
		return pb.NewKVClient(c).Range(ctx, &pb.RangeRequest{Key: []byte(key)})
	})
	if err != nil {
		return 0, nil, err
	}
	if len(resp.Kvs) == 0 {
		return resp.Header.GetRevision(), nil, nil
	}
	kv := resp.Kvs[0]
	return resp.Header.GetRevision(), &KV{kv.Key, kv.Value, kv.CreateRevision, kv.ModRevision, kv.Version, kv.Lease}, nil
}

// Grant a lease: its id and the TTL etcd granted. A grant whose outcome is
// unknown leaks at most one unused lease that expires by itself, so it is
// retried like a read.
func (s *Store) Grant(ctx context.Context, ttl int64) (int64, int64, error) {
	resp, err := call(s, ctx, false, true, func(ctx context.Context, c *grpc.ClientConn) (*pb.LeaseGrantResponse, error) {
		return pb.NewLeaseClient(c).LeaseGrant(ctx, &pb.LeaseGrantRequest{TTL: ttl})
	})
	if err != nil {
		return 0, 0, err
	}
	if resp.Error != "" {
		return 0, 0, errs.Generic("etcd refused the lease grant: " + resp.Error)
	}
	return resp.ID, resp.TTL, nil
}

// Revoke a lease (one already gone is fine).
func (s *Store) Revoke(ctx context.Context, id int64) error {
	_, err := call(s, ctx, false, true, func(ctx context.Context, c *grpc.ClientConn) (*pb.LeaseRevokeResponse, error) {
		return pb.NewLeaseClient(c).LeaseRevoke(ctx, &pb.LeaseRevokeRequest{ID: id})
	})
	if errs.Is(err, errs.KindLeaseNotFound) {
		return nil
	}
	return err
}

// KeepAlive is one persistent LeaseKeepAlive stream, reopened (on the next
// endpoint) when it breaks.
type KeepAlive struct {
	s      *Store
	id     int64
	stream pb.Lease_LeaseKeepAliveClient
	cancel context.CancelFunc
	used   string
}

// NewKeepAlive prepares a stream for lease id (opened on first Renew).
func (s *Store) NewKeepAlive(id int64) *KeepAlive { return &KeepAlive{s: s, id: id} }

// Renew sends one keep-alive and waits for its answer within timeout: the TTL
// etcd reset the lease to (0: etcd no longer knows it). A stream refused for a
// stale auth token is reopened once with a fresh token.
func (k *KeepAlive) Renew(timeout time.Duration) (int64, error) {
	deadline := time.Now().Add(timeout)
	for attempt := 1; attempt <= 2; attempt++ {
		ttl, err := k.renewOnce(deadline)
		if err == nil {
			return ttl, nil
		}
		k.Close()
		st, _ := status.FromError(err)
		if attempt == 1 && hasAny(st.Message(), staleTokenHints) {
			k.s.tokenRejected(k.used)
			continue
		}
		k.s.failOver()
		if st.Code() == codes.PermissionDenied || st.Code() == codes.Unauthenticated {
			return 0, k.s.refused(context.Background(), err)
		}
		if pe, ok := errs.As(err); ok && pe.Kind == errs.KindForbidden {
			return 0, pe // from authenticating again: counted there
		}
		return 0, errs.Unavailable(fmt.Sprintf("keep-alive failed: %v", err))
	}
	return 0, errs.Unavailable("keep-alive failed")
}

func (k *KeepAlive) renewOnce(deadline time.Time) (int64, error) {
	if k.stream == nil {
		// The stream outlives this renewal, so its context has no deadline;
		// opening it (auth token included) must still end by the renewal's
		// deadline, or a connection that accepts and never answers would hold
		// the keep-alive loop past the safety deadline without a word.
		ctx, cancel := context.WithCancel(context.Background())
		opening := time.AfterFunc(time.Until(deadline), cancel)
		stream, used, err := k.open(ctx)
		if !opening.Stop() {
			cancel()
			return 0, status.Error(codes.DeadlineExceeded, "opening the keep-alive stream timed out")
		}
		if err != nil {
			cancel()
			return 0, err
		}
		k.stream, k.cancel, k.used = stream, cancel, used
	}
	type answer struct {
		ttl int64
		err error
	}
	done := make(chan answer, 1)
	stream := k.stream
	go func() {
		if err := stream.Send(&pb.LeaseKeepAliveRequest{ID: k.id}); err != nil {
			done <- answer{0, err}
			return
		}
		resp, err := stream.Recv()
		if err != nil {
			done <- answer{0, err}
			return
		}
		done <- answer{resp.TTL, nil}
	}()
	timer := time.NewTimer(time.Until(deadline))
	defer timer.Stop()
	select {
	case a := <-done:
		return a.ttl, a.err
	case <-timer.C:
		return 0, status.Error(codes.DeadlineExceeded, "keep-alive timed out")
	}
}

func (k *KeepAlive) open(ctx context.Context) (pb.Lease_LeaseKeepAliveClient, string, error) {
	actx, used, err := k.s.authContext(ctx)
	if err != nil {
		return nil, used, err
	}
	c, err := k.s.conn(k.s.currentIndex())
	if err != nil {
		return nil, used, err
	}
	stream, err := pb.NewLeaseClient(c).LeaseKeepAlive(actx)
	return stream, used, err
}

// Close ends the stream.
func (k *KeepAlive) Close() {
	if k.cancel != nil {
		k.cancel()
	}
	k.stream, k.cancel = nil, nil
}

// watchFinal is a watch refusal that retrying cannot cure (revision
// compacted, permission denied): the wait ends with it.
type watchFinal struct{ err error }

func (w watchFinal) Error() string { return w.err.Error() }

// WatchChange waits for the first change of key (a put or a delete) at or
// after startRevision: true when one came, false (nil error) when ctx ended
// first. Like joblease.etcd_store's watch, a dropped stream is reopened (on
// the next endpoint, after 50 ms doubling to 2 s, reset by a stream etcd
// accepted) from the same revision, so no change in between is missed; a
// stream refused for a stale auth token is reopened at once with a fresh
// token; a compacted revision or a permission refusal ends the wait with an
// error. The stream is closed before WatchChange returns.
func (s *Store) WatchChange(ctx context.Context, key string, startRevision int64) (bool, error) {
	return s.WatchUntil(ctx, key, nil, startRevision, func(Event) bool { return true })
}

// Event is one change a watch saw: Deleted tells a delete from a put;
// Revision is the revision of the change (a reopened stream replays from its
// start revision, so a watcher that keeps going may see a change twice).
type Event struct {
	Key      []byte
	Deleted  bool
	Revision int64
}

// WatchUntil is WatchChange over the keys from key to end (nil: key alone)
// that waits for the first event match accepts (a queue waiter wakes for a
// new pending key or a deleted holder, not for every write under the queue).
// A reopened stream replays from startRevision; replayed events that did not
// match do not match the second time either.
func (s *Store) WatchUntil(ctx context.Context, key string, end []byte, startRevision int64, match func(Event) bool) (bool, error) {
	failures, reauthenticated := 0, false
	for {
		changed, accepted, used, err := s.watchOnce(ctx, key, end, startRevision, match)
		if ctx.Err() != nil {
			return false, nil
		}
		if err == nil {
			return changed, nil
		}
		if accepted {
			failures, reauthenticated = 0, false
		}
		var final watchFinal
		if errors.As(err, &final) {
			s.reportRefusal(final.err) // a watch cancelled for "permission denied"
			return false, final.err
		}
		if pe, ok := errs.As(err); ok && pe.Kind == errs.KindForbidden {
			return false, pe
		}
		st, _ := status.FromError(err)
		if used != "" && hasAny(st.Message(), staleTokenHints) {
			s.tokenRejected(used)
			if !reauthenticated {
				reauthenticated = true
				continue // at once: the next attempt carries a fresh token
			}
		} else if st.Code() == codes.PermissionDenied || st.Code() == codes.Unauthenticated {
			return false, s.refused(ctx, err)
		}
		failures++
		s.failOver()
		t := time.NewTimer(time.Duration(min(2.0, 0.05*float64(int(1)<<min(failures, 6))) * float64(time.Second)))
		select {
		case <-ctx.Done():
			t.Stop()
			return false, nil
		case <-t.C:
		}
	}
}

// watchOnce runs one Watch stream until its first event or error; accepted:
// etcd created the watch; used: the auth token it carried.
func (s *Store) watchOnce(ctx context.Context, key string, end []byte, startRevision int64, match func(Event) bool) (changed, accepted bool, used string, err error) {
	wctx, cancel := context.WithCancel(ctx)
	defer cancel() // ends the stream on the server too
	actx, used, err := s.authContext(wctx)
	if err != nil {
		return false, false, used, err
	}
	// hasleader: a member cut off from its cluster refuses the watch instead of
	// holding it open silently, so the next endpoint is tried.
	actx = metadata.AppendToOutgoingContext(actx, "hasleader", "true")
	c, err := s.conn(s.currentIndex())
	if err != nil {
		return false, false, used, watchFinal{err}
	}
	stream, err := pb.NewWatchClient(c).Watch(actx)
	if err != nil {
		return false, false, used, err
	}
	if err := stream.Send(&pb.WatchRequest{RequestUnion: &pb.WatchRequest_CreateRequest{
		CreateRequest: &pb.WatchCreateRequest{Key: []byte(key), RangeEnd: end, StartRevision: startRevision}}}); err != nil {
		return false, false, used, err
	}
	for {
		resp, err := stream.Recv()
		if err != nil {
			return false, accepted, used, err
		}
		if resp.CompactRevision != 0 {
			return false, accepted, used, watchFinal{errs.Generic(fmt.Sprintf(
				"etcd compacted revision %d of %s (compacted up to %d)", startRevision, key, resp.CompactRevision))}
		}
		if resp.Canceled {
			if strings.Contains(resp.CancelReason, "permission denied") {
				return false, accepted, used, watchFinal{errs.Forbidden("etcd refused the watch: " + resp.CancelReason)}
			}
			return false, accepted, used, status.Error(codes.Unavailable, "watch cancelled: "+resp.CancelReason)
		}
		accepted = true
		for _, ev := range resp.Events {
			if ev.Kv != nil && match(Event{Key: ev.Kv.Key, Deleted: ev.Type == mvccpb.DELETE, Revision: ev.Kv.ModRevision}) {
				return true, true, used, nil
			}
		}
	}
}
