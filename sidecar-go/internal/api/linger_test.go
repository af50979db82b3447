package api

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/joblease/joblease/sidecar-go/internal/config"
	"github.com/joblease/joblease/sidecar-go/internal/protocol"
	"github.com/joblease/joblease/sidecar-go/internal/runner"
)

// serve runs the loopback API as main.go does (a LingeringListener) for a
// runner that never claims: every request below is answered before the runner,
// and so etcd, is asked (it has no client).
func serve(t *testing.T) string {
	t.Helper()
	cfg := config.Config{Job: protocol.JobRef{Namespace: "default", Name: "j"}, Owner: "o",
		APIToken: "right", MaxResultBytes: protocol.MaxResultBytes}
	rn := runner.New(cfg, nil, slog.New(slog.NewTextHandler(io.Discard, nil)))
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: Handler(rn), ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(LingeringListener(ln)) }()
	t.Cleanup(func() { _ = srv.Close() })
	return ln.Addr().String()
}

// exchange sends request (head, then body, in one write, from its own goroutine
// so a server that stops reading cannot block the test) on a fresh connection
// and reads everything the server sends until it closes the connection.
func exchange(t *testing.T, addr string, request []byte) ([]byte, error) {
	t.Helper()
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
	go func() { _, _ = conn.Write(request) }()
	return io.ReadAll(conn)
}

func post(path, headers string, body int) []byte {
	head := fmt.Sprintf("POST %s HTTP/1.1\r\nHost: sidecar\r\nContent-Length: %d\r\n%s\r\n", path, body, headers)
	return append([]byte(head), bytes.Repeat([]byte("x"), body)...)
}

// TestAnswersBeforeTheBodyAreDelivered: requests answered without reading their
// body (net/http's own 400 for a target it cannot parse; a 401, 404, 405 or 413
// on a connection that closes afterwards) get their whole answer and a clean
// end of stream, not a connection reset. The bodies are larger than net/http's
// 4 KiB read buffer, so bytes stay unread in the socket when it is closed:
// without the lingering close the kernel answers with RST and the read fails
// with "connection reset by peer" (checked: with Serve(ln) the first five
// fail so; the last passes there too, net/http closes that one itself with
// FIN first, and stays here to show the lingering close keeps it working).
func TestAnswersBeforeTheBodyAreDelivered(t *testing.T) {
	addr := serve(t)
	const kib = 1024
	cases := []struct {
		name    string
		request []byte
		status  int
		body    string
	}{
		{"unparsable target (net/http's 400, ended by the close)", post("/%zz", "", 64*kib), 400, "400 Bad Request"},
		{"no bearer, Connection: close", post("/v1/complete", "Connection: close\r\n", 64*kib), 401, `"error":"unauthorized"`},
		{"unknown path, Connection: close", post("/nope", "Connection: close\r\n", 64*kib), 404, "Not Found"},
		{"wrong method, Connection: close", post("/v1/lease", "Authorization: Bearer right\r\nConnection: close\r\n", 64*kib), 405, `"error":"method_not_allowed"`},
		{"declared body over the limit, Connection: close", post("/v1/complete", "Authorization: Bearer right\r\nConnection: close\r\n", 100*kib), 413, `"error":"too_large"`},
		{"declared body over net/http's 256 KiB discard limit", post("/v1/complete", "Authorization: Bearer right\r\n", 300*kib), 413, `"error":"too_large"`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			raw, err := exchange(t, addr, c.request)
			if err != nil {
				t.Fatalf("reading the answer: %v after %d bytes: %q", err, len(raw), raw)
			}
			resp, err := http.ReadResponse(bufio.NewReader(bytes.NewReader(raw)), nil)
			if err != nil {
				t.Fatalf("not an HTTP answer: %v: %q", err, raw)
			}
			body, err := io.ReadAll(resp.Body)
			if err != nil || resp.StatusCode != c.status || !strings.Contains(string(body), c.body) {
				t.Fatalf("got %d %q (%v), want %d with %q", resp.StatusCode, body, err, c.status, c.body)
			}
		})
	}
}
