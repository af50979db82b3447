package api

import (
	"io"
	"net"
	"sync"
	"time"
)

// Lingering close (what Apache and nginx do, RFC 7230 section 6.6): net/http
// closes a connection with request bytes still unread in some cases, e.g. its
// own 400 for a request target it cannot parse (`/%zz`) sent before the body
// was read, or a request with `Connection: close` (or HTTP/1.0) whose body the
// handler did not read (a 401, 404, 405, 413 or 429 is answered before the
// body). Closing a TCP socket with unread data makes the kernel send RST
// instead of FIN, and the client sees "connection reset by peer" instead of
// the answer's end (for net/http's own 400, which has no Content-Length, the
// body ends only with the FIN). So a connection's Close sends FIN first, then
// reads and discards what the client still sends until it closes its side
// (or lingerTimeout / lingerBytes pass), and only then closes the socket.
// The drain runs on its own goroutine: Close returns at once, so
// Server.Shutdown is not held up by idle keep-alive clients.

const (
	lingerTimeout = 5 * time.Second
	lingerBytes   = 4 << 20
)

// LingeringListener wraps ln so that every connection it accepts closes as above.
func LingeringListener(ln net.Listener) net.Listener { return lingeringListener{ln} }

type lingeringListener struct{ net.Listener }

func (l lingeringListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if tcp, ok := c.(*net.TCPConn); ok && err == nil {
		return &lingeringConn{TCPConn: tcp}, nil
	}
	return c, err
}

// lingeringConn keeps *net.TCPConn's methods (net/http's closeWriteAndWait
// uses CloseWrite); only Close changes.
type lingeringConn struct {
	*net.TCPConn
	once sync.Once
}

func (c *lingeringConn) Close() error {
	c.once.Do(func() {
		if err := c.TCPConn.CloseWrite(); err != nil { // not connected any more: nothing to linger for
			_ = c.TCPConn.Close()
			return
		}
		go func() {
			_ = c.TCPConn.SetReadDeadline(time.Now().Add(lingerTimeout))
			_, _ = io.CopyN(io.Discard, c.TCPConn, lingerBytes)
			_ = c.TCPConn.Close()
		}()
	})
	return nil
}
