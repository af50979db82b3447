// Command joblease-sidecar is the Go sidecar: a drop-in for `python -m
// joblease.sidecar` (same flags, JOBLEASE_* variables, HTTP API, token files,
// signals and exit codes; docs/sidecar.md and docs/sidecar-go.md). It claims
// this pod's job, keeps the lease alive and serves the token to the worker.
package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"syscall"
	"time"

	"github.com/joblease/joblease/sidecar-go/internal/api"
	"github.com/joblease/joblease/sidecar-go/internal/config"
	"github.com/joblease/joblease/sidecar-go/internal/etcd"
	"github.com/joblease/joblease/sidecar-go/internal/logs"
	"github.com/joblease/joblease/sidecar-go/internal/protocol"
	"github.com/joblease/joblease/sidecar-go/internal/runner"
	"github.com/joblease/joblease/sidecar-go/internal/startup"
	"github.com/joblease/joblease/sidecar-go/internal/tracing"
)

func main() { os.Exit(run()) }

func run() int {
	timeline := startup.New(time.Now())
	cfg, err := config.Parse(os.Args[1:], config.Environ())
	if errors.Is(err, config.ErrHelp) {
		fmt.Print(config.Usage)
		return 0
	}
	if err != nil {
		// click.UsageError: usage line, the error, exit 2.
		fmt.Fprintf(os.Stderr, "Usage: joblease-sidecar [OPTIONS]\nTry 'joblease-sidecar --help' for help.\n\nError: %s\n", err)
		return 2
	}
	slog.SetDefault(slog.New(logs.New(os.Stderr, cfg.LogLevel, "joblease")))
	log := slog.New(logs.New(os.Stderr, cfg.LogLevel, "joblease.sidecar"))
	if cfg.RateLimitProblem != "" {
		slog.New(logs.New(os.Stderr, cfg.LogLevel, "joblease.sidecar.api")).Error("invalid rate limit; using the default",
			"variable", "JOBLEASE_SIDECAR_RATE_LIMIT", "value", cfg.RateLimitProblem, "default", config.DefaultRateLimit)
	}
	if cfg.CheckpointRateProblem != "" {
		slog.New(logs.New(os.Stderr, cfg.LogLevel, "joblease.sidecar.api")).Error("invalid checkpoint rate; using the default",
			"variable", "JOBLEASE_SIDECAR_CHECKPOINT_RATE", "value", cfg.CheckpointRateProblem, "default", config.DefaultCheckpointRate)
	}
	timeline.Mark("config")
	cfg.Etcd.RequestTimeout = 5 * time.Second
	store, err := etcd.New(cfg.Etcd)
	if err != nil {
		fmt.Fprintf(os.Stderr, "Usage: joblease-sidecar [OPTIONS]\nTry 'joblease-sidecar --help' for help.\n\nError: %s\n", err)
		return 2
	}
	store.SetTimeline(timeline)
	timeline.Mark("etcd client")
	// Connect and authenticate now, while the listeners start, not on the first request.
	store.Warm()
	client := protocol.NewClient(store, cfg.Etcd.Root)
	client.LeaseTTLHint = cfg.LeaseTTL
	rn := runner.New(cfg, client, log)
	rn.SetTimeline(timeline)
	store.SetRefusalHook(func() { rn.Metrics.Inc(rn.Metrics.AuthFailures) })
	tracer := tracing.New(tracing.FromEnv(os.Getenv)) // nil without the OTEL_* variables: no spans
	defer tracer.Shutdown(2 * time.Second)
	rn.SetTracer(tracer)
	// A restarted container finds the pod's volumes as the dead incarnation
	// left them: its token is nobody's now, so it goes before anything is served.
	if err := rn.RemoveStaleFiles(); err != nil {
		log.Error("cannot remove the token files an earlier run left", "reason", err.Error())
		rn.CloseClient()
		return 1
	}

	signals := make(chan os.Signal, 2)
	signal.Notify(signals, syscall.SIGTERM, syscall.SIGINT)
	go func() {
		for s := range signals {
			name := "SIGTERM"
			if s == syscall.SIGINT {
				name = "SIGINT"
			}
			rn.RequestStop(name)
		}
	}()
	log.Info("sidecar starting", "config", cfg.Describe())

	if !cfg.Loopback() {
		log.Warn("the lease API listens beyond loopback; set a bearer token", "host", cfg.Host)
	}
	var servers []*http.Server
	listen := func(name string, h http.Handler, host string, port int, portFile string) error {
		ln, err := net.Listen("tcp", net.JoinHostPort(host, strconv.Itoa(port)))
		if err != nil {
			return err
		}
		bound := ln.Addr().(*net.TCPAddr).Port
		srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
		servers = append(servers, srv)
		// Lingering close: an answer sent before the request body was read still
		// reaches the client, instead of a connection reset (internal/api/linger.go).
		go func() { _ = srv.Serve(api.LingeringListener(ln)) }()
		if portFile != "" {
			if _, err := runner.WriteAtomic(portFile, []byte(fmt.Sprintf("%d\n", bound)), nil); err != nil {
				return err
			}
		}
		log.Info("listening", "listener", name, "host", host, "port", bound)
		return nil
	}
	stopServers := func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		for _, s := range servers {
			_ = s.Shutdown(ctx)
		}
	}
	err = listen("api", api.Handler(rn), cfg.Host, cfg.Port, cfg.PortFile)
	if err == nil && cfg.ProbePort >= 0 {
		err = listen("probe", api.ProbeHandler(rn), cfg.ProbeHost, cfg.ProbePort, cfg.ProbePortFile)
	}
	if err != nil { // e.g. the port is taken: say so, exit non-zero
		log.Error("cannot listen", "reason", err.Error())
		stopServers()
		rn.CloseClient()
		return 1
	}
	timeline.Mark("listen")

	done := make(chan runner.End, 1)
	go rn.Lifecycle(done)
	code := 0
	select {
	case <-rn.Stopped():
	case end := <-done:
		if end.ExitNow {
			code = end.Code
		} else {
			<-rn.Stopped() // completed, released, lost with "signal", or a final answer served: keep serving
		}
	}
	rn.Shutdown()
	stopServers()
	rn.CloseClient()
	if c, ok := rn.ExitCode(); ok {
		code = c
	}
	log.Info("sidecar exiting", "exitCode", code, "state", string(rn.PhaseNow()))
	return code
}
