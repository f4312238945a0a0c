// Command plot draws the benchmark results that bench/ keeps as SVG
// charts: latency and throughput against message size (results.json),
// many clients (results-clients.txt) and datagrams (results-ud.json),
// this library beside Go's net and perftest. It charts the files'
// figures only, each the median of its rounds as the tables give it.
//
//	cd bench/plot && go run . -in .. -out ..
//
// A missing or malformed results.json is an error; a chart whose
// optional input is absent is skipped with a note.
package main

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
)

func main() {
	in := flag.String("in", ".", "the directory holding the results files (bench/)")
	out := flag.String("out", ".", "the directory to write the SVG charts to")
	flag.Usage = func() {
		fmt.Fprintf(flag.CommandLine.Output(), "usage: plot [-in DIR] [-out DIR]\n\nDraws the charts of bench/'s results files:\n")
		for _, c := range charts {
			fmt.Fprintf(flag.CommandLine.Output(), "  %s from %s\n", c.name, c.input)
		}
		flag.PrintDefaults()
	}
	flag.Parse()
	if flag.NArg() > 0 {
		flag.Usage()
		os.Exit(2)
	}
	if err := run(*in, *out, os.Stdout); err != nil {
		fmt.Fprintf(os.Stderr, "plot: %v\n", err)
		os.Exit(1)
	}
}

// run draws every chart from the files in in into out, saying on w what
// it wrote and what it left out.
func run(in, out string, w io.Writer) error {
	for _, c := range charts {
		data, err := os.ReadFile(filepath.Join(in, c.input))
		if errors.Is(err, fs.ErrNotExist) && c.optional {
			fmt.Fprintf(w, "plot: skipping %s: no %s in %s\n", c.name, c.input, in)
			continue
		}
		if err != nil {
			return fmt.Errorf("%s needs %w", c.name, err)
		}
		f, notes, err := c.build(c.input, data)
		if err != nil {
			return err
		}
		for _, n := range notes {
			fmt.Fprintf(w, "plot: %s: %s\n", c.name, n)
		}
		path := filepath.Join(out, c.name)
		if err := writeFigure(path, f); err != nil {
			return err
		}
		fmt.Fprintf(w, "plot: wrote %s\n", path)
	}
	return nil
}

// writeFigure replaces path only with a whole chart.
func writeFigure(path string, f *figure) error {
	var b bytes.Buffer
	if err := f.writeSVG(&b); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, b.Bytes(), 0o644); err != nil {
		return err
	}
	if err := os.Rename(tmp, path); err != nil {
		os.Remove(tmp)
		return err
	}
	return nil
}

func parseRunBytes(input string, data []byte) (*benchRun, error) {
	br, err := parseRun(bytes.NewReader(data))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", input, err)
	}
	return br, nil
}
