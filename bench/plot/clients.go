package main

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"regexp"
	"slices"
	"strconv"
	"strings"
)

// clientsRun is bench/clients.sh's output (results-clients.txt): a
// "# <date>" line, a "clients: N CPUs, ..." line, then per round and
// connection count rdmaperf's summary line for each network.
type clientsRun struct {
	date   string
	cpus   int // 0 where the run did not say
	size   int // the request's size, B
	rounds int
	rows   []clientsRow
	failed int // summaries of runs that failed ("...: error: ..."), left out
}

type clientsRow struct {
	net       string // "rdma" or "tcp"
	conns     int
	reqPerSec float64
	p99us     float64
}

var (
	// rdmaperf -test clients' summary line, as cmd/rdmaperf/clients.go
	// prints it; what follows the p99 is not charted.
	// A single connection's line has no "x N conns".
	clientsLine = regexp.MustCompile(`^rdmaperf/(rdma|tcp) clients (\d+) B(?: x (\d+) conns)?: ([0-9.]+) req/s, p50 ([0-9.]+) µs, p99 ([0-9.]+) µs`)
	failedLine  = regexp.MustCompile(`^rdmaperf/(rdma|tcp) clients \d+ B(?: x \d+ conns)?: error: `)
	cpusLine    = regexp.MustCompile(`^clients: (\d+) CPUs`)
	roundLine   = regexp.MustCompile(`^round (\d+): `)
)

// parseClients reads results-clients.txt. A summary line that does not
// parse is an error, not a row left out: a chart without it would look
// complete.
func parseClients(r io.Reader) (*clientsRun, error) {
	cr := &clientsRun{rounds: 1}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		if n == 1 {
			date, ok := strings.CutPrefix(line, "# ")
			if !ok || strings.TrimSpace(date) == "" {
				return nil, errors.New("line 1: want \"# <date>\" (bench/clients.sh --table writes it)")
			}
			cr.date = strings.TrimSpace(date)
			continue
		}
		if m := cpusLine.FindStringSubmatch(line); m != nil {
			cr.cpus, _ = strconv.Atoi(m[1])
			continue
		}
		if m := roundLine.FindStringSubmatch(line); m != nil {
			k, err := strconv.Atoi(m[1])
			if err != nil {
				return nil, fmt.Errorf("line %d: round %q: %w", n, m[1], err)
			}
			cr.rounds = max(cr.rounds, k)
			continue
		}
		if !strings.HasPrefix(line, "rdmaperf/rdma clients ") && !strings.HasPrefix(line, "rdmaperf/tcp clients ") {
			continue
		}
		if failedLine.MatchString(line) {
			cr.failed++
			continue
		}
		m := clientsLine.FindStringSubmatch(line)
		if m == nil {
			return nil, fmt.Errorf("line %d: a clients summary without its size, connections, req/s, p50 and p99: %q", n, line)
		}
		size, _ := strconv.Atoi(m[2])
		conns := 1
		if m[3] != "" {
			conns, _ = strconv.Atoi(m[3])
		}
		var f [3]float64
		for i, s := range m[4:7] {
			v, err := strconv.ParseFloat(s, 64)
			if err != nil {
				return nil, fmt.Errorf("line %d: %q: %w", n, s, err)
			}
			f[i] = v
		}
		if conns <= 0 || f[0] <= 0 || f[2] <= 0 {
			return nil, fmt.Errorf("line %d: connections, req/s and p99 must be positive: %q", n, line)
		}
		if cr.size != 0 && size != cr.size {
			return nil, fmt.Errorf("line %d: requests of %d B in a run of %d B requests", n, size, cr.size)
		}
		cr.size = size
		cr.rows = append(cr.rows, clientsRow{net: m[1], conns: conns, reqPerSec: f[0], p99us: f[2]})
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if cr.date == "" {
		return nil, errors.New("empty")
	}
	if len(cr.rows) == 0 {
		return nil, errors.New("no rdmaperf clients lines")
	}
	return cr, nil
}

// series is the medians of the rounds for net, per connection count, as
// bench/clients-table.awk makes results-clients.md's: requests/s, and
// the p99 in ms.
func (cr *clientsRun) series(net string) (rate, p99 []point) {
	byConns := map[int][]clientsRow{}
	for _, row := range cr.rows {
		if row.net == net {
			byConns[row.conns] = append(byConns[row.conns], row)
		}
	}
	conns := make([]int, 0, len(byConns))
	for n := range byConns {
		conns = append(conns, n)
	}
	slices.Sort(conns)
	for _, n := range conns {
		var rs, ps []float64
		for _, row := range byConns[n] {
			rs = append(rs, row.reqPerSec)
			ps = append(ps, row.p99us/1000)
		}
		rate = append(rate, point{float64(n), median(rs)})
		p99 = append(p99, point{float64(n), median(ps)})
	}
	return rate, p99
}
