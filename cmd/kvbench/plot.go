package main

import (
	"fmt"
	"math"
	"strings"
)

// plotTTFT draws the TTFT distribution (a CDF) of each policy as an SVG,
// log-scaled in time, so the picture shows where each policy's requests
// wait.
func plotTTFT(sums []summary) []byte {
	const w, h, left, right, top, bottom = 760.0, 420.0, 70.0, 20.0, 40.0, 50.0
	colors := []string{"#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b"}
	lo, hi := math.Inf(1), 0.0
	for _, s := range sums {
		for _, v := range s.ttfts {
			lo, hi = math.Min(lo, math.Max(v, 0.1)), math.Max(hi, v)
		}
	}
	if hi <= 0 || math.IsInf(lo, 1) {
		lo, hi = 1, 10
	}
	lo, hi = math.Pow(10, math.Floor(math.Log10(lo))), math.Pow(10, math.Ceil(math.Log10(hi)))
	x := func(v float64) float64 {
		return left + (math.Log10(math.Max(v, lo))-math.Log10(lo))/(math.Log10(hi)-math.Log10(lo))*(w-left-right)
	}
	y := func(p float64) float64 { return h - bottom - p*(h-top-bottom) }
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%.0f" height="%.0f" font-family="sans-serif" font-size="12">`+"\n", w, h)
	fmt.Fprintf(&b, `<rect width="100%%" height="100%%" fill="white"/>`+"\n")
	fmt.Fprintf(&b, `<text x="%.0f" y="22" font-size="15">Time to first token: share of requests served within t</text>`+"\n", left)
	for d := lo; d <= hi*1.001; d *= 10 {
		fmt.Fprintf(&b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#ddd"/>`, x(d), y(0), x(d), y(1))
		fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" text-anchor="middle">%g ms</text>`+"\n", x(d), h-bottom+18, d)
	}
	for _, p := range []float64{0, .25, .5, .75, 1} {
		fmt.Fprintf(&b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#ddd"/>`, left, y(p), w-right, y(p))
		fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" text-anchor="end">%.0f%%</text>`+"\n", left-6, y(p)+4, p*100)
	}
	for i, s := range sums {
		c := colors[i%len(colors)]
		var pts []string
		for k, v := range s.ttfts {
			pts = append(pts, fmt.Sprintf("%.1f,%.1f", x(v), y(float64(k+1)/float64(len(s.ttfts)))))
		}
		fmt.Fprintf(&b, `<polyline fill="none" stroke="%s" stroke-width="2" points="%s"/>`+"\n", c, strings.Join(pts, " "))
		fmt.Fprintf(&b, `<rect x="%.0f" y="%.0f" width="12" height="12" fill="%s"/><text x="%.0f" y="%.0f">%s: p50 %.0f ms, hit %.2f</text>`+"\n",
			left+10, top+8+float64(i)*18, c, left+28, top+18+float64(i)*18, s.Policy, s.TTFTms.P50, s.HitRatio)
	}
	b.WriteString("</svg>\n")
	return []byte(b.String())
}
