package main

import (
	"bytes"
	"fmt"
	"html"
	"math"
)

// palette colours the policies in the order they ran.
var palette = []string{"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"}

// plotSVG draws three panels: hit ratio per policy, TTFT p50 and p90 per
// policy, and the load spread (busiest worker's prefill over the mean)
// over time, one line per policy. Hand-written SVG: no dependency, and
// the same report gives the same bytes.
func plotSVG(rep *report) []byte {
	const w, panelH, left, barH = 900, 260, 170, 18
	n := len(rep.Results)
	barsH := 40 + n*(barH+6)
	height := 2*barsH + panelH + 120
	var b bytes.Buffer
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" font-family="sans-serif" font-size="12">`+"\n", w, height)
	fmt.Fprintf(&b, `<rect width="%d" height="%d" fill="white"/>`+"\n", w, height)
	colour := func(i int) string { return palette[i%len(palette)] }
	label := func(i int) string { return html.EscapeString(rep.Results[i].Policy) }

	// Panel 1: hit ratio.
	y0 := 10
	fmt.Fprintf(&b, `<text x="10" y="%d" font-weight="bold">Prefix hit ratio (prompt tokens found cached by the engine)</text>`+"\n", y0+14)
	for i, r := range rep.Results {
		y := y0 + 30 + i*(barH+6)
		bw := r.HitRatio * float64(w-left-80)
		fmt.Fprintf(&b, `<text x="%d" y="%d" text-anchor="end">%s</text>`, left-8, y+13, label(i))
		fmt.Fprintf(&b, `<rect x="%d" y="%d" width="%.1f" height="%d" fill="%s"/>`, left, y, bw, barH, colour(i))
		fmt.Fprintf(&b, `<text x="%.1f" y="%d">%.4f</text>`+"\n", float64(left)+bw+4, y+13, r.HitRatio)
	}

	// Panel 2: TTFT, log scale.
	y0 += barsH
	fmt.Fprintf(&b, `<text x="10" y="%d" font-weight="bold">Time to first token, p50 (bar) and p90 (tick), seconds, log scale</text>`+"\n", y0+14)
	lo, hi := math.Inf(1), 0.0
	for _, r := range rep.Results {
		for _, v := range []float64{r.TTFTP50, r.TTFTP90} {
			if v > 0 {
				lo, hi = math.Min(lo, v), math.Max(hi, v)
			}
		}
	}
	if hi == 0 {
		lo, hi = 0.001, 1
	}
	lo, hi = math.Pow(10, math.Floor(math.Log10(lo))), math.Pow(10, math.Ceil(math.Log10(hi)))
	if hi <= lo {
		hi = lo * 10
	}
	scale := func(v float64) float64 {
		if v <= lo {
			return 0
		}
		return (math.Log10(v) - math.Log10(lo)) / (math.Log10(hi) - math.Log10(lo)) * float64(w-left-80)
	}
	for i, r := range rep.Results {
		y := y0 + 30 + i*(barH+6)
		fmt.Fprintf(&b, `<text x="%d" y="%d" text-anchor="end">%s</text>`, left-8, y+13, label(i))
		fmt.Fprintf(&b, `<rect x="%d" y="%d" width="%.1f" height="%d" fill="%s"/>`, left, y, scale(r.TTFTP50), barH, colour(i))
		x90 := float64(left) + scale(r.TTFTP90)
		fmt.Fprintf(&b, `<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="black" stroke-width="2"/>`, x90, y-2, x90, y+barH+2)
		fmt.Fprintf(&b, `<text x="%.1f" y="%d">%.3g / %.3g</text>`+"\n", x90+6, y+13, r.TTFTP50, r.TTFTP90)
	}
	fmt.Fprintf(&b, `<text x="%d" y="%d">%g s … %g s</text>`+"\n", left, y0+30+n*(barH+6)+10, lo, hi)

	// Panel 3: load spread over time.
	y0 += barsH + 20
	fmt.Fprintf(&b, `<text x="10" y="%d" font-weight="bold">Load spread: busiest worker's prefill tokens over the mean, per time bucket</text>`+"\n", y0+14)
	top := 1.0
	var t0, t1 float64
	first := true
	for _, r := range rep.Results {
		for _, p := range r.LoadSpread {
			top = math.Max(top, p.MaxOverMean)
			if first || p.T < t0 {
				t0 = p.T
			}
			if first || p.T > t1 {
				t1 = p.T
			}
			first = false
		}
	}
	top = math.Ceil(top)
	px, py, pw, ph := float64(left), float64(y0+30), float64(w-left-80), float64(panelH-60)
	fmt.Fprintf(&b, `<rect x="%.0f" y="%.0f" width="%.0f" height="%.0f" fill="none" stroke="#999"/>`+"\n", px, py, pw, ph)
	for k := 0.0; k <= top; k++ {
		yy := py + ph - k/top*ph
		fmt.Fprintf(&b, `<text x="%.0f" y="%.1f" text-anchor="end">%g</text><line x1="%.0f" y1="%.1f" x2="%.0f" y2="%.1f" stroke="#eee"/>`+"\n", px-4, yy+4, k, px, yy, px+pw, yy)
	}
	fmt.Fprintf(&b, `<text x="%.0f" y="%.0f">%g s</text><text x="%.0f" y="%.0f" text-anchor="end">%g s</text>`+"\n", px, py+ph+16, t0, px+pw, py+ph+16, t1)
	for i, r := range rep.Results {
		if len(r.LoadSpread) == 0 {
			continue
		}
		fmt.Fprintf(&b, `<polyline fill="none" stroke="%s" stroke-width="1.5" points="`, colour(i))
		for _, p := range r.LoadSpread {
			x := px
			if t1 > t0 {
				x += (p.T - t0) / (t1 - t0) * pw
			}
			fmt.Fprintf(&b, "%.1f,%.1f ", x, py+ph-p.MaxOverMean/top*ph)
		}
		b.WriteString("\"/>\n")
		fmt.Fprintf(&b, `<text x="%.0f" y="%.0f" fill="%s">%s</text>`+"\n", px+pw+6, py+12+float64(i)*14, colour(i), label(i))
	}
	b.WriteString("</svg>\n")
	return b.Bytes()
}
