// Package rdmaprom exports the counters of github.com/goverbs/rdma to
// Prometheus: a Collector reports the process's RDMA devices (rdma.Devices)
// and the listeners, datagram sockets and connections the application
// registers with it, under the names it gives them.
//
// The package is named rdmaprom, not prometheus, so that a program can
// import it beside client_golang's prometheus package without renaming
// either; its import path is github.com/goverbs/rdma/metrics/prometheus.
// It is a module of its own, so that the rdma module itself requires no
// Prometheus code.
//
// # Registering
//
// A service registers one Collector per process (a second would report
// the same devices, and the registry refuses it):
//
//	col := rdmaprom.NewCollector()
//	prometheus.MustRegister(col)
//	ln, err := rdma.Listen("rdma", addr)
//	...
//	defer col.AddListener("api", ln)()
//
// Connections come and go, and each is registered when it starts and
// removed when it ends: with an http.Server, ConnState does both,
//
//	srv := &http.Server{Handler: h, ConnState: col.ConnState("api")}
//
// and an accept loop of its own calls AddConn for each connection it
// accepts and the function AddConn returns once it is done with it:
//
//	c, err := ln.Accept()
//	...
//	go func() {
//		defer col.AddConn("api", c)()
//		defer c.Close()
//		serve(c)
//	}()
//
// Registering a connection takes a lock and a map insertion; nothing is
// read from the connection until a scrape. So that a connection whose
// removal is missed (one that failed while its goroutine was stuck, say)
// does not stay among the open ones, ConnClosed gives the library's
// Tracer a function that removes each registered connection once it is
// released:
//
//	col := rdmaprom.NewCollector()
//	lc := rdma.ListenConfig{Tracer: &rdma.Tracer{ConnClosed: col.ConnClosed()}}
//
// # Aggregation
//
// Everything registered under one name is reported as one set of series
// labeled name: the connections of a listener sum into its name's
// counters. A connection's own series would be labeled with its address
// and vanish when it closed, a new time series per connection, which
// costs a Prometheus server memory and queries their meaning; per name,
// the series are as few as the names the application chooses. So that
// a name's counters never go back when connections end, what a removed
// connection (listener, PacketConn) counted stays in its name's totals:
// rdma_conn_written_bytes_total{name="api"} is every byte written on the
// connections registered as "api" while they were registered, the closed
// ones too. Gauges (the open connections, their registered memory)
// count what is registered now. A connection's own counters, for a
// closer look at one, are its Stats.
//
// The series of a name appear when the first listener, PacketConn or
// connection is registered under it (each kind's series with its first)
// and stay for the Collector's life. The devices' series are labeled
// device and are there while rdma.Devices reports the device: while this
// process has connections on it, and half a second after.
//
// To add labels of the process's own (a zone, a role), register the
// Collector with prometheus.WrapRegistererWith.
package rdmaprom
