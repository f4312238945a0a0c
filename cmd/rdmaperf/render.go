package main

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"slices"
	"strings"
)

// benchRun is the JSON document bench/run.sh prints: this tool's results
// and the peer tools' results, from one run on one machine.
type benchRun struct {
	Date        string   `json:"date"`
	Kernel      string   `json:"kernel"`
	Environment string   `json:"environment"`
	Notes       []string `json:"notes,omitempty"`
	Results     []Result `json:"results"`
}

// self is this library in its default (adaptive) poll mode, busy the
// same with -poll busy.
const (
	self = "rdmaperf/rdma"
	busy = "rdmaperf/rdma busy"
	// oneProc is this library with both ends in one process (bench/run.sh
	// run_rdmaperf_oneproc), as a Go user's own test would run it.
	oneProc = "rdmaperf/rdma one process"
	// The object store example's PUT and GET (bench/run.sh's
	// objstore-put and objstore-get rows): by token, with HTTP bodies
	// over the same RDMA connection, and with HTTP bodies over Go TCP.
	objToken = "objectstore token"
	objBody  = "objectstore body"
	objTCP   = "objectstore body tcp"
)

// Columns of the table, in order. The ratio columns compare this library
// with the peers that measure the same thing the same way: the default
// mode with each peer, and busy polling with busy-polling perftest.
var (
	columns = []struct{ impl, title string }{
		{self, "this library"},
		{busy, "this library, busy poll"},
		{oneProc, "this library, one process"},
		{"rdmaperf/tcp", "Go TCP"},
		{"perftest", "perftest"},
		{"perftest -e", "perftest -e"},
		{"rsockets", "rsockets"},
		{"cmtime", "cmtime"},
		{"postrate", "its post pattern in C"},
		{self + " plain", "this library, plain io.Copy"},
		{objToken, "object store by token"},
		{objBody, "object store, HTTP bodies"},
		{objTCP, "object store, HTTP bodies over Go TCP"},
	}
	ratios = []struct{ mine, peer, title string }{
		{self, "perftest", "÷ perftest"},
		{self, "perftest -e", "÷ perftest -e"},
		{self, "rsockets", "÷ rsockets"},
		{self, "cmtime", "÷ cmtime"},
		{self, "postrate", "÷ its pattern in C"},
		{busy, "perftest", "busy ÷ perftest"},
		{oneProc, "perftest", "one process ÷ perftest"},
		{oneProc, "rsockets", "one process ÷ rsockets"},
		{self, self + " plain", "÷ plain io.Copy"},
		{objToken, "perftest", "token ÷ perftest"},
		{objToken, objTCP, "token ÷ bodies over TCP"},
	}
)

// metric is one row's figure for a workload.
type metric struct{ key, label string }

// perMsg are the figures -stats adds (this library's only): the client
// process's cgo calls and ibv_post_send calls per message it sent (for a
// round trip, per round trip).
var perMsg = []metric{{"cgo_per_msg", "cgo calls per message sent (client process)"}, {"posts_per_msg", "ibv_post_send per message sent"}}

var metricsOf = map[string][]metric{
	"lat":              append([]metric{{"p50_us", "p50 µs"}, {"p99_us", "p99 µs"}, {"avg_us", "avg µs"}}, perMsg...),
	"bw":               append([]metric{{"mb_s", "MB/s"}}, perMsg...),
	"rate":             append([]metric{{"msg_s", "msg/s"}}, perMsg...),
	"rate-msg":         append([]metric{{"msg_s", "msg/s"}}, perMsg...),
	"rate-msg-nodelay": append([]metric{{"msg_s", "msg/s"}}, perMsg...),
	"idle":             {{"cpu_s", "CPU s"}, {"reg_kib", "registered KiB per connection"}},
	"copy":             {{"mb_s", "MB/s"}, {"cpu_s", "CPU s"}},
	// setup is the connection's establishment alone (rdmaperf: until the
	// last Dial returned), what cmtime's steps up to connect add up to.
	"dial":      {{"p50_us", "p50 µs"}, {"p99_us", "p99 µs"}, {"conn_s", "conn/s"}, {"setup_us", "setup p50 µs"}},
	"http":      {{"req_s", "req/s"}, {"p50_us", "p50 µs"}, {"p99_us", "p99 µs"}},
	"http-kept": {{"req_s", "req/s"}, {"p50_us", "p50 µs"}, {"p99_us", "p99 µs"}},
	// Many clients: the rate, the latency, what a request costs, and the
	// spread of requests per connection (fairness).
	"clients": {{"req_s", "req/s"}, {"p50_us", "p50 µs"}, {"p99_us", "p99 µs"}, {"cpu_us_per_req", "CPU µs per request"},
		{"min_req", "fewest requests of a connection"}, {"median_req", "median requests of a connection"}, {"max_req", "most requests of a connection"},
		{"starved", "connections under half the median"}, {"dial_s", "dial all, s"}, {"close_s", "close all, s"}},
	// One-sided, against ib_write_lat, ib_read_lat, ib_write_bw and
	// ib_read_bw (-R).
	"write-lat": {{"p50_us", "p50 µs"}, {"p99_us", "p99 µs"}, {"avg_us", "avg µs"}},
	"read-lat":  {{"p50_us", "p50 µs"}, {"p99_us", "p99 µs"}, {"avg_us", "avg µs"}},
	"write-bw":  {{"mb_s", "MB/s"}},
	"read-bw":   {{"mb_s", "MB/s"}},
	// The object store example, against ib_read_bw (PUT: the server
	// READs) and ib_write_bw (GET) of the object's size.
	"objstore-put": {{"mb_s", "MB/s"}},
	"objstore-get": {{"mb_s", "MB/s"}},
	// Remote atomics, against ib_atomic_lat and ib_atomic_bw (-R).
	"atomic-lat":  {{"p50_us", "p50 µs"}, {"p99_us", "p99 µs"}, {"avg_us", "avg µs"}},
	"atomic-rate": {{"msg_s", "msg/s"}},
	// Datagrams: what the sender sent, and what arrived at the receiver.
	"dgram-lat":  {{"p50_us", "p50 µs"}, {"p99_us", "p99 µs"}, {"avg_us", "avg µs"}, {"lost", "round trips lost"}},
	"dgram-rate": {{"recv_msg_s", "msg/s received"}, {"msg_s", "msg/s sent"}, {"loss_pct", "% lost"}},
	"dgram-bw":   {{"recv_mb_s", "MB/s received"}, {"mb_s", "MB/s sent"}, {"loss_pct", "% lost"}},
}

var workloadNames = map[string]string{
	"lat":              "latency (one-way)",
	"bw":               "throughput",
	"rate":             "message rate, Writes gathered while the peer is behind (not one message per Write)",
	"rate-msg":         "message rate, one message per Write (Options.Messages; Writes while the peer is behind share a post)",
	"rate-msg-nodelay": "message rate, one message and one post per Write (Options.Messages, SetNoDelay(true))",
	"idle":             "idle connection",
	"copy":             "io.Copy file → conn → io.Discard",
	"dial":             "dial + round trip + close",
	"http":             "HTTP/1.1 GET, http.DefaultTransport (2 idle connections kept: most requests dial)",
	"http-kept":        "HTTP/1.1 GET, the README's Transport (an idle connection kept per client)",
	"clients":          "many clients, one request outstanding each, against one echo server",
	"write-lat":        "one-sided WRITE latency (one-way)",
	"read-lat":         "one-sided READ latency",
	"write-bw":         "one-sided WRITE throughput",
	"read-bw":          "one-sided READ throughput",
	"objstore-put":     "object store PUT (examples/objectstore; perftest: ib_read_bw)",
	"objstore-get":     "object store GET (examples/objectstore; perftest: ib_write_bw)",
	"atomic-lat":       "remote atomic (fetch-and-add) latency",
	"atomic-rate":      "remote atomic (fetch-and-add) rate, 16 in flight",
	"dgram-lat":        "datagram latency (one-way)",
	"dgram-rate":       "datagram rate",
	"dgram-bw":         "datagram throughput",
}

// The datagram rows have a table of their own: this library's PacketConn
// beside perftest over UD (ib_send_lat, ib_send_bw -c UD) and Go's UDP.
const (
	selfBatch = self + " batch"
	udp       = "rdmaperf/udp"
	udpBatch  = udp + " batch"
)

var (
	dgramColumns = []struct{ impl, title string }{
		{self, "this library, WriteTo"},
		{selfBatch, "this library, WriteBatch"},
		{oneProc, "this library, one process"},
		{selfBatch + " one process", "this library, WriteBatch, one process"},
		{"perftest", "perftest -c UD"},
		{udp, "Go UDP"},
		{udpBatch, "Go UDP, WriteBatch"},
	}
	dgramRatios = []struct{ mine, peer, title string }{
		{self, "perftest", "÷ perftest"},
		{self, udp, "÷ Go UDP"},
		{selfBatch, "perftest", "WriteBatch ÷ perftest"},
		{selfBatch, udp, "WriteBatch ÷ Go UDP"},
		{selfBatch, udpBatch, "WriteBatch ÷ Go UDP WriteBatch"},
		{oneProc, "perftest", "one process ÷ perftest"},
		{selfBatch + " one process", "perftest", "WriteBatch, one process ÷ perftest"},
	}
)

// dgramGoals are the datagram rows' goals: a ratio of this library's
// figure to a peer's, at most or at least a bound.
var dgramGoals = []struct {
	what          string
	key           rowKey
	mine, metric  string
	peers         []string // the goal holds against each
	bound         float64
	atMost, below bool // atMost: ratio ≤ bound; below: ratio < bound; else ratio ≥ bound
}{
	{"64 B round trip p50 ≤ 1.3× ib_send_lat -c UD", rowKey{"dgram-lat", 64, 1}, self, "p50_us", []string{"perftest"}, 1.3, true, false},
	{"64 B round trip p50 below Go UDP's", rowKey{"dgram-lat", 64, 1}, self, "p50_us", []string{udp}, 1, false, true},
	{"64 B rate with WriteBatch (received) ≥ 0.8× ib_send_bw -c UD", rowKey{"dgram-rate", 64, 1}, selfBatch, "recv_msg_s", []string{"perftest"}, 0.8, false, false},
	{"64 B rate with WriteBatch (received) ≥ Go UDP's, WriteTo and WriteBatch", rowKey{"dgram-rate", 64, 1}, selfBatch, "recv_msg_s", []string{udp, udpBatch}, 1, false, false},
	{"largest datagrams (received) ≥ 0.8× the bytes/s of ib_send_bw -c UD at the MTU", rowKey{"dgram-bw", maxDatagram, 1}, selfBatch, "recv_mb_s", []string{"perftest"}, 0.8, false, false},
}

func renderFile(w io.Writer, path string) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	var br benchRun
	if err := json.Unmarshal(b, &br); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	renderMarkdown(w, &br)
	return nil
}

// rowKey identifies the results that belong in one group of rows.
type rowKey struct {
	workload    string
	size, conns int
}

func renderMarkdown(w io.Writer, br *benchRun) {
	fmt.Fprintf(w, "# rdma benchmark\n\n")
	fmt.Fprintf(w, "- Date (UTC): %s\n- Kernel: %s\n- %s\n\n", br.Date, br.Kernel, br.Environment)

	// Rows appear in the order run.sh measured them. run.sh repeats every
	// test in rounds, interleaving the tools, and each figure is the median
	// of an impl's successful rounds: in an emulated VM a single run can be
	// off by an order of magnitude (a missed scheduler tick), and the
	// median of interleaved rounds keeps one such run from setting a ratio.
	var keys []rowKey
	runs := map[rowKey]map[string][]map[string]float64{}
	byRound := map[rowKey]map[string]map[int]map[string]float64{}
	rounds := 0
	for _, r := range br.Results {
		rounds = max(rounds, r.Round)
		if r.Error != "" {
			continue
		}
		k := rowKey{r.Workload, r.Size, max(r.Conns, 1)}
		if runs[k] == nil {
			runs[k] = map[string][]map[string]float64{}
			keys = append(keys, k)
		}
		runs[k][r.Impl] = append(runs[k][r.Impl], r.Metrics)
		if r.Round > 0 {
			if byRound[k] == nil {
				byRound[k] = map[string]map[int]map[string]float64{}
			}
			if byRound[k][r.Impl] == nil {
				byRound[k][r.Impl] = map[int]map[string]float64{}
			}
			byRound[k][r.Impl][r.Round] = r.Metrics
		}
	}
	// ratio compares two impls the way the machine allows: the median of
	// their per-round ratios (run.sh measures them back to back within a
	// round, so a slow or fast spell of the emulated machine hits both
	// alike), or, without rounds in common, the ratio of their medians.
	ratio := func(k rowKey, mine, peer, metric string) (float64, bool) {
		var rs []float64
		for round, m := range byRound[k][mine] {
			a, okA := m[metric]
			b, okB := byRound[k][peer][round][metric]
			if okA && okB && b != 0 {
				rs = append(rs, a/b)
			}
		}
		if len(rs) > 0 {
			return median(rs)
		}
		a, okA := figure0(runs, k, mine, metric)
		b, okB := figure0(runs, k, peer, metric)
		if !okA || !okB || b == 0 {
			return 0, false
		}
		return a / b, true
	}
	figure := func(k rowKey, impl, metric string) (float64, bool) { return figure0(runs, k, impl, metric) }

	var streams, dgrams []rowKey
	for _, k := range keys {
		if isDgram(k.workload) {
			dgrams = append(dgrams, k)
		} else {
			streams = append(streams, k)
		}
	}
	table := func(keys []rowKey, columns []struct{ impl, title string }, ratios []struct{ mine, peer, title string }) {
		head := []string{"workload", "figure"}
		for _, c := range columns {
			head = append(head, c.title)
		}
		for _, r := range ratios {
			head = append(head, r.title)
		}
		fmt.Fprintf(w, "| %s |\n", strings.Join(head, " | "))
		fmt.Fprintf(w, "|%s\n", strings.Repeat(" --- |", len(head)))
		for _, k := range keys {
			tableRows(w, k, columns, ratios, figure, ratio)
		}
	}
	if len(streams) > 0 || len(dgrams) == 0 {
		// Only the one-sided section measures the object store: the
		// other tables go without its columns.
		absent := func(impl string) bool { return strings.HasPrefix(impl, "objectstore") && !hasImpl(runs, impl) }
		cols := slices.DeleteFunc(slices.Clone(columns), func(c struct{ impl, title string }) bool { return absent(c.impl) })
		rats := slices.DeleteFunc(slices.Clone(ratios), func(r struct{ mine, peer, title string }) bool { return absent(r.mine) || absent(r.peer) })
		table(streams, cols, rats)
	}
	if len(dgrams) > 0 {
		if len(streams) > 0 {
			fmt.Fprintf(w, "\n## Datagrams\n\n")
		}
		table(dgrams, dgramColumns, dgramRatios)
		fmt.Fprintf(w, "\nGoals (ratios as in the table: the median of the per-round ratios):\n\n")
		fmt.Fprintf(w, "| goal | ratio | met |\n| --- | --- | --- |\n")
		for _, g := range dgramGoals {
			var rs []string
			met, have := true, false
			for _, p := range g.peers {
				v, ok := ratio(g.key, g.mine, p, g.metric)
				if !ok {
					met = false
					rs = append(rs, "— ("+p+")")
					continue
				}
				have = true
				rs = append(rs, fmt.Sprintf("%.2f", v))
				switch {
				case g.atMost:
					met = met && v <= g.bound
				case g.below:
					met = met && v < g.bound
				default:
					met = met && v >= g.bound
				}
			}
			verdict := "no"
			switch {
			case !have:
				verdict = "not measured"
			case met:
				verdict = "yes"
			}
			fmt.Fprintf(w, "| %s | %s | %s |\n", g.what, strings.Join(rs, ", "), verdict)
		}
	}
	fmt.Fprintf(w, "\nRatios are this library's figure divided by the peer's: above 1 is slower for "+
		"latency and times (µs), below 1 is slower for throughput and rates (per second).")
	if rounds > 1 {
		fmt.Fprintf(w, " Each figure is the median of up to %d rounds; each ratio is the median of the "+
			"ratios within a round (the tools of a round run back to back), so it need not equal "+
			"the ratio of the figures.", rounds)
	}
	fmt.Fprintln(w)

	if notes := unique(br.Notes); len(notes) > 0 {
		fmt.Fprintf(w, "\n## Notes\n\n")
		for _, n := range notes {
			fmt.Fprintf(w, "- %s\n", n)
		}
	}
	var problems []string
	for _, r := range br.Results {
		if r.Error != "" {
			where := rowName(rowKey{r.Workload, r.Size, max(r.Conns, 1)})
			if r.Round > 0 {
				where += fmt.Sprintf(" (round %d)", r.Round)
			}
			problems = append(problems, fmt.Sprintf("%s, %s: %s", r.Impl, where, strings.TrimSpace(r.Error)))
		}
	}
	if len(problems) > 0 {
		fmt.Fprintf(w, "\n## Failed measurements\n\n")
		for _, p := range problems {
			fmt.Fprintf(w, "- %s\n", p)
		}
	}
}

// tableRows prints a row group's rows: each metric of its workload that
// some column has, the columns' figures and the ratios.
func tableRows(w io.Writer, k rowKey, columns []struct{ impl, title string }, ratios []struct{ mine, peer, title string },
	figure func(rowKey, string, string) (float64, bool), ratio func(rowKey, string, string, string) (float64, bool)) {
	for _, m := range metricsOf[k.workload] {
		cells := []string{rowName(k), m.label}
		have := false
		for _, c := range columns {
			v, ok := figure(k, c.impl, m.key)
			cells = append(cells, cell(v, ok))
			have = have || ok
		}
		if !have {
			continue
		}
		for _, r := range ratios {
			v, ok := ratio(k, r.mine, r.peer, m.key)
			// Losses are counted, not compared: a ratio of them says nothing.
			if !ok || m.key == "loss_pct" || m.key == "lost" {
				cells = append(cells, "")
				continue
			}
			cells = append(cells, fmt.Sprintf("%.2f", v))
		}
		fmt.Fprintf(w, "| %s |\n", strings.Join(cells, " | "))
	}
}

func rowName(k rowKey) string {
	name := workloadNames[k.workload]
	if name == "" {
		name = k.workload
	}
	// An idle connection moves nothing; a dial's round trip is the test
	// header and one byte back.
	if k.workload != "idle" && k.workload != "dial" {
		name += " " + sizeName(k.size)
	}
	if k.conns > 1 {
		name += fmt.Sprintf(", %d conns", k.conns)
	}
	return name
}

func sizeName(n int) string {
	switch {
	case n >= 1<<20 && n%(1<<20) == 0:
		return fmt.Sprintf("%d MiB", n>>20)
	case n >= 1<<10 && n%(1<<10) == 0:
		return fmt.Sprintf("%d KiB", n>>10)
	}
	return fmt.Sprintf("%d B", n)
}

// cell formats a figure to about three significant digits: more would be
// noise in an emulated VM.
func cell(v float64, ok bool) string {
	if !ok {
		return "—"
	}
	a := math.Abs(v)
	switch {
	case a >= 100:
		return fmt.Sprintf("%.0f", v)
	case a >= 10:
		return fmt.Sprintf("%.1f", v)
	case a >= 1:
		return fmt.Sprintf("%.2f", v)
	case a == 0:
		return "0"
	}
	return fmt.Sprintf("%.3f", v)
}

// figure0 is the median of an impl's figures for a row.
func figure0(runs map[rowKey]map[string][]map[string]float64, k rowKey, impl, metric string) (float64, bool) {
	var vs []float64
	for _, m := range runs[k][impl] {
		if v, ok := m[metric]; ok {
			vs = append(vs, v)
		}
	}
	return median(vs)
}

// median of vs (the mean of the middle two for an even count); false if
// there are none.
func median(vs []float64) (float64, bool) {
	if len(vs) == 0 {
		return 0, false
	}
	slices.Sort(vs)
	n := len(vs)
	if n%2 == 1 {
		return vs[n/2], true
	}
	return (vs[n/2-1] + vs[n/2]) / 2, true
}

// unique drops repeated lines, keeping the first occurrence's place.
func unique(ss []string) []string {
	seen := map[string]bool{}
	var out []string
	for _, s := range ss {
		if !seen[s] {
			seen[s] = true
			out = append(out, s)
		}
	}
	return out
}

// hasImpl reports whether any row has a figure of impl.
func hasImpl(runs map[rowKey]map[string][]map[string]float64, impl string) bool {
	for _, byImpl := range runs {
		if len(byImpl[impl]) > 0 {
			return true
		}
	}
	return false
}
