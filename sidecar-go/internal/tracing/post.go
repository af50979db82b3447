package tracing

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"net/textproto"
	"net/url"
	"strconv"
	"strings"
	"time"
)

// post sends one OTLP/HTTP request (HTTP/1.1, "Connection: close") and
// reads only its status line. Hand-written rather than net/http's client,
// which would add about 0.44 MB to the binary (docs/tracing.md): an export
// is one small POST a second at most, with nothing to keep alive or redirect.
// https endpoints use crypto/tls with the system's roots.
func post(ctx context.Context, endpoint string, body []byte, timeout time.Duration) error {
	u, err := url.Parse(endpoint)
	if err != nil {
		return fmt.Errorf("endpoint %q: %w", endpoint, err)
	}
	port := u.Port()
	switch {
	case u.Scheme == "http" && port == "":
		port = "80"
	case u.Scheme == "https" && port == "":
		port = "443"
	case u.Scheme != "http" && u.Scheme != "https":
		return fmt.Errorf("endpoint %q: scheme must be http or https", endpoint)
	}
	deadline := time.Now().Add(timeout)
	ctx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	d := net.Dialer{}
	conn, err := d.DialContext(ctx, "tcp", net.JoinHostPort(u.Hostname(), port))
	if err != nil {
		return err
	}
	defer conn.Close()
	_ = conn.SetDeadline(deadline)
	if u.Scheme == "https" {
		tc := tls.Client(conn, &tls.Config{ServerName: u.Hostname(), MinVersion: tls.VersionTLS12})
		if err := tc.HandshakeContext(ctx); err != nil {
			return err
		}
		conn = tc
	}
	path := u.EscapedPath()
	if path == "" {
		path = "/"
	}
	if u.RawQuery != "" {
		path += "?" + u.RawQuery
	}
	var head bytes.Buffer
	fmt.Fprintf(&head, "POST %s HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\n"+
		"Content-Length: %d\r\nConnection: close\r\nUser-Agent: joblease-sidecar\r\n\r\n", path, u.Host, len(body))
	if _, err := conn.Write(append(head.Bytes(), body...)); err != nil {
		return err
	}
	status, err := textproto.NewReader(bufio.NewReader(conn)).ReadLine()
	if err != nil {
		return fmt.Errorf("no answer: %w", err)
	}
	// "HTTP/1.1 200 OK"
	fields := strings.Fields(status)
	if len(fields) < 2 || !strings.HasPrefix(fields[0], "HTTP/") {
		return fmt.Errorf("not an HTTP answer: %q", status)
	}
	code, err := strconv.Atoi(fields[1])
	if err != nil || code/100 != 2 {
		return fmt.Errorf("answer %q", status)
	}
	return nil
}
