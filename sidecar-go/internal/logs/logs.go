// Package logs writes JSON lines on stderr in the Python sidecar's format
// ({"ts","level","logger","msg", fields...}), so log queries and tests that
// read fields (job, token, reason) work with either sidecar. Secrets never
// reach a record: callers pass no password or bearer token.
package logs

import (
	"context"
	"io"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/joblease/joblease/sidecar-go/internal/pyjson"
)

// Handler is a slog.Handler producing the JSON lines.
type Handler struct {
	mu     *sync.Mutex
	w      io.Writer
	level  slog.Level
	logger string
	attrs  []slog.Attr
}

// New handler writing to w at level ("DEBUG", "INFO", "WARNING", "ERROR").
func New(w io.Writer, level, logger string) *Handler {
	return &Handler{mu: &sync.Mutex{}, w: w, level: ParseLevel(level), logger: logger}
}

// ParseLevel maps Python's level names to slog's.
func ParseLevel(level string) slog.Level {
	switch strings.ToUpper(level) {
	case "DEBUG":
		return slog.LevelDebug
	case "WARNING", "WARN":
		return slog.LevelWarn
	case "ERROR", "CRITICAL":
		return slog.LevelError
	}
	return slog.LevelInfo
}

func (h *Handler) Enabled(_ context.Context, l slog.Level) bool { return l >= h.level }

func (h *Handler) WithAttrs(as []slog.Attr) slog.Handler {
	c := *h
	c.attrs = append(append([]slog.Attr(nil), h.attrs...), as...)
	return &c
}

func (h *Handler) WithGroup(string) slog.Handler { return h }

func levelName(l slog.Level) string {
	switch {
	case l >= slog.LevelError:
		return "error"
	case l >= slog.LevelWarn:
		return "warning"
	case l >= slog.LevelInfo:
		return "info"
	}
	return "debug"
}

func value(v slog.Value) any {
	v = v.Resolve()
	switch v.Kind() {
	case slog.KindInt64:
		return v.Int64()
	case slog.KindUint64:
		return int64(v.Uint64())
	case slog.KindFloat64:
		return v.Float64()
	case slog.KindBool:
		return v.Bool()
	case slog.KindString:
		return v.String()
	case slog.KindGroup:
		o := pyjson.Obj{}
		for _, a := range v.Group() {
			o = append(o, pyjson.KV{Key: a.Key, Value: value(a.Value)})
		}
		return o
	}
	switch x := v.Any().(type) {
	case pyjson.Obj, []any, map[string]any, nil:
		return x
	case []string:
		out := make([]any, len(x))
		for i, s := range x {
			out[i] = s
		}
		return out
	case []int:
		out := make([]any, len(x))
		for i, n := range x {
			out[i] = n
		}
		return out
	case error:
		return x.Error()
	}
	return v.String()
}

func (h *Handler) Handle(_ context.Context, r slog.Record) error {
	t := r.Time.UTC()
	o := pyjson.Obj{{Key: "ts", Value: t.Format("2006-01-02T15:04:05.000Z")}, {Key: "level", Value: levelName(r.Level)},
		{Key: "logger", Value: h.logger}, {Key: "msg", Value: r.Message}}
	for _, a := range h.attrs {
		o = append(o, pyjson.KV{Key: a.Key, Value: value(a.Value)})
	}
	r.Attrs(func(a slog.Attr) bool {
		o = append(o, pyjson.KV{Key: a.Key, Value: value(a.Value)})
		return true
	})
	line := append(pyjson.Response(o), '\n')
	h.mu.Lock()
	defer h.mu.Unlock()
	_, err := h.w.Write(line)
	return err
}

var _ = time.Now
