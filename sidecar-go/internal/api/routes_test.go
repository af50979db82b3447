package api

import (
	"bufio"
	"bytes"
	"io"
	"net/http"
	"testing"
)

// TestRoutingIsStarlettes: exact paths, no cleaning redirects (http.ServeMux
// would answer the first four with 307 to the cleaned path), a 307 for a route
// but for trailing slashes, Starlette's plain-text 404 for the rest
// (tests/security/test_hostile_input.py::test_routing_matches_starlette runs the
// same against both sidecars).
func TestRoutingIsStarlettes(t *testing.T) {
	addr := serve(t)
	cases := []struct {
		target, location string
		status           int
	}{
		{"/v1//lease", "", 404},
		{"/v1/./lease", "", 404},
		{"/v1/x/../lease", "", 404},
		{"//healthz", "", 404},
		{"/v1/", "", 404},
		{"/v1/lease/", "http://sidecar/v1/lease", 307},
		{"/healthz//?a=b&c=%20&d=<", "http://sidecar/healthz?a=b&c=%20&d=%3C", 307},
		{"/readyz%2F", "http://sidecar/readyz", 307},
		{"/v1/%6cease", "", 401},
	}
	for _, c := range cases {
		raw, err := exchange(t, addr, []byte("GET "+c.target+" HTTP/1.1\r\nHost: sidecar\r\nConnection: close\r\n\r\n"))
		if err != nil {
			t.Fatalf("%s: %v", c.target, err)
		}
		resp, err := http.ReadResponse(bufio.NewReader(bytes.NewReader(raw)), nil)
		if err != nil {
			t.Fatalf("%s: %v: %q", c.target, err, raw)
		}
		body, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != c.status || resp.Header.Get("Location") != c.location ||
			(c.status == 404 && string(body) != "Not Found") || (c.status == 307 && len(body) != 0) {
			t.Errorf("%s: got %d, Location %q, body %q; want %d, Location %q", c.target, resp.StatusCode,
				resp.Header.Get("Location"), body, c.status, c.location)
		}
	}
}
