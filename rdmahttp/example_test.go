package rdmahttp_test

import (
	"fmt"
	"net/http"
	"net/http/httptrace"
	"time"

	"github.com/goverbs/rdma"
	"github.com/goverbs/rdma/rdmahttp"
)

// An HTTP client over RDMA whose requests' ClientTrace sees each dial.
func ExampleDialContext() {
	d := &rdma.Dialer{Timeout: 5 * time.Second, FallbackTCP: true}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.DialContext = rdmahttp.DialContext(d)
	tr.MaxIdleConnsPerHost = 64
	client := &http.Client{Transport: tr}

	trace := &httptrace.ClientTrace{
		ConnectDone: func(network, addr string, err error) {
			fmt.Println("connected over", network, "to", addr, "error:", err)
		},
	}
	req, err := http.NewRequest("GET", "http://10.0.0.1:7471/", nil)
	if err != nil {
		return
	}
	req = req.WithContext(httptrace.WithClientTrace(req.Context(), trace))
	if resp, err := client.Do(req); err == nil {
		resp.Body.Close()
	}
}
