package main

import (
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
)

// printTable prints the reload figures as a markdown table (the docs paste
// it verbatim) with every supervisor column's ratio against gunicorn alone
// from the same run, then the direct comparison and the targets.
func printTable(rows []scenario, direct []directRow, conditions string) {
	fmt.Printf("\ncommand: %s\nmachine: %s\n", commandLine(), conditions)
	fmt.Printf("load: %d req/s constant, %d workers, app import %s; %d reloads %s apart; storm: a change every %s for %s\n",
		*rate, *workers, *startup, *reloads, *spacing, *stormEvery, *stormFor)
	fmt.Printf("supervisor: stability.window %s (gunicorn alone has none), one keeper process per worker\n", *window)
	for _, r := range rows {
		fmt.Printf("%s: %s\n", r.Name, r.Reload)
	}
	if len(rows) > 0 {
		var base []cell
		table := [][]string{{"metric"}}
		for i, r := range rows {
			if r.Name == "gunicorn alone" {
				base = cells(&rows[i])
				table[0] = append(table[0], "gunicorn alone (baseline)")
			} else {
				table[0] = append(table[0], r.Name, "ratio")
			}
		}
		for _, c := range cells(&rows[0]) {
			table = append(table, []string{c.label})
		}
		for i := range rows {
			for m, c := range cells(&rows[i]) {
				table[m+1] = append(table[m+1], c.text)
				if rows[i].Name == "gunicorn alone" {
					continue
				}
				ratio := "-"
				if base != nil && c.ratio && c.ok && base[m].ok && base[m].v != 0 {
					ratio = fmt.Sprintf("%.2fx", c.v/base[m].v)
				}
				table[m+1] = append(table[m+1], ratio)
			}
		}
		fmt.Println()
		printMarkdown(table)
	}

	if len(direct) > 0 {
		fmt.Printf("\n%-26s %14s %14s %8s   %-26s %s\n", "steady throughput (wrk)", "direct req/s", "supervisor", "ratio", "p99 direct / supervisor", "server CPU/request direct / supervisor")
		for _, d := range direct {
			fmt.Printf("%-26s %14.0f %14.0f %7.1f%%   %-26s %.1f / %.1f us (%.3fx)\n", d.Name, d.Direct, d.UnderSV, 100*d.Ratio, d.directP99+" / "+d.svP99,
				d.CPUDirect, d.CPUSV, d.cpuRatio())
		}
	}
	fmt.Println("\ntargets (supervisor columns): zero failed requests across swaps and the storm; slowest request <= 100ms;")
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
	met := map[bool]string{true: "MET", false: "MISSED"}
	for _, d := range direct {
		fmt.Printf("  %-32s %s (%.1f%%, median of %d paired rounds)\n", d.Name+" throughput", met[d.Ratio >= 0.95], 100*d.Ratio, len(d.Ratios))
		fmt.Printf("  %-32s %s (%.3fx the CPU per request of the same worker bound directly)\n", d.Name+" CPU cost", met[d.CPUDirect != 0 && d.CPUSV <= 1.05*d.CPUDirect], d.cpuRatio())
	}
}

// cell is a scenario's value of a metric (the table's row label): ratio
// when a supervisor column's ratio against the baseline means something,
// ok unless "never".
type cell struct {
	label, text string
	v           float64
	ratio, ok   bool
}

func cells(s *scenario) []cell {
	unit := func(label string, v float64, unit string) cell { // one decimal below 10
		return cell{label, fmt.Sprintf("%.*f %s", map[bool]int{true: 1}[v < 10], v, unit), v, true, true}
	}
	ms := func(label string, v float64, seen int) cell {
		if seen == 0 {
			return cell{label, "never", 0, true, false}
		}
		return unit(label, v, "ms")
	}
	count := func(label string, n int) cell { return cell{label, strconv.Itoa(n), float64(n), true, true} }
	frac := func(label string, a, b int) cell { return cell{label, fmt.Sprintf("%d/%d", a, b), 0, false, true} }
	r, st := &s.Reloads, &s.Storm
	return []cell{
		unit("steady throughput (same generator)", s.SteadyRPS, "req/s"),
		count("reloads: failed requests", r.Failed),
		ms("reloads: slowest request", r.MaxMS, 1),
		ms("reloads: p99 latency", r.P99MS, 1),
		ms("reloads: change -> first answer from new code, p50", r.FirstP50MS, r.FirstSeen),
		ms("reloads: change -> first answer from new code, max", r.FirstMaxMS, r.FirstSeen),
		ms("reloads: change -> all answers from new code, p50", r.AllP50MS, r.AllNew),
		ms("reloads: change -> all answers from new code, max", r.AllMaxMS, r.AllNew),
		frac("reloads: changes served alone before the next", r.AllNew, r.Changes),
		count("storm: failed requests", st.Failed),
		ms("storm: slowest request", st.MaxMS, 1),
		unit("storm: throughput while changes are made", st.RPS, "req/s"),
		frac("storm: versions that answered", st.VersionsServed, st.Changes),
		ms("storm: last change -> first answer from its code", st.FirstP50MS, st.FirstSeen),
		ms("storm: last change -> all answers from its code", st.AllP50MS, st.AllNew),
	}
}

// printMarkdown prints rows as a padded markdown table; the first row is
// the header, the first column left-aligned, the others right-aligned.
func printMarkdown(rows [][]string) {
	w := 0
	for _, r := range rows {
		w = max(w, len(r[0]))
	}
	sep := append([]string{strings.Repeat("-", w)}, slices.Repeat([]string{"---:"}, len(rows[0])-1)...)
	tw := tabwriter.NewWriter(os.Stdout, 0, 0, 0, ' ', tabwriter.AlignRight)
	for _, r := range slices.Insert(rows, 1, sep) {
		fmt.Fprintf(tw, "| %-*s |\t %s |\t\n", w, r[0], strings.Join(r[1:], " |\t "))
	}
	tw.Flush()
}
