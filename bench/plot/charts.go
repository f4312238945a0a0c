package main

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"slices"

	"gonum.org/v1/plot/vg/draw"
)

// chart is one SVG made from one results file.
type chart struct {
	name     string // the SVG's file name
	input    string // the results file it is drawn from
	optional bool   // without its input the chart is skipped, not an error
	build    func(input string, data []byte) (*figure, []string, error)
}

var charts = []chart{
	{"latency.svg", "results.json", false, buildLatency},
	{"throughput.svg", "results.json", false, buildThroughput},
	{"clients.svg", "results-clients.txt", true, buildClients},
	{"datagrams.svg", "results-ud.json", true, buildDatagrams},
}

// The implementations that the charts set side by side, in their
// results' names: this library, Go's net, and the C peers.
const (
	self      = "rdmaperf/rdma"
	selfBatch = "rdmaperf/rdma batch"
	goTCP     = "rdmaperf/tcp"
	goUDP     = "rdmaperf/udp"
	goUDPB    = "rdmaperf/udp batch"
	perftest  = "perftest"
)

var (
	lookSelf      = look{color: blue, shape: draw.CircleGlyph{}}
	lookSelfOther = look{color: purple, shape: draw.RingGlyph{}, dashed: true}
	lookGo        = look{color: orange, shape: draw.SquareGlyph{}}
	lookGoOther   = look{color: red, shape: draw.BoxGlyph{}, dashed: true}
	lookPerftest  = look{color: green, shape: draw.TriangleGlyph{}}
)

// peer is one implementation's series in a chart.
type peer struct {
	impl, name string
	look       look
}

// runCaption names the source, when it ran, how the figures were made
// and the test bed, as the file says.
func runCaption(input string, br *benchRun, more ...string) []string {
	rounds := "one round"
	if n := br.rounds(); n > 1 {
		rounds = fmt.Sprintf("median of %d rounds", n)
	}
	return append([]string{fmt.Sprintf("Source: %s, %s, %s. Test bed: %s.", input, br.Date, rounds, br.Environment)}, more...)
}

func buildLatency(input string, data []byte) (*figure, []string, error) {
	br, err := parseRunBytes(input, data)
	if err != nil {
		return nil, nil, err
	}
	f := newFigure("Latency against message size: one-way, half the round trip, as perftest reports it", 1)
	p := f.panels[0]
	p.logY = true
	p.X.Label.Text = "message size (log scale)"
	p.Y.Label.Text = "one-way latency, µs (log scale)"
	peers := []peer{
		{self, "this library", lookSelf},
		{goTCP, "Go TCP", lookGo},
		{perftest, "perftest (ib_send_lat -R)", lookPerftest},
	}
	var all []point
	var notes []string
	for i, pr := range peers {
		for _, q := range []struct{ metric, label string }{{"p50_us", "p50"}, {"p99_us", "p99"}} {
			pts := br.series("lat", pr.impl, q.metric)
			if len(pts) == 0 {
				if i == 0 && q.label == "p50" {
					return nil, nil, fmt.Errorf("%s: no %s of %s in the latency rows (workload lat)", input, q.metric, pr.impl)
				}
				notes = append(notes, fmt.Sprintf("%s: no %s %s latency: its series is left out", input, pr.impl, q.label))
				continue
			}
			l := pr.look
			l.dashed = q.label == "p99"
			if err := addSeries(p, &f.legend, pr.name+", "+q.label, pts, l); err != nil {
				return nil, nil, err
			}
			all = append(all, pts...)
		}
	}
	if err := axes(p, all, sizeName); err != nil {
		return nil, nil, fmt.Errorf("%s: %w", input, err)
	}
	f.caption = runCaption(input, br, "p99 dashed. perftest's p50 is its t_typical.")
	return f, notes, nil
}

func buildThroughput(input string, data []byte) (*figure, []string, error) {
	br, err := parseRunBytes(input, data)
	if err != nil {
		return nil, nil, err
	}
	f := newFigure("Streaming throughput against message size, one connection", 1)
	p := f.panels[0]
	p.X.Label.Text = "message (Write) size (log scale)"
	p.Y.Label.Text = "throughput, MB/s (MB = 10⁶ bytes)"
	peers := []peer{
		{self, "this library", lookSelf},
		{goTCP, "Go TCP", lookGo},
		{perftest, "perftest (ib_send_bw -R)", lookPerftest},
	}
	var all []point
	var notes []string
	for i, pr := range peers {
		pts := br.series("bw", pr.impl, "mb_s")
		if len(pts) == 0 {
			if i == 0 {
				return nil, nil, fmt.Errorf("%s: no mb_s of %s in the throughput rows (workload bw)", input, pr.impl)
			}
			notes = append(notes, fmt.Sprintf("%s: no %s throughput: its series is left out", input, pr.impl))
			continue
		}
		if err := addSeries(p, &f.legend, pr.name, pts, pr.look); err != nil {
			return nil, nil, err
		}
		all = append(all, pts...)
	}
	if err := axes(p, all, sizeName); err != nil {
		return nil, nil, fmt.Errorf("%s: %w", input, err)
	}
	f.caption = runCaption(input, br)
	return f, notes, nil
}

func buildClients(input string, data []byte) (*figure, []string, error) {
	cr, err := parseClients(bytes.NewReader(data))
	if err != nil {
		return nil, nil, fmt.Errorf("%s: %w", input, err)
	}
	f := newFigure(fmt.Sprintf("Many clients of one echo server, one %d B request outstanding on each", cr.size), 2)
	rateP, p99P := f.panels[0], f.panels[1]
	p99P.logY = true
	rateP.Title.Text = "requests per second"
	rateP.Y.Label.Text = "requests/s"
	p99P.Title.Text = "p99 latency of a request"
	p99P.Y.Label.Text = "p99, ms (log scale)"
	for _, p := range f.panels {
		p.X.Label.Text = "connections (log scale)"
	}
	var rates, p99s []point
	var notes []string
	for _, pr := range []peer{{"rdma", "this library (RDMA)", lookSelf}, {"tcp", "Go TCP", lookGo}} {
		rate, p99 := cr.series(pr.impl)
		if len(rate) == 0 {
			if pr.impl == "rdma" {
				return nil, nil, fmt.Errorf("%s: no rdmaperf/rdma clients lines", input)
			}
			notes = append(notes, fmt.Sprintf("%s: no rdmaperf/%s clients lines: its series is left out", input, pr.impl))
			continue
		}
		if err := addSeries(rateP, &f.legend, pr.name, rate, pr.look); err != nil {
			return nil, nil, err
		}
		if err := addSeries(p99P, nil, pr.name, p99, pr.look); err != nil {
			return nil, nil, err
		}
		rates, p99s = append(rates, rate...), append(p99s, p99...)
	}
	if err := axes(rateP, rates, number); err != nil {
		return nil, nil, fmt.Errorf("%s: %w", input, err)
	}
	if err := axes(p99P, p99s, number); err != nil {
		return nil, nil, fmt.Errorf("%s: %w", input, err)
	}
	if cr.failed > 0 {
		notes = append(notes, fmt.Sprintf("%s: %d failed runs (\"error:\") left out", input, cr.failed))
	}
	rounds := "one round"
	if cr.rounds > 1 {
		rounds = fmt.Sprintf("median of %d rounds", cr.rounds)
	}
	bed := "the Soft-RoCE VM that bench/clients.sh --table runs it in"
	if cr.cpus > 0 {
		bed = fmt.Sprintf("%d CPUs, %s", cr.cpus, bed)
	}
	f.caption = []string{
		fmt.Sprintf("Source: %s, %s, %s. Test bed: %s; both ends in one process (rdmaperf -test clients -local).", input, cr.date, rounds, bed),
	}
	return f, notes, nil
}

func buildDatagrams(input string, data []byte) (*figure, []string, error) {
	br, err := parseRunBytes(input, data)
	if err != nil {
		return nil, nil, err
	}
	f := newFigure("Datagrams sent one way for 2 s, as received at the server, against datagram size", 2)
	rateP, bwP := f.panels[0], f.panels[1]
	rateP.logY, bwP.logY = true, true
	rateP.Title.Text = "datagrams per second"
	rateP.Y.Label.Text = "datagrams/s received (log scale)"
	bwP.Title.Text = "throughput"
	bwP.Y.Label.Text = "MB/s received, MB = 10⁶ bytes (log scale)"
	for _, p := range f.panels {
		p.X.Label.Text = "datagram size (log scale)"
	}
	peers := []peer{
		{selfBatch, "this library, WriteBatch of 32", lookSelf},
		{self, "this library, WriteTo", lookSelfOther},
		{perftest, "perftest (ib_send_bw -c UD)", lookPerftest},
		{goUDPB, "Go UDP, WriteBatch of 32 (sendmmsg)", lookGo},
		{goUDP, "Go UDP, WriteTo", lookGoOther},
	}
	var rates, bws []point
	var notes []string
	var selfMax, perftestMax float64
	for i, pr := range peers {
		// The 64 B rate row and the throughput rows are the same test
		// at different sizes: datagrams one way, counted where they
		// arrive.
		rate := slices.Concat(br.series("dgram-rate", pr.impl, "recv_msg_s"), br.series("dgram-bw", pr.impl, "recv_msg_s"))
		bw := slices.Concat(br.series("dgram-rate", pr.impl, "recv_mb_s"), br.series("dgram-bw", pr.impl, "recv_mb_s"))
		if len(rate) == 0 || len(bw) == 0 {
			if i == 0 {
				return nil, nil, fmt.Errorf("%s: no recv_msg_s and recv_mb_s of %s in the datagram rows (dgram-rate, dgram-bw)", input, pr.impl)
			}
			notes = append(notes, fmt.Sprintf("%s: no %s datagram rate: its series is left out", input, pr.impl))
			continue
		}
		if err := addSeries(rateP, &f.legend, pr.name, rate, pr.look); err != nil {
			return nil, nil, err
		}
		if err := addSeries(bwP, nil, pr.name, bw, pr.look); err != nil {
			return nil, nil, err
		}
		rates, bws = append(rates, rate...), append(bws, bw...)
		switch pr.impl {
		case selfBatch:
			selfMax = rate[len(rate)-1].x
		case perftest:
			perftestMax = rate[len(rate)-1].x
		}
	}
	if err := axes(rateP, rates, sizeName); err != nil {
		return nil, nil, fmt.Errorf("%s: %w", input, err)
	}
	if err := axes(bwP, bws, sizeName); err != nil {
		return nil, nil, fmt.Errorf("%s: %w", input, err)
	}
	var more []string
	if perftestMax > 0 && perftestMax < selfMax {
		more = append(more, fmt.Sprintf("perftest's largest datagram is %.0f B (its UD sends at most the MTU); the others' is %.0f B.",
			perftestMax, selfMax))
	}
	f.caption = runCaption(input, br, more...)
	return f, notes, nil
}

// axes scales p's axes to the points: x log-scaled with a tick at each
// value measured, y log-scaled or linear from 0 as the panel is.
func axes(p *panel, pts []point, xLabel func(float64) string) error {
	if len(pts) == 0 {
		return errors.New("nothing to chart")
	}
	var xs []float64
	lo, hi := math.Inf(1), math.Inf(-1)
	for _, pt := range pts {
		if _, err := p.at(pt); err != nil {
			return err
		}
		xs = append(xs, pt.x)
		lo, hi = min(lo, pt.y), max(hi, pt.y)
	}
	slices.Sort(xs)
	atValues(&p.X, slices.Compact(xs), xLabel)
	if p.logY {
		logAxis(&p.Y, lo, hi)
	} else {
		linearFromZero(&p.Y, hi)
	}
	return nil
}
