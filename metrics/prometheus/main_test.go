package rdmaprom_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/goverbs/rdma"
)

var testAddr = os.Getenv("RDMA_TEST_ADDR")

func needDevice(t testing.TB) {
	t.Helper()
	if testAddr == "" {
		t.Skip("no RDMA device: set RDMA_TEST_ADDR to an RDMA interface's IP (make test does, in the VM)")
	}
}

// TestMain checks, once the devices the tests used are let go, that no
// goroutine is left.
func TestMain(m *testing.M) {
	code := m.Run()
	if code == 0 {
		waitDevicesIdle()
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	os.Exit(code)
}

// waitDevicesIdle waits for the devices to be let go: a device stays set
// up, with its goroutines, a while after its last connection closed.
func waitDevicesIdle() {
	for deadline := time.Now().Add(10 * time.Second); len(rdma.Devices()) > 0 && time.Now().Before(deadline); {
		time.Sleep(50 * time.Millisecond)
	}
}

// scraper serves reg's /metrics as a Prometheus server would scrape it:
// over HTTP, in the text format.
type scraper struct {
	t      testing.TB
	srv    *httptest.Server
	client *http.Client
}

func newScraper(t testing.TB, reg *prometheus.Registry) *scraper {
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{ErrorHandling: promhttp.HTTPErrorOnError}))
	s := &scraper{t: t, srv: httptest.NewServer(mux), client: &http.Client{Transport: &http.Transport{}}}
	t.Cleanup(func() {
		s.client.CloseIdleConnections()
		s.srv.Close()
	})
	return s
}

// scrape is one scrape, its families by name.
type scrape map[string]*dto.MetricFamily

func (s *scraper) scrape() scrape {
	s.t.Helper()
	req, err := http.NewRequest("GET", s.srv.URL+"/metrics", nil)
	require.NoError(s.t, err)
	req.Header.Set("Accept", "text/plain; version=0.0.4") // the format a human reads too
	resp, err := s.client.Do(req)
	require.NoError(s.t, err)
	defer resp.Body.Close()
	require.Equal(s.t, http.StatusOK, resp.StatusCode)
	p := expfmt.NewTextParser(model.LegacyValidation)
	fams, err := p.TextToMetricFamilies(resp.Body)
	require.NoError(s.t, err)
	return fams
}

// value is the series of name with exactly these label pairs (name,
// value, name, value...); the test fails if there is none.
func (sc scrape) value(t testing.TB, name string, labels ...string) float64 {
	t.Helper()
	m := sc.find(name, labels...)
	require.NotNil(t, m, "no series %s%v", name, labels)
	switch {
	case m.Counter != nil:
		return m.Counter.GetValue()
	case m.Gauge != nil:
		return m.Gauge.GetValue()
	}
	t.Fatalf("%s%v is neither a counter nor a gauge", name, labels)
	return 0
}

func (sc scrape) has(name string, labels ...string) bool { return sc.find(name, labels...) != nil }

func (sc scrape) find(name string, labels ...string) *dto.Metric {
	f := sc[name]
	if f == nil {
		return nil
	}
	want := map[string]string{}
	for i := 0; i+1 < len(labels); i += 2 {
		want[labels[i]] = labels[i+1]
	}
next:
	for _, m := range f.Metric {
		if len(m.Label) != len(want) {
			continue
		}
		for _, l := range m.Label {
			if v, ok := want[l.GetName()]; !ok || v != l.GetValue() {
				continue next
			}
		}
		return m
	}
	return nil
}

// kind is the family's type, as the scrape's TYPE line gave it.
func (sc scrape) kind(name string) dto.MetricType { return sc[name].GetType() }
