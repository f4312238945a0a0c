package rdma_test

import (
	"log"
	"log/slog"
	"os"

	"github.com/goverbs/rdma"
)

// A Tracer that logs how long dials take and why connections end, and a
// Logger for the rare events; both on a Dialer and on a ListenConfig.
func ExampleTracer() {
	tr := &rdma.Tracer{
		DialDone: func(i rdma.DialDoneInfo) {
			log.Printf("dial %s over %s: %v (resolve %v, route %v, connect %v), err %v",
				i.Address, i.Network, i.Duration, i.Resolve, i.Route, i.Connect, i.Err)
		},
		Fallback: func(i rdma.FallbackInfo) {
			log.Printf("%s %s went over %s: %v", i.Op, i.Address, i.Network, i.Reason)
		},
		ConnClosed: func(i rdma.ConnClosedInfo) {
			log.Printf("%v-%v closed after %v, %d bytes in, %d out: %v",
				i.Local, i.Remote, i.Duration, i.Stats.BytesRead, i.Stats.BytesWritten, i.Err)
		},
	}
	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	d := &rdma.Dialer{Tracer: tr, Logger: logger, FallbackTCP: true}
	lc := &rdma.ListenConfig{Tracer: tr, Logger: logger}
	_, _ = d, lc // d.Dial, lc.Listen as usual
}
