package main

import (
	"bytes"
	"encoding/xml"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// committed is where the results files that bench/ keeps are, seen from
// this module.
const committed = ".."

// svgText parses an SVG with encoding/xml, which fails on a document
// that is not well formed, and returns its root element's name and the
// text of its <text> elements, one string each.
func svgText(t *testing.T, data []byte) (root string, texts []string) {
	t.Helper()
	dec := xml.NewDecoder(bytes.NewReader(data))
	depth, inText := 0, false
	var cur strings.Builder
	for {
		tok, err := dec.Token()
		if errors.Is(err, io.EOF) {
			break
		}
		require.NoError(t, err)
		switch el := tok.(type) {
		case xml.StartElement:
			if depth == 0 {
				root = el.Name.Local
			}
			depth++
			if el.Name.Local == "text" {
				inText = true
				cur.Reset()
			}
		case xml.EndElement:
			depth--
			if el.Name.Local == "text" {
				inText = false
				texts = append(texts, cur.String())
			}
		case xml.CharData:
			if inText {
				cur.Write(el)
			}
		}
	}
	require.Zero(t, depth, "unclosed elements")
	return root, texts
}

// TestChartsFromCommittedResults draws every chart from the results
// files in bench/ and checks each SVG: well formed, small, with its
// title, its series in the legend and its source in the caption.
func TestChartsFromCommittedResults(t *testing.T) {
	out := t.TempDir()
	var log bytes.Buffer
	require.NoError(t, run(committed, out, &log))
	require.NotContains(t, log.String(), "skipping")

	// Each chart's title first, then its series and axes.
	want := map[string][]string{
		"latency.svg": {"Latency against message size: one-way, half the round trip, as perftest reports it", "this library, p50", "this library, p99",
			"Go TCP, p50", "Go TCP, p99", "perftest (ib_send_lat -R), p50", "perftest (ib_send_lat -R), p99",
			"64 B", "4 KiB", "one-way latency, µs (log scale)"},
		"throughput.svg": {"Streaming throughput against message size, one connection", "this library", "Go TCP", "perftest (ib_send_bw -R)",
			"4 KiB", "64 KiB", "1 MiB", "throughput, MB/s (MB = 10⁶ bytes)"},
		"clients.svg": {"Many clients of one echo server, one 64 B request outstanding on each", "this library (RDMA)", "Go TCP", "requests/s", "p99, ms (log scale)",
			"100", "1,000", "10,000"},
		"datagrams.svg": {"Datagrams sent one way for 2 s, as received at the server, against datagram size", "this library, WriteBatch of 32", "this library, WriteTo",
			"perftest (ib_send_bw -c UD)", "Go UDP, WriteBatch of 32 (sendmmsg)", "Go UDP, WriteTo",
			"64 B", "65507 B"},
	}
	for _, c := range charts {
		t.Run(c.name, func(t *testing.T) {
			path := filepath.Join(out, c.name)
			require.Contains(t, log.String(), "wrote "+path)
			data, err := os.ReadFile(path)
			require.NoError(t, err)
			require.Less(t, len(data), 64<<10, "a chart to commit should stay small")
			root, texts := svgText(t, data)
			require.Equal(t, "svg", root)
			for _, s := range want[c.name] {
				require.Contains(t, texts, s)
			}
			// The caption names the file and the test bed; it wraps, so
			// look in the lines joined.
			caption := strings.Join(texts, " ")
			require.Contains(t, caption, "Source: "+c.input)
			require.Contains(t, caption, "Test bed: ")
			if strings.HasSuffix(c.input, ".json") {
				require.Contains(t, caption, "Soft-RoCE (rdma_rxe)")
			}
		})
	}
}

// TestChartFiguresAreTheMedians checks figures against the committed
// tables that bench/README.md quotes: the charts draw the same medians.
func TestChartFiguresAreTheMedians(t *testing.T) {
	data, err := os.ReadFile(filepath.Join(committed, "results.json"))
	require.NoError(t, err)
	br, err := parseRun(bytes.NewReader(data))
	require.NoError(t, err)
	// results.md: latency 64 B p50 26.9 µs, 1 MiB stream 53.8 MB/s.
	lat := br.series("lat", self, "p50_us")
	require.Equal(t, 64.0, lat[0].x)
	require.InDelta(t, 26.9, lat[0].y, 0.05)
	bw := br.series("bw", self, "mb_s")
	require.Equal(t, float64(1<<20), bw[len(bw)-1].x)
	require.InDelta(t, 53.8, bw[len(bw)-1].y, 0.05)

	data, err = os.ReadFile(filepath.Join(committed, "results-clients.txt"))
	require.NoError(t, err)
	cr, err := parseClients(bytes.NewReader(data))
	require.NoError(t, err)
	// results-clients.md: 1000 connections, RDMA 16203 req/s, p99 104.7 ms.
	rate, p99 := cr.series("rdma")
	require.Equal(t, point{1000, 16203}, point{rate[0].x, float64(int(rate[0].y))})
	require.InDelta(t, 104.7, p99[0].y, 0.05)
}

func copyInput(t *testing.T, dir, name string) {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(committed, name))
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(dir, name), data, 0o644))
}

func TestRunSkipsAbsentOptionalInputs(t *testing.T) {
	in, out := t.TempDir(), t.TempDir()
	copyInput(t, in, "results.json")
	var log bytes.Buffer
	require.NoError(t, run(in, out, &log))
	require.Contains(t, log.String(), "skipping clients.svg: no results-clients.txt")
	require.Contains(t, log.String(), "skipping datagrams.svg: no results-ud.json")
	for _, name := range []string{"latency.svg", "throughput.svg"} {
		require.FileExists(t, filepath.Join(out, name))
	}
	for _, name := range []string{"clients.svg", "datagrams.svg"} {
		require.NoFileExists(t, filepath.Join(out, name))
	}
}

func TestRunFailsWithoutItsRequiredInput(t *testing.T) {
	in, out := t.TempDir(), t.TempDir()
	copyInput(t, in, "results-clients.txt")
	err := run(in, out, io.Discard)
	require.ErrorIs(t, err, os.ErrNotExist)
	require.ErrorContains(t, err, "latency.svg needs")
	require.ErrorContains(t, err, "results.json")
}

func TestRunFailsOnAMalformedInput(t *testing.T) {
	for _, tc := range []struct {
		name, file, content, want string
	}{
		{"required JSON", "results.json", `{"date": "x", `, "results.json: not a results document"},
		{"optional text", "results-clients.txt", "# 2026-11-28T08:20Z\nrdmaperf/rdma clients 64 B x 100 conns: fast\n",
			"results-clients.txt: line 2"},
		{"optional JSON without its rows", "results-ud.json",
			`{"date": "d", "environment": "e", "results": [{"impl": "perftest", "workload": "lat", "metrics": {"p50_us": 1}}]}`,
			"results-ud.json: no recv_msg_s and recv_mb_s of rdmaperf/rdma batch"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in, out := t.TempDir(), t.TempDir()
			copyInput(t, in, "results.json")
			require.NoError(t, os.WriteFile(filepath.Join(in, tc.file), []byte(tc.content), 0o644))
			require.ErrorContains(t, run(in, out, io.Discard), tc.want)
		})
	}
}

// A replaced chart is written whole or not at all: a failed run leaves
// the previous SVG.
func TestRunKeepsTheOldChartOnError(t *testing.T) {
	in, out := t.TempDir(), t.TempDir()
	copyInput(t, in, "results.json")
	require.NoError(t, run(in, out, io.Discard))
	before, err := os.ReadFile(filepath.Join(out, "latency.svg"))
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(in, "results.json"), []byte("{}"), 0o644))
	require.Error(t, run(in, out, io.Discard))
	after, err := os.ReadFile(filepath.Join(out, "latency.svg"))
	require.NoError(t, err)
	require.Equal(t, before, after)
	entries, err := os.ReadDir(out)
	require.NoError(t, err)
	for _, e := range entries {
		require.False(t, strings.HasSuffix(e.Name(), ".tmp"), e.Name())
	}
}
