package benchkit

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"strings"
	"sync"
	"time"
)

// Printer prints the report's lines, one whole line at a time from any
// goroutine.
type Printer struct {
	mu sync.Mutex
	// W is where the lines go (os.Stdout when nil).
	W io.Writer
	// Stamp prefixes every line with the time of day (15:04:05).
	Stamp bool
}

// Say prints one line.
func (p *Printer) Say(format string, args ...any) {
	p.mu.Lock()
	defer p.mu.Unlock()
	w := p.W
	if w == nil {
		w = os.Stdout
	}
	if p.Stamp {
		format = "%s  " + format
		args = append([]any{time.Now().Format("15:04:05")}, args...)
	}
	fmt.Fprintf(w, format+"\n", args...)
}

// Verdict is a goal's line: "met", or "NOT MET" to stand out.
func Verdict(met bool) string {
	if met {
		return "met"
	}
	return "NOT MET"
}

// Out is a benchmark's report as it runs and its -json flag: with -json
// the lines go to stderr, so that stdout holds only the JSON summary
// (Finish writes it).
type Out struct {
	Printer
	JSON *bool
}

// NewOut declares -json; the benchmark calls Parse, not flag.Parse.
func NewOut() *Out {
	return &Out{JSON: flag.Bool("json", false, "print the summary as JSON on stdout (the report goes to stderr)")}
}

// Parse parses the command line and, under -json, sends the lines to
// stderr.
func (o *Out) Parse() {
	flag.Parse()
	if *o.JSON {
		o.W = os.Stderr
	}
}

// MS is d in milliseconds, to the microsecond.
func MS(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// Ratio is x/base; NaN when base is 0.
func Ratio(x, base float64) float64 {
	if base == 0 {
		return math.NaN()
	}
	return x / base
}

// RatioX is x/base as "1.23x": "1.00x" when both are 0, "n/a" when only
// base is.
func RatioX(x, base float64) string {
	switch {
	case base == 0 && x == 0:
		return "1.00x"
	case base == 0:
		return "n/a"
	}
	return fmt.Sprintf("%.2fx", x/base)
}

// LoadAvg is the machine's load averages from /proc/loadavg, the first n
// of them (1, 5, 15 minutes) separated by spaces; "?" when unreadable.
// Other work on shared cores shows in every figure.
func LoadAvg(n int) string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	f := strings.Fields(string(b))
	if len(f) < n {
		return "?"
	}
	return strings.Join(f[:n], " ")
}

// WriteJSON writes v to w as indented JSON.
func WriteJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// Finish ends a benchmark's main. When the run gave a summary, err (if
// any) is recorded in it with setErr, report prints it, and with jsonOut
// the summary also goes to stdout as JSON. Then an error is printed as
// "name: err" on stderr and exits 1, as is a failure to write the JSON.
func Finish[S any](name string, sum *S, err error, setErr func(*S, string), report func(*S), jsonOut bool) {
	if sum != nil {
		if err != nil {
			setErr(sum, err.Error())
		}
		report(sum)
		if jsonOut {
			if jerr := WriteJSON(os.Stdout, sum); jerr != nil {
				err = errors.Join(err, fmt.Errorf("writing the JSON summary: %w", jerr))
			}
		}
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, name+":", err)
		os.Exit(1)
	}
}
