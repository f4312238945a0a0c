package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"slices"
)

// benchRun is the document that bench/bench.sh writes (results.json and
// results-<section>.json): every measurement of one run, each round of
// each tool a result of its own. The fields are those of cmd/rdmaperf's
// benchRun; the rest of a result (intervals, counters) is not charted.
type benchRun struct {
	Date        string   `json:"date"`
	Kernel      string   `json:"kernel"`
	Environment string   `json:"environment"`
	Notes       []string `json:"notes"`
	Results     []result `json:"results"`
}

type result struct {
	Impl     string             `json:"impl"`
	Workload string             `json:"workload"`
	Size     int                `json:"size"`
	Conns    int                `json:"conns"`
	Metrics  map[string]float64 `json:"metrics"`
	Error    string             `json:"error"`
	Round    int                `json:"round"`
}

// point is one figure of a series: x the message size (or the number of
// connections), y the median of the rounds.
type point struct{ x, y float64 }

// parseRun reads and checks a results document: a chart's caption needs
// its date and test bed, and every result must say who measured what.
func parseRun(r io.Reader) (*benchRun, error) {
	var br benchRun
	dec := json.NewDecoder(r)
	if err := dec.Decode(&br); err != nil {
		return nil, fmt.Errorf("not a results document: %w", err)
	}
	if dec.More() {
		return nil, errors.New("not a results document: data after the JSON object")
	}
	switch {
	case br.Date == "":
		return nil, errors.New("no date")
	case br.Environment == "":
		return nil, errors.New("no environment (the test bed)")
	case len(br.Results) == 0:
		return nil, errors.New("no results")
	}
	for i, res := range br.Results {
		if res.Impl == "" || res.Workload == "" {
			return nil, fmt.Errorf("result %d: no impl or no workload", i)
		}
		if res.Size < 0 || res.Conns < 0 || res.Round < 0 {
			return nil, fmt.Errorf("result %d (%s %s): negative size, conns or round", i, res.Impl, res.Workload)
		}
		for k, v := range res.Metrics {
			if math.IsNaN(v) || math.IsInf(v, 0) {
				return nil, fmt.Errorf("result %d (%s %s): metric %s is %v", i, res.Impl, res.Workload, k, v)
			}
		}
	}
	return &br, nil
}

// rounds is how many rounds the run had (1 for a run without them).
func (br *benchRun) rounds() int {
	n := 1
	for _, res := range br.Results {
		n = max(n, res.Round)
	}
	return n
}

// series is impl's figures of metric for workload on one connection, one
// point per size, each the median of the rounds that measured it, as
// cmd/rdmaperf -render makes the tables' figures. A result that failed
// is left out, as there. A result's size_b metric, where it has one, is
// the size the tool really sent: perftest's UD sends at most the MTU,
// so its row beside the largest datagrams is measured at 4096 B.
func (br *benchRun) series(workload, impl, metric string) []point {
	bySize := map[float64][]float64{}
	for _, res := range br.Results {
		if res.Workload != workload || res.Impl != impl || res.Error != "" || max(res.Conns, 1) != 1 {
			continue
		}
		v, ok := res.Metrics[metric]
		if !ok {
			continue
		}
		x := float64(res.Size)
		if s, ok := res.Metrics["size_b"]; ok {
			x = s
		}
		bySize[x] = append(bySize[x], v)
	}
	var pts []point
	for x, vs := range bySize {
		pts = append(pts, point{x, median(vs)})
	}
	slices.SortFunc(pts, func(a, b point) int { return cmpFloat(a.x, b.x) })
	return pts
}

// median of vs, which is not empty: the mean of the middle two for an
// even count.
func median(vs []float64) float64 {
	s := slices.Clone(vs)
	slices.Sort(s)
	n := len(s)
	if n%2 == 1 {
		return s[n/2]
	}
	return (s[n/2-1] + s[n/2]) / 2
}

func cmpFloat(a, b float64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}
