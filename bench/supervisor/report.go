package main

import (
	"fmt"
	"strconv"
	"strings"
)

func fmtRatios(v []float64) string {
	var parts []string
	for _, r := range v {
		parts = append(parts, fmt.Sprintf("%.2f", r))
	}
	return strings.Join(parts, " ")
}

// printTable prints the reload figures as a markdown table (the docs paste
// it verbatim) with every supervisor column's ratio against gunicorn alone
// from the same run, then the direct comparison and the targets.
func printTable(rows []scenario, direct []directRow, conditions string) {
	fmt.Println()
	fmt.Println("command:", commandLine())
	fmt.Println("machine:", conditions)
	fmt.Printf("load: %d req/s constant, %d workers, app import %s; %d reloads %s apart; storm: a change every %s for %s\n",
		*rate, *workers, *startup, *reloads, *spacing, *stormEvery, *stormFor)
	fmt.Printf("supervisor: stability.window %s (gunicorn alone has none), one keeper process per worker\n", *window)
	for _, r := range rows {
		fmt.Printf("%s: %s\n", r.Name, r.Reload)
	}
	if len(rows) > 0 {
		type metric struct {
			label string
			get   func(s *scenario) (v float64, text string, ok bool)
			ratio bool
		}
		msv := func(f func(s *scenario) (float64, bool)) func(s *scenario) (float64, string, bool) {
			return func(s *scenario) (float64, string, bool) {
				v, ok := f(s)
				if !ok {
					return 0, "never", false
				}
				if v < 10 {
					return v, fmt.Sprintf("%.1f ms", v), true
				}
				return v, fmt.Sprintf("%.0f ms", v), true
			}
		}
		count := func(f func(s *scenario) int) func(s *scenario) (float64, string, bool) {
			return func(s *scenario) (float64, string, bool) { v := f(s); return float64(v), strconv.Itoa(v), true }
		}
		rps := func(f func(s *scenario) float64) func(s *scenario) (float64, string, bool) {
			return func(s *scenario) (float64, string, bool) {
				v := f(s)
				if v < 10 {
					return v, fmt.Sprintf("%.1f req/s", v), true
				}
				return v, fmt.Sprintf("%.0f req/s", v), true
			}
		}
		frac := func(f func(s *scenario) (int, int)) func(s *scenario) (float64, string, bool) {
			return func(s *scenario) (float64, string, bool) { a, b := f(s); return 0, fmt.Sprintf("%d/%d", a, b), true }
		}
		metrics := []metric{
			{"steady throughput (same generator)", rps(func(s *scenario) float64 { return s.SteadyRPS }), true},
			{"reloads: failed requests", count(func(s *scenario) int { return s.Reloads.Failed }), true},
			{"reloads: slowest request", msv(func(s *scenario) (float64, bool) { return s.Reloads.MaxMS, true }), true},
			{"reloads: p99 latency", msv(func(s *scenario) (float64, bool) { return s.Reloads.P99MS, true }), true},
			{"reloads: change -> first answer from new code, p50", msv(func(s *scenario) (float64, bool) { return s.Reloads.FirstP50MS, s.Reloads.FirstSeen > 0 }), true},
			{"reloads: change -> first answer from new code, max", msv(func(s *scenario) (float64, bool) { return s.Reloads.FirstMaxMS, s.Reloads.FirstSeen > 0 }), true},
			{"reloads: change -> all answers from new code, p50", msv(func(s *scenario) (float64, bool) { return s.Reloads.AllP50MS, s.Reloads.AllNew > 0 }), true},
			{"reloads: change -> all answers from new code, max", msv(func(s *scenario) (float64, bool) { return s.Reloads.AllMaxMS, s.Reloads.AllNew > 0 }), true},
			{"reloads: changes served alone before the next", frac(func(s *scenario) (int, int) { return s.Reloads.AllNew, s.Reloads.Changes }), false},
			{"storm: failed requests", count(func(s *scenario) int { return s.Storm.Failed }), true},
			{"storm: slowest request", msv(func(s *scenario) (float64, bool) { return s.Storm.MaxMS, true }), true},
			{"storm: throughput while changes are made", rps(func(s *scenario) float64 { return s.Storm.RPS }), true},
			{"storm: versions that answered", frac(func(s *scenario) (int, int) { return s.Storm.VersionsServed, s.Storm.Changes }), false},
			{"storm: last change -> first answer from its code", msv(func(s *scenario) (float64, bool) { return s.Storm.FirstP50MS, s.Storm.FirstSeen > 0 }), true},
			{"storm: last change -> all answers from its code", msv(func(s *scenario) (float64, bool) { return s.Storm.AllP50MS, s.Storm.AllNew > 0 }), true},
		}
		var base *scenario
		for i := range rows {
			if rows[i].Name == "gunicorn alone" {
				base = &rows[i]
			}
		}
		header := []string{"metric"}
		for _, r := range rows {
			if r.Name == "gunicorn alone" {
				header = append(header, "gunicorn alone (baseline)")
				continue
			}
			header = append(header, r.Name, "ratio")
		}
		table := [][]string{header}
		for _, m := range metrics {
			line := []string{m.label}
			for i := range rows {
				v, text, ok := m.get(&rows[i])
				line = append(line, text)
				if rows[i].Name == "gunicorn alone" {
					continue
				}
				ratio := "-"
				if base != nil && m.ratio && ok {
					if b, _, bok := m.get(base); bok && b != 0 {
						ratio = fmt.Sprintf("%.2fx", v/b)
					}
				}
				line = append(line, ratio)
			}
			table = append(table, line)
		}
		fmt.Println()
		printMarkdown(table)
	}

	if len(direct) > 0 {
		fmt.Println()
		fmt.Printf("%-26s %14s %14s %8s   %-26s %s\n", "steady throughput (wrk)", "direct req/s", "supervisor", "ratio", "p99 direct / supervisor", "server CPU/request direct / supervisor")
		for _, d := range direct {
			fmt.Printf("%-26s %14.0f %14.0f %7.1f%%   %-26s %.1f / %.1f us (%.3fx)\n", d.name, d.direct, d.underSV, 100*d.ratio, d.directP99+" / "+d.svP99,
				d.cpuDirect, d.cpuSV, d.cpuSV/max(d.cpuDirect, 1e-9))
		}
	}
	fmt.Println()
	fmt.Println("targets (supervisor columns): zero failed requests across swaps and the storm; slowest request <= 100ms;")
	fmt.Println("storm throughput >= 90% of steady; every change's code serving alone before the next; steady throughput within 5% of the same worker bound directly.")
	for _, r := range rows {
		if !strings.HasPrefix(r.Name, "supervisor") {
			continue
		}
		var fails []string
		if f := r.Reloads.Failed + r.Storm.Failed; f > 0 {
			fails = append(fails, fmt.Sprintf("%d failed requests", f))
		}
		if m := max(r.Reloads.MaxMS, r.Storm.MaxMS); m > 100 {
			fails = append(fails, fmt.Sprintf("slowest %.0fms > 100ms", m))
		}
		if r.Storm.RPS < 0.9*r.SteadyRPS {
			fails = append(fails, fmt.Sprintf("storm throughput %.0f%% of steady < 90%%", 100*r.Storm.RPS/r.SteadyRPS))
		}
		if r.Reloads.AllNew < r.Reloads.Changes || r.Storm.AllNew == 0 {
			fails = append(fails, fmt.Sprintf("new code alone after %d/%d reloads, storm %d/1", r.Reloads.AllNew, r.Reloads.Changes, r.Storm.AllNew))
		}
		verdict := "MET"
		if len(fails) > 0 {
			verdict = "MISSED: " + strings.Join(fails, "; ")
		}
		fmt.Printf("  %-32s %s\n", r.Name, verdict)
	}
	for _, d := range direct {
		verdict := "MET"
		if d.ratio < 0.95 {
			verdict = "MISSED"
		}
		fmt.Printf("  %-32s %s (%.1f%%, median of %d paired rounds)\n", d.name+" throughput", verdict, 100*d.ratio, len(d.ratios))
		verdict = "MET"
		if d.cpuDirect == 0 || d.cpuSV > 1.05*d.cpuDirect {
			verdict = "MISSED"
		}
		fmt.Printf("  %-32s %s (%.3fx the CPU per request of the same worker bound directly)\n", d.name+" CPU cost", verdict, d.cpuSV/max(d.cpuDirect, 1e-9))
	}
}

// printMarkdown prints rows as a padded markdown table; the first row is
// the header, the first column left-aligned, the others right-aligned.
func printMarkdown(rows [][]string) {
	width := make([]int, len(rows[0]))
	for _, r := range rows {
		for i, c := range r {
			width[i] = max(width[i], len(c), 3)
		}
	}
	line := func(cells []string) {
		var b strings.Builder
		for i, c := range cells {
			if i == 0 {
				fmt.Fprintf(&b, "| %-*s ", width[i], c)
			} else {
				fmt.Fprintf(&b, "| %*s ", width[i], c)
			}
		}
		fmt.Println(b.String() + "|")
	}
	line(rows[0])
	sep := make([]string, len(width))
	for i, w := range width {
		if i == 0 {
			sep[i] = strings.Repeat("-", w)
		} else {
			sep[i] = strings.Repeat("-", w-1) + ":"
		}
	}
	line(sep)
	for _, r := range rows[1:] {
		line(r)
	}
}
