package rdmaprom_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	rdmaprom "github.com/goverbs/rdma/metrics/prometheus"

	"github.com/goverbs/rdma"
)

// An HTTP service over RDMA whose listener and connections are counted,
// with /metrics served over TCP beside it. Here the service listens on
// loopback with FallbackTCP, so that the example runs without an RDMA
// device; a real one listens on its RDMA interface's address.
func Example() {
	col := rdmaprom.NewCollector()
	reg := prometheus.NewRegistry()
	reg.MustRegister(col)

	lc := rdma.ListenConfig{FallbackTCP: true}
	nl, err := lc.Listen(context.Background(), "rdma", "127.0.0.1:0")
	if err != nil {
		log.Fatal(err)
	}
	ln := nl.(*rdma.Listener)
	defer col.AddListener("api", ln)()
	api := &http.Server{
		Handler:   http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "hello") }),
		ConnState: col.ConnState("api"), // each connection counted while it is open
	}
	go api.Serve(ln)
	defer api.Close()

	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	ml, err := net.Listen("tcp", "127.0.0.1:0") // e.g. ":9100" in a service
	if err != nil {
		log.Fatal(err)
	}
	metrics := &http.Server{Handler: mux}
	go metrics.Serve(ml)
	defer metrics.Close()

	// A request to the service, then a scrape.
	client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	resp, err := client.Get("http://" + ln.Addr().String() + "/")
	if err != nil {
		log.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	resp, err = client.Get("http://" + ml.Addr().String() + "/metrics")
	if err != nil {
		log.Fatal(err)
	}
	defer resp.Body.Close()
	for sc := bufio.NewScanner(resp.Body); sc.Scan(); {
		if strings.HasPrefix(sc.Text(), "rdma_listener_accepted_total") {
			fmt.Println(sc.Text())
		}
	}
	// Output:
	// rdma_listener_accepted_total{name="api",transport="rdma"} 0
	// rdma_listener_accepted_total{name="api",transport="tcp"} 1
}
