package main

import (
	"fmt"
	"image/color"
	"io"
	"math"
	"strconv"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/font"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/text"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgsvg"
)

// A sans-serif face whose metrics match the fonts browsers substitute
// for it (the SVGs name their font and do not embed it, to stay small).
var face = font.Font{Typeface: "Liberation", Variant: "Sans"}

// figure is one SVG: a title, one or more panels side by side sharing a
// legend at their right, and a caption under them naming the source.
type figure struct {
	title   string
	panels  []*panel
	legend  plot.Legend
	caption []string // paragraphs, wrapped to the figure's width
	width   vg.Length
	height  vg.Length
}

func newFigure(title string, panels int) *figure {
	f := &figure{title: title, width: 7.5 * vg.Inch, height: 4.2 * vg.Inch}
	if panels > 1 {
		f.width = 10.5 * vg.Inch
	}
	for range panels {
		p := plot.New()
		p.Title.TextStyle.Font = font.From(face, 11)
		for _, a := range []*plot.Axis{&p.X, &p.Y} {
			a.Label.TextStyle.Font = font.From(face, 10)
			a.Tick.Label.Font = font.From(face, 9)
		}
		p.Add(plotter.NewGrid())
		f.panels = append(f.panels, &panel{Plot: p})
	}
	f.legend = plot.NewLegend()
	f.legend.TextStyle.Font = font.From(face, 10)
	f.legend.Top, f.legend.Left = true, true
	f.legend.Padding = vg.Points(3)
	return f
}

// writeSVG lays the figure out and writes it.
func (f *figure) writeSVG(w io.Writer) error {
	c := vgsvg.New(f.width, f.height)
	dc := draw.New(c)
	dc.SetColor(color.White)
	dc.Fill(dc.Rectangle.Path())

	pad := vg.Points(8)
	area := draw.Crop(dc, pad, -pad, pad, -pad)
	title := textStyle(13, draw.XCenter, draw.YTop)
	area.FillText(title, vg.Point{X: (area.Min.X + area.Max.X) / 2, Y: area.Max.Y}, f.title)
	area = draw.Crop(area, 0, 0, 0, -(title.Height(f.title) + pad))

	caption := textStyle(8, draw.XLeft, draw.YBottom)
	lines := wrap(caption, f.caption, area.Max.X-area.Min.X)
	lineHeight := caption.FontExtents().Height * 1.2
	y := area.Min.Y
	for i := len(lines) - 1; i >= 0; i-- {
		area.FillText(caption, vg.Point{X: area.Min.X, Y: y}, lines[i])
		y += lineHeight
	}
	area = draw.Crop(area, 0, 0, y-area.Min.Y+pad, 0)

	r := f.legend.Rectangle(area)
	legendWidth := r.Max.X - r.Min.X
	f.legend.Draw(draw.Crop(area, area.Max.X-area.Min.X-legendWidth, 0, 0, -pad))
	plots := draw.Crop(area, 0, -(legendWidth + 2*pad), 0, 0)
	tiles := draw.Tiles{Rows: 1, Cols: len(f.panels), PadX: 2 * pad}
	row := make([]*plot.Plot, len(f.panels))
	for i, p := range f.panels {
		row[i] = p.Plot
	}
	for i, tc := range plot.Align([][]*plot.Plot{row}, tiles, plots)[0] {
		row[i].Draw(tc)
	}
	_, err := c.WriteTo(w)
	return err
}

func textStyle(size vg.Length, x text.XAlignment, y text.YAlignment) text.Style {
	return text.Style{Color: color.Black, Font: font.From(face, size), XAlign: x, YAlign: y, Handler: plot.DefaultTextHandler}
}

// wrap breaks each paragraph into lines no wider than width.
func wrap(sty text.Style, paragraphs []string, width vg.Length) []string {
	var lines []string
	for _, para := range paragraphs {
		line := ""
		for _, word := range strings.Fields(para) {
			if line != "" && sty.Width(line+" "+word) > width {
				lines = append(lines, line)
				line = ""
			}
			if line != "" {
				line += " "
			}
			line += word
		}
		if line != "" {
			lines = append(lines, line)
		}
	}
	return lines
}

// panel is a plot whose axes may be log-scaled. Its figures are drawn
// as their logarithms on linear axes, ticks labelled with the figures
// themselves: gonum's LogScale places a long axis label by the
// arithmetic middle of the range and so pads the plot out of shape.
type panel struct {
	*plot.Plot
	logY bool // x is always log-scaled
}

// at maps a figure to where the panel draws it.
func (p *panel) at(pt point) (plotter.XY, error) {
	if pt.x <= 0 || (p.logY && pt.y <= 0) {
		return plotter.XY{}, fmt.Errorf("a figure of %v at %v does not fit a log scale", pt.y, pt.x)
	}
	xy := plotter.XY{X: math.Log10(pt.x), Y: pt.y}
	if p.logY {
		xy.Y = math.Log10(pt.y)
	}
	return xy, nil
}

// look is how a series is drawn: the same implementation looks the same
// in every chart.
type look struct {
	color  color.Color
	shape  draw.GlyphDrawer
	dashed bool
}

// A palette that stays apart for the colour-blind (Okabe and Ito's).
var (
	blue   = color.RGBA{0x00, 0x72, 0xb2, 0xff}
	orange = color.RGBA{0xe6, 0x9f, 0x00, 0xff}
	green  = color.RGBA{0x00, 0x9e, 0x73, 0xff}
	red    = color.RGBA{0xd5, 0x5e, 0x00, 0xff}
	purple = color.RGBA{0xcc, 0x79, 0xa7, 0xff}
)

// addSeries draws pts on p in look l and, if leg is not nil, names it
// there.
func addSeries(p *panel, leg *plot.Legend, name string, pts []point, l look) error {
	xys := make(plotter.XYs, len(pts))
	for i, pt := range pts {
		xy, err := p.at(pt)
		if err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
		xys[i] = xy
	}
	line, dots, err := plotter.NewLinePoints(xys)
	if err != nil {
		return fmt.Errorf("%s: %w", name, err)
	}
	line.Color = l.color
	line.Width = vg.Points(1.5)
	if l.dashed {
		line.Dashes = []vg.Length{vg.Points(5), vg.Points(3)}
	}
	dots.Color = l.color
	dots.Shape = l.shape
	dots.Radius = vg.Points(3)
	p.Add(line, dots)
	if leg != nil {
		leg.Add(name, line, dots)
	}
	return nil
}

// logAxis makes a an axis of the logarithms of [lo, hi], with a margin
// so that no point sits on the frame, and ticks at 1, 2 and 5 times the
// powers of ten (the figures span one to three decades).
func logAxis(a *plot.Axis, lo, hi float64) {
	a.Min, a.Max = math.Log10(lo/1.6), math.Log10(hi*1.6)
	var ticks plot.ConstantTicks
	for e := math.Floor(a.Min); e <= a.Max; e++ {
		for m := 1; m < 10; m++ {
			v := float64(m) * math.Pow(10, e)
			if l := math.Log10(v); l >= a.Min && l <= a.Max {
				t := plot.Tick{Value: l}
				if m == 1 || m == 2 || m == 5 {
					t.Label = number(v)
				}
				ticks = append(ticks, t)
			}
		}
	}
	a.Tick.Marker = ticks
}

// atValues makes a an axis of the logarithms of xs, sorted and not
// empty, with a tick at each labelled by label.
func atValues(a *plot.Axis, xs []float64, label func(float64) string) {
	a.Min, a.Max = math.Log10(xs[0]/1.6), math.Log10(xs[len(xs)-1]*1.6)
	var ticks plot.ConstantTicks
	last := 0.0
	for _, x := range xs {
		// Values within 5 % of the last one labelled (4092 B and
		// perftest's 4096 B) would print over each other.
		if len(ticks) > 0 && x < last*1.05 {
			continue
		}
		ticks = append(ticks, plot.Tick{Value: math.Log10(x), Label: label(x)})
		last = x
	}
	a.Tick.Marker = ticks
}

// linearFromZero makes a linear axis from 0 to a little above hi, its
// labels with thousands separated.
func linearFromZero(a *plot.Axis, hi float64) {
	a.Min, a.Max = 0, hi*1.1
	a.Tick.Marker = plot.TickerFunc(func(min, max float64) []plot.Tick {
		ticks := plot.DefaultTicks{}.Ticks(min, max)
		for i := range ticks {
			if ticks[i].Label != "" {
				ticks[i].Label = number(ticks[i].Value)
			}
		}
		return ticks
	})
}

// number formats a tick's value: thousands separated, no exponent.
func number(v float64) string {
	if v < 1 {
		return strconv.FormatFloat(v, 'g', 3, 64)
	}
	s := strconv.FormatInt(int64(math.Round(v)), 10)
	for i := len(s) - 3; i > 0; i -= 3 {
		s = s[:i] + "," + s[i:]
	}
	return s
}

// sizeName is a message size as the results tables print it.
func sizeName(v float64) string {
	n := int(v)
	switch {
	case n >= 1<<20 && n%(1<<20) == 0:
		return fmt.Sprintf("%d MiB", n>>20)
	case n >= 1<<10 && n%(1<<10) == 0:
		return fmt.Sprintf("%d KiB", n>>10)
	}
	return fmt.Sprintf("%d B", n)
}
