package rdmaprom

import (
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/require"

	"github.com/goverbs/rdma"
)

// The tables against the library's structs: every field is exported, and
// summed where it is a counter, so that a field added to the library's
// stats fails here until it has its metric.

// numbers visits every number of the struct v points to (each element of
// an array), with its path.
func numbers(v reflect.Value, path string, f func(path string, n reflect.Value)) {
	switch v.Kind() {
	case reflect.Struct:
		for i := range v.NumField() {
			numbers(v.Field(i), path+"."+v.Type().Field(i).Name, f)
		}
	case reflect.Array:
		for i := range v.Len() {
			numbers(v.Index(i), path+"["+string(rune('0'+i))+"]", f)
		}
	case reflect.Int, reflect.Int64, reflect.Uint64:
		f(path, v)
	case reflect.String:
	default:
		panic(path + ": a field of a kind the test does not know")
	}
}

func set(n reflect.Value, x int64) {
	if n.Kind() == reflect.Uint64 {
		n.SetUint(uint64(x))
	} else {
		n.SetInt(x)
	}
}

// gaugeFields are the fields that are levels, not counts: never summed
// into a removed member's totals.
var gaugeFields = map[string]bool{".RegisteredBytes": true, ".HalfOpen": true}

func TestSumsEveryCounter(t *testing.T) {
	for _, tc := range []struct {
		name string
		s    any // a pointer to stats with every field set
		sum  func(s any) any
	}{
		{"ConnStats", new(rdma.ConnStats), func(s any) any {
			var sum rdma.ConnStats
			addConn(&sum, *s.(*rdma.ConnStats))
			return &sum
		}},
		{"ListenerStats", new(rdma.ListenerStats), func(s any) any {
			var sum rdma.ListenerStats
			addListener(&sum, *s.(*rdma.ListenerStats))
			return &sum
		}},
		{"PacketStats", new(rdma.PacketStats), func(s any) any {
			var sum rdma.PacketStats
			addPacket(&sum, *s.(*rdma.PacketStats))
			return &sum
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			x := int64(1)
			numbers(reflect.ValueOf(tc.s).Elem(), "", func(_ string, n reflect.Value) { x++; set(n, x) })
			sum := reflect.ValueOf(tc.sum(tc.s)).Elem()
			numbers(reflect.ValueOf(tc.s).Elem(), "", func(path string, n reflect.Value) {
				got := sum.FieldByName(strings.TrimPrefix(strings.SplitN(path, "[", 2)[0], "."))
				if strings.Contains(path, "[") {
					return // arrays: checked whole below
				}
				if gaugeFields[path] {
					require.True(t, got.IsZero(), "%s is a gauge: a removed member's is not kept", path)
				} else {
					require.Equal(t, n.Interface(), got.Interface(), "%s is summed", path)
				}
			})
			if f := sum.FieldByName("Refused"); f.IsValid() {
				require.Equal(t, reflect.ValueOf(tc.s).Elem().FieldByName("Refused").Interface(), f.Interface())
			}
		})
	}
}

// values collects what collect sends for these devices and snapshots:
// each series' value, by name and labels.
func values(t *testing.T, devs []rdma.DeviceStats, snaps []snapshot) map[string]float64 {
	ch := make(chan prometheus.Metric)
	go func() {
		collect(ch, devs, snaps)
		close(ch)
	}()
	got := map[string]float64{}
	for m := range ch {
		var pb dto.Metric
		require.NoError(t, m.Write(&pb))
		key := m.Desc().String()
		for _, l := range pb.Label {
			key += " " + l.GetName() + "=" + l.GetValue()
		}
		got[key] = pb.GetCounter().GetValue() + pb.GetGauge().GetValue()
	}
	return got
}

// TestExportsEveryField sets one field at a time to a value of its own
// and finds it in exactly one series.
func TestExportsEveryField(t *testing.T) {
	const v = 7919
	for _, tc := range []struct {
		name  string
		stats func() (any, func() ([]rdma.DeviceStats, []snapshot))
	}{
		{"DeviceStats", func() (any, func() ([]rdma.DeviceStats, []snapshot)) {
			d := &rdma.DeviceStats{Name: "rxe0"}
			return d, func() ([]rdma.DeviceStats, []snapshot) { return []rdma.DeviceStats{*d}, nil }
		}},
		{"ConnStats", func() (any, func() ([]rdma.DeviceStats, []snapshot)) {
			s := &snapshot{name: "a", hasConn: true}
			return &s.conn, func() ([]rdma.DeviceStats, []snapshot) { return nil, []snapshot{*s} }
		}},
		{"ListenerStats", func() (any, func() ([]rdma.DeviceStats, []snapshot)) {
			s := &snapshot{name: "a", hasListener: true}
			return &s.listener, func() ([]rdma.DeviceStats, []snapshot) { return nil, []snapshot{*s} }
		}},
		{"PacketStats", func() (any, func() ([]rdma.DeviceStats, []snapshot)) {
			s := &snapshot{name: "a", hasPacket: true}
			return &s.packet, func() ([]rdma.DeviceStats, []snapshot) { return nil, []snapshot{*s} }
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, _ := tc.stats()
			var paths []string
			numbers(reflect.ValueOf(s).Elem(), "", func(path string, _ reflect.Value) { paths = append(paths, path) })
			for _, path := range paths {
				s, get := tc.stats()
				numbers(reflect.ValueOf(s).Elem(), "", func(p string, n reflect.Value) {
					if p != path {
						return
					}
					if n.Type() == reflect.TypeFor[time.Duration]() {
						set(n, v*int64(time.Second)) // exported in seconds
					} else {
						set(n, v)
					}
				})
				var found []string
				devs, snaps := get()
				for k, x := range values(t, devs, snaps) {
					if x == v {
						found = append(found, k)
					}
				}
				require.Len(t, found, 1, "%s%s is exported, once", tc.name, path)
			}
		})
	}
}

// TestLintEveryFamily lints one of every series, the devices' too, and
// checks that a family is a counter exactly when its name says so.
func TestLintEveryFamily(t *testing.T) {
	devs := []rdma.DeviceStats{{Name: "rxe0", Connections: 2, CQEntries: 216, CompletionQueues: 1, RegisteredBytes: 65536, ActiveMTU: 1024}}
	snaps := []snapshot{{name: "api", hasListener: true, hasPacket: true, hasConn: true}}
	reg := prometheus.NewPedanticRegistry()
	require.NoError(t, reg.Register(prometheus.CollectorFunc(func(ch chan<- prometheus.Metric) { collect(ch, devs, snaps) })))
	problems, err := testutil.GatherAndLint(reg)
	require.NoError(t, err)
	require.Empty(t, problems)

	fams, err := reg.Gather()
	require.NoError(t, err)
	var c Collector
	descs := make(chan *prometheus.Desc)
	go func() {
		c.Describe(descs)
		close(descs)
	}()
	described := 0
	for range descs {
		described++
	}
	require.Len(t, fams, described, "one of every family Describe promises")
	for _, f := range fams {
		require.True(t, strings.HasPrefix(f.GetName(), "rdma_"), f.GetName())
		if strings.HasSuffix(f.GetName(), "_total") {
			require.Equal(t, dto.MetricType_COUNTER, f.GetType(), f.GetName())
		} else {
			require.Equal(t, dto.MetricType_GAUGE, f.GetType(), f.GetName())
		}
	}
}

func TestRefuseReasons(t *testing.T) {
	require.Len(t, refuseReasons, int(rdma.NumRefuseReasons), "a label for every reason")
	seen := map[string]bool{}
	for r := range rdma.NumRefuseReasons {
		l := refuseReason(r)
		require.NotEmpty(t, l)
		require.False(t, seen[l], "%q twice", l)
		seen[l] = true
	}
	require.Equal(t, "reason_200", refuseReason(200))
}
